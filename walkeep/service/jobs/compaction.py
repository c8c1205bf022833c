"""Compaction: re-pack a quilt whose bytes are mostly forgotten, when that is cheaper.

A quilt is renewed as a whole. Once most of its bytes belong to forgotten
members, extending it keeps paying for patches nobody wants (their shares are
Walkeep's cost). When such a quilt is due for renewal and writing its live
members into a new quilt costs less over the target runway than extending
the old one, ``start`` moves them instead:

1. one write job per live patch (active or paused members), holding the
   patch's ciphertext read back from Walrus, keyed ``compact:<quilt pk>:<patch
   id>``; the old quilt is held back from renewal while the move is under way
   (``renew_not_before``, so a move that never lands falls back to renewing);
2. the jobs are packed like any other writes of the account, into a new quilt
   bought for the target runway (Walkeep pays for it; nobody is charged again);
3. once it has landed and its patches are indexed, ``finish`` re-points the
   members — Blob object, blob_id (the new patch id) and share — in one
   transaction, conditional on them still being on the old quilt, so they move
   exactly once. The old quilt, left with no active member, is never renewed
   again and lapses at its end_epoch.

Recall never misses a member: the new patch is indexed before the members
move, and the old one stays readable until it lapses. A crash at any point
leaves either the old quilt or the new one in charge of each member — never
neither, never both.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import and_, case, func, select, update

from walkeep import lifecycle
from walkeep.backends.base import JobState, JobStatus
from walkeep.db import rowcount
from walkeep.db.models import Blob, Memory
from walkeep.errors import WalkeepError
from walkeep.lifecycle import BlobStatus, MemoryStatus
from walkeep.protocol import walrus
from walkeep.service.pipeline import (
    COMPACT_KEY_PREFIX,
    compact_job_key,
    parse_compact_key,
    upsert_blob,
)
from walkeep.service.runtime import Runtime

log = logging.getLogger(__name__)

# How long a quilt is held back from renewal while its members move. Generous:
# the writes are ordinary queued writes; if they have not landed by then the
# old quilt is renewed as before (its members never moved).
HOLD_BACK = timedelta(hours=1)
LIVE = (MemoryStatus.ACTIVE, MemoryStatus.PAUSED)
LANDED_ONCE = (
    MemoryStatus.ACTIVE,
    MemoryStatus.PAUSED,
    MemoryStatus.NO_RENEW,
    MemoryStatus.EXPIRED,
)


@dataclass
class CompactReport:
    started: int = 0
    patches: int = 0
    moved_memories: int = 0


def worth_it(
    storage_size: int, live_sizes: list[int], total_bytes: int, k: int, target: int
) -> bool:
    """Compact when most bytes are forgotten AND a new quilt of the live patches,
    bought for the target runway, costs fewer storage units than extending the
    old quilt by ``k`` epochs (Walrus bills units × epochs either way)."""
    from walkeep.protocol.quilt import quilt_storage_size

    live = sum(live_sizes)
    if not live_sizes or k <= 0 or live * 2 >= total_bytes:
        return False
    new_units = walrus.storage_units(quilt_storage_size(live_sizes)) * target
    return new_units < walrus.storage_units(storage_size) * k


def start(rt: Runtime) -> CompactReport:
    """Begin moving the live members of every due, mostly-forgotten quilt (renew pass)."""
    report = CompactReport()
    relayer = rt.relayer
    if not hasattr(relayer, "requeue_patch"):
        return report  # only Walkeep's own write path can re-pack
    current = rt.chain.current_epoch()
    now = rt.clock.now()
    s_ = rt.settings
    with rt.db.read() as s:
        due = list(
            s.execute(
                select(Blob.id, Blob.account_id, Blob.storage_size, Blob.end_epoch).where(
                    Blob.kind == "quilt",
                    Blob.status == BlobStatus.LIVE,
                    Blob.pending_renewal_id.is_(None),
                    Blob.end_epoch > current,
                    Blob.end_epoch <= current + s_.renew_threshold_epochs,
                    (Blob.renew_not_before.is_(None)) | (Blob.renew_not_before <= now),
                )
            )
        )
    for quilt_pk, account_id, storage_size, end_epoch in due:
        with rt.db.read() as s:
            patches = list(
                s.execute(
                    select(
                        Memory.blob_id,
                        func.max(Memory.size_bytes),
                        func.max(Memory.namespace),
                        func.sum(case((Memory.status.in_(list(LIVE)), 1), else_=0)),
                    )
                    .where(Memory.blob_pk == quilt_pk, Memory.status.in_(list(LANDED_ONCE)))
                    .group_by(Memory.blob_id)
                )
            )
        if relayer.unfinished_jobs(f"{COMPACT_KEY_PREFIX}{quilt_pk}:"):  # type: ignore[attr-defined]
            continue  # a move is already under way
        live = [(pid, size, ns) for pid, size, ns, n_live in patches if n_live and pid]
        total = sum(size for _, size, _, _ in patches)
        k = lifecycle.extension_epochs(end_epoch, current, s_.target_runway_epochs)
        sizes = [size for _, size, _ in live]
        if not worth_it(storage_size, sizes, total, k, s_.target_runway_epochs):
            continue
        try:
            for patch_id, _size, namespace in live:
                relayer.requeue_patch(  # type: ignore[attr-defined]
                    account_id=account_id,
                    namespace=namespace,
                    patch_id=patch_id,
                    idempotency_key=compact_job_key(quilt_pk, patch_id),
                    epochs=s_.target_runway_epochs,
                )
        except WalkeepError as exc:
            log.warning("cannot compact quilt %s yet: %s", quilt_pk, exc.message)
            continue
        with rt.db.begin() as s:
            s.execute(
                update(Blob).where(Blob.id == quilt_pk).values(renew_not_before=now + HOLD_BACK)
            )
        report.started += 1
        report.patches += len(live)
        log.info(
            "compacting quilt",
            extra={"quilt_pk": quilt_pk, "live_patches": len(live), "patches": len(patches)},
        )
    return report


def finish(rt: Runtime, landed: list[tuple[str, str, JobStatus]]) -> int:
    """Move members onto their new quilt once it has landed; returns memories moved.

    ``landed`` holds ``(job_id, idempotency_key, status)`` of compaction jobs.
    Each job is applied once (its status goes ``landed`` → ``applied`` in the
    same transaction as the move).
    """

    mark_applied = rt.relayer.mark_applied_in  # type: ignore[attr-defined]
    moved = 0
    threshold = rt.settings.renew_threshold_epochs
    for job_id, key, st in landed:
        parsed = parse_compact_key(key)
        if parsed is None or st.state != JobState.LANDED or st.blob is None or not st.patch_id:
            continue
        old_pk, old_patch = parsed
        now = rt.clock.now()
        with rt.db.begin() as s:
            if not mark_applied(s, job_id, now):
                continue  # applied already
            account_id = s.scalar(select(Blob.account_id).where(Blob.id == old_pk))
            if account_id is None:
                continue
            new_pk = upsert_blob(
                s,
                account_id,
                st.blob,
                now,
                threshold,
                live=True,
                patch_count=st.patch_count,
                share_micro=st.quilt_share_micro,
            )
            res = s.execute(
                update(Memory)
                .where(
                    and_(
                        Memory.blob_pk == old_pk,
                        Memory.blob_id == old_patch,
                        Memory.status.in_(list(LIVE)),
                    )
                )
                .values(blob_pk=new_pk, blob_id=st.patch_id, share_micro=st.share_micro)
            )
            moved += rowcount(res)
    return moved


def finish_landed(rt: Runtime, limit: int = 1000) -> int:
    """Apply compaction jobs that landed but were not applied (after a crash, or when
    a poll for ordinary stores wrote the quilt they were packed in)."""
    landed = getattr(rt.relayer, "landed_jobs", None)
    if landed is None:
        return 0
    return finish(rt, landed(COMPACT_KEY_PREFIX, limit))
