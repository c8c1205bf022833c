"""How a memory leaves service: forgotten, superseded by a correction, or expired.

Three tools and jobs retire memories — ``forget`` (tools/forget.py), a store that
``supersedes`` another, applied when its write lands (jobs/completion.py), and the
sweep when an ``expires_at`` passes (jobs/sweep.py). They share this one function so
what "leaves" means cannot drift between them:

- a landed, visible memory (active or paused) stops renewing: ``no-renew`` when it was
  forgotten or superseded, ``expired`` when its expiry passed — either way it leaves
  recall and export in the same transaction, and ``status_changed_at`` tells the search
  index to drop it (walkeep/index/search.py);
- a memory still being written is marked (``forgotten_at``) and lands as ``no-renew``
  (completion reads the mark), so it never becomes visible;
- an expired memory's bytes leave the account's usage at once (a forgotten or
  superseded one's leave when its blob lapses, as they always have): an expired memory
  is not kept, and the lapse of its blob would never count it again.

Every update is conditional on the memory still being in service, so two callers racing
to retire the same memory (two corrections of one fact) are decided by the database:
exactly one of them changes the row.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from enum import StrEnum

from sqlalchemy import ColumnElement, or_, select, update
from sqlalchemy.orm import Session

from walkeep import usage
from walkeep.db import rowcount
from walkeep.db.models import Memory
from walkeep.lifecycle import IN_FLIGHT, VISIBLE, MemoryStatus


class Why(StrEnum):
    FORGOTTEN = "forgotten"
    SUPERSEDED = "superseded"
    EXPIRED = "expired"


def leave(
    s: Session,
    where: Sequence[ColumnElement[bool]],
    now: datetime,
    why: Why,
    *,
    superseded_by: str | None = None,
) -> int:
    """Retire the memories matching ``where`` that are still in service; how many did.

    Memories already retired (forgotten, superseded, expired, failed) are left as they
    are: the caller learns from the count whether it was the one that retired them."""
    values: dict[str, object] = {"status_changed_at": now}
    if why is Why.EXPIRED:
        values["status"] = MemoryStatus.EXPIRED
    else:
        values["status"] = MemoryStatus.NO_RENEW
        values["forgotten_at"] = now
    if superseded_by is not None:
        values["superseded_by"] = superseded_by
    in_service = [*where, Memory.superseded_by.is_(None)]
    visible = [*in_service, Memory.status.in_(list(VISIBLE))]
    freed = usage.kept_bytes(s, visible) if why is Why.EXPIRED else []
    n = rowcount(s.execute(update(Memory).where(*visible).values(**values)))
    if freed:
        # After the memory rows, as the sweep and registration lock them: counters
        # first, then the accounts.
        usage.release_each(s, freed)
    if why is not Why.EXPIRED:
        # Still being written: it lands retired (completion reads forgotten_at).
        marked: dict[str, object] = {"forgotten_at": now}
        if superseded_by is not None:
            marked["superseded_by"] = superseded_by
        n += rowcount(
            s.execute(
                update(Memory)
                .where(
                    *in_service,
                    Memory.status.in_(list(IN_FLIGHT)),
                    Memory.forgotten_at.is_(None),
                )
                .values(**marked)
            )
        )
    return n


def supersede(s: Session, account_id: str, old_id: str, new_id: str, now: datetime) -> bool:
    """Retire ``old_id`` in favour of ``new_id``, in the transaction that registers the
    new write; False, changing nothing, if it is no longer in service (another correction
    won, or it was forgotten or expired meanwhile).

    The conditional UPDATE decides a race: on PostgreSQL the second of two concurrent
    updates of the row waits for the first and then finds ``superseded_by`` set. The
    identical copies sharing the old one's blob_id leave with it — otherwise its content
    would stay recallable through them — but never the new memory itself (identical
    content corrects nothing, yet it must not retire itself)."""
    won = leave(
        s,
        [
            Memory.id == old_id,
            Memory.account_id == account_id,
            or_(Memory.expires_at.is_(None), Memory.expires_at > now),
        ],
        now,
        Why.SUPERSEDED,
        superseded_by=new_id,
    )
    if not won:
        return False
    blob_id = s.scalar(select(Memory.blob_id).where(Memory.id == old_id))
    if blob_id is not None:
        leave(
            s,
            [Memory.account_id == account_id, Memory.blob_id == blob_id, Memory.id != new_id],
            now,
            Why.SUPERSEDED,
            superseded_by=new_id,
        )
    return True
