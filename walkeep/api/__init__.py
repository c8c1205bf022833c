"""HTTP entrypoints: REST, webhooks and pages (thin: parse, call one service function, render)."""
