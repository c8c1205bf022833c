"""Automatic charges of a saved card: one at a time, never past the cap, credited once.

Three promises, each with its mechanism:

1. **One charge at a time, and one per crossing.** A charge is a row in
   ``auto_charges`` claimed in the database *before* the provider is called, with every
   parameter the provider will see — amount, card, customer, the idempotency key
   ``walkeep-autotopup-<charge id>`` — fixed in the row, and what the rule saw recorded
   beside it. The claim runs under the account's ``auto_top_ups`` row lock, evaluates
   the rule (``walkeep/topup_rule.py``) on the balance, the month's charges and the
   pending ones, and inserts the row with ``pending_account_id`` set: UNIQUE, so a
   second pending charge for the account is impossible on either database, whichever
   worker tries. While one is pending the rule is not even asked (a pending amount
   counts as funded), and a new charge waits ``WALKEEP_AUTO_TOP_UP_MIN_INTERVAL_SECONDS``
   after the last. Just before the provider call the claim is checked again under the
   same lock: if automatic top-up was turned off or credits arrived meanwhile (a manual
   top-up racing it), the claim is canceled and the card is never charged.
2. **Credited exactly once, from whichever signal comes first.** The synchronous
   answer, the ``payment_intent.succeeded`` webhook and the reconcile job all reach
   :func:`settle`, which re-reads the charge under its lock and credits through the same
   path as Checkout (``pausing.credit_payment``: ledger ref ``autotopup:<charge id>``,
   UNIQUE per account, then paused memories resume). An unknown outcome (a timeout, a
   crash between the call and the record) leaves the charge pending; the reconcile job
   asks the provider by the payment id, or replays the identical request under the same
   idempotency key (the provider answers with the first outcome), or — once the key may
   be forgotten — searches for the charge by its id. Never a new charge for old news.
3. **Failures by class, never a storm.** A decline backs off
   (``WALKEEP_AUTO_TOP_UP_RETRY_SECONDS``, doubling) and the third in a row disables
   automatic top-up; a hard decline disables it at once and forgets the card; a charge
   that needs its holder's authentication stops retries (``action_required``) and offers
   a checkout link for the same amount that saves the card again. Each state change is
   one alert (``autotopup.transition``).

Refunds and disputes (``charge.refunded``, ``charge.dispute.created``) take back what the
charge credited — at most that, and never below zero: what the balance cannot cover is
recorded on the charge as a shortfall and alerted (``payment.reversed``). A dispute also
disables automatic top-up.

Lock order everywhere: the account's ``auto_top_ups`` row, then the charge row.

Why one file: one charge row's life — claimed, checked again, sent, settled by whichever
of three signals comes first, reconciled after a crash, reversed by a refund — and every
step locks and reads it the same way; split, the lock order and the "credited once"
argument would have to be read across files.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import Literal

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from walkeep import ledger, topup_rule
from walkeep.db.models import AutoCharge, AutoTopUp
from walkeep.errors import NotFound, PaymentsUnavailable, WalkeepError
from walkeep.ids import _token
from walkeep.ledger import Kind
from walkeep.payments.base import ChargeRequest, ChargeResult, PaymentEvent, Reversals, SavedCard
from walkeep.service import alerts, autotopup
from walkeep.service.pausing import credit_payment
from walkeep.service.renewal_price import renewal_burn_mc_per_epoch
from walkeep.service.runtime import Runtime

log = logging.getLogger(__name__)

CURRENCY = "usd"
DESCRIPTION = "Walkeep automatic top-up"
# Stripe forgets idempotency keys after 24 h: replay a lost answer under its key only
# well inside that; later, search for the charge instead.
KEY_REPLAY_WINDOW = timedelta(hours=23)
# A pending charge younger than this may still be in the hands of the worker that made it.
GRACE_SECONDS = 60

Evaluated = Literal["charged", "pending", "waiting", "none", "cap_reached", "canceled", "off"]


def new_charge_id() -> str:
    return "atu_" + _token(24)


def idempotency_key(charge_id: str) -> str:
    return f"walkeep-autotopup-{charge_id}"


@dataclass(frozen=True, slots=True)
class Evaluation:
    """What evaluating one account did (the job counts these)."""

    action: Evaluated
    reason: str
    charge_id: str | None = None
    outcome: str | None = None  # the charge's status after the provider answered


# --- the claim ------------------------------------------------------------------------------


def _pending(s: Session, account_id: str) -> AutoCharge | None:
    return s.scalars(
        select(AutoCharge).where(AutoCharge.pending_account_id == account_id)
    ).one_or_none()


def _blocked(rt: Runtime, s: Session, row: AutoTopUp, now: datetime) -> str | None:
    """Why no charge may be made now for this (locked, active) row, or None."""
    if row.next_attempt_at is not None and now < row.next_attempt_at:
        return f"retrying after a decline at {row.next_attempt_at.isoformat()}"
    last = s.scalar(
        select(AutoCharge.created_at)
        .where(AutoCharge.account_id == row.account_id, AutoCharge.status != "canceled")
        .order_by(AutoCharge.created_at.desc())
        .limit(1)
    )
    interval = timedelta(seconds=rt.settings.auto_top_up_min_interval_seconds)
    if last is not None and now < last + interval:
        return "at most one automatic charge per WALKEEP_AUTO_TOP_UP_MIN_INTERVAL_SECONDS"
    return None


def _inputs(
    s: Session, row: AutoTopUp, burn: int, shortfall_mc: int, now: datetime
) -> topup_rule.Inputs:
    assert row.below_runway_epochs and row.to_runway_epochs and row.monthly_cap_cents
    return topup_rule.Inputs(
        available_mc=ledger.balance(s, row.account_id).available_mc,
        pending_mc=0,
        burn_mc_per_epoch=burn,
        below_runway_epochs=row.below_runway_epochs,
        to_runway_epochs=row.to_runway_epochs,
        monthly_cap_cents=row.monthly_cap_cents,
        charged_this_month_cents=autotopup.charged_this_month_cents(s, row.account_id, now),
        shortfall_mc=shortfall_mc,
    )


def _claim(rt: Runtime, account_id: str, trigger: str, burn: int, shortfall_mc: int) -> Evaluation:
    now = rt.clock.now()
    try:
        with rt.db.begin() as s:
            row = autotopup.lock(s, rt, account_id)
            if row is None or row.status != "active":
                return Evaluation("off", "automatic top-up is not active")
            if not autotopup.usable_card(rt, row) or row.monthly_cap_cents is None:
                return Evaluation("off", "no usable saved card or no monthly cap")
            pending = _pending(s, account_id)
            if pending is not None:
                return Evaluation("pending", "a charge is pending", pending.id)
            blocked = _blocked(rt, s, row, now)
            if blocked:
                return Evaluation("waiting", blocked)
            inputs = _inputs(s, row, burn, shortfall_mc, now)
            decision = topup_rule.decide(inputs)
            if decision.action == "cap_reached":
                month = topup_rule.month_of(now)
                if row.cap_alert_month != month:
                    row.cap_alert_month = month
                    row.updated_at = now
                    alerts.emit(
                        s,
                        account_id,
                        "auto_top_up.cap_reached",
                        {
                            "month": month,
                            "monthly_cap_usd": ledger.mc_to_usd_str(row.monthly_cap_cents * 1000),
                            "charged_this_month_usd": ledger.mc_to_usd_str(
                                inputs.charged_this_month_cents * 1000
                            ),
                            "funded_runway_epochs": decision.funded_runway_epochs,
                            "note": "no automatic charge until next month or a higher cap; "
                            "top up by hand to keep renewing",
                        },
                    )
                return Evaluation("cap_reached", decision.reason)
            if decision.action == "none":
                return Evaluation("none", decision.reason)
            assert row.payment_method_id and row.customer_id
            charge_id = new_charge_id()
            s.add(
                AutoCharge(
                    id=charge_id,
                    account_id=account_id,
                    pending_account_id=account_id,
                    amount_cents=decision.amount_cents,
                    currency=CURRENCY,
                    provider=rt.payments.provider,
                    customer_id=row.customer_id,
                    payment_method_id=row.payment_method_id,
                    idempotency_key=idempotency_key(charge_id),
                    status="pending",
                    trigger=trigger,
                    inputs={
                        **asdict(inputs),
                        "funded_runway_epochs": decision.funded_runway_epochs,
                        "reason": decision.reason,
                    },
                    created_at=now,
                    updated_at=now,
                )
            )
            s.flush()
            return Evaluation("charged", decision.reason, charge_id)
    except IntegrityError:
        # Only the UNIQUE pending_account_id can fail here: another worker's charge is
        # pending (our lock makes this rare; the constraint makes it certain).
        return Evaluation("pending", "a charge is pending")


def _precheck(rt: Runtime, account_id: str, burn: int, shortfall_mc: int) -> Evaluation | None:
    """The same questions as the claim, read without a lock or a write transaction: an
    answer when the claim would surely do nothing (the common case, every minute for
    every account), None when it must look under the lock."""
    now = rt.clock.now()
    with rt.db.read() as s:
        row = s.get(AutoTopUp, account_id)
        if row is None or row.status != "active":
            return Evaluation("off", "automatic top-up is not active")
        if not autotopup.usable_card(rt, row) or row.monthly_cap_cents is None:
            return Evaluation("off", "no usable saved card or no monthly cap")
        if _pending(s, account_id) is not None:
            return Evaluation("pending", "a charge is pending")
        blocked = _blocked(rt, s, row, now)
        if blocked:
            return Evaluation("waiting", blocked)
        decision = topup_rule.decide(_inputs(s, row, burn, shortfall_mc, now))
        if decision.action == "none":
            return Evaluation("none", decision.reason)
        if decision.action == "cap_reached" and row.cap_alert_month == topup_rule.month_of(now):
            return Evaluation("cap_reached", decision.reason)  # already said this month
    return None


def evaluate(
    rt: Runtime, account_id: str, *, trigger: str = "schedule", shortfall_mc: int = 0
) -> Evaluation:
    """Evaluate the rule for one account and, if it says so, claim and make one charge."""
    burn, _runway = renewal_burn_mc_per_epoch(rt, account_id)
    early = _precheck(rt, account_id, burn, shortfall_mc)
    if early is not None:
        return early
    claimed = _claim(rt, account_id, trigger, burn, shortfall_mc)
    if claimed.action != "charged" or claimed.charge_id is None:
        return claimed
    outcome = submit(rt, claimed.charge_id)
    if outcome == "canceled":
        return Evaluation(
            "canceled", "no longer needed when it was about to be sent", claimed.charge_id
        )
    return Evaluation("charged", claimed.reason, claimed.charge_id, outcome)


# --- sending --------------------------------------------------------------------------------


def _lock_charge(rt: Runtime, s: Session, charge_id: str) -> tuple[AutoTopUp | None, AutoCharge]:
    """The charge and its account's row, locked in the house order (row, then charge)."""
    account_id = s.scalar(select(AutoCharge.account_id).where(AutoCharge.id == charge_id))
    if account_id is None:
        raise NotFound("no such automatic charge", {"charge_id": charge_id})
    row = autotopup.lock(s, rt, account_id)
    q = (
        select(AutoCharge)
        .where(AutoCharge.id == charge_id)
        .execution_options(populate_existing=True)
    )
    if rt.db.is_postgres:
        q = q.with_for_update()
    return row, s.scalars(q).one()


def _cancel(ch: AutoCharge, now: datetime, why: str) -> None:
    ch.status = "canceled"
    ch.pending_account_id = None
    ch.message = why[:500]
    ch.settled_at = now
    ch.updated_at = now


def _request(ch: AutoCharge) -> ChargeRequest:
    return ChargeRequest(
        charge_id=ch.id,
        account_id=ch.account_id,
        amount_cents=ch.amount_cents,
        currency=ch.currency,
        customer_id=ch.customer_id,
        payment_method_id=ch.payment_method_id,
        idempotency_key=ch.idempotency_key,
        description=DESCRIPTION,
    )


def _release_for_sending(rt: Runtime, charge_id: str) -> ChargeRequest | None:
    """The last check before the provider sees the charge (promise 1); marks it sent.

    None: it must not be sent (already sent or settled by someone else, or canceled
    now because automatic top-up was turned off or credits covered the need)."""
    now = rt.clock.now()
    with rt.db.begin() as s:
        row, ch = _lock_charge(rt, s, charge_id)
        if ch.status != "pending" or ch.submitted_at is not None:
            return None
        if row is None or row.status != "active" or row.payment_method_id != ch.payment_method_id:
            _cancel(ch, now, "automatic top-up was turned off (or its card changed) before sending")
            return None
        burn = int(ch.inputs.get("burn_mc_per_epoch") or 0)
        shortfall = int(ch.inputs.get("shortfall_mc") or 0)
        again = topup_rule.decide(
            topup_rule.Inputs(
                available_mc=ledger.balance(s, ch.account_id).available_mc,
                pending_mc=0,
                burn_mc_per_epoch=burn,
                below_runway_epochs=row.below_runway_epochs or 0,
                to_runway_epochs=row.to_runway_epochs or 0,
                monthly_cap_cents=(row.monthly_cap_cents or 0) + ch.amount_cents,
                charged_this_month_cents=autotopup.charged_this_month_cents(s, ch.account_id, now),
                shortfall_mc=shortfall,
            )
        )
        if again.action != "charge":
            _cancel(ch, now, f"not sent: {again.reason} (credits arrived after the claim)")
            log.info("auto top-up %s canceled before sending: %s", ch.id, again.reason)
            return None
        ch.submitted_at = now
        ch.updated_at = now
        return _request(ch)


def submit(rt: Runtime, charge_id: str) -> str:
    """Send a claimed charge to the provider and settle what it answers.

    Returns the charge's status afterwards (``pending`` when the outcome is unknown:
    the reconcile job finds out, never by charging again)."""
    req = _release_for_sending(rt, charge_id)
    if req is None:
        with rt.db.read() as s:
            return str(s.scalar(select(AutoCharge.status).where(AutoCharge.id == charge_id)))
    hooks = rt.extras.get("autocharge_hooks", {})
    if "before_charge" in hooks:
        hooks["before_charge"](charge_id)
    try:
        result = rt.payments.charge(req)
    except PaymentsUnavailable as exc:
        log.warning(
            "auto top-up %s: outcome unknown (%s); reconcile will ask", charge_id, exc.message
        )
        return "pending"
    except WalkeepError as exc:
        # The provider refused the request itself (not the card): nothing was charged.
        log.error("auto top-up %s refused by the provider: %s", charge_id, exc.message)
        result = ChargeResult(
            payment_intent_id=None,
            status="failed",
            amount_cents=req.amount_cents,
            currency=req.currency,
            failure="declined",
            decline_code=exc.code.lower(),
            message=exc.message[:300],
        )
    if "after_charge" in hooks:
        hooks["after_charge"](charge_id)
    return settle(rt, charge_id, result, source="charge")


# --- settling -------------------------------------------------------------------------------


def settle(rt: Runtime, charge_id: str, result: ChargeResult, *, source: str) -> str:
    with rt.db.begin() as s:
        return settle_in(s, rt, charge_id, result, source=source)


def settle_in(s: Session, rt: Runtime, charge_id: str, result: ChargeResult, *, source: str) -> str:
    """Apply the provider's view of a charge in ``s`` (promise 2). Returns its status."""
    now = rt.clock.now()
    row, ch = _lock_charge(rt, s, charge_id)
    if result.payment_intent_id and ch.payment_intent_id is None:
        ch.payment_intent_id = result.payment_intent_id
    if result.amount_cents is not None and (
        result.amount_cents != ch.amount_cents or (result.currency or CURRENCY) != ch.currency
    ):
        log.error(
            "auto top-up %s: provider reports %s %s, the row says %s %s; NOT settling",
            ch.id,
            result.amount_cents,
            result.currency,
            ch.amount_cents,
            ch.currency,
        )
        return ch.status
    if result.status == "succeeded":
        if ch.credited_entry_id is None:
            if ch.status != "pending":
                log.warning(
                    "auto top-up %s was %s; the provider says it succeeded", ch.id, ch.status
                )
            _credit(s, rt, row, ch, now, source)
        return ch.status
    if ch.status != "pending":
        return ch.status  # settled before: nothing to add
    if result.status == "pending":
        ch.updated_at = now
        return ch.status
    failure = result.failure or "declined"
    ch.status = "authentication_required" if failure == "authentication_required" else "declined"
    ch.failure = failure
    ch.decline_code = (result.decline_code or "")[:64] or None
    ch.message = (result.message or "")[:500] or None
    ch.pending_account_id = None
    ch.settled_at = now
    ch.updated_at = now
    if ch.submitted_at is None:
        ch.submitted_at = now
    log.info(
        "auto top-up %s %s (%s, %s) via %s", ch.id, ch.status, failure, ch.decline_code, source
    )
    if row is not None and row.status == "active" and row.payment_method_id == ch.payment_method_id:
        _after_failure(s, rt, row, ch, failure, now)
    return ch.status


def _credit(
    s: Session, rt: Runtime, row: AutoTopUp | None, ch: AutoCharge, now: datetime, source: str
) -> None:
    amount_mc = ch.amount_cents * ledger.MC_PER_CREDIT
    entry = credit_payment(
        s,
        rt,
        ch.account_id,
        amount_mc,
        ref=f"autotopup:{ch.id}",
        kind=Kind.AUTO_TOPUP,
        memo=(
            f"automatic top-up ${ledger.mc_to_usd_str(amount_mc)} via {ch.provider} "
            f"{ch.payment_intent_id or ch.id}"
        ),
    )
    ch.status = "succeeded"
    ch.failure = None
    ch.credited_entry_id = entry.id
    ch.pending_account_id = None
    ch.settled_at = now
    ch.updated_at = now
    if row is not None and row.payment_method_id == ch.payment_method_id:
        row.consecutive_declines = 0
        row.next_attempt_at = None
        row.updated_at = now
    if entry.replayed:
        return
    alerts.emit(
        s,
        ch.account_id,
        "auto_top_up.succeeded",
        {
            "charge_id": ch.id,
            "payment_id": ch.payment_intent_id,
            "amount_usd": ledger.mc_to_usd_str(amount_mc),
            "balance_mc": ledger.balance(s, ch.account_id).balance_mc,
            "charged_this_month_usd": ledger.mc_to_usd_str(
                autotopup.charged_this_month_cents(s, ch.account_id, now) * 1000
            ),
        },
    )
    log.info("auto top-up %s credited %s mc to %s (%s)", ch.id, amount_mc, ch.account_id, source)


def _after_failure(
    s: Session,
    rt: Runtime,
    row: AutoTopUp,
    ch: AutoCharge,
    failure: topup_rule.Failure,
    now: datetime,
) -> None:
    """What a refused charge does to automatic top-up (promise 3), with its one alert."""
    after = topup_rule.after_failure(
        failure, row.consecutive_declines, rt.settings.auto_top_up_retry_seconds
    )
    row.consecutive_declines = after.consecutive_declines
    row.next_attempt_at = (
        now + timedelta(seconds=after.retry_after_seconds)
        if after.retry_after_seconds is not None
        else None
    )
    amount = ledger.mc_to_usd_str(ch.amount_cents * 1000)
    detail = {
        "charge_id": ch.id,
        "payment_id": ch.payment_intent_id,
        "amount_usd": amount,
        "decline_code": ch.decline_code,
        "consecutive_declines": after.consecutive_declines,
    }
    if after.clear_card:
        card = autotopup.card_label(row)
        autotopup.forget_card(row)
        autotopup.transition(
            s,
            row,
            "disabled",
            reason=f"the card ({card}) was refused for good ({ch.decline_code or 'hard decline'}); "
            "save another card and turn automatic top-up on again",
            **detail,
        )
    elif after.status == "action_required":
        row.action_charge_id = ch.id
        url = autotopup.action_url(rt, ch.id)
        changed = autotopup.transition(
            s,
            row,
            "action_required",
            reason=f"the bank asks the card holder to authenticate a ${amount} charge; "
            "open action_url to pay it (and save the card again)",
            action_url=url,
            **detail,
        )
        if not changed:  # already waiting: point at the newest charge
            row.action_charge_id = ch.id
    elif after.status == "disabled":
        autotopup.transition(
            s,
            row,
            "disabled",
            reason=f"{after.consecutive_declines} declines in a row "
            f"(last: {ch.decline_code or 'declined'}); update the card and turn it on again",
            **detail,
        )
    else:
        row.updated_at = now
        alerts.emit(
            s,
            row.account_id,
            "auto_top_up.failed",
            {
                **detail,
                "message": ch.message,
                "next_attempt_at": row.next_attempt_at.isoformat() if row.next_attempt_at else None,
                "note": f"retried automatically; disabled after "
                f"{topup_rule.MAX_CONSECUTIVE_DECLINES} declines in a row",
            },
        )


# --- reconciliation (worker job) ------------------------------------------------------------


@dataclass
class ReconcileReport:
    settled: int = 0
    canceled: int = 0
    pending: int = 0
    errors: int = 0


def reconcile(
    rt: Runtime, *, grace_seconds: int = GRACE_SECONDS, limit: int = 200
) -> ReconcileReport:
    """Settle charges whose outcome a crash or a timeout left unknown (promise 2)."""
    report = ReconcileReport()
    now = rt.clock.now()
    with rt.db.read() as s:
        rows = s.execute(
            select(AutoCharge.id, AutoCharge.submitted_at, AutoCharge.payment_intent_id)
            .where(
                AutoCharge.status == "pending",
                AutoCharge.provider == rt.payments.provider,
                AutoCharge.created_at <= now - timedelta(seconds=grace_seconds),
            )
            .order_by(AutoCharge.created_at)
            .limit(limit)
        ).all()
    for charge_id, submitted_at, payment_intent_id in rows:
        try:
            status = _reconcile_one(rt, charge_id, submitted_at, payment_intent_id, now)
        except Exception:
            log.exception("reconcile: automatic charge %s failed", charge_id)
            report.errors += 1
            continue
        if status == "pending":
            report.pending += 1
        elif status == "canceled":
            report.canceled += 1
        else:
            report.settled += 1
    return report


def _reconcile_one(
    rt: Runtime,
    charge_id: str,
    submitted_at: datetime | None,
    payment_intent_id: str | None,
    now: datetime,
) -> str:
    if submitted_at is None:
        # Claimed, never sent (the worker died in between): send it now, after the
        # same last check as ever.
        return submit(rt, charge_id)
    if payment_intent_id:
        result = rt.payments.retrieve_charge(payment_intent_id)
        return settle(rt, charge_id, result, source="reconcile")
    if now - submitted_at < KEY_REPLAY_WINDOW:
        with rt.db.read() as s:
            ch = s.get(AutoCharge, charge_id)
            assert ch is not None
            req = _request(ch)
        try:
            # The identical request under the same key: the provider returns the first
            # outcome, or makes the charge if the first request never reached it.
            result = rt.payments.charge(req)
        except PaymentsUnavailable:
            return "pending"
        return settle(rt, charge_id, result, source="reconcile (replay)")
    found = rt.payments.find_charge(charge_id)
    if found is not None:
        return settle(rt, charge_id, found, source="reconcile (search)")
    with rt.db.begin() as s:
        _row, ch = _lock_charge(rt, s, charge_id)
        if ch.status == "pending":
            _cancel(ch, now, "the provider has no record of this charge")
        return ch.status


# --- webhooks -------------------------------------------------------------------------------

HANDLED_EVENTS = frozenset(
    {
        "payment_intent.succeeded",
        "payment_intent.payment_failed",
        "payment_intent.processing",
        "charge.refunded",
        "charge.dispute.created",
        "payment_method.detached",
        "customer.updated",
    }
)
EventAction = Literal[
    "charge_settled", "reversed", "card_removed", "card_updated", "unknown_charge", "ignored"
]


@dataclass(frozen=True, slots=True)
class EventFacts:
    """What the provider says *now* about an event's object (read before the transaction)."""

    charge_id: str | None = None
    result: ChargeResult | None = None
    reversals: Reversals | None = None
    card: SavedCard | None = None


def _charge_for(
    rt: Runtime, payment_intent_id: str | None, result: ChargeResult | None
) -> str | None:
    with rt.db.read() as s:
        if payment_intent_id:
            found = s.scalar(
                select(AutoCharge.id).where(AutoCharge.payment_intent_id == payment_intent_id)
            )
            if found:
                return str(found)
        charge_id = ((result.metadata if result else None) or {}).get("walkeep_charge_id")
        if charge_id and s.get(AutoCharge, charge_id) is not None:
            return charge_id
    return None


def event_facts(rt: Runtime, event: PaymentEvent) -> EventFacts:
    """Re-read the event's object from the provider (events are snapshots; order-proof).

    Raises PaymentsUnavailable (the webhook answers 5xx and the provider retries)."""
    if event.type.startswith(("payment_intent.", "charge.")) and event.payment_intent_id:
        try:
            result = rt.payments.retrieve_charge(event.payment_intent_id)
        except NotFound:
            return EventFacts()
        charge_id = _charge_for(rt, event.payment_intent_id, result)
        if charge_id is None:
            return EventFacts(result=result)
        reversals = (
            rt.payments.reversals(event.payment_intent_id)
            if event.type.startswith("charge.")
            else None
        )
        return EventFacts(charge_id=charge_id, result=result, reversals=reversals)
    if event.type == "customer.updated" and event.customer_id:
        with rt.db.read() as s:
            known = s.scalar(
                select(AutoTopUp.account_id).where(AutoTopUp.customer_id == event.customer_id)
            )
        if known is None:
            return EventFacts()
        return EventFacts(card=rt.payments.default_card(event.customer_id))
    return EventFacts()


def apply_event(s: Session, rt: Runtime, event: PaymentEvent, facts: EventFacts) -> EventAction:
    """Act on a verified, first-seen event in ``s`` (the transaction that records it)."""
    if event.type.startswith(("payment_intent.", "charge.")):
        if facts.charge_id is None or facts.result is None:
            return "unknown_charge"  # a payment Walkeep did not make automatically
        settle_in(s, rt, facts.charge_id, facts.result, source=f"webhook {event.event_id}")
        if facts.reversals is not None:
            return (
                "reversed"
                if reverse_in(s, rt, facts.charge_id, facts.reversals, event)
                else "charge_settled"
            )
        return "charge_settled"
    if event.type == "payment_method.detached" and event.object_id:
        return _card_removed(s, rt, event.object_id)
    if event.type == "customer.updated" and facts.card is not None and event.customer_id:
        return _portal_card(s, rt, event.customer_id, facts.card)
    return "ignored"


def _card_removed(s: Session, rt: Runtime, payment_method_id: str) -> EventAction:
    accounts = list(
        s.scalars(
            select(AutoTopUp.account_id).where(AutoTopUp.payment_method_id == payment_method_id)
        )
    )
    for account_id in accounts:
        row = autotopup.lock(s, rt, account_id)
        if row is None or row.payment_method_id != payment_method_id:
            continue
        card = autotopup.card_label(row)
        autotopup.forget_card(row)
        if row.status in ("active", "action_required"):
            autotopup.transition(
                s,
                row,
                "disabled",
                reason=f"the card ({card}) was removed; save a card and turn automatic top-up on again",
            )
        else:
            row.updated_at = rt.clock.now()
    return "card_removed" if accounts else "ignored"


def _portal_card(s: Session, rt: Runtime, customer_id: str, card: SavedCard) -> EventAction:
    """The card holder chose another default card (the provider's portal): use it."""
    account_id = s.scalar(select(AutoTopUp.account_id).where(AutoTopUp.customer_id == customer_id))
    if account_id is None:
        return "ignored"
    row = autotopup.lock(s, rt, account_id)
    if row is None or row.payment_method_id == card.payment_method_id:
        return "ignored"
    autotopup.card_saved(s, rt, account_id, card, customer_id=customer_id, source="customer portal")
    return "card_updated"


# --- refunds and disputes -------------------------------------------------------------------


def reverse_in(
    s: Session, rt: Runtime, charge_id: str, rev: Reversals, event: PaymentEvent
) -> bool:
    """Take back what refunds and disputes of a credited charge say, once, never below 0.

    ``rev`` is cumulative; what was already taken back (or recorded as a shortfall) is
    not taken twice, so repeated and reordered events change nothing more."""
    now = rt.clock.now()
    row, ch = _lock_charge(rt, s, charge_id)
    if ch.credited_entry_id is None:
        return False
    credited_mc = ch.amount_cents * ledger.MC_PER_CREDIT
    ch.refunded_cents = max(ch.refunded_cents, rev.refunded_cents)
    ch.disputed_cents = max(ch.disputed_cents, rev.disputed_cents)
    target = min(credited_mc, (ch.refunded_cents + ch.disputed_cents) * ledger.MC_PER_CREDIT)
    accounted = ch.reversed_mc + ch.reversal_shortfall_mc
    delta = target - accounted
    disputed = event.type == "charge.dispute.created"
    if disputed and row is not None and row.status in ("active", "action_required"):
        autotopup.transition(
            s,
            row,
            "disabled",
            reason=f"the card holder disputed automatic charge {ch.payment_intent_id or ch.id}",
        )
    if delta <= 0:
        ch.updated_at = now
        return False
    available = ledger.balance(s, ch.account_id).available_mc
    take = max(0, min(delta, available))
    if take:
        ledger.debit(
            s,
            ch.account_id,
            take,
            ref=f"reversal:{ch.id}:{accounted + delta}",
            kind=Kind.REVERSAL,
            memo=(
                f"{'dispute' if disputed else 'refund'} of automatic top-up "
                f"{ch.payment_intent_id or ch.id}"
            ),
        )
    short = delta - take
    ch.reversed_mc += take
    ch.reversal_shortfall_mc += short
    ch.updated_at = now
    alerts.emit(
        s,
        ch.account_id,
        "payment.reversed",
        {
            "charge_id": ch.id,
            "payment_id": ch.payment_intent_id,
            "cause": "dispute" if disputed else "refund",
            "refunded_usd": ledger.mc_to_usd_str(ch.refunded_cents * 1000),
            "disputed_usd": ledger.mc_to_usd_str(ch.disputed_cents * 1000),
            "debited_mc": take,
            "shortfall_mc": short,
            "note": "the balance cannot go below zero: the shortfall was recorded, not debited"
            if short
            else "the credits this payment bought were taken back",
        },
    )
    if short:
        log.warning(
            "reversal of %s: %s mc could not be debited (balance too low); recorded", ch.id, short
        )
    return True


# --- the renewal pass's question ----------------------------------------------------------


def will_fund(s: Session, rt: Runtime, account_id: str) -> bool:
    """Will automatic top-up fund this account soon? Asked (in the renewal pass's own
    transaction, without locking) before it pauses memories it cannot fund: yes when a
    charge is pending (it counts as funded), or automatic top-up is active with a usable
    card and at least $0.50 of its monthly cap left (a charge is made now, or after the
    back-off of a decline; after the third decline it is disabled and memories pause)."""
    row = s.get(AutoTopUp, account_id)
    if row is None or row.status != "active" or not autotopup.usable_card(rt, row):
        return False
    if _pending(s, account_id) is not None:
        return True
    left = topup_rule.cap_left_cents(
        row.monthly_cap_cents or 0,
        autotopup.charged_this_month_cents(s, account_id, rt.clock.now()),
    )
    return left >= topup_rule.MIN_CHARGE_CENTS
