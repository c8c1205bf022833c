"""``check_runway``: the durability receipt — is my data alive, and can I prove it?

Every figure comes from Walkeep's registry of on-chain facts (blob end_epoch,
renewal digests) and the chain's current epoch. ``last_renewal_tx`` is a Sui
transaction digest an auditor can paste into an explorer.
"""

from __future__ import annotations

from sqlalchemy import select

from walkeep import lifecycle
from walkeep.db.models import Blob, Memory
from walkeep.lifecycle import LISTED, MemoryStatus
from walkeep.service.runtime import Runtime
from walkeep.service.schemas import RunwayMemory, RunwayResult, RunwaySummary
from walkeep.service.views import resolve

SUMMARY_LIST_MAX = 100


def check_runway(rt: Runtime, account_id: str, memory_id: str | None = None) -> RunwayResult:
    current = rt.chain.current_epoch()
    with rt.db.read() as s:
        if memory_id is not None:
            rows = resolve(s, account_id, memory_id)
            return RunwayResult(
                current_epoch=current, memories=[_view(rt, m, b, current) for m, b in rows]
            )
        rows = list(
            s.execute(
                select(Memory, Blob)
                .outerjoin(Blob, Blob.id == Memory.blob_pk)
                .where(Memory.account_id == account_id, Memory.status.in_(list(LISTED)))
            )
        )
    views = [_view(rt, m, b, current) for m, b in rows]
    counts = {st: 0 for st in MemoryStatus}
    for v in views:
        counts[MemoryStatus(v.status)] += 1
    alive = [
        v.runway_epochs
        for v in views
        if v.runway_epochs is not None and v.status in ("active", "paused")
    ]
    # Most at-risk first; the summary lists at most SUMMARY_LIST_MAX memories.
    views.sort(key=lambda v: (v.runway_epochs is None, v.runway_epochs or 0, v.memory_id))
    return RunwayResult(
        current_epoch=current,
        memories=views[:SUMMARY_LIST_MAX],
        account=RunwaySummary(
            total_memories=len(views),
            active=counts[MemoryStatus.ACTIVE],
            paused=counts[MemoryStatus.PAUSED],
            no_renew=counts[MemoryStatus.NO_RENEW],
            min_runway_epochs=min(alive) if alive else None,
        ),
    )


def _view(rt: Runtime, m: Memory, b: Blob | None, current: int) -> RunwayMemory:
    status = m.status
    if (
        b is not None
        and status in (MemoryStatus.ACTIVE, MemoryStatus.PAUSED, MemoryStatus.NO_RENEW)
        and b.end_epoch <= current
    ):
        status = MemoryStatus.EXPIRED  # lapsed since the last sweep: say so now
    if b is None:
        return RunwayMemory(
            memory_id=m.id,
            status=status,  # type: ignore[arg-type]
            end_epoch=None,
            current_epoch=current,
            runway_epochs=None,
            renewals_performed=0,
            last_renewal_tx=None,
            next_renewal_epoch=None,
        )
    renewing = status == MemoryStatus.ACTIVE
    return RunwayMemory(
        memory_id=m.id,
        status=status,  # type: ignore[arg-type]
        end_epoch=b.end_epoch,
        current_epoch=current,
        runway_epochs=lifecycle.runway(b.end_epoch, current),
        renewals_performed=b.renewals_performed,
        last_renewal_tx=b.last_renewal_tx,
        next_renewal_epoch=max(
            current, lifecycle.next_renewal_epoch(b.end_epoch, rt.settings.renew_threshold_epochs)
        )
        if renewing
        else None,
        last_renewal_url=rt.chain.explorer_tx_url(b.last_renewal_tx) if b.last_renewal_tx else None,
    )
