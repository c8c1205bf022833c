"""The sweep: what no other job cleans up.

0. **Expired by date**: memories stored with an ``expires_at`` that has passed leave
   service (``service/leaving.py``): ``expired``, their bytes out of the account's usage.
   Recall and export stopped showing them at that instant already; this makes the
   counts, renewal and the search index agree. No alert: the agent asked for it.
1. **Lapsed**: a blob past its end epoch is gone on chain, and so are its memories:
   they become ``expired``, their bytes leave the account's usage, the blob is
   marked expired (memory rows first, then the account: the lock order of
   registration and renewal).
2. **Orphans**: blobs the server wallet owns that the registry does not know (a
   crash between a write landing and its registration) are recorded, never renewed.
   An object is recorded only once it has stayed unknown for ``ORPHAN_GRACE``: a
   write that just landed is registered seconds later, and recording it first (to
   be adopted by its registration) raised a false orphan warning. The first sighting
   is kept in the worker's memory; a restart only delays the record.
3. **Stale holds**: holds older than any legitimate operation, with nothing in
   flight behind them, are released so credits never stay locked by a lost worker.
4. **Old sign-in counts**: console sign-in attempts of windows an hour past.
5. **Departed memories' derived data**: purged once due (``purge.py``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session

from walkeep import ledger, lifecycle, metrics, usage
from walkeep.db import insert_if_absent, rowcount
from walkeep.db.models import Blob, LedgerEntry, Memory, Renewal, SignInAttempts, table
from walkeep.lifecycle import BlobStatus, MemoryStatus
from walkeep.service import alerts
from walkeep.service.jobs import purge
from walkeep.service.leaving import Why, leave
from walkeep.service.runtime import Runtime

log = logging.getLogger(__name__)

# Longer than landing → registration takes (seconds), shorter than the sweep interval.
ORPHAN_GRACE = timedelta(minutes=5)


@dataclass
class SweepReport:
    orphans: int = 0
    expired_by_date: int = 0
    expired_memories: int = 0
    # Of those, memories that were paid for (active or paused, not forgotten).
    lapsed_paid_memories: int = 0
    expired_blobs: int = 0
    stale_holds_released: int = 0
    stale_hold_refs: list[str] = field(default_factory=list)
    sign_in_rows_pruned: int = 0
    purged_memories: int = 0


def sweep(rt: Runtime) -> SweepReport:
    """Orphans (owned blobs nobody references), lapsed memories, stale holds."""
    report = SweepReport()
    now = rt.clock.now()
    current = rt.chain.current_epoch()
    threshold = rt.settings.renew_threshold_epochs

    # 0. Expired by date — before the lapses, so that a memory whose expiry passed is
    # never reported as lost when its blob (paid to the end of that epoch) lapses.
    with rt.db.begin() as s:
        report.expired_by_date = leave(
            s, [Memory.expires_at.is_not(None), Memory.expires_at <= now], now, Why.EXPIRED
        )

    # 1. Lapsed: a blob past its end_epoch is gone; so are its memories.
    with rt.db.begin() as s:
        lapsed = select(Blob.id).where(Blob.end_epoch <= current, Blob.status != BlobStatus.EXPIRED)
        lapsed_ids = list(s.scalars(lapsed))
        if lapsed_ids:
            # Paid-for memories (not forgotten) that lapse: say so, per account, in the
            # transaction that marks them (nothing lapses silently).
            paid = (
                Memory.blob_pk.in_(lapsed_ids),
                Memory.status.in_([MemoryStatus.ACTIVE, MemoryStatus.PAUSED]),
            )
            lost = s.execute(
                select(Memory.account_id, func.count())
                .where(*paid)
                .group_by(Memory.account_id)
                .order_by(Memory.account_id)
            ).all()
            for acct, n in lost:
                shown = s.scalars(
                    select(Memory.id)
                    .where(*paid, Memory.account_id == acct)
                    .order_by(Memory.id)
                    .limit(EXPIRED_IDS_SHOWN)
                ).all()
                alerts.emit(s, acct, "memories.expired", _expired_alert(int(n), list(shown)))
            report.lapsed_paid_memories = sum(int(n) for _acct, n in lost)
            kept = [MemoryStatus.ACTIVE, MemoryStatus.PAUSED, MemoryStatus.NO_RENEW]
            freed = usage.kept_bytes(s, [Memory.blob_pk.in_(lapsed_ids), Memory.status.in_(kept)])
            res = s.execute(
                update(Memory)
                .where(
                    Memory.blob_pk.in_(lapsed_ids),
                    Memory.status.in_(
                        [MemoryStatus.ACTIVE, MemoryStatus.PAUSED, MemoryStatus.NO_RENEW]
                    ),
                )
                .values(status=MemoryStatus.EXPIRED, status_changed_at=now)
            )
            report.expired_memories = rowcount(res)
            # After the memories: their counters (memory_counts, by trigger) are locked
            # before the accounts, as registration and renewal lock them. The other way
            # round, a sweep and a registration for one account could deadlock.
            usage.release_each(s, freed)
            s.execute(
                update(Blob)
                .where(Blob.id.in_(lapsed_ids))
                .values(status=BlobStatus.EXPIRED, updated_at=now)
            )
            report.expired_blobs = len(lapsed_ids)

    # 2. Orphans: owned by the server wallet, unknown to the registry.
    known: set[str] = set()
    with rt.db.read() as s:
        known.update(s.scalars(select(Blob.blob_object_id)))
    unknown_since: dict[str, datetime] = rt.extras.setdefault("sweep.unknown_since", {})
    fresh = []
    seen: set[str] = set()
    for obj in rt.chain.owned_blobs():
        if obj.blob_object_id in known or obj.end_epoch <= current:
            continue
        seen.add(obj.blob_object_id)
        first = unknown_since.setdefault(obj.blob_object_id, now)
        if now - first >= ORPHAN_GRACE:
            fresh.append(obj)
    for gone in unknown_since.keys() - seen:  # registered, recorded or lapsed since
        del unknown_since[gone]
    if fresh:
        with rt.db.begin() as s:
            # In object-id order and ON CONFLICT DO NOTHING: a write registered by a web
            # process meanwhile (or another worker's sweep) wins without a unique-key
            # violation, and two transactions inserting overlapping objects take their
            # index entries in one order, so they cannot deadlock on each other.
            for obj in sorted(fresh, key=lambda o: o.blob_object_id):
                row = lifecycle.blob_row(obj, None, BlobStatus.ORPHAN, now, threshold)
                if insert_if_absent(s, table(Blob), row, ["blob_object_id"]) is not None:
                    report.orphans += 1
        metrics.ORPHANS.inc(report.orphans)
        if report.orphans:  # not when writes registered meanwhile took them all
            log.warning("recorded %d orphan blobs (never renewed)", report.orphans)

    # 3. Stale holds: older than any legitimate operation, with nothing in flight.
    cutoff = now - timedelta(seconds=rt.settings.stale_hold_seconds)
    with rt.db.read() as s:
        accounts = list(
            s.scalars(select(LedgerEntry.account_id).where(LedgerEntry.kind == "hold").distinct())
        )
    for account_id in accounts:
        with rt.db.begin() as s:
            for hold in ledger.open_holds(s, account_id):
                if hold.created_at > cutoff or _hold_in_flight(s, hold.ref):
                    continue
                ledger.release(s, account_id, hold.ref, memo="stale hold released by sweep")
                report.stale_holds_released += 1
                report.stale_hold_refs.append(hold.ref)
    if report.stale_holds_released:
        log.error(
            "released %d stale holds: %s", report.stale_holds_released, report.stale_hold_refs
        )

    # 4. Old sign-in counts. Rows taken by another sweep are skipped, not waited for,
    # and a sign-in holds one such row at a time: no lock cycle on PostgreSQL.
    with rt.db.begin() as s:
        old = (
            select(SignInAttempts.bucket)
            .where(SignInAttempts.window_start < int(rt.clock.time()) - 3600)
            .with_for_update(skip_locked=True)
        )
        report.sign_in_rows_pruned = rowcount(
            s.execute(delete(SignInAttempts).where(SignInAttempts.bucket.in_(old)))
        )

    # 5. Departed memories' derived data, once due (walkeep/service/jobs/purge.py).
    report.purged_memories = purge.due(rt).memories
    return report


# Memory ids listed in one memories.expired event (the count is always exact).
EXPIRED_IDS_SHOWN = 100


def _expired_alert(count: int, memory_ids: list[str]) -> dict[str, object]:
    return {
        "expired_memories": count,
        "memory_ids": memory_ids,
        "reason": "their paid storage ran out before a renewal could be paid",
        "note": "they are gone from Walrus and no longer appear in recall or export; "
        "check_runway lists them as expired. Store them again to keep them",
    }


def _hold_in_flight(s: Session, ref: str) -> bool:
    kind, _, rest = ref.partition(":")
    if kind == "store":
        memory_id = rest.split(":")[0]
        status = s.scalar(select(Memory.status).where(Memory.id == memory_id))
        return status in (MemoryStatus.ACCEPTING, MemoryStatus.STORING)
    if kind == "renewal":
        renewal_id = int(rest.split(":")[0])
        status = s.scalar(select(Renewal.status).where(Renewal.id == renewal_id))
        return status == "intent"
    return True  # unknown kinds are never touched automatically
