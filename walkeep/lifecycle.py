"""Memory states and runway math. Pure: no database, no network.

A memory moves ``accepting → storing → active`` as its write lands, and from
``active`` to ``paused`` (renewal unfunded; paid runway still counts down),
``no-renew`` (forgotten, or superseded by a correction; lapses at its end_epoch) or
``expired`` (its blob's end_epoch has passed, or the ``expires_at`` it was stored with).
``failed`` is a write that never landed (the hold was released; the request may be
retried with the same request_id).

A memory stored with ``expires_at`` needs its blob paid up to the end of the epoch
holding that instant and no further: ``expiry_end_epoch``. Renewal never extends a
blob past the last such epoch any of its kept members needs (``capped_extension``).
"""

from __future__ import annotations

from datetime import UTC, timedelta
from enum import StrEnum
from typing import TYPE_CHECKING, overload

from walkeep.protocol.walrus import MAX_EPOCHS_AHEAD

if TYPE_CHECKING:  # types only: this module stays free of the database
    from datetime import datetime

    from sqlalchemy import ColumnElement

    from walkeep.backends.base import BlobObject


class MemoryStatus(StrEnum):
    ACCEPTING = "accepting"
    STORING = "storing"
    ACTIVE = "active"
    PAUSED = "paused"
    NO_RENEW = "no-renew"
    EXPIRED = "expired"
    FAILED = "failed"


# What recall and export show: stored, not forgotten, not lapsed.
VISIBLE = frozenset({MemoryStatus.ACTIVE, MemoryStatus.PAUSED})
# Accepted and not yet settled either way.
IN_FLIGHT = frozenset({MemoryStatus.ACCEPTING, MemoryStatus.STORING})
# Shown by check_runway (a failed write is not a memory).
LISTED = frozenset(
    {
        MemoryStatus.STORING,
        MemoryStatus.ACTIVE,
        MemoryStatus.PAUSED,
        MemoryStatus.NO_RENEW,
        MemoryStatus.EXPIRED,
    }
)


class BlobStatus(StrEnum):
    LIVE = "live"
    ORPHAN = "orphan"
    EXPIRED = "expired"


def runway(end_epoch: int, current_epoch: int) -> int:
    """Paid epochs left. ``end_epoch`` is exclusive, so 0 means lapsed."""
    return max(0, end_epoch - current_epoch)


def is_due(end_epoch: int, current_epoch: int, threshold: int) -> bool:
    """Renew early: as soon as runway falls to the threshold, never at the last moment."""
    return current_epoch < end_epoch and end_epoch - current_epoch <= threshold


def extension_epochs(end_epoch: int, current_epoch: int, target_runway: int) -> int:
    """Epochs to add so runway reaches ``target_runway``, within Walrus's 53-epoch cap.

    Returns 0 when nothing should (or can) be added.
    """
    if current_epoch >= end_epoch:
        return 0
    remaining = end_epoch - current_epoch
    wanted = max(0, target_runway - remaining)
    return max(0, min(wanted, MAX_EPOCHS_AHEAD - remaining))


def capped_extension(
    end_epoch: int, current_epoch: int, target_runway: int, cap: int | None
) -> int:
    """``extension_epochs``, but never past ``cap`` (the end epoch the blob's kept members
    still need; None: a member with no expiry, no cap). 0 when nothing should be added."""
    k = extension_epochs(end_epoch, current_epoch, target_runway)
    return k if cap is None else max(0, min(k, cap - end_epoch))


def epoch_at(info_epoch: int, started_at: datetime, duration_seconds: int, at: datetime) -> int:
    """The epoch that contains ``at``, counted from the current epoch's start and length.

    Integer arithmetic on whole microseconds, so an instant on an epoch boundary belongs
    to the epoch it starts (never to the one before, as float rounding could say)."""
    delta = at - started_at
    micros = (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    return info_epoch + micros // (max(1, duration_seconds) * 1_000_000)


def expiry_end_epoch(expires_epoch: int) -> int:
    """The end epoch (exclusive) a memory expiring during ``expires_epoch`` needs: its
    bytes must outlive its expiry, so the epoch holding it is paid for in full."""
    return expires_epoch + 1


def epochs_needed(current_epoch: int, expires_epoch: int | None, initial_epochs: int) -> int:
    """Epochs a new write buys: the initial epochs, or fewer if the memory expires first
    (at least 1: an expiry in the future is at or after the current epoch)."""
    if expires_epoch is None:
        return initial_epochs
    return max(1, min(initial_epochs, expiry_end_epoch(expires_epoch) - current_epoch))


def end_of_day(at: datetime) -> datetime:
    """The end of ``at``'s UTC day, as the instant the next one starts (exclusive)."""
    day = at.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return day + timedelta(days=1)


@overload
def next_renewal_epoch(end_epoch: int, threshold: int) -> int: ...
@overload
def next_renewal_epoch(end_epoch: ColumnElement[int], threshold: int) -> ColumnElement[int]: ...
def next_renewal_epoch(
    end_epoch: int | ColumnElement[int], threshold: int
) -> int | ColumnElement[int]:
    """The first epoch at which the worker will try to renew this blob.

    Also takes a SQL expression, so a set-based UPDATE (the renewal pass)
    computes it with this same rule rather than a copy of it.
    """
    return end_epoch - threshold


def blob_row(
    obj: BlobObject,
    account_id: str | None,
    status: BlobStatus,
    now: datetime,
    threshold: int,
    *,
    patch_count: int | None = None,
    share_micro: int | None = None,
) -> dict[str, object]:
    """The ``blobs`` row for an on-chain Blob object (a quilt when it has patches)."""
    return {
        "account_id": account_id,
        "kind": "quilt" if patch_count is not None else "blob",
        "patch_count": patch_count,
        "share_micro": share_micro if patch_count is not None else None,
        "blob_id": obj.blob_id,
        "blob_object_id": obj.blob_object_id,
        "size_bytes": obj.size,
        "storage_size": obj.storage_size,
        "registered_epoch": obj.registered_epoch,
        "end_epoch": obj.end_epoch,
        "status": status,
        "next_renewal_epoch": next_renewal_epoch(obj.end_epoch, threshold),
        "created_at": now,
        "updated_at": now,
    }
