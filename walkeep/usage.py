"""Per-account usage for quotas: bytes kept and stores accepted per UTC day.

Counters live on the ``accounts`` row and change in the same transaction as
the memory status change that causes them, so a quota check is O(1) under
the account lock. What counts as kept: every memory that is not ``failed``
or ``expired`` (a forgotten memory still occupies storage until it lapses).
``recount`` rebuilds the byte counter from the memories (audits, tests).
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BindParameter, bindparam, case, func, or_, select, update
from sqlalchemy.orm import Session

from walkeep.db.models import Account, Memory, table
from walkeep.errors import NotFound, QuotaExceeded
from walkeep.lifecycle import MemoryStatus

NOT_KEPT = (MemoryStatus.FAILED, MemoryStatus.EXPIRED)


def day_number(when: datetime) -> int:
    return when.toordinal()


# Built once (this runs on every store; see ledger.py on why that matters).
_A = table(Account)
_P_SIZE: BindParameter[int] = bindparam("p_size")
_P_TODAY: BindParameter[int] = bindparam("p_today")
# Check and count in one conditional UPDATE. It is also what takes the account's
# row lock on PostgreSQL (SQLite's BEGIN IMMEDIATE already serialises writers),
# held from here to commit: fewer round trips under that lock is what lets one
# busy account's concurrent stores through faster.
FITS = (
    _A.c.usage_bytes + _P_SIZE <= bindparam("p_max_bytes"),
    or_(_A.c.usage_day != _P_TODAY, _A.c.usage_day_stores < bindparam("p_max_stores")),
)
"""The quota condition, for statements that count a store along with other changes to the
account row (``ledger.hold_statement``); its parameters come from ``params``."""
COUNT = {
    "usage_bytes": _A.c.usage_bytes + _P_SIZE,
    "usage_day_stores": case((_A.c.usage_day == _P_TODAY, _A.c.usage_day_stores + 1), else_=1),
    "usage_day": _P_TODAY,
}
"""The counting itself (SET clauses) that goes with ``FITS``."""
_ADD = update(_A).where(_A.c.id == bindparam("p_account"), *FITS).values(**COUNT).returning(_A.c.id)
_USAGE = select(_A.c.usage_bytes, _A.c.usage_day, _A.c.usage_day_stores).where(
    _A.c.id == bindparam("p_account")
)
# NO KEY UPDATE, the lock PostgreSQL's own UPDATE takes: it does not conflict with
# the KEY SHARE locks that foreign-key inserts take, which FOR UPDATE would.
_USAGE_LOCKED = _USAGE.with_for_update(key_share=True)


def counting(
    size: int, now: datetime, *, max_total_bytes: int, max_stores_per_day: int
) -> dict[str, int]:
    """The parameters of ``FITS`` and ``COUNT`` for one store of ``size`` bytes at ``now``."""
    return {
        "p_size": size,
        "p_today": day_number(now),
        "p_max_bytes": max_total_bytes,
        "p_max_stores": max_stores_per_day,
    }


def check_and_add(
    session: Session,
    account_id: str,
    size: int,
    now: datetime,
    *,
    max_total_bytes: int,
    max_stores_per_day: int,
) -> None:
    """Count one new store of ``size`` bytes, or refuse it (QuotaExceeded) and count
    nothing. Exact under concurrency: the check and the count are one UPDATE."""
    today = day_number(now)
    params = {
        "p_account": account_id,
        **counting(
            size, now, max_total_bytes=max_total_bytes, max_stores_per_day=max_stores_per_day
        ),
    }
    if session.execute(_ADD, params).first() is not None:
        return
    # Refused, or no such account. Re-read the row under the account lock (it may
    # have changed since: PostgreSQL's READ COMMITTED), then say which limit.
    postgres = session.get_bind().dialect.name == "postgresql"
    row = session.execute(_USAGE_LOCKED if postgres else _USAGE, {"p_account": account_id}).first()
    if row is None:
        raise NotFound("unknown account", {"account_id": account_id})
    used_bytes, day, day_stores = int(row[0]), int(row[1]), int(row[2])
    if used_bytes + size > max_total_bytes:
        raise QuotaExceeded(
            f"storing this would bring the account to {used_bytes + size} bytes; "
            f"the limit is {max_total_bytes}",
            {"limit": "max_total_bytes", "limit_bytes": max_total_bytes, "used_bytes": used_bytes},
        )
    if day == today and day_stores >= max_stores_per_day:
        raise QuotaExceeded(
            f"daily store limit of {max_stores_per_day} reached (resets at 00:00 UTC)",
            {
                "limit": "max_stores_per_day",
                "limit_count": max_stores_per_day,
                "used_count": day_stores,
            },
        )
    # Usage was released between the two statements; we hold the lock now.
    if session.execute(_ADD, params).first() is None:
        raise RuntimeError(f"usage of {account_id} changed under its row lock")


def release(session: Session, account_id: str, size: int) -> None:
    """A memory stopped counting (its write failed, or it lapsed)."""
    session.execute(
        update(Account)
        .where(Account.id == account_id)
        .values(usage_bytes=case((Account.usage_bytes > size, Account.usage_bytes - size), else_=0))
    )


def kept_bytes(session: Session, memory_filter: list) -> list[tuple[str, int]]:  # type: ignore[type-arg]
    """What the memories matching ``memory_filter`` count against their accounts, per
    account in id order: read before they change state, released (``release_each``)
    after, so that the memories' rows (and the per-account counters their trigger
    updates) are locked before the accounts', the order registration takes."""
    rows = session.execute(
        select(Memory.account_id, func.sum(Memory.size_bytes))
        .where(*memory_filter, Memory.status.not_in(list(NOT_KEPT)))
        .group_by(Memory.account_id)
        .order_by(Memory.account_id)
    ).all()
    return [(account_id, int(total or 0)) for account_id, total in rows]


def release_each(session: Session, freed: list[tuple[str, int]]) -> None:
    for account_id, size in freed:
        release(session, account_id, size)


def recount(session: Session, account_id: str) -> int:
    return int(
        session.scalar(
            select(func.coalesce(func.sum(Memory.size_bytes), 0)).where(
                Memory.account_id == account_id, Memory.status.not_in(list(NOT_KEPT))
            )
        )
        or 0
    )
