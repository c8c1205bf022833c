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

Saved cards (automatic top-up, notes/stripe.md "Saved cards and off-session charges"):
a Customer per account; Checkout in payment mode with
``payment_intent_data.setup_future_usage="off_session"`` (pay and save) or in setup mode
(save only), the consent text next to the button; off-session PaymentIntents
(``off_session=true, confirm=true``) under the charge row's idempotency key. A card
error (HTTP 402) is an answer, classed here from Stripe's ``code``, ``decline_code`` and
``advice_code`` into declined / hard_declined / authentication_required, so nothing
above this file knows Stripe's vocabulary.

Why one file: the whole Stripe adapter — every call Walkeep makes, the parameters it
builds and the translation of every error — so the one place that knows Stripe's
vocabulary is read in one sitting.
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
    ChargeRequest,
    ChargeResult,
    CheckoutRequest,
    Failure,
    InvalidSignature,
    MalformedEvent,
    PaymentEvent,
    ProviderSession,
    Reversals,
    SavedCard,
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


def card_from_stripe(pm: Any) -> SavedCard | None:
    """A ``SavedCard`` from an expanded PaymentMethod (None for an id or no card)."""
    if pm is None or isinstance(pm, str):
        return None
    card = _field(pm, "card")
    return SavedCard(
        payment_method_id=str(pm["id"]),
        brand=_field(card, "brand"),
        last4=_field(card, "last4"),
    )


def _session_card(obj: Any) -> SavedCard | None:
    """The card a completed session saved: its PaymentIntent's (payment mode) or its
    SetupIntent's (setup mode) payment method, when the session was retrieved expanded."""
    for intent_field in ("payment_intent", "setup_intent"):
        intent = _field(obj, intent_field)
        if intent is not None and not isinstance(intent, str):
            card = card_from_stripe(_field(intent, "payment_method"))
            if card is not None:
                return card
    return None


def session_from_stripe(obj: Any) -> ProviderSession:
    """A ``ProviderSession`` from a ``stripe.checkout.Session`` (or its event copy)."""
    currency = _field(obj, "currency")
    customer = _field(obj, "customer")
    return ProviderSession(
        session_id=str(obj["id"]),
        url=_field(obj, "url"),
        status=str(_field(obj, "status") or "open"),
        payment_status=str(_field(obj, "payment_status") or "unpaid"),
        amount_total=_field(obj, "amount_total"),
        currency=currency.lower() if isinstance(currency, str) else None,
        client_reference_id=_field(obj, "client_reference_id"),
        metadata=_metadata(obj),
        mode=str(_field(obj, "mode") or "payment"),
        customer_id=customer if isinstance(customer, str) else _field(customer, "id"),
        card=_session_card(obj),
    )


def checkout_params(req: CheckoutRequest) -> dict[str, Any]:
    """The Checkout Session parameters for ``req`` (notes/stripe.md §5.2).

    A pure function of the request, which is itself a pure function of the
    stored row: a replay under the same idempotency key sends identical
    parameters, which Stripe requires.
    """
    if req.mode == "setup":
        return _setup_params(req)
    params = {
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
    if req.save_card:
        # Pay and save the card for later charges made without the customer present.
        params.update(_save_card_params(req))
        params["payment_intent_data"] = {
            "setup_future_usage": "off_session",
            "metadata": _metadata_of(req),
        }
    return params


def _metadata_of(req: CheckoutRequest) -> dict[str, str]:
    return {
        "account_id": req.account_id,
        "request_id": req.request_id,
        "checkout_id": req.checkout_id,
    }


def _save_card_params(req: CheckoutRequest) -> dict[str, Any]:
    if not req.customer_id:
        raise ValueError("saving a card needs a customer")
    out: dict[str, Any] = {"customer": req.customer_id, "payment_method_types": ["card"]}
    if req.consent_text:
        # Shown next to the Pay / Save button: what the customer agrees to.
        out["custom_text"] = {"submit": {"message": req.consent_text}}
    return out


def _setup_params(req: CheckoutRequest) -> dict[str, Any]:
    """A setup-mode session: save a card, charge nothing."""
    return {
        "mode": "setup",
        "currency": req.currency.lower(),
        "client_reference_id": req.account_id,
        "metadata": _metadata_of(req),
        "setup_intent_data": {"metadata": _metadata_of(req)},
        "success_url": req.success_url,
        "cancel_url": req.cancel_url,
        "expires_at": int(req.expires_at.timestamp()),
        **_save_card_params(req),
    }


def charge_params(req: ChargeRequest) -> dict[str, Any]:
    """The off-session PaymentIntent for ``req``: a pure function of the charge row."""
    return {
        "amount": req.amount_cents,
        "currency": req.currency.lower(),
        "customer": req.customer_id,
        "payment_method": req.payment_method_id,
        "off_session": True,
        "confirm": True,
        "description": req.description,
        "metadata": {"account_id": req.account_id, "walkeep_charge_id": req.charge_id},
    }


# A decline Stripe says never to retry (or that cannot succeed with this card).
HARD_DECLINE_CODES = frozenset(
    {
        "lost_card",
        "stolen_card",
        "pickup_card",
        "restricted_card",
        "fraudulent",
        "revocation_of_authorization",
        "revocation_of_all_authorizations",
        "stop_payment_order",
        "invalid_account",
        "new_account_information_available",
        "expired_card",
        "incorrect_number",
        "invalid_number",
        "card_not_supported",
    }
)
HARD_ERROR_CODES = frozenset({"expired_card", "incorrect_number", "invalid_number"})


def classify_failure(error: dict[str, Any]) -> Failure:
    """Class a Stripe payment error (a 402 body's ``error``, or ``last_payment_error``)."""
    code = error.get("code")
    decline = error.get("decline_code")
    if "authentication_required" in (code, decline):
        return "authentication_required"
    if (
        error.get("advice_code") == "do_not_try_again"
        or decline in HARD_DECLINE_CODES
        or code in HARD_ERROR_CODES
    ):
        return "hard_declined"
    return "declined"


def charge_from_stripe(pi: Any) -> ChargeResult:
    """A ``ChargeResult`` from a PaymentIntent (a StripeObject or its dict)."""
    data = pi.to_dict() if hasattr(pi, "to_dict") else dict(pi)
    status = data.get("status")
    currency = data.get("currency")
    common: dict[str, Any] = {
        "payment_intent_id": data.get("id"),
        "amount_cents": data.get("amount"),
        "currency": currency.lower() if isinstance(currency, str) else None,
        "metadata": {str(k): str(v) for k, v in (data.get("metadata") or {}).items()},
    }
    if status == "succeeded":
        return ChargeResult(status="succeeded", **common)
    if status == "requires_action":
        return ChargeResult(
            status="failed",
            failure="authentication_required",
            decline_code="authentication_required",
            message="the card holder must authenticate this payment",
            **common,
        )
    err = data.get("last_payment_error")
    if status == "requires_payment_method" or status == "canceled" or err:
        err = err if isinstance(err, dict) else {}
        return ChargeResult(
            status="failed",
            failure=classify_failure(err) if err else "declined",
            decline_code=err.get("decline_code") or err.get("code"),
            message=err.get("message") or f"payment {status}",
            **common,
        )
    return ChargeResult(status="pending", **common)  # processing, requires_confirmation …


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
            obj = self.client.v1.checkout.sessions.retrieve(
                session_id,
                # The card a completed session saved comes with it (one request).
                params={"expand": ["payment_intent.payment_method", "setup_intent.payment_method"]},
            )
        except stripe.StripeError as exc:
            raise _translate(exc, "retrieve a Checkout Session", session_id=session_id) from exc
        return session_from_stripe(obj)

    # --- saved cards -------------------------------------------------------------------

    def ensure_customer(self, account_id: str, idempotency_key: str) -> str:
        try:
            obj = self.client.v1.customers.create(
                params={
                    "description": f"Walkeep account {account_id}",
                    "metadata": {"account_id": account_id},
                },
                options={"idempotency_key": idempotency_key},
            )
        except stripe.StripeError as exc:
            raise _translate(exc, "create a Customer") from exc
        return str(obj["id"])

    def charge(self, req: ChargeRequest) -> ChargeResult:
        try:
            obj = self.client.v1.payment_intents.create(
                params=charge_params(req),  # type: ignore[arg-type]
                options={"idempotency_key": req.idempotency_key},
            )
        except stripe.CardError as exc:
            return _card_error(exc)
        except stripe.InvalidRequestError as exc:
            if exc.param in ("payment_method", "customer") and exc.http_status in (400, 404):
                # The card (or customer) is gone: removed, or never attached. Retrying
                # the same card can never succeed.
                err = _error_body(exc)
                return ChargeResult(
                    payment_intent_id=None,
                    status="failed",
                    amount_cents=req.amount_cents,
                    currency=req.currency,
                    failure="hard_declined",
                    decline_code=err.get("code") or "card_removed",
                    message="the saved card can no longer be charged (removed or detached)",
                )
            raise _translate(exc, "charge a saved card") from exc
        except stripe.StripeError as exc:
            raise _translate(exc, "charge a saved card") from exc
        return charge_from_stripe(obj)

    def retrieve_charge(self, payment_intent_id: str) -> ChargeResult:
        try:
            obj = self.client.v1.payment_intents.retrieve(payment_intent_id)
        except stripe.StripeError as exc:
            raise _translate(
                exc, "retrieve a PaymentIntent", payment_intent=payment_intent_id
            ) from exc
        return charge_from_stripe(obj)

    def find_charge(self, charge_id: str) -> ChargeResult | None:
        try:
            found = self.client.v1.payment_intents.search(
                params={"query": f"metadata['walkeep_charge_id']:'{charge_id}'", "limit": 1}
            )
        except stripe.StripeError as exc:
            raise _translate(exc, "search PaymentIntents") from exc
        data = list(_field(found, "data") or [])
        return charge_from_stripe(data[0]) if data else None

    def reversals(self, payment_intent_id: str) -> Reversals:
        try:
            pi = self.client.v1.payment_intents.retrieve(
                payment_intent_id, params={"expand": ["latest_charge"]}
            )
            disputes = self.client.v1.disputes.list(
                params={"payment_intent": payment_intent_id, "limit": 100}
            )
        except stripe.StripeError as exc:
            raise _translate(
                exc, "read refunds and disputes", payment_intent=payment_intent_id
            ) from exc
        charge = _field(pi, "latest_charge")
        refunded = int(_field(charge, "amount_refunded") or 0) if not isinstance(charge, str) else 0
        disputed = sum(
            int(_field(d, "amount") or 0)
            for d in (_field(disputes, "data") or [])
            if _field(d, "status") != "won"
        )
        return Reversals(refunded_cents=refunded, disputed_cents=disputed)

    def default_card(self, customer_id: str) -> SavedCard | None:
        try:
            cus = self.client.v1.customers.retrieve(
                customer_id, params={"expand": ["invoice_settings.default_payment_method"]}
            )
        except stripe.StripeError as exc:
            raise _translate(exc, "retrieve a Customer", customer=customer_id) from exc
        return card_from_stripe(_field(_field(cus, "invoice_settings"), "default_payment_method"))

    def portal_url(self, customer_id: str, return_url: str) -> str | None:
        try:
            obj = self.client.v1.billing_portal.sessions.create(
                params={
                    "customer": customer_id,
                    "return_url": return_url,
                    "flow_data": {"type": "payment_method_update"},
                }
            )
        except stripe.StripeError as exc:
            raise _translate(exc, "open the Customer Portal") from exc
        return str(obj["url"])

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
    if not isinstance(obj, dict):
        return PaymentEvent(event_id=str(event_id), type=str(event_type), session_id=session_id)
    kind = _ident(obj.get("object"))
    object_id = _ident(obj.get("id"))
    payment_intent = object_id if kind == "payment_intent" else _ident(obj.get("payment_intent"))
    customer = object_id if kind == "customer" else _ident(obj.get("customer"))
    return PaymentEvent(
        event_id=str(event_id),
        type=str(event_type),
        session_id=session_id,
        object_type=kind,
        object_id=object_id,
        payment_intent_id=payment_intent,
        customer_id=customer,
    )


def _ident(value: Any) -> str | None:
    """An object id from an event body (a string, or an expanded object's id), if usable."""
    if isinstance(value, dict):
        value = value.get("id")
    if isinstance(value, str) and value and len(value) <= 255 and "\x00" not in value:
        return value
    return None


def _error_body(exc: stripe.StripeError) -> dict[str, Any]:
    """The ``error`` object of an error response (a dict; empty if there is none)."""
    body = exc.json_body
    err = body.get("error") if isinstance(body, dict) else None
    return err if isinstance(err, dict) else {}


def _card_error(exc: stripe.CardError) -> ChargeResult:
    """A declined off-session charge (HTTP 402): the answer, classed."""
    err = _error_body(exc)
    pi = err.get("payment_intent") or {}
    currency = pi.get("currency") if isinstance(pi, dict) else None
    log.info(
        "Stripe declined an off-session charge: code=%s decline_code=%s advice=%s",
        err.get("code"),
        err.get("decline_code"),
        err.get("advice_code"),
    )
    return ChargeResult(
        payment_intent_id=pi.get("id") if isinstance(pi, dict) else None,
        status="failed",
        amount_cents=pi.get("amount") if isinstance(pi, dict) else None,
        currency=currency.lower() if isinstance(currency, str) else None,
        failure=classify_failure(err),
        decline_code=err.get("decline_code") or err.get("code"),
        message=(exc.user_message or err.get("message") or "card declined")[:300],
        metadata={str(k): str(v) for k, v in (pi.get("metadata") or {}).items()}
        if isinstance(pi, dict)
        else None,
    )


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
            return NotFound(f"Stripe has no such object ({action})", dict(context))
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
