"""The write pipeline's shared vocabulary: keys, holds, a failed attempt, a landed blob's row.

A store (tools/store.py) claims a memory and places a hold; the background jobs
(jobs/completion.py, jobs/compaction.py) settle the write once it lands. Both sides
must agree on how a relayer job and a ledger hold are named, on what a failed
attempt undoes, and on how a landed object becomes a ``blobs`` row. That agreement
lives here, below both, so neither imports the other.
"""

from __future__ import annotations

from datetime import datetime
from typing import Protocol

from sqlalchemy import bindparam, select, update
from sqlalchemy.orm import Session

from walkeep import ledger, lifecycle, usage
from walkeep.backends.base import BlobObject
from walkeep.db import insert_if_absent, rowcount
from walkeep.db.models import Blob, Memory, Request, table
from walkeep.lifecycle import BlobStatus, MemoryStatus

# Statuses of a memory whose write has landed (a replayed store answers ``stored``).
SETTLED = frozenset(
    {MemoryStatus.ACTIVE, MemoryStatus.PAUSED, MemoryStatus.NO_RENEW, MemoryStatus.EXPIRED}
)

# Relayer idempotency keys of compaction's moves (jobs/compaction.py), beside the
# store's ``<memory id>:<attempt>``: the completer tells them apart by this prefix.
COMPACT_KEY_PREFIX = "compact:"


class Attempted(Protocol):
    """What undoing an attempt needs of a memory: a claimed one or a loaded row."""

    @property
    def id(self) -> str: ...
    @property
    def account_id(self) -> str: ...
    @property
    def size_bytes(self) -> int: ...


def hold_ref(memory_id: str, attempt: int) -> str:
    return f"store:{memory_id}:{attempt}"


def job_key(memory_id: str, attempt: int) -> str:
    """The relayer idempotency key: one per attempt, so a retry is a new write."""
    return f"{memory_id}:{attempt}"


def parse_job_key(key: str) -> tuple[str, int] | None:
    """(memory_id, attempt) from a relayer idempotency key, or None if not ours."""
    memory_id, sep, attempt = key.rpartition(":")
    return (memory_id, int(attempt)) if sep and attempt.isdigit() else None


def compact_job_key(quilt_pk: int, patch_id: str) -> str:
    return f"{COMPACT_KEY_PREFIX}{quilt_pk}:{patch_id}"


def parse_compact_key(key: str) -> tuple[int, str] | None:
    if not key.startswith(COMPACT_KEY_PREFIX):
        return None
    pk, sep, patch_id = key[len(COMPACT_KEY_PREFIX) :].partition(":")
    return (int(pk), patch_id) if sep and pk.isdigit() and patch_id else None


def fail_attempt(
    sess: Session,
    memory: Attempted,
    attempt: int,
    reason: str,
    now: datetime,
    *,
    from_status: MemoryStatus | None,
) -> bool:
    """This attempt did not land: the memory fails, its hold and usage are released, its
    request may be retried. Conditional on ``from_status`` (None: unconditional) and on
    the attempt, so only one of several racing settlers does it. True if it did."""
    cond = [Memory.id == memory.id, Memory.attempt == attempt]
    if from_status is not None:
        cond.append(Memory.status == from_status)
    res = sess.execute(
        update(Memory)
        .where(*cond)
        .values(status=MemoryStatus.FAILED, failure_reason=reason[:500], status_changed_at=now)
    )
    if rowcount(res) != 1:
        return False
    ledger.release(sess, memory.account_id, hold_ref(memory.id, attempt), memo=reason[:200])
    usage.release(sess, memory.account_id, memory.size_bytes)
    sess.execute(
        update(Request)
        .where(Request.account_id == memory.account_id, Request.memory_id == memory.id)
        .values(status="failed", updated_at=now)
    )
    return True


_B = table(Blob)
_BLOB_BY_OBJECT = select(_B.c.id, _B.c.status).where(_B.c.blob_object_id == bindparam("p_object"))
_SHARED_BLOB = (
    select(_B.c.id)
    .where(
        _B.c.account_id == bindparam("p_account"),
        _B.c.blob_id == bindparam("p_blob_id"),
        _B.c.status == BlobStatus.LIVE,
        _B.c.end_epoch >= bindparam("p_end_epoch"),
    )
    .order_by(_B.c.end_epoch.desc())
    .limit(1)
)


def upsert_blob(  # type: ignore[no-untyped-def]
    s,
    account_id: str,
    obj: BlobObject,
    now,
    threshold: int,
    *,
    live: bool,
    patch_count=None,
    share_micro=None,
) -> int:
    """The blob row for this landed object, reusing the account's existing live blob
    with the same blob_id (identical content shares one renewal). A quilt's row is
    made by its first member and found by the others; ``share_micro`` is its
    apportioned shares (``pricing.apportion_quilt_shares``), fixed from then on."""
    existing = s.execute(_BLOB_BY_OBJECT, {"p_object": obj.blob_object_id}).first()
    if existing is not None:
        if live and existing.status == BlobStatus.ORPHAN:
            # The sweep saw this object before its write was registered: adopt it
            # (a quilt is only known to be one from its members' results).
            kind = (
                {"kind": "quilt", "patch_count": patch_count, "share_micro": share_micro}
                if patch_count
                else {}
            )
            s.execute(
                update(Blob)
                .where(Blob.id == existing.id)
                .values(status=BlobStatus.LIVE, account_id=account_id, updated_at=now, **kind)
            )
        return int(existing.id)
    shared = None
    if live and patch_count is None:
        shared = s.scalar(
            _SHARED_BLOB,
            {"p_account": account_id, "p_blob_id": obj.blob_id, "p_end_epoch": obj.end_epoch},
        )
    # A duplicate object of content we already keep alive is left to lapse.
    status = BlobStatus.LIVE if live and shared is None else BlobStatus.ORPHAN
    row = lifecycle.blob_row(
        obj, account_id, status, now, threshold, patch_count=patch_count, share_micro=share_micro
    )
    # ON CONFLICT, not an insert caught as IntegrityError: another process (a second
    # web process's completer, or the sweep recording it as an orphan) may have
    # inserted this object meanwhile; then its row is the one.
    new_id = insert_if_absent(s, _B, row, ["blob_object_id"])
    if new_id is None:
        again = s.scalar(
            _BLOB_BY_OBJECT.with_only_columns(_B.c.id), {"p_object": obj.blob_object_id}
        )
        assert again is not None
        return int(again)
    return int(shared) if shared is not None else int(new_id)
