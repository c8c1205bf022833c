"""Memory states and runway math. Pure: no database, no network.

A memory moves ``accepting → storing → active`` as its write lands, and from
``active`` to ``paused`` (renewal unfunded; paid runway still counts down),
``no-renew`` (forgotten; lapses at its end_epoch) or ``expired`` (its blob's
end_epoch has passed). ``failed`` is a write that never landed (the hold was
released; the request may be retried with the same request_id).
"""

from __future__ import annotations

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
