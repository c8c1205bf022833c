"""Stripe Checkout through the official SDK (``stripe`` 16.x, ``StripeClient`` style).

Why a client object and not the module globals: several runtimes (tests, a
CLI next to a server) may live in one process with different keys and API
bases, and the global style is on its way to deprecation. Everything the SDK
needs is passed explicitly: key, API base (``STRIPE_API_BASE``, used to point
at the in-repo fake), retry count (the SDK's own default on a client is *no*
retries) and an HTTP client with a timeout, so a hung Stripe can't hang a
worker thread forever.

Errors are translated into Walkeep's hierarchy here, so nothing above the
adapter ever imports ``stripe``:

* unreachable / 5xx / rate-limited → ``PaymentsUnavailable`` (retry with the
  same request_id: the idempotency key makes that safe);
* rejected parameters → ``ValidationError`` carrying Stripe's ``param``;
* bad key / no permission → ``PaymentsUnavailable`` with a message for the
  operator (an agent can't fix it);
* idempotency conflict → ``IdempotencyConflict``: a bug, because a replay is
  always built from the stored row and so is byte-for-byte identical.

Stripe objects are not dicts since stripe-python 15 (no ``.get()``); fields
are read with ``in`` / ``[]`` only.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import stripe

from walkeep.config import Settings
from walkeep.errors import (
    ConfigurationError,
    Internal,
    NotFound,
    PaymentsUnavailable,
    ValidationError,
    WalkeepError,
)
from walkeep.payments.base import (
    CheckoutRequest,
    InvalidSignature,
    MalformedEvent,
    PaymentEvent,
    ProviderSession,
)

log = logging.getLogger(__name__)

PRODUCT_NAME = "Walkeep credits"
RETRY_HINT = "retry the same call with the same request_id; it is safe and will not charge twice"


class IdempotencyConflict(Internal):
    """Stripe saw one idempotency key with two different parameter sets.

    Walkeep derives every parameter from the stored checkout row, so this
    means a code change altered the request shape for an existing row.
    """


def _field(obj: Any, name: str) -> Any:
    """Read an optional field of a StripeObject (no ``.get()`` since v15)."""
    if obj is None:
        return None
    try:
        return obj[name] if name in obj else None  # noqa: SIM401 (no .get() on StripeObject)
    except (KeyError, TypeError):
        return getattr(obj, name, None)


def _metadata(obj: Any) -> dict[str, str] | None:
    md = _field(obj, "metadata")
    if md is None:
        return None
    raw = md.to_dict() if hasattr(md, "to_dict") else dict(md)
    return {str(k): str(v) for k, v in raw.items()}


def session_from_stripe(obj: Any) -> ProviderSession:
    """A ``ProviderSession`` from a ``stripe.checkout.Session`` (or its event copy)."""
    currency = _field(obj, "currency")
    return ProviderSession(
        session_id=str(obj["id"]),
        url=_field(obj, "url"),
        status=str(_field(obj, "status") or "open"),
        payment_status=str(_field(obj, "payment_status") or "unpaid"),
        amount_total=_field(obj, "amount_total"),
        currency=currency.lower() if isinstance(currency, str) else None,
        client_reference_id=_field(obj, "client_reference_id"),
        metadata=_metadata(obj),
    )


def checkout_params(req: CheckoutRequest) -> dict[str, Any]:
    """The Checkout Session parameters for ``req`` (notes/stripe.md §5.2).

    A pure function of the request, which is itself a pure function of the
    stored row: a replay under the same idempotency key sends identical
    parameters, which Stripe requires.
    """
    return {
        "mode": "payment",
        "client_reference_id": req.account_id,
        "line_items": [
            {
                "quantity": 1,
                "price_data": {
                    "currency": req.currency.lower(),
                    "unit_amount": req.amount_cents,
                    "product_data": {"name": PRODUCT_NAME},
                },
            }
        ],
        "metadata": {
            "account_id": req.account_id,
            "request_id": req.request_id,
            "checkout_id": req.checkout_id,
        },
        "success_url": req.success_url,
        "cancel_url": req.cancel_url,
        "expires_at": int(req.expires_at.timestamp()),
    }


class StripePayments:
    """The ``Payments`` port on Stripe Checkout."""

    provider = "stripe"

    def __init__(
        self,
        settings: Settings,
        *,
        max_network_retries: int = 2,
        timeout_seconds: float = 20,
    ) -> None:
        if not settings.stripe_secret_key:
            raise ConfigurationError("StripePayments needs STRIPE_SECRET_KEY")
        # Request metrics would otherwise be reported to Stripe on later calls.
        stripe.enable_telemetry = False
        base_addresses: dict[str, str] | None = (
            {"api": settings.stripe_api_base.rstrip("/")} if settings.stripe_api_base else None
        )
        self._webhook_secret = settings.stripe_webhook_secret
        # requests (a dependency of stripe) for the sync calls the service makes;
        # httpx (a Walkeep dependency) for the SDK's *_async twins, same timeout.
        self._http = stripe.RequestsClient(
            timeout=timeout_seconds,
            async_fallback_client=stripe.HTTPXClient(timeout=timeout_seconds),
        )
        self.client = stripe.StripeClient(
            settings.stripe_secret_key,
            base_addresses=base_addresses,  # type: ignore[arg-type]
            max_network_retries=max_network_retries,
            http_client=self._http,
        )

    # --- Payments --------------------------------------------------------------------

    def create_session(self, req: CheckoutRequest) -> ProviderSession:
        try:
            obj = self.client.v1.checkout.sessions.create(
                params=checkout_params(req),  # type: ignore[arg-type]
                options={"idempotency_key": req.idempotency_key},
            )
        except stripe.StripeError as exc:
            raise _translate(exc, "create a Checkout Session") from exc
        return session_from_stripe(obj)

    def retrieve_session(self, session_id: str) -> ProviderSession:
        try:
            obj = self.client.v1.checkout.sessions.retrieve(session_id)
        except stripe.StripeError as exc:
            raise _translate(exc, "retrieve a Checkout Session", session_id=session_id) from exc
        return session_from_stripe(obj)

    def parse_webhook(self, body: bytes, signature: str | None) -> PaymentEvent:
        """Verify the ``Stripe-Signature`` over the raw body, then parse the event.

        Anything that does not verify — no secret configured, no header, a
        tampered body, a timestamp more than the tolerance in the past *or the
        future* (the SDK checks only the past) — is an ``InvalidSignature``; a
        verified body that is not a usable event (``[]``, no ``id`` or
        ``type``) is a ``MalformedEvent``. Either way the caller answers 400
        and changes nothing.
        """
        if not self._webhook_secret:
            raise InvalidSignature("STRIPE_WEBHOOK_SECRET is not configured")
        if not signature:
            raise InvalidSignature("missing Stripe-Signature header")
        try:
            stripe.WebhookSignature.verify_header(
                body, signature, self._webhook_secret, tolerance=WEBHOOK_TOLERANCE_SECONDS
            )
        except stripe.SignatureVerificationError as exc:
            raise InvalidSignature(str(exc.user_message or "signature mismatch")) from exc
        except ValueError as exc:  # a body that is not UTF-8
            raise InvalidSignature(f"not a Stripe event: {type(exc).__name__}") from exc
        signed_at = _signature_timestamp(signature)
        if signed_at > time.time() + WEBHOOK_TOLERANCE_SECONDS:
            raise InvalidSignature(
                f"signature timestamp {signed_at} is more than "
                f"{WEBHOOK_TOLERANCE_SECONDS} s in the future"
            )
        return _parse_event(body)

    def close(self) -> None:
        """Release pooled connections (the async client's pool lives in its event loop)."""
        self._http.close()


# The SDK's default (and Stripe's recommendation): five minutes either way.
WEBHOOK_TOLERANCE_SECONDS = 300


def _signature_timestamp(header: str) -> int:
    """``t=`` of a header that already verified (so it is present and an integer)."""
    for item in header.split(","):
        key, _, value = item.partition("=")
        if key.strip() == "t":
            return int(value)
    raise InvalidSignature("no timestamp in Stripe-Signature")  # pragma: no cover


def _parse_event(body: bytes) -> PaymentEvent:
    """The fields Walkeep acts on, from a verified body; MalformedEvent if unusable."""
    try:
        data = json.loads(body)
    except ValueError as exc:
        raise MalformedEvent("signed body is not JSON") from exc
    if not isinstance(data, dict):
        raise MalformedEvent(f"signed body is a JSON {type(data).__name__}, not an event object")
    event_id, event_type = data.get("id"), data.get("type")
    for name, value, limit in (("id", event_id, 255), ("type", event_type, 100)):
        if not isinstance(value, str) or not value or len(value) > limit or "\x00" in value:
            raise MalformedEvent(f"signed event has no usable {name!r} ({value!r:.80})")
    holder = data.get("data")
    obj = holder.get("object") if isinstance(holder, dict) else None
    session_id = None
    if isinstance(obj, dict) and obj.get("object") == "checkout.session":
        sid = obj.get("id")
        if not isinstance(sid, str) or not sid or len(sid) > 255 or "\x00" in sid:
            raise MalformedEvent(f"signed event {event_id} has no usable checkout session id")
        session_id = sid
    return PaymentEvent(event_id=str(event_id), type=str(event_type), session_id=session_id)


def _translate(exc: stripe.StripeError, action: str, **context: str) -> WalkeepError:
    """Map an SDK error onto Walkeep's hierarchy (messages are client-safe)."""
    status = exc.http_status
    if isinstance(exc, stripe.IdempotencyError):
        log.error("Stripe idempotency conflict while trying to %s: %s", action, exc)
        return IdempotencyConflict(
            "Stripe reports the idempotency key was reused with different parameters; "
            "this is a Walkeep bug, please report it",
            {"provider": "stripe", **context},
        )
    if isinstance(exc, stripe.InvalidRequestError):
        if status == 404:
            return NotFound(f"Stripe has no such Checkout Session ({action})", dict(context))
        return ValidationError(
            f"Stripe rejected the request: {exc.user_message or 'invalid parameters'}",
            {"provider": "stripe", "param": exc.param, **context},
        )
    if isinstance(exc, stripe.AuthenticationError | stripe.PermissionError):
        log.error("Stripe refused our credentials while trying to %s: %s", action, exc)
        return PaymentsUnavailable(
            "payments are misconfigured on this server (Stripe refused its API key); "
            "the operator must fix STRIPE_SECRET_KEY",
            {"provider": "stripe", "operator_action": "check STRIPE_SECRET_KEY", **context},
        )
    if isinstance(exc, stripe.APIConnectionError | stripe.RateLimitError | stripe.APIError):
        log.warning("Stripe unavailable while trying to %s: %r", action, exc)
        return PaymentsUnavailable(
            f"the payment provider is unavailable; {RETRY_HINT}",
            {"provider": "stripe", "retry": True, "http_status": status, **context},
        )
    log.error("unexpected Stripe error while trying to %s: %r", action, exc)
    return PaymentsUnavailable(
        f"the payment provider returned an unexpected error; {RETRY_HINT}",
        {"provider": "stripe", "retry": True, "http_status": status, **context},
    )
