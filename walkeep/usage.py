"""Per-account usage for quotas: bytes kept and stores accepted per UTC day.

Counters live on the ``accounts`` row and change in the same transaction as
the memory status change that causes them, so a quota check is O(1) under
the account lock. What counts as kept: every memory that is not ``failed``
or ``expired`` (a forgotten memory still occupies storage until it lapses).
``recount`` rebuilds the byte counter from the memories (audits, tests).
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import bindparam, case, func, select, update
from sqlalchemy.orm import Session

from walkeep.db.models import Account, Memory, table
from walkeep.errors import NotFound, QuotaExceeded
from walkeep.lifecycle import MemoryStatus

NOT_KEPT = (MemoryStatus.FAILED, MemoryStatus.EXPIRED)


def day_number(when: datetime) -> int:
    return when.toordinal()


# Built once (this runs on every store; see ledger.py on why that matters).
_A = table(Account)
_USAGE = select(_A.c.usage_bytes, _A.c.usage_day, _A.c.usage_day_stores).where(
    _A.c.id == bindparam("p_account")
)
# Serialise this account's accepts on PostgreSQL (SQLite: BEGIN IMMEDIATE already
# does). NO KEY UPDATE, like PostgreSQL's own lock for a non-key UPDATE: it does
# not conflict with the KEY SHARE locks that foreign-key inserts take (e.g. this
# transaction's request row), which FOR UPDATE would — a deadlock.
_USAGE_LOCKED = _USAGE.with_for_update(key_share=True)
_COUNT = (
    update(_A)
    .where(_A.c.id == bindparam("p_account"))
    .values(
        usage_bytes=bindparam("p_bytes"),
        usage_day=bindparam("p_day"),
        usage_day_stores=bindparam("p_day_stores"),
    )
)


def check_and_add(
    session: Session,
    account_id: str,
    size: int,
    now: datetime,
    *,
    max_total_bytes: int,
    max_stores_per_day: int,
) -> None:
    """Refuse (QuotaExceeded) or count one new store of ``size`` bytes.

    The caller holds the account lock (row lock on PostgreSQL, the database
    write lock on SQLite), so check-then-add is exact.
    """
    postgres = session.get_bind().dialect.name == "postgresql"
    row = session.execute(_USAGE_LOCKED if postgres else _USAGE, {"p_account": account_id}).first()
    if row is None:
        raise NotFound("unknown account", {"account_id": account_id})
    used_bytes, day, day_stores = int(row[0]), int(row[1]), int(row[2])
    today = day_number(now)
    if day != today:
        day_stores = 0
    if used_bytes + size > max_total_bytes:
        raise QuotaExceeded(
            f"storing this would bring the account to {used_bytes + size} bytes; "
            f"the limit is {max_total_bytes}",
            {"limit": "max_total_bytes", "limit_bytes": max_total_bytes, "used_bytes": used_bytes},
        )
    if day_stores >= max_stores_per_day:
        raise QuotaExceeded(
            f"daily store limit of {max_stores_per_day} reached (resets at 00:00 UTC)",
            {
                "limit": "max_stores_per_day",
                "limit_count": max_stores_per_day,
                "used_count": day_stores,
            },
        )
    session.execute(
        _COUNT,
        {
            "p_account": account_id,
            "p_bytes": used_bytes + size,
            "p_day": today,
            "p_day_stores": day_stores + 1,
        },
    )


def release(session: Session, account_id: str, size: int) -> None:
    """A memory stopped counting (its write failed, or it lapsed)."""
    session.execute(
        update(Account)
        .where(Account.id == account_id)
        .values(usage_bytes=case((Account.usage_bytes > size, Account.usage_bytes - size), else_=0))
    )


def release_many(session: Session, memory_filter: list) -> None:  # type: ignore[type-arg]
    """Release the bytes of the memories matching ``memory_filter`` (before they change state)."""
    rows = session.execute(
        select(Memory.account_id, func.sum(Memory.size_bytes))
        .where(*memory_filter, Memory.status.not_in(list(NOT_KEPT)))
        .group_by(Memory.account_id)
    ).all()
    for account_id, total in rows:
        release(session, account_id, int(total or 0))


def recount(session: Session, account_id: str) -> int:
    return int(
        session.scalar(
            select(func.coalesce(func.sum(Memory.size_bytes), 0)).where(
                Memory.account_id == account_id, Memory.status.not_in(list(NOT_KEPT))
            )
        )
        or 0
    )
