"""Renewal: keep every active, funded memory's blob paid ahead of time.

(The renewal pass itself is added with the worker; this module already owns
pausing and resuming because crediting an account must resume it.)
"""

from __future__ import annotations

from sqlalchemy import update
from sqlalchemy.orm import Session

from walkeep import ledger
from walkeep.db.models import Memory
from walkeep.lifecycle import MemoryStatus


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
