"""Renewal: keep every active, funded memory's blob paid ahead of time.

One pass (``renew``) repeats until nothing is due:

1. **Claim + hold + intent** (one transaction). Pick up to ``renew_batch``
   live blobs that hold at least one ``active`` memory and whose runway is at
   or below the threshold (early, never at the last moment), skipping blobs
   another worker has claimed (``FOR UPDATE SKIP LOCKED`` on PostgreSQL; on
   SQLite a single worker runs). For each owning account, under its row lock,
   hold the cost of as many of its blobs as its available credits cover;
   the rest are left out and their memories become ``paused`` (their paid
   runway keeps counting down). Build the chain transaction — its digest is
   known before it is submitted — and record it as a renewal *intent* with
   its items; each claimed blob points at the intent, which is the lease
   other workers respect.
2. **Submit** the transaction (outside any database transaction).
3. **Record + capture** (one transaction): new end_epoch, renewals_performed,
   last_renewal_tx, next_renewal_epoch, the renewal's cost, and the holds
   captured. A refused transaction releases the holds and backs off.

A crash between 1 and 3 leaves an intent. ``reconcile_renewals`` asks the
chain about its digest (and the blobs' end_epoch): applied → record and
capture once; not applied → release. Never paid twice, never billed for an
extension that didn't happen.
"""

from __future__ import annotations

import logging
import os
import socket
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import timedelta

from sqlalchemy import exists, select, update
from sqlalchemy.orm import Session

from walkeep import ledger, lifecycle, metrics, pricing, usage
from walkeep.backends.base import ChainError, ChainRejected, ChainUnavailable, PreparedTx, TxEffects
from walkeep.db.models import Account, Blob, Memory, Renewal, RenewalItem
from walkeep.errors import InsufficientBalance
from walkeep.lifecycle import BlobStatus, MemoryStatus
from walkeep.service.runtime import Runtime

log = logging.getLogger(__name__)

# An intent younger than this may still be in flight in the worker that made it.
INTENT_GRACE_SECONDS = 120


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def resume_paused(session: Session, account_id: str) -> int:
    """After credits arrive, paused memories become active again (no one has to act).

    The next renewal pass renews those that are due; if the money still does
    not stretch that far they are paused again. Returns how many resumed.
    """
    if ledger.balance(session, account_id).available_mc <= 0:
        return 0
    now = session.info["clock"].now()
    res = session.execute(
        update(Memory)
        .where(Memory.account_id == account_id, Memory.status == MemoryStatus.PAUSED)
        .values(status=MemoryStatus.ACTIVE, status_changed_at=now)
    )
    return int(res.rowcount or 0)


@dataclass
class RenewReport:
    transactions: int = 0
    blobs_renewed: int = 0
    failed_transactions: int = 0
    unknown_outcome: int = 0
    paused_memories: int = 0
    resumed_memories: int = 0
    captured_mc: int = 0
    wal_cost_frost: int = 0
    digests: list[str] = field(default_factory=list)


@dataclass
class _Claim:
    renewal_id: int
    prepared: PreparedTx | None
    items: list[RenewalItem]


# Due blobs were found but none could be submitted (unfunded → paused, or
# refused → backed off): they drop out of the due query, so look again.
_SKIPPED = _Claim(-1, None, [])


class CrashForTest(Exception):
    """Raised by test hooks to simulate a process dying at a chosen point."""


def renew(rt: Runtime, *, max_batches: int | None = None, worker: str | None = None) -> RenewReport:
    report = RenewReport()
    worker = worker or worker_name()
    report.resumed_memories = resume_eligible(rt)
    batches = 0
    stop = rt.extras.get("stop")
    while max_batches is None or batches < max_batches:
        if stop is not None and stop.is_set():
            break  # graceful shutdown: the batch in hand was recorded
        current = rt.chain.current_epoch()
        claim = _claim_batch(rt, current, worker, report)
        if claim is None:
            break
        batches += 1
        _submit_and_record(rt, claim, report)
    return report


def resume_eligible(rt: Runtime) -> int:
    """Paused accounts that can pay for at least one renewal become active again."""
    with rt.db.read() as s:
        accounts = list(
            s.scalars(
                select(Memory.account_id).where(Memory.status == MemoryStatus.PAUSED).distinct()
            )
        )
    total = 0
    for account_id in accounts:
        with rt.db.begin() as s:
            cheapest = s.execute(
                select(Blob.storage_size, Blob.end_epoch)
                .join(Memory, Memory.blob_pk == Blob.id)
                .where(Memory.account_id == account_id, Memory.status == MemoryStatus.PAUSED)
                .order_by(Blob.storage_size)
                .limit(1)
            ).first()
            if cheapest is None:
                continue
            current = rt.chain.current_epoch()
            k = max(
                1,
                lifecycle.extension_epochs(cheapest[1], current, rt.settings.target_runway_epochs),
            )
            need = pricing.renewal_cost_mc(
                cheapest[0], k, rt.settings.renewal_price_mc_per_unit_epoch
            )
            if ledger.balance(s, account_id).available_mc >= max(need, 1):
                total += resume_paused(s, account_id)
    return total


def _due_query(rt: Runtime, current: int, now):  # type: ignore[no-untyped-def]
    threshold = rt.settings.renew_threshold_epochs
    active = exists().where(Memory.blob_pk == Blob.id, Memory.status == MemoryStatus.ACTIVE)
    q = (
        select(Blob)
        .where(
            Blob.status == BlobStatus.LIVE,
            Blob.pending_renewal_id.is_(None),
            Blob.end_epoch > current,
            Blob.end_epoch <= current + threshold,
            (Blob.renew_not_before.is_(None)) | (Blob.renew_not_before <= now),
            active,
        )
        .order_by(Blob.end_epoch, Blob.id)
        .limit(rt.settings.renew_batch)
    )
    if rt.db.is_postgres:
        # NO KEY UPDATE: compatible with the KEY SHARE locks of concurrent
        # foreign-key inserts (memories being registered on these blobs).
        q = q.with_for_update(skip_locked=True, of=Blob, key_share=True)
    return q


def _claim_batch(rt: Runtime, current: int, worker: str, report: RenewReport) -> _Claim | None:
    now = rt.clock.now()
    price = rt.settings.renewal_price_mc_per_unit_epoch
    target = rt.settings.target_runway_epochs
    with rt.db.begin() as s:
        blobs = list(s.scalars(_due_query(rt, current, now)))
        if not blobs:
            return None
        by_account: dict[str | None, list[tuple[Blob, int, int]]] = defaultdict(list)
        for b in blobs:
            k = lifecycle.extension_epochs(b.end_epoch, current, target)
            if k <= 0:
                # Nothing can be added (cap reached): look again next epoch.
                b.renew_not_before = now + timedelta(seconds=rt.chain.epoch_info().duration_seconds)
                continue
            by_account[b.account_id].append(
                (b, k, pricing.renewal_cost_mc(b.storage_size, k, price))
            )

        funded: list[tuple[Blob, int, int]] = []
        holds: dict[str, int] = {}
        unfunded: list[Blob] = []
        for account_id in sorted(a for a in by_account if a is not None):
            entries = by_account[account_id]
            lock = select(Account.balance_mc, Account.held_mc).where(Account.id == account_id)
            if rt.db.is_postgres:
                lock = lock.with_for_update(key_share=True)
            row = s.execute(lock).one()
            available = row[0] - row[1]
            spent = 0
            for blob, k, cost in entries:
                if spent + cost <= available:
                    spent += cost
                    funded.append((blob, k, cost))
                else:
                    unfunded.append(blob)
            if spent:
                holds[account_id] = spent

        if unfunded:
            res = s.execute(
                update(Memory)
                .where(
                    Memory.blob_pk.in_([b.id for b in unfunded]),
                    Memory.status == MemoryStatus.ACTIVE,
                )
                .values(status=MemoryStatus.PAUSED, status_changed_at=now)
            )
            paused = int(res.rowcount or 0)
            report.paused_memories += paused
            metrics.PAUSED_MEMORIES.inc(paused)
            log.warning("paused %d memories on %d unfunded blobs", paused, len(unfunded))
        if not funded:
            return _SKIPPED
        funded, prepared = _prepare_checked(rt, funded, now)
        if prepared is None:
            return _SKIPPED
        # Holds may have shrunk if some blobs were refused at prepare time.
        holds = defaultdict(int)
        for blob, _k, cost in funded:
            if blob.account_id:
                holds[blob.account_id] += cost
        renewal = Renewal(
            digest=prepared.digest,
            network=rt.chain.network,
            status="intent",
            walrus_epoch=prepared.epoch,
            blob_count=len(funded),
            cost_mc=sum(c for _, _, c in funded),
            tx_bytes=prepared.tx_bytes,
            worker=worker,
            created_at=now,
        )
        s.add(renewal)
        s.flush()
        items = []
        for blob, k, cost in funded:
            item = RenewalItem(
                renewal_id=renewal.id,
                blob_pk=blob.id,
                account_id=blob.account_id,
                epochs=k,
                old_end_epoch=blob.end_epoch,
                new_end_epoch=blob.end_epoch + k,
                cost_mc=cost,
                hold_ref=_hold_ref(renewal.id, blob.account_id) if blob.account_id else None,
            )
            items.append(item)
            blob.pending_renewal_id = renewal.id
            blob.updated_at = now
        s.add_all(items)
        for account_id, amount in holds.items():
            ledger.hold(
                s,
                account_id,
                amount,
                ref=_hold_ref(renewal.id, account_id),
                memo=f"renewal {prepared.digest}",
            )
        s.flush()
        return _Claim(renewal.id, prepared, items)


def _prepare_checked(
    rt: Runtime,
    funded: list[tuple[Blob, int, int]],
    now,  # type: ignore[no-untyped-def]
) -> tuple[list[tuple[Blob, int, int]], PreparedTx | None]:
    """Prepare the batch; if the chain refuses it, drop the blobs it refuses (e.g.
    lapsed since we read them) so one bad blob never blocks the others."""
    try:
        return funded, rt.chain.prepare_extend([(b.blob_object_id, k) for b, k, _ in funded])
    except ChainRejected:
        pass
    kept = []
    for blob, k, cost in funded:
        try:
            rt.chain.prepare_extend([(blob.blob_object_id, k)])
            kept.append((blob, k, cost))
        except ChainRejected as exc:
            blob.renew_failures += 1
            blob.renew_not_before = now + timedelta(seconds=_backoff(blob.renew_failures))
            log.warning("chain refuses to extend %s: %s", blob.blob_object_id, exc)
    if not kept:
        return kept, None
    return kept, rt.chain.prepare_extend([(b.blob_object_id, k) for b, k, _ in kept])


def _hold_ref(renewal_id: int, account_id: str) -> str:
    return f"renewal:{renewal_id}:{account_id}"


def _backoff(failures: int) -> int:
    return min(3600, 30 * 2 ** min(failures, 7))


def _submit_and_record(rt: Runtime, claim: _Claim, report: RenewReport) -> None:
    if claim.prepared is None:
        return
    hooks = rt.extras.get("renew_hooks", {})
    if "before_submit" in hooks:
        hooks["before_submit"](claim)
    try:
        effects = rt.chain.execute(claim.prepared)
    except ChainRejected as exc:
        _abandon(rt, claim.renewal_id, f"refused: {exc}", backoff=True)
        report.failed_transactions += 1
        metrics.RENEWAL_TXS.labels("refused").inc()
        return
    except (ChainUnavailable, ChainError, OSError) as exc:
        log.warning(
            "renewal %s outcome unknown (%s); reconcile will settle it", claim.prepared.digest, exc
        )
        report.unknown_outcome += 1
        metrics.RENEWAL_TXS.labels("unknown").inc()
        return
    if "after_submit" in hooks:
        hooks["after_submit"](claim)
    _record(rt, claim.renewal_id, effects, report)


def _record(
    rt: Runtime, renewal_id: int, effects: TxEffects, report: RenewReport | None = None
) -> bool:
    """Apply a confirmed transaction: end epochs, counters, capture. Exactly once."""
    now = rt.clock.now()
    threshold = rt.settings.renew_threshold_epochs
    by_object = {e.blob_object_id: e for e in effects.extensions}
    with rt.db.begin() as s:
        renewal = s.get(Renewal, renewal_id, with_for_update=rt.db.is_postgres)
        if renewal is None or renewal.status != "intent":
            return False
        items = list(s.scalars(select(RenewalItem).where(RenewalItem.renewal_id == renewal_id)))
        captured = 0
        for item in items:
            blob = s.get(Blob, item.blob_pk)
            assert blob is not None
            ext = by_object.get(blob.blob_object_id)
            new_end = ext.new_end_epoch if ext else item.new_end_epoch
            item.new_end_epoch = new_end
            blob.end_epoch = max(blob.end_epoch, new_end)
            blob.renewals_performed += 1
            blob.last_renewal_tx = effects.digest
            blob.next_renewal_epoch = lifecycle.next_renewal_epoch(blob.end_epoch, threshold)
            blob.pending_renewal_id = None
            blob.renew_failures = 0
            blob.renew_not_before = None
            blob.updated_at = now
        for account_id in sorted({i.account_id for i in items if i.account_id}):
            entry = ledger.capture(
                s, account_id, _hold_ref(renewal_id, account_id), memo=f"renewal {effects.digest}"
            )
            captured += entry.amount_mc
        renewal.status = "confirmed"
        renewal.wal_cost_frost = effects.wal_cost_frost
        renewal.gas_used = effects.gas_used
        renewal.submitted_at = renewal.submitted_at or now
        renewal.settled_at = now
    metrics.RENEWAL_TXS.labels("confirmed").inc()
    metrics.RENEWED_BLOBS.inc(len(items))
    metrics.BLOBS_PER_TX.observe(len(items))
    metrics.RENEWAL_WAL_FROST.inc(effects.wal_cost_frost or 0)
    metrics.CREDITS_CAPTURED_MC.labels("renewal").inc(captured)
    if report is not None:
        report.transactions += 1
        report.blobs_renewed += len(items)
        report.captured_mc += captured
        report.wal_cost_frost += effects.wal_cost_frost or 0
        report.digests.append(effects.digest)
    log.info("renewal %s confirmed: %d blobs, %d mc captured", effects.digest, len(items), captured)
    return True


def _abandon(rt: Runtime, renewal_id: int, reason: str, *, backoff: bool) -> bool:
    """The transaction did not happen: release holds, free the blobs."""
    now = rt.clock.now()
    with rt.db.begin() as s:
        renewal = s.get(Renewal, renewal_id, with_for_update=rt.db.is_postgres)
        if renewal is None or renewal.status != "intent":
            return False
        items = list(s.scalars(select(RenewalItem).where(RenewalItem.renewal_id == renewal_id)))
        for account_id in sorted({i.account_id for i in items if i.account_id}):
            ledger.release(s, account_id, _hold_ref(renewal_id, account_id), memo=reason[:200])
        for item in items:
            blob = s.get(Blob, item.blob_pk)
            assert blob is not None
            blob.pending_renewal_id = None
            if backoff:
                blob.renew_failures += 1
                blob.renew_not_before = now + timedelta(seconds=_backoff(blob.renew_failures))
            blob.updated_at = now
        renewal.status = "failed" if backoff else "abandoned"
        renewal.error = reason[:1000]
        renewal.settled_at = now
    log.warning("renewal %d released: %s", renewal_id, reason)
    return True


@dataclass
class ReconcileReport:
    confirmed: int = 0
    abandoned: int = 0
    waiting: int = 0


def reconcile_renewals(
    rt: Runtime, *, grace_seconds: int = INTENT_GRACE_SECONDS
) -> ReconcileReport:
    """Settle intents a crash (or an unknown outcome) left behind, by asking the chain."""
    report = ReconcileReport()
    cutoff = rt.clock.now() - timedelta(seconds=grace_seconds)
    with rt.db.read() as s:
        intents = list(
            s.execute(
                select(Renewal.id, Renewal.digest).where(
                    Renewal.status == "intent", Renewal.created_at <= cutoff
                )
            )
        )
    for renewal_id, digest in intents:
        try:
            effects = rt.chain.get_transaction(digest)
        except ChainError as exc:
            log.warning("cannot look up %s yet: %s", digest, exc)
            report.waiting += 1
            continue
        if effects is not None and effects.success:
            if _record(rt, renewal_id, effects):
                report.confirmed += 1
            continue
        # Unknown digest: confirm from the blobs themselves before releasing.
        with rt.db.read() as s:
            items = list(
                s.execute(
                    select(
                        Blob.blob_object_id, RenewalItem.old_end_epoch, RenewalItem.new_end_epoch
                    )
                    .join(Blob, Blob.id == RenewalItem.blob_pk)
                    .where(RenewalItem.renewal_id == renewal_id)
                )
            )
        applied = True
        for object_id, _old_end, new_end in items:
            obj = rt.chain.get_blob(object_id)
            if obj is None or obj.end_epoch < new_end:
                applied = False
                break
        if applied and items and effects is None:
            # Every blob shows the extension yet the digest is unknown: do not
            # release (the money was spent on chain); wait for the digest.
            report.waiting += 1
            continue
        if _abandon(rt, renewal_id, "not applied on chain (reconciled)", backoff=False):
            report.abandoned += 1
    return report


@dataclass
class SweepReport:
    orphans: int = 0
    expired_memories: int = 0
    expired_blobs: int = 0
    stale_holds_released: int = 0
    stale_hold_refs: list[str] = field(default_factory=list)


def sweep(rt: Runtime) -> SweepReport:
    """Orphans (owned blobs nobody references), lapsed memories, stale holds."""
    report = SweepReport()
    now = rt.clock.now()
    current = rt.chain.current_epoch()
    threshold = rt.settings.renew_threshold_epochs

    # 1. Lapsed: a blob past its end_epoch is gone; so are its memories.
    with rt.db.begin() as s:
        lapsed = select(Blob.id).where(Blob.end_epoch <= current, Blob.status != BlobStatus.EXPIRED)
        lapsed_ids = list(s.scalars(lapsed))
        if lapsed_ids:
            kept = [MemoryStatus.ACTIVE, MemoryStatus.PAUSED, MemoryStatus.NO_RENEW]
            usage.release_many(s, [Memory.blob_pk.in_(lapsed_ids), Memory.status.in_(kept)])
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
            report.expired_memories = int(res.rowcount or 0)
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
    fresh = []
    for obj in rt.chain.owned_blobs():
        if obj.blob_object_id in known or obj.end_epoch <= current:
            continue
        fresh.append(obj)
    if fresh:
        with rt.db.begin() as s:
            for obj in fresh:
                if s.scalar(select(Blob.id).where(Blob.blob_object_id == obj.blob_object_id)):
                    continue
                s.add(
                    Blob(
                        account_id=None,
                        blob_id=obj.blob_id,
                        blob_object_id=obj.blob_object_id,
                        size_bytes=obj.size,
                        storage_size=obj.storage_size,
                        registered_epoch=obj.registered_epoch,
                        end_epoch=obj.end_epoch,
                        status=BlobStatus.ORPHAN,
                        next_renewal_epoch=lifecycle.next_renewal_epoch(obj.end_epoch, threshold),
                        created_at=now,
                        updated_at=now,
                    )
                )
                report.orphans += 1
        metrics.ORPHANS.inc(report.orphans)
        log.warning("recorded %d orphan blobs (never renewed)", report.orphans)

    # 3. Stale holds: older than any legitimate operation, with nothing in flight.
    from walkeep.db.models import LedgerEntry

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
    return report


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


__all__ = [
    "CrashForTest",
    "InsufficientBalance",
    "RenewReport",
    "reconcile_renewals",
    "renew",
    "resume_paused",
    "sweep",
]
