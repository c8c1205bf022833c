"""Shared read helpers: resolve a memory_id or blob_id within one account.

Every lookup is scoped by account id, so another account's ids are simply
not found (invariant 7: isolation, never a leak).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import ColumnElement, or_, select
from sqlalchemy.orm import Session

from walkeep import ids
from walkeep.backends.base import EpochInfo
from walkeep.db.models import Blob, Memory
from walkeep.errors import NotFound, ValidationError
from walkeep.lifecycle import LISTED


def resolve(
    session: Session, account_id: str, ident: str, *, namespace: str | None = None
) -> list[tuple[Memory, Blob | None]]:
    """Memories named by a ``mem_…`` id or sharing a blob_id, in this account only — and,
    given ``namespace`` (a token: the calling key is confined to it), in that namespace
    only. An id outside it is NOT_FOUND with the very words of an unknown one: a confined
    key learns nothing of the account's other namespaces."""
    if not isinstance(ident, str) or not ident.strip():
        raise ValidationError("memory_id is required", {"field": "memory_id"})
    ident = ids.check_identifier(ident.strip(), "memory_id")
    q = (
        select(Memory, Blob)
        .outerjoin(Blob, Blob.id == Memory.blob_pk)
        .where(Memory.account_id == account_id, Memory.status.in_(list(LISTED)))
    )
    if namespace is not None:
        q = q.where(Memory.namespace == namespace)
    if ident.startswith("mem_"):
        q = q.where(Memory.id == ident)
    else:
        # A memory's blob_id is its quilt patch id, or its own blob's id.
        q = q.where(Memory.blob_id == ident)
    rows: list[tuple[Memory, Blob | None]] = [
        (m, b) for m, b in session.execute(q.order_by(Memory.accepted_at))
    ]
    if not rows:
        raise NotFound(
            "no memory with that memory_id or blob_id in this account",
            {"memory_id": ident, "hint": "list your memories with check_runway()"},
        )
    return rows


def unexpired(now: datetime) -> ColumnElement[bool]:
    """Memories whose ``expires_at`` (if any) is still ahead of ``now``: what recall and
    export may show. An expiry hides a memory at the instant it names — not when the sweep
    next marks it, nor when its blob lapses."""
    return or_(Memory.expires_at.is_(None), Memory.expires_at > now)


def approx_epoch_start(info: EpochInfo, epoch: int, now: datetime) -> datetime:
    """When ``epoch`` begins, estimated from the current epoch's start and length."""
    start = info.started_at or now
    return start + timedelta(seconds=(epoch - info.epoch) * info.duration_seconds)


def human_duration(seconds: float) -> str:
    """'about 9 months', 'about 3 weeks', 'about 5 days', 'about 4 hours'."""
    seconds = max(0.0, seconds)
    units = [
        (365 * 86400, "year"),
        (30 * 86400, "month"),
        (7 * 86400, "week"),
        (86400, "day"),
        (3600, "hour"),
        (60, "minute"),
    ]
    for size, name in units:
        if seconds >= size:
            n = round(seconds / size)
            return f"about {n} {name}{'s' if n != 1 else ''}"
    return "less than a minute"


def epochs_text(n: int) -> str:
    """'1 epoch', '3 epochs': a count of epochs as people write it."""
    return f"{n} epoch" if n == 1 else f"{n} epochs"


def short_duration(seconds: float) -> str:
    """An exact-enough length for an epoch or an interval: '30 s', '1.5 min', '1 h', '14 d'.

    Why not hours everywhere: a 30-s local epoch read "0.0 h"."""
    seconds = max(0.0, float(seconds))
    for size, unit in ((86400, "d"), (3600, "h"), (60, "min")):
        if seconds >= size:
            return f"{seconds / size:.1f}".removesuffix(".0") + f" {unit}"
    return f"{seconds:.1f}".removesuffix(".0") + " s"
