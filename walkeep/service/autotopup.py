"""Automatic top-up's settings and state: the saved card, its consent, the rule, the status.

Three promises, each with its mechanism:

1. **Never on by default, only an operator turns it on.** An account's row starts
   ``off``; the only path to ``active`` from ``off`` or ``disabled`` is
   ``operators/autotopup.set_rule``, which requires a saved card and a monthly cap. What
   agents can reach only reads this state (``check_balance``) or makes a checkout link
   (``top_up(save_card=true)``): saving a card records it, never enables anything. The
   one automatic way back to ``active`` is the card holder completing the checkout that
   ``action_required`` asked for (the human acted, with the card, under the consent).
2. **Each state change is one alert.** Every status change goes through
   :func:`transition`, under the row's lock, in the transaction that makes the change;
   it emits the event only when the status really changes, so racing deliveries of the
   same news (the synchronous answer, the webhook, the reconcile job) alert once.
3. **A card is kept with its consent.** :func:`card_saved` stores the provider's
   payment method id with what a person recognises (brand, last four) and the consent
   given when it was saved: the time, the version of the text shown next to the button
   (``topup_rule.CONSENT_TEXT``) and where it was given (which checkout, or the TEST MODE
   CLI). A card of another provider (after switching from TEST MODE to Stripe) is never
   charged.

Locks: every transaction that touches an account's automatic top-up locks this row
first (:func:`lock`), then any charge row (``autocharge.py``), so two of them can never
wait on each other in a cycle.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from walkeep import topup_rule
from walkeep.db.models import Account, AutoCharge, AutoTopUp
from walkeep.errors import NotFound
from walkeep.payments.base import SavedCard
from walkeep.service import alerts
from walkeep.service.runtime import Runtime

log = logging.getLogger(__name__)

# Events sent when the status changes to … (walkeep/service/alerts.py).
_EVENT_OF_STATUS = {
    "active": "auto_top_up.enabled",
    "off": "auto_top_up.disabled",
    "disabled": "auto_top_up.disabled",
    "action_required": "auto_top_up.action_required",
}
# Charge statuses that count against the monthly cap (money moved, or may yet).
COUNTED = ("pending", "succeeded")


def lock(s: Session, rt: Runtime, account_id: str, *, create: bool = False) -> AutoTopUp | None:
    """The account's row under its lock (PostgreSQL; SQLite's writer lock serialises),
    created ``off`` when ``create`` and missing. NotFound for an unknown account."""
    q = (
        select(AutoTopUp)
        .where(AutoTopUp.account_id == account_id)
        .execution_options(populate_existing=True)
    )
    if rt.db.is_postgres:
        q = q.with_for_update()
    row = s.scalars(q).one_or_none()
    if row is not None or not create:
        return row
    if s.get(Account, account_id) is None:
        raise NotFound(f"unknown account {account_id}", {"account_id": account_id})
    now = rt.clock.now()
    try:
        with s.begin_nested():
            s.add(AutoTopUp(account_id=account_id, status="off", created_at=now, updated_at=now))
            s.flush()
    except IntegrityError:
        pass  # created concurrently: read (and lock) that one
    return s.scalars(q).one()


def transition(
    s: Session, row: AutoTopUp, status: topup_rule.Status, *, reason: str | None, **data: Any
) -> bool:
    """Move ``row`` (locked) to ``status``; alert once, only if the status changed."""
    now = s.info["clock"].now()
    row.reason = reason
    row.updated_at = now
    if row.status == status:
        return False
    previous, row.status = row.status, status
    if status != "action_required":
        row.action_charge_id = None
    alerts.emit(
        s,
        row.account_id,
        _EVENT_OF_STATUS[status],
        {"status": status, "previous_status": previous, "reason": reason, **data},
    )
    log.info("auto top-up of %s: %s → %s (%s)", row.account_id, previous, status, reason)
    return True


def forget_card(row: AutoTopUp) -> None:
    row.payment_method_id = None
    row.card_brand = None
    row.card_last4 = None


def card_saved(
    s: Session,
    rt: Runtime,
    account_id: str,
    card: SavedCard,
    *,
    customer_id: str | None,
    source: str,
) -> AutoTopUp:
    """Record a card saved for off-session use, with its consent (promise 3).

    Re-activates a row waiting for the card holder (``action_required``): they just
    completed a checkout with the card. Any other status is left as it is.
    """
    row = lock(s, rt, account_id, create=True)
    assert row is not None
    now = rt.clock.now()
    row.provider = rt.payments.provider
    if customer_id:
        row.customer_id = customer_id
    row.payment_method_id = card.payment_method_id
    row.card_brand = (card.brand or "card")[:32]
    row.card_last4 = (card.last4 or "")[:4] or None
    row.consent_at = now
    row.consent_version = topup_rule.CONSENT_VERSION
    row.consent_source = source[:100]
    row.consecutive_declines = 0
    row.next_attempt_at = None
    row.updated_at = now
    if row.status == "action_required":
        transition(
            s,
            row,
            "active",
            reason=None,
            note="the card holder completed the checkout; automatic top-up resumes",
            card=card_label(row),
        )
    return row


def ensure_customer(rt: Runtime, account_id: str) -> str:
    """The provider's customer for the account, created once (before any card is saved).

    The provider call happens outside any transaction, under an idempotency key derived
    from the account, so two racing callers get the same customer."""
    with rt.db.read() as s:
        if s.get(Account, account_id) is None:
            raise NotFound(f"unknown account {account_id}", {"account_id": account_id})
        row = s.get(AutoTopUp, account_id)
        if row is not None and row.customer_id and row.provider == rt.payments.provider:
            return row.customer_id
    customer = rt.payments.ensure_customer(account_id, f"walkeep-customer-{account_id}")
    with rt.db.begin() as s:
        row = lock(s, rt, account_id, create=True)
        assert row is not None
        if row.provider != rt.payments.provider:
            # Cards belong to a provider's customer: one from another provider is unusable.
            forget_card(row)
            row.provider = rt.payments.provider
            row.customer_id = customer
        elif not row.customer_id:
            row.customer_id = customer
        row.updated_at = rt.clock.now()
        return row.customer_id


def card_label(row: AutoTopUp) -> str | None:
    if not row.payment_method_id:
        return None
    return f"{row.card_brand or 'card'} •••• {row.card_last4 or '????'}"


def usable_card(rt: Runtime, row: AutoTopUp) -> bool:
    return bool(row.payment_method_id and row.customer_id and row.provider == rt.payments.provider)


def charged_this_month_cents(s: Session, account_id: str, now: datetime) -> int:
    """Automatic charges created this UTC month that moved money or still may."""
    total = s.scalar(
        select(func.coalesce(func.sum(AutoCharge.amount_cents), 0)).where(
            AutoCharge.account_id == account_id,
            AutoCharge.status.in_(COUNTED),
            AutoCharge.created_at >= topup_rule.month_start(now),
        )
    )
    return int(total or 0)


def action_url(rt: Runtime, charge_id: str) -> str:
    """The card holder's link for an ``action_required`` charge: it opens a fresh checkout
    for the same amount that saves the card again (walkeep/api/payments.py). A link to a
    Walkeep page rather than to the provider's session, because a Checkout Session
    expires within a day and this link must keep working until the human acts."""
    return f"{rt.settings.public_url.rstrip('/')}/topup/action/{charge_id}"
