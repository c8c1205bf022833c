"""walkeep.db.Prepared writes exactly what Session.execute writes (it runs the same compiled
statement on the driver's cursor, values through the same bind processors), keeps
SQLAlchemy's exceptions, and applies a statement's literals and constant defaults; and
Database.run_alone runs one as a transaction of its own, on a thread or on the loop."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TypeVar

import anyio
import pytest
from sqlalchemy import func, insert, select, text
from sqlalchemy.exc import IntegrityError, OperationalError

from tests.helpers import write_job_row
from walkeep import ledger
from walkeep.db import Database, Prepared, is_outage
from walkeep.db.models import Memory, WriteJob, table
from walkeep.service.operators import accounts
from walkeep.service.tools.store import _MEMORY_COLUMNS

T = TypeVar("T")

# The columns a store's claim sets on a new memory.
_MEMORY_KEYS = _MEMORY_COLUMNS


def _memory_row(account_id: str, memory_id: str) -> dict[str, object]:
    at = datetime(2026, 12, 1, 14, 3, 7, 123456, tzinfo=UTC)
    return {
        "id": memory_id,
        "account_id": account_id,
        "namespace": "notes",
        "metadata": {"topic": "café ☕", "empty": ""},
        "size_bytes": 42,
        "content_hash": "ab" * 32,
        "status": "storing",
        "cost_mc": 1234,
        "attempt": 2,
        "job_id": None,
        "accepted_at": at,
        "deadline_at": at + timedelta(hours=1),
        "status_changed_at": at,
        "supersedes": "mem_corrected",
        "expires_at": at + timedelta(days=2),
        "expires_epoch": 7,
    }


def test_prepared_rows_are_the_rows_session_execute_writes(db: Database) -> None:
    acct = accounts.create_account(db, "prepared", credits_mc=ledger.usd_to_mc("1"))
    prepared = Prepared(insert(table(Memory)), keys=_MEMORY_KEYS)
    with db.begin() as s:
        s.execute(insert(table(Memory)), _memory_row(acct.account_id, "mem_by_session"))
        prepared.run(s, _memory_row(acct.account_id, "mem_by_prepared"))
    columns = ", ".join(c.name for c in table(Memory).c if c.name != "id")
    with db.read() as s:
        # As stored, not as read back through the ORM's types.
        stored = {
            memory_id: s.execute(
                text(f"SELECT {columns} FROM memories WHERE id = :id"), {"id": memory_id}
            ).one()
            for memory_id in ("mem_by_session", "mem_by_prepared")
        }
        assert stored["mem_by_prepared"] == stored["mem_by_session"]
        assert s.get(Memory, "mem_by_prepared").metadata_ == {"topic": "café ☕", "empty": ""}  # type: ignore[union-attr]
        assert s.scalar(select(Memory.attempt).where(Memory.id == "mem_by_prepared")) == 2


def test_prepared_follows_its_session_from_one_transaction_to_the_next(db: Database) -> None:
    """A session that commits and goes on runs the next statement in its new transaction
    (on its new connection), never on the one it remembered from the last: a rolled-back
    second transaction leaves the first one's row alone and writes nothing."""
    from sqlalchemy.orm import Session

    acct = accounts.create_account(db, "prepared-txns", credits_mc=ledger.usd_to_mc("1"))
    prepared = Prepared(insert(table(Memory)), keys=_MEMORY_KEYS)
    with Session(db.engine) as s:
        prepared.run(s, _memory_row(acct.account_id, "mem_first_txn"))
        s.commit()
        prepared.run(s, _memory_row(acct.account_id, "mem_second_txn"))
        s.rollback()
        prepared.run(s, _memory_row(acct.account_id, "mem_third_txn"))
        s.commit()
    with db.read() as s:
        ids = set(s.scalars(select(Memory.id).where(Memory.account_id == acct.account_id)))
    assert ids == {"mem_first_txn", "mem_third_txn"}


def test_prepared_keeps_sqlalchemys_integrity_error(db: Database) -> None:
    acct = accounts.create_account(db, "dupes", credits_mc=0)
    prepared = Prepared(insert(table(Memory)), keys=_MEMORY_KEYS)
    with db.begin() as s:
        prepared.run(s, _memory_row(acct.account_id, "mem_once"))
    with pytest.raises(IntegrityError), db.begin() as s:
        prepared.run(s, _memory_row(acct.account_id, "mem_once"))


def test_prepared_update_applies_its_literals_and_returns_rows(db: Database) -> None:
    acct = accounts.create_account(db, "literals", credits_mc=ledger.usd_to_mc("1"))
    job = write_job_row(acct.account_id, "job_prepared")
    with db.begin() as s:
        Prepared(insert(table(WriteJob)), keys=tuple(job)).run(s, job)
        bump = Prepared(
            table(WriteJob)
            .update()
            .where(table(WriteJob).c.id == job["id"])
            .values(attempts=table(WriteJob).c.attempts + 5)  # 5: an anonymous literal
            .returning(table(WriteJob).c.attempts)
        )
        assert bump.run(s, {}) == [(5,)]  # attempts started at its default, 0


# --- Database.run_alone: one statement, a transaction of its own ---------------------------


_INSERT_JOB = Prepared(
    insert(table(WriteJob)).returning(table(WriteJob).c.id, table(WriteJob).c.attempts),
    keys=tuple(write_job_row("a", "j")),
)


def _on(where: str, db: Database, fn: Callable[[], T]) -> T:
    """Call ``fn`` on a worker thread's path or, as the MCP store does, on the event loop."""
    if where == "thread":
        return fn()

    async def main() -> T:
        return await db.on_loop(fn)

    return anyio.run(main)


@pytest.mark.parametrize("where", ["thread", "loop"])
def test_run_alone_commits_its_statement_and_returns_its_rows(db: Database, where: str) -> None:
    acct = accounts.create_account(db, f"alone-{where}", credits_mc=0).account_id
    rows = _on(where, db, lambda: db.run_alone(_INSERT_JOB, write_job_row(acct, f"job_{where}")))
    assert [tuple(r) for r in rows] == [(f"job_{where}", 0)]  # RETURNING, with the default
    with db.read() as s:  # committed: another connection sees it
        assert s.scalar(select(WriteJob.idempotency_key).where(WriteJob.id == f"job_{where}")) == (
            f"k-job_{where}"
        )
    with pytest.raises(IntegrityError):  # a duplicate surfaces as SQLAlchemy's error
        _on(where, db, lambda: db.run_alone(_INSERT_JOB, write_job_row(acct, f"job_{where}")))


@pytest.mark.postgres
@pytest.mark.parametrize("where", ["thread", "loop"])
def test_run_alone_gives_its_connection_back_as_it_took_it(db_url: str, where: str) -> None:
    """PostgreSQL: the pooled connection is switched to autocommit for the one statement
    only — a transaction on it afterwards still rolls back — and a connection found dead
    is dropped, so the next call gets a live one."""
    db = Database(db_url, pool_size=1, max_overflow=0)  # one connection: always the same
    acct = accounts.create_account(db, f"pool-{where}", credits_mc=0).account_id
    pid_of = Prepared(select(func.pg_backend_pid()))

    def then_roll_back() -> int:
        db.run_alone(_INSERT_JOB, write_job_row(acct, f"job_first_{where}"))
        with pytest.raises(RuntimeError), db.begin() as s:
            Prepared(insert(table(WriteJob)), keys=tuple(write_job_row("a", "j"))).run(
                s, write_job_row(acct, f"job_undone_{where}")
            )
            raise RuntimeError("roll it back")
        return int(db.run_alone(pid_of, {})[0][0])

    async def scenario() -> None:
        # One event loop throughout: the loop's connections belong to it.
        async def call(fn: Callable[[], T]) -> T:
            return fn() if where == "thread" else await db.on_loop(fn)

        pid = await call(then_roll_back)
        with db.read() as s:
            kept = set(s.scalars(select(WriteJob.id).where(WriteJob.account_id == acct)))
        assert kept == {f"job_first_{where}"}  # the second insert was rolled back

        killer = Database(db_url)
        with killer.begin() as s:
            s.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
        killer.dispose()
        with pytest.raises(OperationalError) as lost:
            await call(lambda: db.run_alone(pid_of, {}))
        assert is_outage(lost.value)  # SERVICE_UNAVAILABLE to a caller, not INTERNAL
        assert int((await call(lambda: db.run_alone(pid_of, {})))[0][0]) != pid
        await db.close_loop()

    try:
        anyio.run(scenario)
    finally:
        db.dispose()


class _Cancelled(BaseException):
    """As asyncio's CancelledError: not an Exception."""


@pytest.mark.postgres
@pytest.mark.parametrize("failure", ["unusable", "cancelled"])
def test_run_alone_never_pools_a_connection_it_could_not_restore(
    db_url: str, failure: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If the connection cannot be switched back out of autocommit (broken, left
    mid-statement, or the call cancelled meanwhile), it is dropped, not pooled: a later
    session would otherwise commit its statements one by one."""
    from walkeep.db import engine

    db = Database(db_url, pool_size=1, max_overflow=0)
    try:
        pid_of = Prepared(select(func.pg_backend_pid()))
        first = int(db.run_alone(pid_of, {})[0][0])

        def fail(conn: object, *, on_loop: bool) -> bool:
            if failure == "cancelled":
                raise _Cancelled
            return False

        with monkeypatch.context() as m:
            m.setattr(engine, "_autocommit_off", fail)
            if failure == "cancelled":
                with pytest.raises(_Cancelled):
                    db.run_alone(pid_of, {})
            else:
                assert int(db.run_alone(pid_of, {})[0][0]) == first
        assert int(db.run_alone(pid_of, {})[0][0]) != first  # a new connection
        acct = accounts.create_account(db, f"restore-{failure}", credits_mc=0).account_id
        with pytest.raises(RuntimeError), db.begin() as s:
            Prepared(insert(table(WriteJob)), keys=tuple(write_job_row("a", "j"))).run(
                s, write_job_row(acct, f"job_undone_{failure}")
            )
            raise RuntimeError("roll it back")
        with db.read() as s:
            assert s.scalar(select(func.count()).where(WriteJob.account_id == acct)) == 0
    finally:
        db.dispose()


# --- Database.begin_direct: SQLite's claim transaction without a Session --------------


def _ids(db: Database, account_id: str) -> set[str]:
    with db.read() as s:
        return set(s.scalars(select(Memory.id).where(Memory.account_id == account_id)))


def test_begin_direct_commits_on_success_and_writes_nothing_on_error(
    sqlite_db: Database,
) -> None:
    acct = accounts.create_account(sqlite_db, "direct", credits_mc=0).account_id
    prepared = Prepared(insert(table(Memory)), keys=_MEMORY_KEYS)
    with sqlite_db.begin_direct() as tx:
        prepared.run(tx, _memory_row(acct, "mem_direct_one"))
        prepared.run(tx, _memory_row(acct, "mem_direct_two"))
    with pytest.raises(RuntimeError), sqlite_db.begin_direct() as tx:
        prepared.run(tx, _memory_row(acct, "mem_direct_undone"))
        raise RuntimeError("the caller changed its mind")
    # A duplicate keeps SQLAlchemy's class and undoes the whole transaction.
    with pytest.raises(IntegrityError), sqlite_db.begin_direct() as tx:
        prepared.run(tx, _memory_row(acct, "mem_direct_three"))
        prepared.run(tx, _memory_row(acct, "mem_direct_one"))
    assert _ids(sqlite_db, acct) == {"mem_direct_one", "mem_direct_two"}
    # The rows are the ones a Session would have written.
    with sqlite_db.read() as s:
        assert s.get(Memory, "mem_direct_one").metadata_ == {"topic": "café ☕", "empty": ""}  # type: ignore[union-attr]
    # Its connection is not left in a transaction: a session writes beside it again.
    with sqlite_db.begin() as s:
        Prepared(insert(table(Memory)), keys=_MEMORY_KEYS).run(
            s, _memory_row(acct, "mem_by_session")
        )
    assert "mem_by_session" in _ids(sqlite_db, acct)


def test_begin_direct_refuses_a_no_wait_caller_while_the_write_lock_is_taken(
    sqlite_db: Database,
) -> None:
    import sqlite3
    import threading

    from walkeep import nowait

    held, release = threading.Event(), threading.Event()

    def writer() -> None:
        with sqlite_db.begin():
            held.set()
            release.wait(10)

    t = threading.Thread(target=writer)
    t.start()
    try:
        assert held.wait(10)
        # This process's lock: refused with a way to hear when it is free.
        with (
            nowait.no_wait(),
            pytest.raises(nowait.WouldWait) as refused,
            sqlite_db.begin_direct(),
        ):
            raise AssertionError("must not get here while the lock is held")
        assert refused.value.on_free is not None
    finally:
        release.set()
        t.join()
    # Another process's lock (a plain connection to the same file): refused at once.
    assert sqlite_db.sqlite_path is not None
    other = sqlite3.connect(sqlite_db.sqlite_path, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        with (
            nowait.no_wait(),
            pytest.raises(nowait.WouldWait, match="another process"),
            sqlite_db.begin_direct(),
        ):
            raise AssertionError("must not get here while the file is locked")
        other.execute("ROLLBACK")
    finally:
        other.close()
    acct = accounts.create_account(sqlite_db, "after", credits_mc=0).account_id
    with nowait.no_wait(), sqlite_db.begin_direct() as tx:  # free again: no refusal
        Prepared(insert(table(Memory)), keys=_MEMORY_KEYS).run(tx, _memory_row(acct, "mem_ok"))
    assert _ids(sqlite_db, acct) == {"mem_ok"}


def test_begin_direct_keeps_no_slot_of_a_small_pool(sqlite_db: Database) -> None:
    """Its connection leaves the pool: a Database of one pooled connection still opens a
    session beside it (else the session would wait out the pool's timeout)."""
    from sqlalchemy.exc import TimeoutError as PoolTimeout

    one = Database(sqlite_db.url, pool_size=1, max_overflow=0, pool_timeout=1)
    try:
        acct = accounts.create_account(one, "small-pool", credits_mc=0).account_id
        with one.begin_direct() as tx:
            Prepared(insert(table(Memory)), keys=_MEMORY_KEYS).run(tx, _memory_row(acct, "m1"))
        with one.begin() as s:  # the pool's one connection is free
            assert s.execute(text("SELECT count(*) FROM memories")).scalar() == 1
        with one.read() as s:
            s.execute(text("SELECT 1"))  # holds the pool's one connection
            with pytest.raises(PoolTimeout), one.read() as t:
                t.execute(text("SELECT 1"))  # and there is no other: the pool is as it was
    finally:
        one.dispose()
