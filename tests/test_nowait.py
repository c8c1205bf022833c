"""Stores tried on the event loop (walkeep/nowait.py): they never wait there. A call that
would have waited for this process's own write lock awaits its release and tries again on
the loop; one that would have waited for anything else runs again on a worker thread.
Either way it is admitted once, charged once."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import anyio
import pytest
from sqlalchemy import event, text

from walkeep import ledger, nowait
from walkeep.bootstrap import build_runtime
from walkeep.clock import ManualClock
from walkeep.db import Database
from walkeep.db.engine import SQLITE_BUSY_TIMEOUT_MS
from walkeep.mcp.server import Caller, build_mcp
from walkeep.service import sealed
from walkeep.service.operators import accounts
from walkeep.service.tools import store
from walkeep.service.tools.ratelimit import limiter


@contextmanager
def write_lock_held(db: Database) -> Iterator[threading.Event]:
    """Another thread of this process in a write transaction until the yielded event is
    set (or 10 s pass: then ``timed_out`` says nobody released it in time)."""
    held, release = threading.Event(), threading.Event()
    outcome: dict[str, bool] = {}

    def hold() -> None:
        with db.begin():
            held.set()
            outcome["timed_out"] = not release.wait(10)

    t = threading.Thread(target=hold)
    t.start()
    assert held.wait(10)
    try:
        yield release
    finally:
        release.set()
        t.join()
    release.timed_out = outcome["timed_out"]  # type: ignore[attr-defined]


def test_no_wait_refuses_this_process_write_lock_when_taken(sqlite_db: Database) -> None:
    db = sqlite_db
    with (
        write_lock_held(db),
        nowait.no_wait(),
        pytest.raises(nowait.WouldWait, match="write lock"),
        db.begin(),
    ):
        raise AssertionError("must not get here while the lock is held")
    with nowait.no_wait(), db.begin() as s:  # free again: no refusal
        assert s.execute(text("SELECT 1")).scalar() == 1


def test_no_wait_refuses_another_process_lock_without_the_busy_timeout(
    sqlite_db: Database,
) -> None:
    one = Database(sqlite_db.url, pool_size=1, max_overflow=0)  # so the next begin reuses it
    assert sqlite_db.sqlite_path is not None
    other = sqlite3.connect(sqlite_db.sqlite_path, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")  # what another walkeep process would hold
        started = time.monotonic()
        with (
            nowait.no_wait(),
            pytest.raises(nowait.WouldWait, match="another process"),
            one.begin() as s,
        ):
            s.execute(text("SELECT 1"))  # SQLite's BEGIN IMMEDIATE runs here
            raise AssertionError("must not get here while the file is locked")
        # Refused at once, not after SQLite's busy handler gave up (30 s).
        assert time.monotonic() - started < SQLITE_BUSY_TIMEOUT_MS / 1000 / 6
        other.execute("ROLLBACK")
        # The connection it tried with is back to waiting normally for other callers.
        with one.begin() as s:
            assert s.execute(text("PRAGMA busy_timeout")).scalar() == SQLITE_BUSY_TIMEOUT_MS
    finally:
        other.close()
        one.dispose()


def test_a_connection_switches_its_busy_timeout_only_when_the_caller_changes(
    sqlite_db: Database,
) -> None:
    one = Database(sqlite_db.url, pool_size=1, max_overflow=0)  # every begin: one connection
    pragmas: list[str] = []

    def seen(statement: str) -> None:  # every statement SQLite itself runs
        if statement.startswith("PRAGMA busy_timeout="):  # a switch, not a question
            pragmas.append(statement)

    def trace(dbapi_conn: sqlite3.Connection, _record: object) -> None:
        dbapi_conn.set_trace_callback(seen)

    event.listen(one.engine, "connect", trace)
    try:
        for _ in range(3):  # the event loop's stores, back to back
            with nowait.no_wait(), one.begin() as s:
                s.execute(text("SELECT 1"))
        assert pragmas == ["PRAGMA busy_timeout=0"]  # once, not twice per store
        with one.read() as s:  # then a thread's read: waits normally again
            assert s.execute(text("PRAGMA busy_timeout")).scalar() == SQLITE_BUSY_TIMEOUT_MS
        with one.begin() as s:
            assert s.execute(text("PRAGMA busy_timeout")).scalar() == SQLITE_BUSY_TIMEOUT_MS
        assert pragmas[1:] == [f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}"]
    finally:
        one.dispose()


def test_outside_no_wait_nothing_is_refused() -> None:
    nowait.refuse("anything")  # returns: only no_wait() turns waiting into WouldWait
    with nowait.no_wait():
        assert nowait.active()
        with pytest.raises(nowait.WouldWait):
            nowait.refuse("anything")
    assert not nowait.active()


def test_store_may_run_inline_only_where_nothing_leaves_the_machine(rt) -> None:  # type: ignore[no-untyped-def]
    assert store.may_run_inline(rt)  # the self-run relayer, on either database
    rt.relayer.stage = None  # a relayer that accepts over HTTP: on a thread
    assert not store.may_run_inline(rt)


def test_the_write_lock_calls_back_once_it_is_free(sqlite_db: Database) -> None:
    db = sqlite_db
    calls: list[str] = []
    db._call_when_free(lambda: calls.append("free"))  # free already: called at once
    assert calls == ["free"]
    with write_lock_held(db) as release:
        db._call_when_free(lambda: calls.append("released"))
        assert calls == ["free"]  # not while another thread holds it
        release.set()
    assert calls == ["free", "released"]
    with db.begin():  # later releases call nobody: each callback runs once
        pass
    assert calls == ["free", "released"]


@pytest.fixture
def inline_rt(settings, clock: ManualClock, sqlite_db: Database):  # type: ignore[no-untyped-def]
    """A runtime that runs stores inline, with a rate limit of one store: a second
    admission of the same call would find no token."""
    settings.rate_limits = {"store": 1}
    rt = build_runtime(settings, clock=clock, database=sqlite_db, with_completer=False)
    assert store.may_run_inline(rt)
    assert rt.relayer.health().ok  # a fresh probe, as a running server has: not refused
    return rt


@pytest.fixture
def thread_hops(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Names of the calls the MCP layer sends to a worker thread."""
    hops: list[str] = []
    real = anyio.to_thread.run_sync

    async def counted(fn, *args, **kwargs):  # type: ignore[no-untyped-def]
        hops.append(getattr(getattr(fn, "func", fn), "__name__", repr(fn)))
        return await real(fn, *args, **kwargs)

    monkeypatch.setattr(anyio.to_thread, "run_sync", counted)
    return hops


async def _store_while(mcp, blocked: Callable[[], None], release: Callable[[], None]) -> object:  # type: ignore[no-untyped-def]
    """Call store in a task; once every task is blocked (the loop is free), check
    ``blocked`` and release the blocker; return the call's result."""
    results: list[object] = []
    async with anyio.create_task_group() as tg:

        async def call() -> None:
            results.append(
                await mcp.call_tool("store", {"content": "a fact", "request_id": "req-inline-1"})
            )

        tg.start_soon(call)
        await anyio.wait_all_tasks_blocked()  # the call is parked, the loop is free
        assert not results
        blocked()
        release()
    (result,) = results
    return result


def _assert_stored_and_charged_once(rt, result: object, account_id: str) -> None:  # type: ignore[no-untyped-def]
    assert not result.is_error, result  # type: ignore[attr-defined]
    assert result.structured_content["status"] == "storing"  # type: ignore[attr-defined]
    tokens, _ = limiter(rt)._buckets[(account_id, "store")]
    assert tokens == 0.0


def test_a_store_refused_this_process_lock_awaits_it_on_the_loop(
    inline_rt, thread_hops: list[str]
) -> None:  # type: ignore[no-untyped-def]
    """Another thread of this process holds the write lock: the store parks without
    blocking the loop (the test's own coroutine releases the lock) and, once released,
    runs on the loop — not on a worker thread, where it used to hold the lock next,
    slowly, and push the stores behind it onto threads too."""
    rt = inline_rt
    acct = accounts.create_account(rt.db, "inline", credits_mc=ledger.usd_to_mc("10"))
    rt.relayer.keyring.encrypt(acct.account_id, b"")  # loaded, as after its first store
    sealed.remember_namespace(rt, acct.account_id, "default")  # recorded, likewise
    mcp = build_mcp(lambda: rt, transport="stdio", fixed_caller=Caller(acct.account_id))

    async def go() -> object:
        with write_lock_held(rt.db) as release:
            return await _store_while(mcp, lambda: None, release.set)

    result = anyio.run(go)
    _assert_stored_and_charged_once(rt, result, acct.account_id)
    assert thread_hops == []


def test_a_store_refused_another_process_lock_runs_on_a_thread_once(
    inline_rt, thread_hops: list[str]
) -> None:  # type: ignore[no-untyped-def]
    """Another process holds the database file: nothing says when it lets go, so the
    store runs again on a worker thread, which waits in SQLite's busy handler."""
    rt = inline_rt
    acct = accounts.create_account(rt.db, "inline", credits_mc=ledger.usd_to_mc("10"))
    rt.relayer.keyring.encrypt(acct.account_id, b"")  # loaded, as after its first store
    sealed.remember_namespace(rt, acct.account_id, "default")  # recorded, likewise
    mcp = build_mcp(lambda: rt, transport="stdio", fixed_caller=Caller(acct.account_id))
    assert rt.db.sqlite_path is not None
    other = sqlite3.connect(rt.db.sqlite_path, isolation_level=None, check_same_thread=False)
    try:
        other.execute("BEGIN IMMEDIATE")  # what another walkeep process would hold

        def on_a_thread() -> None:
            assert thread_hops == ["store"]

        def let_go() -> None:
            other.execute("ROLLBACK")

        result = anyio.run(_store_while, mcp, on_a_thread, let_go)
    finally:
        other.close()
    _assert_stored_and_charged_once(rt, result, acct.account_id)


@pytest.mark.postgres
def test_a_postgresql_store_awaits_its_statement_on_the_loop(rt, thread_hops: list[str]) -> None:  # type: ignore[no-untyped-def]
    """On PostgreSQL the store runs on the loop too, its statement awaited (Database.on_loop):
    while another transaction holds the account's row, the claim waits on the server, the
    loop stays free (the test's own coroutine lets go), and nothing goes to a thread."""
    acct = accounts.create_account(rt.db, "loop", credits_mc=ledger.usd_to_mc("10"))
    mcp = build_mcp(lambda: rt, transport="stdio", fixed_caller=Caller(acct.account_id))
    assert rt.relayer.health().ok  # a fresh probe, as a running server has: not refused
    rt.relayer.keyring.encrypt(acct.account_id, b"")  # loaded, as after its first store
    sealed.remember_namespace(rt, acct.account_id, "default")  # recorded, likewise
    released_by: list[str] = []
    guard = threading.Lock()
    with rt.db.engine.connect() as other:

        def release(by: str) -> None:
            with guard:
                if not released_by:
                    released_by.append(by)
                    other.rollback()

        other.begin()
        other.execute(
            text("SELECT 1 FROM accounts WHERE id = :id FOR UPDATE"), {"id": acct.account_id}
        )
        # Were the loop blocked, the coroutine could never let go: a timer does, and the
        # test fails instead of hanging.
        fallback = threading.Timer(20.0, release, ("timer",))
        fallback.start()
        try:
            result = anyio.run(_store_while, mcp, lambda: None, lambda: release("the loop"))
        finally:
            fallback.cancel()
    assert released_by == ["the loop"]
    assert not result.is_error, result  # type: ignore[attr-defined]
    assert result.structured_content["status"] == "storing"  # type: ignore[attr-defined]
    assert thread_hops == []
    with rt.db.read() as s:
        held, cost = s.execute(
            text(
                "SELECT a.held_mc, m.cost_mc FROM memories m JOIN accounts a "
                "ON a.id = m.account_id WHERE m.id = :m"
            ),
            {"m": result.structured_content["memory_id"]},  # type: ignore[attr-defined]
        ).one()
    assert held == cost > 0  # held once


@pytest.mark.postgres
def test_an_accounts_first_stores_in_parallel_do_not_stop_the_loop(
    rt, thread_hops: list[str]
) -> None:  # type: ignore[no-untyped-def]
    """Regression: the first stores of an account in a process, in parallel on the loop.
    The first loaded the account's data key under the account's lock, awaiting its read
    on the loop; the second waited for that lock on the loop's own thread, so the read
    could never finish: the whole server hung. Now a key not loaded yet sends the call to
    a thread (once per account), and the stores behind it run on the loop."""
    acct = accounts.create_account(rt.db, "parallel", credits_mc=ledger.usd_to_mc("10"))
    mcp = build_mcp(lambda: rt, transport="stdio", fixed_caller=Caller(acct.account_id))
    assert rt.relayer.health().ok  # a fresh probe, as a running server has: not refused
    results: list[object] = []

    async def burst() -> None:
        async with anyio.create_task_group() as tg:
            for n in range(4):

                async def call(n: int = n) -> None:
                    args = {"content": f"fact {n}", "request_id": f"req-parallel-{n}"}
                    results.append(await mcp.call_tool("store", args))

                tg.start_soon(call)

    # On a thread of its own, so that a hung loop fails the test instead of hanging it.
    runner = threading.Thread(target=anyio.run, args=(burst,), daemon=True)
    runner.start()
    runner.join(60)
    assert not runner.is_alive(), "the event loop hung"
    assert len(results) == 4
    assert all(not r.is_error for r in results), results  # type: ignore[attr-defined]
    assert 1 <= len(thread_hops) <= 4  # those that found the key not loaded yet
    with rt.db.read() as s:
        stored = s.execute(
            text("SELECT count(*) FROM memories WHERE account_id = :a"), {"a": acct.account_id}
        ).scalar()
    assert stored == 4
