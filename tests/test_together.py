"""walkeep/db/together.py: statements that arrive while one is in flight go to PostgreSQL
as one pipeline — one transaction — and each caller still sees only its own rows or its
own error; a stalled account holds up the others for at most LOCK_WAIT_MS; a store's
ledger guarantees hold through it."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import anyio
import pytest
from sqlalchemy import func, insert, text, update
from sqlalchemy.exc import IntegrityError

from tests.helpers import write_job_row
from walkeep import metrics, pricing
from walkeep.db import Database, Prepared, together
from walkeep.db.models import Account, WriteJob, table
from walkeep.db.together import MAX_TOGETHER, Aborted, Statement, Together
from walkeep.mcp.server import Caller, build_mcp
from walkeep.service import sealed
from walkeep.service.operators import accounts

# --- the queue itself, with a stand-in for PostgreSQL --------------------------------------


class _Server:
    """Records each pipeline ``Together`` sends; fails one whose SQL says so."""

    def __init__(self) -> None:
        self.pipelines: list[list[str]] = []

    async def send(self, statements: list[Statement]) -> list[list[Any]]:
        self.pipelines.append([sql for sql, _ in statements])
        if any(sql.startswith("fail") for sql, _ in statements):
            raise RuntimeError(f"{len(statements)} statement(s) failed")
        return [[(sql, dict(values))] for sql, values in statements]


def _run_while_leading(together: Together, joiners: list[tuple[str, str]]) -> list[object]:
    """Join ``joiners`` (sql, key) while a leader is in flight, then release the leader;
    each joiner's rows or exception, in the order given."""

    async def main() -> list[object]:
        together.lead()
        tasks = [
            asyncio.ensure_future(together.join((sql, {"n": i}), key=key))
            for i, (sql, key) in enumerate(joiners)
        ]
        await asyncio.sleep(0)  # every joiner queued behind the leader
        together.release()
        return list(await asyncio.gather(*tasks, return_exceptions=True))

    return asyncio.run(main())


def test_what_queues_behind_the_statement_in_flight_goes_out_as_one_pipeline_in_key_order() -> None:
    server = _Server()
    together = Together(server.send)
    joiners = [("c1", "acct_c"), ("a1", "acct_a"), ("c2", "acct_c"), ("b1", "acct_b")]
    results = _run_while_leading(together, joiners)
    # One pipeline, sorted by the row each locks first; one key's in the order they came.
    assert server.pipelines == [["a1", "b1", "c1", "c2"]]
    assert results == [
        [("c1", {"n": 0})],
        [("a1", {"n": 1})],
        [("c2", {"n": 2})],
        [("b1", {"n": 3})],
    ]  # each its own rows
    assert not together.busy  # idle again: the next caller leads


def test_a_leader_nobody_joined_leaves_it_idle() -> None:
    together = Together(_Server().send)
    together.lead()
    assert together.busy
    together.release()
    assert not together.busy


def test_a_long_queue_goes_out_in_pipelines_of_bounded_length() -> None:
    server = _Server()
    joiners = [(f"s{i:03}", f"k{i:03}") for i in range(MAX_TOGETHER + 5)]
    results = _run_while_leading(Together(server.send), joiners)
    assert [len(p) for p in server.pipelines] == [MAX_TOGETHER, 5]
    assert all(isinstance(r, list) for r in results)


@pytest.mark.parametrize("pipeline", [["ok", "fail"], ["fail"]])
def test_a_failed_pipeline_tells_every_statement_in_it_to_run_again_alone(
    pipeline: list[str],
) -> None:
    server = _Server()
    results = _run_while_leading(Together(server.send), [(sql, "k") for sql in pipeline])
    # Whose error it was, or whether a lock wait ran out, each finds out alone.
    assert [type(r) for r in results] == [Aborted] * len(pipeline)


def test_a_caller_that_gives_up_does_not_take_the_others_pipeline_with_it() -> None:
    server = _Server()
    together = Together(server.send)

    async def main() -> object:
        together.lead()
        gone = asyncio.ensure_future(together.join(("gone", {}), key="a"))
        kept = asyncio.ensure_future(together.join(("kept", {}), key="b"))
        await asyncio.sleep(0)
        gone.cancel()  # a client disconnected while its statement waited
        together.release()
        return await kept

    assert asyncio.run(main()) == [("kept", {})]
    assert server.pipelines == [["gone", "kept"]]  # its statement still ran: replay finds it


# --- on PostgreSQL ---------------------------------------------------------------------------

_A = table(Account)
_J = table(WriteJob)
_TOUCH = Prepared(
    update(_A)
    .where(_A.c.id == text(":a").bindparams(a=None))
    .values(held_mc=_A.c.held_mc)
    .returning(func.txid_current())
)
_JOB_COLUMNS = tuple(write_job_row("a", "j"))
_INSERT_JOB = Prepared(insert(_J).returning(_J.c.id, func.txid_current()), keys=_JOB_COLUMNS)


async def _until(condition: Callable[[], bool]) -> None:
    """Let the loop run (checkpoints, not time) until ``condition`` holds."""
    for _ in range(10_000):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("the loop never got there")


async def _queue_behind_a_locked_row(
    db: Database,
    account_id: str,
    leader: Callable[[], Any],
    joiners: list[Callable[[], Any]],
) -> tuple[object, list[object]]:
    """Run ``leader`` on the loop while another connection holds ``account_id``'s row, so
    that it stays in flight while every ``joiner`` queues behind it; then let go. The
    leader's result and each joiner's result or exception."""
    with db.engine.connect() as holder:
        holder.begin()
        holder.execute(text("SELECT 1 FROM accounts WHERE id = :a FOR UPDATE"), {"a": account_id})
        first = asyncio.ensure_future(db.on_loop(leader))
        await _until(lambda: db._together is not None and db._together.busy)
        queue = db._together
        assert queue is not None
        rest = [asyncio.ensure_future(db.on_loop(j)) for j in joiners]
        await _until(lambda: queue.queued == len(joiners))
        holder.rollback()
    led = await first
    return led, list(await asyncio.gather(*rest, return_exceptions=True))


def _went_out(since: dict[str, int] | None = None) -> dict[str, int]:
    """``walkeep_db_statements_together_total`` by how, since ``since``."""
    counts = {
        how: int(
            metrics.REGISTRY.get_sample_value("walkeep_db_statements_together_total", {"how": how})
            or 0
        )
        for how in ("alone", "pipelined", "rerun")
    }
    return {how: n - (since or {}).get(how, 0) for how, n in counts.items()}


def _on_a_loop(db: Database, scenario: Callable[[], Any]) -> Any:
    async def main() -> Any:
        try:
            return await scenario()
        finally:
            await db.close_loop()

    return asyncio.run(main())


@pytest.fixture
def patient(monkeypatch: pytest.MonkeyPatch) -> None:
    """Statements sent together wait a minute for a lock, not LOCK_WAIT_MS: these tests
    hold a row to keep one in flight while others queue behind it."""
    monkeypatch.setattr(together, "LOCK_WAIT_MS", 60_000)


@pytest.mark.postgres
@pytest.mark.usefixtures("patient")
def test_statements_queued_behind_one_in_flight_commit_as_one_transaction(db: Database) -> None:
    acct = accounts.create_account(db, "together", credits_mc=0).account_id
    before = _went_out()

    def joiner(n: int) -> Callable[[], Any]:
        return lambda: db.run_together(_INSERT_JOB, write_job_row(acct, f"job_{n}"), key=acct)

    led, joined = _on_a_loop(
        db,
        lambda: _queue_behind_a_locked_row(
            db,
            acct,
            lambda: db.run_together(_TOUCH, {"a": acct}, key=acct),
            [joiner(n) for n in range(3)],
        ),
    )
    (leader_tx,) = led[0]
    assert [rows[0][0] for rows in joined] == ["job_0", "job_1", "job_2"]  # each its own rows
    txids = {rows[0][1] for rows in joined}
    assert len(txids) == 1 and leader_tx not in txids  # the three: one transaction
    assert _went_out(since=before) == {"alone": 1, "pipelined": 3, "rerun": 0}
    with db.read() as s:
        assert (
            s.scalar(text("SELECT count(*) FROM write_jobs WHERE account_id = :a"), {"a": acct})
            == 3
        )


@pytest.mark.postgres
@pytest.mark.usefixtures("patient")
def test_one_statements_error_is_its_own_and_the_others_commit_alone(db: Database) -> None:
    acct = accounts.create_account(db, "together-error", credits_mc=0).account_id
    before = _went_out()
    with db.begin() as s:  # job_dup exists: inserting it again fails
        s.execute(insert(_J), write_job_row(acct, "job_dup"))

    def joiner(job_id: str) -> Callable[[], Any]:
        return lambda: db.run_together(_INSERT_JOB, write_job_row(acct, job_id), key=acct)

    _, joined = _on_a_loop(
        db,
        lambda: _queue_behind_a_locked_row(
            db,
            acct,
            lambda: db.run_together(_TOUCH, {"a": acct}, key=acct),
            [joiner("job_x"), joiner("job_dup"), joiner("job_y")],
        ),
    )
    assert isinstance(joined[1], IntegrityError)  # its own error, as SQLAlchemy's
    x, y = joined[0], joined[2]
    assert isinstance(x, list) and isinstance(y, list)
    assert (x[0][0], y[0][0]) == ("job_x", "job_y")
    assert x[0][1] != y[0][1]  # undone with the pipeline, then each ran alone
    with db.read() as s:
        kept = set(s.scalars(text("SELECT id FROM write_jobs WHERE account_id = :a"), {"a": acct}))
    assert kept == {"job_dup", "job_x", "job_y"}
    assert _went_out(since=before) == {"alone": 1, "pipelined": 0, "rerun": 3}


@pytest.mark.postgres
@pytest.mark.usefixtures("patient")
def test_stores_claimed_together_keep_the_ledgers_guarantees(rt) -> None:  # type: ignore[no-untyped-def]
    """Eight stores queue behind a ninth while the account's row is held: credits cover
    five, and two of the eight share a request_id. Exactly five are held, none twice; the
    replay answers with its original; the others are refused by name; every hold's
    running balances follow one another."""
    content = "a fact kept together"
    cost = pricing.store_cost_mc(len(content), rt.settings.store_price_mc_per_64kib)
    acct = accounts.create_account(rt.db, "together-store", credits_mc=5 * cost).account_id
    mcp = build_mcp(lambda: rt, transport="stdio", fixed_caller=Caller(acct))
    assert rt.relayer.health().ok  # a fresh probe, as a running server has
    rt.relayer.keyring.encrypt(acct, b"")  # loaded, as after the account's first store
    sealed.remember_namespace(rt, acct, "default")  # recorded, likewise
    calls: list[dict[str, str]] = [{"content": content, "request_id": "req-lead"}]
    calls += [{"content": content, "request_id": f"req-{n}"} for n in range(7)]
    calls.append({"content": content, "request_id": "req-3"})  # a replay, in the same queue

    results: list[Any] = []

    async def scenario() -> None:
        async with anyio.create_task_group() as tg:

            async def one(args: dict[str, str]) -> None:
                results.append((args["request_id"], await mcp.call_tool("store", args)))

            with rt.db.engine.connect() as other:
                other.begin()
                other.execute(text("SELECT 1 FROM accounts WHERE id = :a FOR UPDATE"), {"a": acct})
                tg.start_soon(one, calls[0])
                await anyio.wait_all_tasks_blocked()  # the leader waits on the row
                for args in calls[1:]:
                    tg.start_soon(one, args)
                await anyio.wait_all_tasks_blocked()  # the others queued behind it
                assert rt.db._together is not None
                assert rt.db._together.queued == len(calls) - 1
                other.rollback()
        await rt.db.close_loop()

    runner = threading.Thread(target=anyio.run, args=(scenario,), daemon=True)
    runner.start()
    runner.join(60)
    assert not runner.is_alive(), "the event loop hung"
    assert len(results) == len(calls)
    outcome = {
        (rid, r.structured_content.get("memory_id") or r.structured_content["code"])
        for rid, r in results
    }
    refused = {o for rid, o in outcome if not o.startswith("mem_")}
    assert refused <= {"INSUFFICIENT_BALANCE"}  # refused by name, nothing else went wrong
    assert len({o for _, o in outcome if o.startswith("mem_")}) == 5  # five memories
    # The request_id sent twice got one answer twice: its memory (a replay), or both refused.
    assert len({o for rid, o in outcome if rid == "req-3"}) == 1
    with rt.db.read() as s:
        held, balance = s.execute(
            text("SELECT held_mc, balance_mc FROM accounts WHERE id = :a"), {"a": acct}
        ).one()
        holds = s.execute(
            text(
                "SELECT amount_mc, held_after_mc, balance_after_mc FROM ledger_entries "
                "WHERE account_id = :a AND kind = 'hold' ORDER BY id"
            ),
            {"a": acct},
        ).all()
        memories = s.scalar(
            text("SELECT count(*) FROM memories WHERE account_id = :a"), {"a": acct}
        )
    assert (held, balance, memories) == (5 * cost, 5 * cost, 5)  # never more than paid for
    assert [h.held_after_mc for h in holds] == [cost * n for n in range(1, 6)]
    assert all(h.amount_mc == cost and h.balance_after_mc == 5 * cost for h in holds)


@pytest.mark.postgres
def test_another_accounts_statements_wait_at_most_the_lock_wait_behind_a_stalled_account(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Account A's row is held by another transaction and A's statement is in flight: B's
    statements queue behind it, but once A's wait runs past LOCK_WAIT_MS it is undone
    and runs again alone (and waits), and B's go out and commit while A's row is held."""
    monkeypatch.setattr(together, "LOCK_WAIT_MS", 20)
    a = accounts.create_account(db, "stalled", credits_mc=0).account_id
    b = accounts.create_account(db, "free", credits_mc=0).account_id
    before = _went_out()

    def job(acct: str, job_id: str) -> Callable[[], Any]:
        return lambda: db.run_together(_INSERT_JOB, write_job_row(acct, job_id), key=acct)

    async def scenario() -> tuple[list[Any], list[Any]]:
        with db.engine.connect() as holder:
            holder.begin()
            holder.execute(text("SELECT 1 FROM accounts WHERE id = :a FOR UPDATE"), {"a": a})
            stalled = asyncio.ensure_future(db.on_loop(job(a, "job_a")))
            await _until(lambda: db._together is not None and db._together.busy)
            # Bounded: were they held up until A's row is let go, they would never finish.
            free = await asyncio.wait_for(
                asyncio.gather(db.on_loop(job(b, "job_b1")), db.on_loop(job(b, "job_b2"))),
                timeout=30,
            )
            assert not stalled.done()  # A's still waits for its row, alone now
            holder.rollback()
        return await stalled, list(free)

    stalled_rows, free_rows = _on_a_loop(db, scenario)
    assert [rows[0][0] for rows in free_rows] == ["job_b1", "job_b2"]
    assert stalled_rows[0][0] == "job_a"
    assert _went_out(since=before)["rerun"] >= 1  # A's, past its lock wait
