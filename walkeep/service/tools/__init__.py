"""The seven agent operations (store, recall, check_runway, check_balance, top_up, forget,
export), their result schemas, idempotency and rate limits: what an API key may call."""
