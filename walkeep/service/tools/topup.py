"""Top-ups: Checkout links for prepaid credits, credited exactly once.

Three promises (DESIGN §4 invariants 3–5):

1. **One session per request_id.** ``top_up`` claims a ``checkout_sessions``
   row — UNIQUE (account, request_id) — *before* calling the provider, with
   every parameter the provider will see (amount, expiry, URLs, idempotency
   key) fixed in that row. A replay rebuilds the identical request from the
   row, so the provider's idempotency key covers the crash window between
   its answer and our write, and the row covers everything after (Stripe
   forgets idempotency keys after ~24 h; the row doesn't).
2. **Credited exactly once, only when paid.** Every path that can learn a
   session was paid — the Stripe webhook, the local TEST MODE Pay button,
   the reconcile job, a ``top_up`` replay — funnels into
   ``credit_checkout``, which re-reads the row under a lock, checks the
   provider's *current* view (amount and currency must match the row) and
   posts a ledger credit whose ref ``topup:<checkout_id>`` is UNIQUE per
   account. Any number of concurrent or reordered deliveries credit once.
3. **A top-up resumes paused memories** in the same transaction as the
   credit (``resume_paused``), so nobody has to act.

Webhooks are verified by the provider adapter (bad signature → nothing
changes), deduplicated by event id in ``stripe_events`` (recorded in the same
transaction as their effect, so an event is marked seen only once it has been
applied), and never trusted for state: the session is re-retrieved, so event
order does not matter.

Expired sessions: replaying ``top_up`` for a row whose session expired (or
whose asynchronous payment failed) creates a fresh session under a new
idempotency key ``<key>:<n>`` (n = 2, 3, …) and a new 24 h expiry written to
the row first. The old session can no longer be paid, so the single ledger
ref per checkout row still means one credit per payment.

Saving a card (automatic top-up): ``top_up(save_card=true)`` makes the same checkout
also save the card for off-session charges, for the account's customer at the provider
(``autotopup.ensure_customer``, fixed in the row like every other parameter), with the
consent text (``topup_rule.CONSENT_TEXT``) shown beside the Pay button; the console's
"add a card" is a setup-mode checkout (``save_card_link``: saves, charges nothing). When
such a checkout completes, the card is recorded once (``card_saved_at``) through
``autotopup.card_saved``, in the transaction that credits it. ``action_checkout`` is the
link an ``action_required`` automatic charge offers its card holder: a ``save_card``
checkout for the same amount, one per charge (its request id is derived from the charge).

The Stripe webhook also carries automatic top-up's events (``payment_intent.*``,
``charge.refunded``, ``charge.dispute.created``, ``payment_method.detached``,
``customer.updated``): deduplicated the same way, acted on by ``autocharge.apply_event``
in the transaction that records them.

Why one file: one checkout row's life — created by ``top_up``, credited by the webhook,
the reconciler or the local pay page — and all four lock and credit it the same way.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
from datetime import datetime, timedelta
from decimal import Decimal, InvalidOperation
from typing import Literal

from pydantic import BaseModel
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from walkeep import ids, ledger, topup_rule
from walkeep.db.models import Account, AutoCharge, CheckoutSession, StripeEvent
from walkeep.errors import Internal, NotFound, Unauthorized, ValidationError
from walkeep.ledger import MC_PER_CREDIT, Kind
from walkeep.payments.base import CheckoutRequest, PaymentEvent, ProviderSession
from walkeep.payments.local import TEST_CARDS, LocalPayments, local_session_id
from walkeep.service import alerts, autocharge, autotopup
from walkeep.service.pausing import credit_payment
from walkeep.service.runtime import Runtime
from walkeep.service.tools.schemas import TopUpResult

log = logging.getLogger(__name__)

CURRENCY = "usd"
MIN_CENTS = 50  # Stripe's minimum charge in USD
MAX_DECIMALS = 2
REQUEST_ID_MAX_CHARS = 255
SESSION_LIFETIME = timedelta(hours=24)  # Stripe's maximum (and default) session lifetime
# Idempotency keys are ≤255 characters and go into an HTTP header: longer or
# non-ASCII request ids are hashed (leaving room for the ":<n>" suffix).
_KEY_BUDGET = 230

EVENT_COMPLETED = "checkout.session.completed"
EVENT_ASYNC_SUCCEEDED = "checkout.session.async_payment_succeeded"
EVENT_ASYNC_FAILED = "checkout.session.async_payment_failed"
EVENT_EXPIRED = "checkout.session.expired"
HANDLED_EVENTS = frozenset(
    {EVENT_COMPLETED, EVENT_ASYNC_SUCCEEDED, EVENT_ASYNC_FAILED, EVENT_EXPIRED}
)

Action = Literal[
    "credited",
    "already_credited",
    "pending",
    "expired",
    "failed",
    "ignored",
    "unknown_session",
    "superseded",
    "amount_mismatch",
    "duplicate",
    "card_saved",
    # automatic top-up's events (autocharge.apply_event)
    "charge_settled",
    "reversed",
    "card_removed",
    "card_updated",
    "unknown_charge",
]


# --- results -------------------------------------------------------------------------


class WebhookOutcome(BaseModel):
    """What a webhook delivery did; the endpoint echoes it next to ``received``."""

    event_id: str
    type: str
    action: Action
    credited: bool = False
    duplicate: bool = False
    checkout_id: str | None = None


class ReconcileReport(BaseModel):
    checked: int = 0
    credited: int = 0
    already_credited: int = 0
    expired: int = 0
    failed: int = 0
    pending: int = 0
    skipped: int = 0
    errors: int = 0


class CheckoutStatus(BaseModel):
    """One checkout as the checkout/done pages show it."""

    checkout_id: str
    account_id: str
    account_name: str
    amount_cents: int
    amount_usd: str
    currency: str
    provider: str
    status: str
    payment_status: str | None
    checkout_url: str | None
    expires_at: datetime
    credited: bool
    test_mode: bool
    mode: str = "payment"  # "setup": saves a card, charges nothing
    save_card: bool = False
    card_saved: bool = False


# --- validation ----------------------------------------------------------------------


def _bounds(max_usd: str) -> dict[str, object]:
    return {"min_usd": "0.50", "max_usd": str(max_usd), "max_decimals": MAX_DECIMALS}


def parse_amount_cents(amount_usd: str | Decimal | int | float, max_usd: str) -> int:
    """Exact US cents for ``amount_usd``, or ValidationError carrying the bounds.

    Goes through ``Decimal(str(x))`` so a float like ``12.34`` means exactly
    12.34 and ``0.1 + 0.2`` (``0.30000000000000004``) is refused, not rounded.
    """
    data = {"field": "amount_usd", **_bounds(max_usd)}
    if isinstance(amount_usd, bool):
        raise ValidationError("amount_usd must be a number of US dollars", data)
    try:
        d = amount_usd if isinstance(amount_usd, Decimal) else Decimal(str(amount_usd).strip())
    except (InvalidOperation, ValueError) as exc:
        raise ValidationError("amount_usd must be a number of US dollars", data) from exc
    if not d.is_finite():
        raise ValidationError("amount_usd must be a finite number", data)
    cents = d * 100
    if cents != cents.to_integral_value():
        raise ValidationError(
            f"amount_usd has more than {MAX_DECIMALS} decimal places (whole cents only)", data
        )
    max_cents = int(Decimal(str(max_usd)) * 100)
    if cents < MIN_CENTS or cents > max_cents:
        raise ValidationError(f"amount_usd must be between 0.50 and {max_usd} US dollars", data)
    return int(cents)


def _validate_request_id(request_id: object) -> str:
    if not isinstance(request_id, str) or not 1 <= len(request_id) <= REQUEST_ID_MAX_CHARS:
        raise ValidationError(
            f"request_id must be a string of 1–{REQUEST_ID_MAX_CHARS} characters",
            {"field": "request_id", "min_chars": 1, "max_chars": REQUEST_ID_MAX_CHARS},
        )
    return ids.check_identifier(request_id, "request_id")


def _key_base(account_id: str, request_id: str) -> str:
    base = f"walkeep-topup-{account_id}-{request_id}"
    if len(base) > _KEY_BUDGET or not (base.isascii() and base.isprintable()):
        digest = hashlib.sha256(request_id.encode("utf-8")).hexdigest()
        base = f"walkeep-topup-{account_id}-sha256-{digest}"
    return base


def idempotency_key(account_id: str, request_id: str, attempt: int = 1) -> str:
    """The provider idempotency key for a checkout row's ``attempt``-th session."""
    base = _key_base(account_id, request_id)
    return base if attempt == 1 else f"{base}:{attempt}"


def _attempt_of(row: CheckoutSession) -> int:
    base = _key_base(row.account_id, row.request_id)
    if row.idempotency_key == base:
        return 1
    suffix = row.idempotency_key.removeprefix(base + ":")
    return int(suffix) if suffix.isdigit() else 1


def _public(rt: Runtime) -> str:
    return rt.settings.public_url.rstrip("/")


def _success_url(rt: Runtime) -> str:
    # {CHECKOUT_SESSION_ID} is a Stripe template Stripe fills in on redirect.
    return f"{_public(rt)}/topup/done?session_id={{CHECKOUT_SESSION_ID}}"


def _done_url(rt: Runtime, row: CheckoutSession) -> str:
    return f"{_public(rt)}/topup/done?session_id={row.provider_session_id or ''}"


def _request_for(rt: Runtime, row: CheckoutSession) -> CheckoutRequest:
    """The provider request, built from the stored row only (never from "now")."""
    return CheckoutRequest(
        checkout_id=row.id,
        account_id=row.account_id,
        request_id=row.request_id,
        amount_cents=row.amount_cents,
        currency=row.currency,
        idempotency_key=row.idempotency_key,
        expires_at=row.expires_at,
        success_url=_success_url(rt),
        cancel_url=f"{_public(rt)}/topup/cancel",
        mode=row.mode,
        save_card=row.save_card,
        customer_id=row.customer_id,
        consent_text=topup_rule.CONSENT_TEXT if row.save_card else None,
    )


# --- top_up --------------------------------------------------------------------------


def top_up(
    rt: Runtime,
    account_id: str,
    amount_usd: str | Decimal | int | float,
    request_id: str,
    save_card: bool = False,
) -> TopUpResult:
    """A checkout link for ``amount_usd`` of credits; idempotent per request_id.

    ``save_card``: the checkout also saves the card for automatic top-up (which only
    an operator can turn on). Raises ValidationError (bad amount/request_id, or the
    request_id was used for a different amount or save_card), NotFound (unknown
    account), PaymentsUnavailable (provider unreachable: the row stays ``creating`` and
    a replay with the same request_id finishes the job without creating a second session).
    """
    request_id = _validate_request_id(request_id)
    cents = parse_amount_cents(amount_usd, rt.settings.topup_max_usd)
    if not isinstance(save_card, bool):
        raise ValidationError("save_card must be true or false", {"field": "save_card"})
    customer = autotopup.ensure_customer(rt, account_id) if save_card else None
    row = _claim(rt, account_id, request_id, cents, save_card=save_card, customer_id=customer)
    url = _ensure_session(rt, row)
    return TopUpResult(checkout_url=url, amount_usd=float(Decimal(cents) / 100))


def save_card_link(rt: Runtime, account_id: str, request_id: str) -> str:
    """A setup-mode checkout: the human saves (or replaces) the card, nothing is charged."""
    request_id = _validate_request_id(request_id)
    customer = autotopup.ensure_customer(rt, account_id)
    row = _claim(rt, account_id, request_id, 0, mode="setup", save_card=True, customer_id=customer)
    return _ensure_session(rt, row)


def action_checkout(rt: Runtime, charge_id: str) -> str:
    """The checkout an ``action_required`` automatic charge offers its card holder: the
    same amount, saving the card again; one per charge, so opening the link twice gives
    the same checkout (and a fresh one once that expired)."""
    ids.check_identifier(charge_id, "charge_id")
    with rt.db.read() as s:
        ch = s.get(AutoCharge, charge_id)
        if ch is None or ch.status != "authentication_required":
            raise NotFound(
                "no automatic charge is waiting for authentication under this link",
                {"charge_id": charge_id},
            )
        account_id, cents = ch.account_id, ch.amount_cents
    amount = Decimal(cents) / 100
    return top_up(rt, account_id, amount, f"auto-top-up-{charge_id}", save_card=True).checkout_url


def _claim(
    rt: Runtime,
    account_id: str,
    request_id: str,
    cents: int,
    *,
    mode: str = "payment",
    save_card: bool = False,
    customer_id: str | None = None,
) -> CheckoutSession:
    """Insert (or find) the row for (account, request_id) before any provider call."""
    for _ in range(3):
        now = rt.clock.now()
        try:
            with rt.db.begin() as s:
                row = s.scalar(
                    select(CheckoutSession).where(
                        CheckoutSession.account_id == account_id,
                        CheckoutSession.request_id == request_id,
                    )
                )
                if row is None:
                    if s.get(Account, account_id) is None:
                        raise NotFound(f"unknown account {account_id}", {"account_id": account_id})
                    row = CheckoutSession(
                        id=ids.new_checkout_id(),
                        account_id=account_id,
                        request_id=request_id,
                        amount_cents=cents,
                        currency=CURRENCY,
                        provider=rt.payments.provider,
                        provider_session_id=None,
                        url=None,
                        status="creating",
                        payment_status=None,
                        idempotency_key=idempotency_key(account_id, request_id),
                        expires_at=now + SESSION_LIFETIME,
                        created_at=now,
                        updated_at=now,
                        mode=mode,
                        save_card=save_card,
                        customer_id=customer_id,
                    )
                    s.add(row)
                    s.flush()
                elif row.mode != mode or row.save_card != save_card:
                    raise ValidationError(
                        "request_id was already used for a different kind of checkout "
                        "(save_card differs); use a new request_id",
                        {"field": "request_id", "request_id": request_id},
                    )
                elif row.amount_cents != cents:
                    raise ValidationError(
                        "request_id was already used for a top-up of a different amount; "
                        "use a new request_id",
                        {
                            "field": "request_id",
                            "request_id": request_id,
                            "original_amount_usd": ledger.mc_to_usd_str(
                                row.amount_cents * MC_PER_CREDIT
                            ),
                        },
                    )
                return row
        except IntegrityError:
            # A concurrent call claimed the same request_id first; read its row.
            continue
    raise Internal("could not claim the top-up row", {"request_id": request_id})


def _ensure_session(rt: Runtime, row: CheckoutSession) -> str:
    """Drive ``row`` to a usable checkout URL (a small state machine, see module doc)."""
    for _ in range(6):
        if row.status == "complete":
            return row.url or _done_url(rt, row)
        if row.provider != rt.payments.provider or row.status in ("expired", "failed"):
            row = _rotate(rt, row)
            continue
        if row.status == "open" and row.provider_session_id:
            if rt.clock.now() < row.expires_at and row.url:
                return row.url
            # Past its expiry (or no URL): ask the provider before replacing it,
            # in case it was paid and the webhook hasn't arrived.
            try:
                ps = rt.payments.retrieve_session(row.provider_session_id)
            except NotFound:
                ps = None
            if ps is None:
                row = _rotate(rt, row)
                continue
            row, _action, _credited = _apply_in_txn(rt, row.id, ps, source="top_up replay")
            if row.status == "open":
                return row.url or _done_url(rt, row)
            continue
        # "creating" (or an open row that lost its session id): call the provider
        # with the identical request; its idempotency key returns the same session.
        req = _request_for(rt, row)
        try:
            ps = rt.payments.create_session(req)
        except ValidationError as exc:
            if exc.data.get("param") == "expires_at":
                # The stored expiry is no longer acceptable (the row sat in
                # "creating" for ~a day): start a fresh attempt.
                row = _rotate(rt, row)
                continue
            raise
        row = _record_created(rt, row.id, req, ps)
    raise Internal("could not create a checkout session", {"checkout_id": row.id})


def _lock_row(s: Session, checkout_id: str) -> CheckoutSession | None:
    """Re-read a checkout row under a row lock (PostgreSQL; SQLite's writer lock
    from BEGIN IMMEDIATE already serialises)."""
    return s.execute(
        select(CheckoutSession)
        .where(CheckoutSession.id == checkout_id)
        .with_for_update()
        .execution_options(populate_existing=True)
    ).scalar_one_or_none()


def _locked(s: Session, checkout_id: str) -> CheckoutSession:
    row = _lock_row(s, checkout_id)
    if row is None:
        raise NotFound("no such checkout", {"checkout_id": checkout_id})
    return row


def _record_created(
    rt: Runtime, checkout_id: str, req: CheckoutRequest, ps: ProviderSession
) -> CheckoutSession:
    with rt.db.begin() as s:
        row = _locked(s, checkout_id)
        if row.idempotency_key != req.idempotency_key:
            return row  # rotated concurrently; the caller re-evaluates
        if row.provider_session_id is None:
            row.provider_session_id = ps.session_id
        if row.provider_session_id == ps.session_id:
            if ps.url:
                row.url = ps.url
            if row.status == "creating":
                row.status = "open"
                row.payment_status = ps.payment_status
                row.updated_at = rt.clock.now()
            _apply_provider_state(s, row, ps, source="top_up create", rt=rt)
        return row


def _rotate(rt: Runtime, stale: CheckoutSession) -> CheckoutSession:
    """Start a fresh provider session for a row whose session is dead.

    New idempotency key suffix, new expiry and the current provider, written
    before the provider is called, like the first attempt.
    """
    with rt.db.begin() as s:
        row = _locked(s, stale.id)
        if row.idempotency_key != stale.idempotency_key or row.status == "complete":
            return row  # someone else moved it on (or it got paid meanwhile)
        now = rt.clock.now()
        old_session = row.provider_session_id
        row.idempotency_key = idempotency_key(row.account_id, row.request_id, _attempt_of(row) + 1)
        row.provider = rt.payments.provider
        row.provider_session_id = None
        row.url = None
        row.status = "creating"
        row.payment_status = None
        row.pay_token_hash = None  # a page of the dead session cannot pay the new one
        row.expires_at = now + SESSION_LIFETIME
        row.updated_at = now
        log.info(
            "top-up %s: session %s is %s, starting attempt %s",
            row.id,
            old_session,
            stale.status,
            row.idempotency_key.rsplit(":", 1)[-1],
        )
        return row


# --- crediting (the one path every signal takes) ------------------------------------


def _session_matches(row: CheckoutSession, ps: ProviderSession) -> bool:
    """Is ``ps`` this row's current session? Adopts it if the row has none yet.

    A row without a session id is one whose create call crashed after the
    provider answered; the provider's metadata names our checkout id.
    """
    if row.provider_session_id is None:
        if (ps.metadata or {}).get("checkout_id") != row.id:
            return False
        row.provider_session_id = ps.session_id
        if ps.url and not row.url:
            row.url = ps.url
        return True
    return row.provider_session_id == ps.session_id


def credit_checkout(
    s: Session, row: CheckoutSession, ps: ProviderSession, *, source: str, rt: Runtime
) -> bool:
    """Credit ``row``'s account once, if the provider says ``ps`` is paid.

    ``row`` must have been read with ``_lock_row`` in ``s`` (the caller's
    transaction). Credits only when ``ps`` is this row's session, its
    ``payment_status`` is ``paid`` and its amount and currency equal the row's.
    The ledger ref ``topup:<checkout_id>`` makes a second call (or a racing
    transaction) a no-op. Returns whether *this* call credited.
    """
    if not _session_matches(row, ps) or ps.payment_status != "paid":
        return False
    if ps.amount_total != row.amount_cents or (ps.currency or "").lower() != row.currency:
        log.error(
            "top-up %s: provider session %s reports %s %s, expected %s %s; NOT crediting",
            row.id,
            ps.session_id,
            ps.amount_total,
            ps.currency,
            row.amount_cents,
            row.currency,
        )
        return False
    amount_mc = row.amount_cents * MC_PER_CREDIT
    entry = credit_payment(
        s,
        rt,
        row.account_id,
        amount_mc,
        ref=f"topup:{row.id}",
        kind=Kind.TOPUP,
        memo=f"top-up ${ledger.mc_to_usd_str(amount_mc)} via {row.provider} {ps.session_id}",
    )
    row.status = "complete"
    row.payment_status = "paid"
    row.credited_entry_id = entry.id
    row.updated_at = s.info["clock"].now()
    # --- alert (same transaction as the credit) ---
    if not entry.replayed:
        alerts.emit(
            s,
            row.account_id,
            "topup.credited",
            {
                "checkout_id": row.id,
                "amount_usd": ledger.mc_to_usd_str(amount_mc),
                "credited_mc": amount_mc,
                "balance_mc": ledger.balance(s, row.account_id).balance_mc,
            },
        )
    if not entry.replayed:
        log.info("top-up %s credited %s mc to %s (%s)", row.id, amount_mc, row.account_id, source)
    return not entry.replayed


def _apply_provider_state(
    s: Session,
    row: CheckoutSession,
    ps: ProviderSession,
    *,
    source: str,
    rt: Runtime,
    failed_signal: bool = False,
) -> tuple[Action, bool]:
    """Bring ``row`` (locked) in line with the provider's current view ``ps``."""
    if not _session_matches(row, ps):
        log.info("top-up %s: ignoring superseded session %s (%s)", row.id, ps.session_id, source)
        return "superseded", False
    if row.mode == "setup" and ps.status == "complete":
        # A setup-mode session saves a card and charges nothing.
        _save_card(s, rt, row, ps)
        row.status = "complete"
        row.payment_status = ps.payment_status
        row.updated_at = s.info["clock"].now()
        return "card_saved", False
    if ps.payment_status == "paid":
        credited = credit_checkout(s, row, ps, source=source, rt=rt)
        if row.status == "complete":
            _save_card(s, rt, row, ps)
        if credited:
            return "credited", True
        return (
            ("already_credited", False) if row.status == "complete" else ("amount_mismatch", False)
        )
    if row.status == "complete":
        return "already_credited", False
    now = s.info["clock"].now()
    row.payment_status = ps.payment_status
    row.updated_at = now
    if ps.status == "expired":
        row.status = "expired"
        return "expired", False
    if failed_signal:
        row.status = "failed"
        return "failed", False
    if row.status == "creating":
        row.status = "open"
    return "pending", False


def _save_card(s: Session, rt: Runtime, row: CheckoutSession, ps: ProviderSession) -> None:
    """Record the card a completed ``save_card`` checkout saved, once per checkout."""
    if not row.save_card or row.card_saved_at is not None:
        return
    if ps.card is None:
        log.warning("checkout %s completed without a saved card to record", row.id)
        return
    autotopup.card_saved(
        s,
        rt,
        row.account_id,
        ps.card,
        customer_id=row.customer_id or ps.customer_id,
        source=f"checkout {row.id}",
    )
    row.card_saved_at = s.info["clock"].now()


def _apply_in_txn(
    rt: Runtime, checkout_id: str, ps: ProviderSession, *, source: str, failed_signal: bool = False
) -> tuple[CheckoutSession, Action, bool]:
    with rt.db.begin() as s:
        row = _locked(s, checkout_id)
        action, credited = _apply_provider_state(
            s, row, ps, source=source, rt=rt, failed_signal=failed_signal
        )
        return row, action, credited


# --- webhooks ------------------------------------------------------------------------


def handle_stripe_webhook(rt: Runtime, body: bytes, signature: str | None) -> WebhookOutcome:
    """Process one webhook delivery; safe under duplicates, reordering and races.

    Raises ``InvalidSignature`` — also for a verified body that is not a usable event
    (``MalformedEvent``), since retrying it can never succeed — (answer 400; nothing
    changed) and
    ``PaymentsUnavailable`` when the session can't be re-retrieved (answer
    5xx so the provider retries; nothing recorded). Anything else is a 200.
    """
    event = rt.payments.parse_webhook(body, signature)
    with rt.db.read() as s:
        seen = s.get(StripeEvent, event.event_id)
        if seen is not None and seen.processed_at is not None:
            return _outcome(event, "duplicate", duplicate=True)

    if event.type in autocharge.HANDLED_EVENTS:
        facts = autocharge.event_facts(rt, event)  # the provider's current view, first
        with rt.db.begin() as s:
            if not _record_event(s, event):
                return _outcome(event, "duplicate", duplicate=True)
            return _outcome(event, autocharge.apply_event(s, rt, event, facts))

    ps: ProviderSession | None = None
    if event.type in HANDLED_EVENTS and event.session_id:
        try:
            # The event body is a snapshot; act on the session's current state.
            ps = rt.payments.retrieve_session(event.session_id)
        except NotFound:
            ps = None

    with rt.db.begin() as s:
        if not _record_event(s, event):
            return _outcome(event, "duplicate", duplicate=True)
        if event.type not in HANDLED_EVENTS:
            return _outcome(event, "ignored")
        row = _find_row(s, ps) if ps is not None else None
        if ps is None or row is None:
            log.warning(
                "webhook %s (%s) for unknown checkout session %s: ignored",
                event.event_id,
                event.type,
                event.session_id,
            )
            return _outcome(event, "unknown_session")
        action, credited = _apply_provider_state(
            s,
            row,
            ps,
            source=f"webhook {event.event_id} {event.type}",
            rt=rt,
            failed_signal=event.type == EVENT_ASYNC_FAILED,
        )
        return _outcome(event, action, credited=credited, checkout_id=row.id)


def _outcome(
    event: PaymentEvent,
    action: Action,
    *,
    credited: bool = False,
    duplicate: bool = False,
    checkout_id: str | None = None,
) -> WebhookOutcome:
    return WebhookOutcome(
        event_id=event.event_id,
        type=event.type,
        action=action,
        credited=credited,
        duplicate=duplicate,
        checkout_id=checkout_id,
    )


def _record_event(s: Session, event: PaymentEvent) -> bool:
    """Insert the event id; False if another delivery already recorded it.

    Recorded in the same transaction as its effect, so "seen" implies
    "applied". A racing delivery of the same event blocks on the primary key
    (PostgreSQL) or the writer lock (SQLite) and then sees the duplicate.
    """
    now = s.info["clock"].now()
    try:
        with s.begin_nested():
            s.add(
                StripeEvent(
                    id=event.event_id,
                    type=event.type[:100],
                    session_id=event.session_id,
                    received_at=now,
                    processed_at=now,
                )
            )
            s.flush()
    except IntegrityError:
        return False
    return True


def _find_row(s: Session, ps: ProviderSession) -> CheckoutSession | None:
    row = s.execute(
        select(CheckoutSession)
        .where(CheckoutSession.provider_session_id == ps.session_id)
        .with_for_update()
        .execution_options(populate_existing=True)
    ).scalar_one_or_none()
    if row is None:
        checkout_id = (ps.metadata or {}).get("checkout_id")
        if checkout_id:
            row = _lock_row(s, checkout_id)
    return row


# --- local TEST MODE -----------------------------------------------------------------


def _token_hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def issue_pay_token(rt: Runtime, checkout_id: str) -> str:
    """A fresh one-time token for the checkout page the operator is about to see.

    The Pay action needs it, so the checkout *link* alone — which the agent
    holds, it is the top_up result — cannot pay. Only the hash is stored;
    rendering the page again replaces it (the older page's token stops working).
    """
    token = secrets.token_urlsafe(32)
    with rt.db.begin() as s:
        row = _locked(s, checkout_id)
        row.pay_token_hash = _token_hash(token)
        row.updated_at = rt.clock.now()
    return token


def pay_local(
    rt: Runtime, checkout_id: str, pay_token: str | None, test_card: str | None = None
) -> bool:
    """The TEST MODE Pay button: mark the local session paid and credit it.

    Same crediting function as the webhook; pressing it again credits nothing
    more. Returns whether this call credited. Refused unless the server runs
    the local provider (with Stripe configured, only Stripe can say "paid"),
    and unless ``pay_token`` is the one-time token of the rendered checkout
    page (constant-time compare, consumed by the payment). A checkout that saves a
    card needs ``test_card``: how the saved TEST MODE card behaves later
    (``succeeds``, ``declines`` or ``authentication_required``). A setup-mode checkout
    only saves it.
    """
    ids.check_identifier(checkout_id, "checkout_id")
    payments = rt.payments
    if payments.provider != "local" or not isinstance(payments, LocalPayments):
        raise ValidationError(
            "TEST MODE payments are disabled on this server (it uses Stripe)",
            {"checkout_id": checkout_id, "provider": payments.provider},
        )
    with rt.db.begin() as s:
        row = _locked(s, checkout_id)
        if row.provider != "local":
            raise ValidationError(
                "this checkout belongs to another payment provider",
                {"checkout_id": checkout_id, "provider": row.provider},
            )
        if row.status == "complete":
            return False
        now = rt.clock.now()
        if payments.session_from_row(row, now).status == "expired":
            raise ValidationError(
                "this checkout link has expired; call top_up again with the same request_id "
                "for a fresh link",
                {"checkout_id": checkout_id, "status": "expired"},
            )
        expected = row.pay_token_hash
        presented = _token_hash(pay_token) if isinstance(pay_token, str) and pay_token else ""
        if not expected or not hmac.compare_digest(presented, expected):
            raise Unauthorized(
                "this payment must be made from the checkout page: open the checkout link in "
                "a browser and press Pay (the page's one-time token is missing, used or stale)",
                {"checkout_id": checkout_id},
            )
        if row.save_card and test_card not in TEST_CARDS:
            raise ValidationError(
                "choose how the saved TEST MODE card behaves: " + ", ".join(TEST_CARDS),
                {"field": "test_card", "allowed": list(TEST_CARDS)},
            )
        row.pay_token_hash = None  # single use
        if row.provider_session_id is None:
            row.provider_session_id = local_session_id(row.id)
        row.test_card = test_card if row.save_card else None
        # the local provider records the payment (or, in setup mode, the saved card)…
        row.payment_status = "no_payment_required" if row.mode == "setup" else "paid"
        ps = payments.session_from_row(row, now)
        # …and crediting goes through the one shared path.
        _action, credited = _apply_provider_state(s, row, ps, source="local pay button", rt=rt)
        return credited


# --- reconciliation (worker job) ----------------------------------------------------


def reconcile_payments(
    rt: Runtime, *, older_than_seconds: int = 300, limit: int = 500
) -> ReconcileReport:
    """Catch what webhooks missed: ask the provider about stale open sessions.

    Rows still ``open``/``creating`` with a provider session, created more than
    ``older_than_seconds`` ago (giving the webhook time to arrive first), are
    retrieved: paid → credited, expired → marked. One bad row is logged and
    counted, never fatal. Rows of another provider (after a configuration
    change) are left alone.
    """
    report = ReconcileReport()
    cutoff = rt.clock.now() - timedelta(seconds=older_than_seconds)
    with rt.db.read() as s:
        rows = s.execute(
            select(CheckoutSession.id, CheckoutSession.provider_session_id)
            .where(
                CheckoutSession.status.in_(("open", "creating")),
                CheckoutSession.provider_session_id.is_not(None),
                CheckoutSession.provider == rt.payments.provider,
                CheckoutSession.created_at <= cutoff,
            )
            .order_by(CheckoutSession.created_at)
            .limit(limit)
        ).all()
    for checkout_id, session_id in rows:
        report.checked += 1
        assert session_id is not None  # filtered in the query
        try:
            try:
                ps = rt.payments.retrieve_session(session_id)
            except NotFound:
                log.warning(
                    "reconcile: provider has no session %s (top-up %s)", session_id, checkout_id
                )
                report.skipped += 1
                continue
            _row, action, _credited = _apply_in_txn(rt, checkout_id, ps, source="reconcile")
        except Exception:
            log.exception("reconcile: top-up %s (session %s) failed", checkout_id, session_id)
            report.errors += 1
            continue
        if action == "credited":
            report.credited += 1
        elif action == "already_credited":
            report.already_credited += 1
        elif action == "expired":
            report.expired += 1
        elif action == "failed":
            report.failed += 1
        elif action == "pending":
            report.pending += 1
        else:
            report.skipped += 1
    if report.credited or report.errors:
        log.info("reconcile_payments: %s", report.model_dump())
    return report


# --- reads ---------------------------------------------------------------------------


def checkout_status(rt: Runtime, checkout_id: str) -> CheckoutStatus:
    """A checkout's current state for the checkout and result pages."""
    ids.check_identifier(checkout_id, "checkout_id")  # from a URL: NUL would 500 on PostgreSQL
    with rt.db.read() as s:
        found = s.execute(
            select(CheckoutSession, Account.name)
            .join(Account, Account.id == CheckoutSession.account_id)
            .where(CheckoutSession.id == checkout_id)
        ).one_or_none()
        if found is None:
            raise NotFound("no such checkout", {"checkout_id": checkout_id})
        row, account_name = found
        return CheckoutStatus(
            checkout_id=row.id,
            account_id=row.account_id,
            account_name=account_name,
            amount_cents=row.amount_cents,
            amount_usd=ledger.mc_to_usd_str(row.amount_cents * MC_PER_CREDIT),
            currency=row.currency,
            provider=row.provider,
            status=row.status,
            payment_status=row.payment_status,
            checkout_url=row.url,
            expires_at=row.expires_at,
            credited=row.credited_entry_id is not None,
            test_mode=row.provider == "local",
            mode=row.mode,
            save_card=row.save_card,
            card_saved=row.card_saved_at is not None,
        )
