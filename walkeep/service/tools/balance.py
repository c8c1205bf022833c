"""``check_balance``: credits, what they buy at current usage, and automatic top-up. Free."""

from __future__ import annotations

from sqlalchemy import func, select

from walkeep import ledger, pricing
from walkeep.db.models import AutoCharge, AutoTopUp, Memory
from walkeep.lifecycle import MemoryStatus
from walkeep.protocol import walrus
from walkeep.service import autotopup
from walkeep.service.renewal_price import (
    renewal_burn_mc_per_epoch,
)
from walkeep.service.runtime import Runtime
from walkeep.service.tools.schemas import AutoTopUpView, BalanceResult, LastAttempt
from walkeep.service.tools.views import epochs_text, human_duration

# The size an "average memory" estimate assumes (a short fact is far below it).
TYPICAL_MEMORY_BYTES = 1024


def typical_memory_mc(rt: Runtime) -> int:
    """What one more typical memory costs: its store price plus renewing it to the
    target runway at the price it will really pay — its share of a quilt when
    quilts are on (a quilt of 600 such memories), its own blob's units otherwise."""
    s = rt.settings
    size = TYPICAL_MEMORY_BYTES
    store = pricing.store_cost_mc(size, s.store_price_mc_per_64kib)
    epochs = s.target_runway_epochs
    if s.quilts == "on" and s.relayer in ("local", "walrus"):
        from walkeep.protocol.quilt import quilt_storage_size

        # Its part of a full quilt's renewal, rounded up: an estimate should not flatter.
        whole = pricing.renewal_cost_mc(
            quilt_storage_size([size] * 600), epochs, s.renewal_price_mc_per_unit_epoch
        )
        renew = -(-whole // 600)
    else:
        renew = pricing.renewal_cost_mc(
            walrus.encoded_blob_length(size), epochs, s.renewal_price_mc_per_unit_epoch
        )
    return store + renew


def check_balance(rt: Runtime, account_id: str) -> BalanceResult:
    with rt.db.read() as s:
        bal = ledger.balance(s, account_id)
        in_flight = (
            s.scalar(
                select(func.count())
                .select_from(Memory)
                .where(Memory.account_id == account_id, Memory.status == MemoryStatus.STORING)
            )
            or 0
        )
        # Any memory that is no longer kept (lapsed or forgotten): "no stored memories"
        # beside "expired 5" read as if nothing had ever been stored.
        had_memories = (
            s.scalar(
                select(Memory.id)
                .where(
                    Memory.account_id == account_id,
                    Memory.status.in_(
                        [
                            MemoryStatus.ACTIVE,
                            MemoryStatus.PAUSED,
                            MemoryStatus.NO_RENEW,
                            MemoryStatus.EXPIRED,
                        ]
                    ),
                )
                .limit(1)
            )
            is not None
        )
    available = bal.available_mc
    per_memory = typical_memory_mc(rt)
    est_memories = available // per_memory if per_memory > 0 else 0
    burn, min_runway = renewal_burn_mc_per_epoch(rt, account_id)
    epoch_seconds = rt.chain.epoch_info().duration_seconds
    if burn == 0:
        if in_flight:
            funded = "nothing to renew yet: your first memories are still being written"
        elif had_memories:
            funded = "nothing to renew: no memory is kept any more (each lapsed or was forgotten)"
        else:
            funded = "nothing to renew yet: no stored memories"
    else:
        epochs = available // burn + (min_runway or 0)
        funded = (
            f"{human_duration(epochs * epoch_seconds)} at current usage "
            f"({epochs_text(available // burn)} of renewals funded on top of "
            f"{min_runway or 0} already paid)"
        )
    return BalanceResult(
        balance_credits=ledger.credits_display(available),
        balance_usd=float(ledger.mc_to_usd_str(available)),
        est_memories_remaining=int(est_memories),
        est_runway_funded=funded,
        auto_top_up=auto_top_up_view(rt, account_id),
    )


def _usd(cents: int) -> float:
    return float(ledger.mc_to_usd_str(cents * ledger.MC_PER_CREDIT))


def _outcome(charge: AutoCharge) -> str:
    """A charge as ``last_attempt.outcome`` names it (a hard decline is a decline)."""
    if charge.status in ("succeeded", "pending", "authentication_required"):
        return charge.status
    return "declined"


def auto_top_up_view(rt: Runtime, account_id: str) -> AutoTopUpView:
    """``check_balance.auto_top_up`` — also what ``walkeep auto-top-up show --json`` prints."""
    now = rt.clock.now()
    with rt.db.read(snapshot=True) as s:
        row = s.get(AutoTopUp, account_id)
        charged = autotopup.charged_this_month_cents(s, account_id, now)
        last = s.scalars(
            select(AutoCharge)
            .where(AutoCharge.account_id == account_id, AutoCharge.status != "canceled")
            .order_by(AutoCharge.created_at.desc(), AutoCharge.id.desc())
            .limit(1)
        ).one_or_none()
        attempt = (
            LastAttempt(
                at=last.submitted_at or last.created_at,
                amount_usd=_usd(last.amount_cents),
                outcome=_outcome(last),  # type: ignore[arg-type]
            )
            if last is not None
            else None
        )
        if row is None:
            return AutoTopUpView(
                status="off",
                below_runway_epochs=None,
                to_runway_epochs=None,
                monthly_cap_usd=None,
                charged_this_month_usd=_usd(charged),
                card=None,
                last_attempt=attempt,
                action_url=None,
                reason=None,
            )
        waiting = row.status == "action_required" and row.action_charge_id
        return AutoTopUpView(
            status=row.status,  # type: ignore[arg-type]
            below_runway_epochs=row.below_runway_epochs,
            to_runway_epochs=row.to_runway_epochs,
            monthly_cap_usd=_usd(row.monthly_cap_cents)
            if row.monthly_cap_cents is not None
            else None,
            charged_this_month_usd=_usd(charged),
            card=autotopup.card_label(row) if row.provider == rt.payments.provider else None,
            last_attempt=attempt,
            action_url=autotopup.action_url(rt, row.action_charge_id) if waiting else None,  # type: ignore[arg-type]
            reason=row.reason,
        )
