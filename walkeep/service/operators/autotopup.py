"""Automatic top-up for operators: consent, the rule, turning it on and off.

Only here does automatic top-up become ``active`` (the console's "Automatic top-up" card
and ``walkeep auto-top-up set`` call :func:`set_rule`); agents can read its state in
``check_balance`` and hand their human a ``save_card`` link, never turn it on or raise
its cap. Turning it on needs a saved card of the current payment provider and a monthly
cap. Every check runs before anything is written (a refusal changes nothing, DESIGN §4
invariant 11), and each state change sends its one alert (``autotopup.transition``).

TEST MODE (no Stripe keys): ``test_card`` saves a TEST MODE card that ``succeeds``,
``declines`` or needs ``authentication_required`` without a checkout; refused when
Stripe is configured (only a real checkout may save a real card).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal, InvalidOperation

from sqlalchemy import select

from walkeep import ledger, topup_rule
from walkeep.db.models import Account, AutoCharge, AutoTopUp
from walkeep.errors import NotFound, ValidationError
from walkeep.payments.local import TEST_CARDS, test_card
from walkeep.service import autotopup
from walkeep.service.runtime import Runtime
from walkeep.service.tools import balance, topup
from walkeep.service.tools.schemas import AutoTopUpView


def _cap_cents(monthly_cap_usd: object) -> int:
    if isinstance(monthly_cap_usd, bool):
        raise ValidationError("monthly_cap_usd must be a number of US dollars", {})
    try:
        d = Decimal(str(monthly_cap_usd).strip())
    except (InvalidOperation, ValueError):
        raise ValidationError(
            "monthly_cap_usd must be a number of US dollars", {"field": "monthly_cap_usd"}
        ) from None
    if not d.is_finite() or d * 100 != (d * 100).to_integral_value():
        raise ValidationError(
            "monthly_cap_usd must be whole cents (at most two decimals)",
            {"field": "monthly_cap_usd"},
        )
    return int(d * 100)


def set_rule(
    rt: Runtime,
    account_id: str,
    *,
    below_runway_epochs: int,
    to_runway_epochs: int,
    monthly_cap_usd: str | Decimal | float | int,
    test_card_behaviour: str | None = None,
) -> AutoTopUpView:
    """Set the rule and turn automatic top-up on (needs a saved card and a monthly cap)."""
    cap = _cap_cents(monthly_cap_usd)
    problems = topup_rule.validate_rule(below_runway_epochs, to_runway_epochs, cap)
    if problems:
        raise ValidationError("; ".join(problems), {"problems": problems})
    if test_card_behaviour is not None:
        if rt.payments.provider != "local":
            raise ValidationError(
                "--test-card is for TEST MODE only; with Stripe configured a card is saved "
                "through a checkout (the console's Automatic top-up card, or top_up with "
                "save_card)",
                {"field": "test_card"},
            )
        if test_card_behaviour not in TEST_CARDS:
            raise ValidationError(
                f"--test-card must be one of {', '.join(TEST_CARDS)}",
                {"field": "test_card", "allowed": list(TEST_CARDS)},
            )
    with rt.db.read() as s:
        if s.get(Account, account_id) is None:
            raise NotFound(f"unknown account {account_id}", {"account_id": account_id})
        existing = s.get(AutoTopUp, account_id)
        has_card = existing is not None and autotopup.usable_card(rt, existing)
    if test_card_behaviour is None and not has_card:
        raise ValidationError(
            "save a card first: open the console's Automatic top-up card (Add a card), or "
            "have the human pay a top_up link with save_card"
            + (" (TEST MODE: or pass --test-card)" if rt.payments.provider == "local" else ""),
            {"field": "card"},
        )
    customer = autotopup.ensure_customer(rt, account_id) if test_card_behaviour else None
    with rt.db.begin() as s:
        if test_card_behaviour is not None:
            card = test_card(test_card_behaviour, secrets.token_hex(6))
            autotopup.card_saved(
                s,
                rt,
                account_id,
                card,
                customer_id=customer,
                source="walkeep auto-top-up set --test-card (TEST MODE)",
            )
        row = autotopup.lock(s, rt, account_id, create=True)
        assert row is not None
        if not autotopup.usable_card(rt, row):  # removed between the read and now
            raise ValidationError("the saved card is gone; save a card first", {"field": "card"})
        raised = row.monthly_cap_cents is not None and cap > row.monthly_cap_cents
        row.below_runway_epochs = below_runway_epochs
        row.to_runway_epochs = to_runway_epochs
        row.monthly_cap_cents = cap
        row.consecutive_declines = 0
        row.next_attempt_at = None
        if raised:
            row.cap_alert_month = None  # a higher cap may charge again this month
        autotopup.transition(
            s,
            row,
            "active",
            reason=None,
            below_runway_epochs=below_runway_epochs,
            to_runway_epochs=to_runway_epochs,
            monthly_cap_usd=ledger.mc_to_usd_str(cap * 1000),
            card=autotopup.card_label(row),
        )
    return balance.auto_top_up_view(rt, account_id)


def turn_off(rt: Runtime, account_id: str) -> AutoTopUpView:
    """Stop automatic charges (the card and the rule are kept for turning it on again)."""
    with rt.db.begin() as s:
        row = autotopup.lock(s, rt, account_id, create=True)
        assert row is not None
        autotopup.transition(s, row, "off", reason="turned off by the operator")
    return balance.auto_top_up_view(rt, account_id)


def card_link(rt: Runtime, account_id: str) -> str:
    """A checkout (setup mode) where the human saves or replaces the card."""
    return topup.save_card_link(rt, account_id, "auto-top-up-card-" + secrets.token_urlsafe(12))


def portal_link(rt: Runtime, account_id: str, return_url: str) -> str:
    """The provider's page for updating the saved card, minted now (a short-lived link)."""
    with rt.db.read() as s:
        row = s.get(AutoTopUp, account_id)
        customer = (
            row.customer_id if row is not None and row.provider == rt.payments.provider else None
        )
    if customer is None:
        raise ValidationError("no card has been saved for this account yet", {"field": "card"})
    url = rt.payments.portal_url(customer, return_url)
    if url is None:
        raise ValidationError(
            "TEST MODE has no card portal: save another test card instead", {"field": "card"}
        )
    return url


@dataclass(frozen=True, slots=True)
class ChargeRow:
    charge_id: str
    created_at: datetime
    amount_usd: str
    status: str
    payment_id: str | None
    detail: str | None
    trigger: str


def recent_charges(rt: Runtime, account_id: str, limit: int = 10) -> list[ChargeRow]:
    """The account's latest automatic charges, newest first (the console's table)."""
    with rt.db.read() as s:
        rows = s.scalars(
            select(AutoCharge)
            .where(AutoCharge.account_id == account_id)
            .order_by(AutoCharge.created_at.desc(), AutoCharge.id.desc())
            .limit(max(1, min(limit, 100)))
        ).all()
        return [
            ChargeRow(
                charge_id=r.id,
                created_at=r.created_at,
                amount_usd=ledger.mc_to_usd_str(r.amount_cents * 1000),
                status=r.status,
                payment_id=r.payment_intent_id,
                detail=r.decline_code or (r.message if r.status == "canceled" else None),
                trigger=r.trigger,
            )
            for r in rows
        ]
