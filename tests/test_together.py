"""walkeep/db/together.py: statements that arrive while one is in flight go to PostgreSQL
as one pipeline — one transaction — and each caller still sees only its own rows or its
own error; a store's ledger guarantees hold through it."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import anyio
import pytest
from sqlalchemy import func, insert, text, update
from sqlalchemy.exc import IntegrityError

from walkeep import pricing
from walkeep.db import Database, Prepared
from walkeep.db.models import Account, WriteJob, table
from walkeep.db.together import MAX_TOGETHER, Aborted, Statement, Together
from walkeep.mcp.server import Caller, build_mcp
from walkeep.service import accounts

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


def _run_while_leading(together: Together, joiners: list[str]) -> list[object]:
    """Join ``joiners`` (their SQL) while the leader is in flight, then release the leader;
    each joiner's rows or exception, in the order given."""

    async def main() -> list[object]:
        tasks = [
            asyncio.ensure_future(together.join((sql, {"n": i}))) for i, sql in enumerate(joiners)
        ]
        await asyncio.sleep(0)  # every joiner queued behind the leader
        together.release()
        return list(await asyncio.gather(*tasks, return_exceptions=True))

    return asyncio.run(main())


def test_what_queues_behind_the_statement_in_flight_goes_out_as_one_pipeline() -> None:
    server = _Server()
    idle: list[bool] = []
    together = Together(server.send, idle=lambda: idle.append(True))
    results = _run_while_leading(together, ["c", "a", "b"])
    assert server.pipelines == [["c", "a", "b"]]  # one pipeline, in the order they came
    assert results == [[("c", {"n": 0})], [("a", {"n": 1})], [("b", {"n": 2})]]  # own rows
    assert idle == [True]  # then idle, once: the next caller leads anew


def test_a_leader_nobody_joined_is_idle_at_once() -> None:
    idle: list[bool] = []
    Together(_Server().send, idle=lambda: idle.append(True)).release()
    assert idle == [True]


def test_a_long_queue_goes_out_in_pipelines_of_bounded_length() -> None:
    server = _Server()
    joiners = [f"s{i:03}" for i in range(MAX_TOGETHER + 5)]
    results = _run_while_leading(Together(server.send), joiners)
    assert [len(p) for p in server.pipelines] == [MAX_TOGETHER, 5]
    assert all(isinstance(r, list) for r in results)


def test_a_failed_pipeline_tells_every_statement_in_it_to_run_again_alone() -> None:
    server = _Server()
    results = _run_while_leading(Together(server.send), ["ok", "fail"])
    assert [type(r) for r in results] == [Aborted, Aborted]  # neither knows whose it was


def test_a_statement_alone_in_its_pipeline_gets_its_own_error() -> None:
    (result,) = _run_while_leading(Together(_Server().send), ["fail"])
    assert isinstance(result, RuntimeError) and "1 statement(s)" in str(result)


def test_a_caller_that_gives_up_does_not_take_the_others_pipeline_with_it() -> None:
    server = _Server()
    together = Together(server.send)

    async def main() -> object:
        gone = asyncio.ensure_future(together.join(("gone", {})))
        kept = asyncio.ensure_future(together.join(("kept", {})))
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
_JOB_COLUMNS = (
    "id",
    "account_id",
    "namespace",
    "idempotency_key",
    "ciphertext",
    "size_bytes",
    "epochs",
    "status",
    "not_before",
    "created_at",
    "updated_at",
)
_INSERT_JOB = Prepared(insert(_J).returning(_J.c.id, func.txid_current()), keys=_JOB_COLUMNS)


def _job(account_id: str, job_id: str) -> dict[str, object]:
    from datetime import UTC, datetime

    now = datetime(2026, 12, 2, tzinfo=UTC)
    return {
        "id": job_id,
        "account_id": account_id,
        "namespace": "default",
        "idempotency_key": f"k-{job_id}",
        "ciphertext": b"\x00",
        "size_bytes": 1,
        "epochs": 3,
        "status": "pending",
        "not_before": now,
        "created_at": now,
        "updated_at": now,
    }


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
    others: tuple[Callable[[], Any], ...] = (),
) -> tuple[object, list[object], list[object]]:
    """Run ``leader`` on the loop while another connection holds ``account_id``'s row, so
    that it stays in flight while every ``joiner`` queues behind it, and ``others`` (of
    other accounts) run to the end meanwhile; then let go. The leader's result, and each
    joiner's and each other's result or exception."""
    with db.engine.connect() as holder:
        holder.begin()
        holder.execute(text("SELECT 1 FROM accounts WHERE id = :a FOR UPDATE"), {"a": account_id})
        first = asyncio.ensure_future(db.on_loop(leader))
        await _until(lambda: account_id in (db._together or {}))  # the leader is in flight
        together = (db._together or {})[account_id]
        rest = [asyncio.ensure_future(db.on_loop(j)) for j in joiners]
        await _until(lambda: together.queued == len(joiners))
        # Bounded: were they queued behind the held row, they would never finish.
        done_meanwhile = await asyncio.wait_for(
            asyncio.gather(*map(db.on_loop, others), return_exceptions=True), timeout=30
        )
        assert not first.done()  # still held
        holder.rollback()
    led = await first
    joined = await asyncio.gather(*rest, return_exceptions=True)
    assert account_id not in (db._together or {})  # idle again, forgotten
    return led, list(joined), list(done_meanwhile)


def _on_a_loop(db: Database, scenario: Callable[[], Any]) -> Any:
    async def main() -> Any:
        try:
            return await scenario()
        finally:
            await db.close_loop()

    return asyncio.run(main())


@pytest.mark.postgres
def test_statements_queued_behind_one_in_flight_commit_as_one_transaction(db: Database) -> None:
    acct = accounts.create_account(db, "together", credits_mc=0).account_id

    def joiner(n: int) -> Callable[[], Any]:
        return lambda: db.run_together(_INSERT_JOB, _job(acct, f"job_{n}"), key=acct)

    led, joined, _ = _on_a_loop(
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
    with db.read() as s:
        assert (
            s.scalar(text("SELECT count(*) FROM write_jobs WHERE account_id = :a"), {"a": acct})
            == 3
        )


@pytest.mark.postgres
def test_one_statements_error_is_its_own_and_the_others_commit_alone(db: Database) -> None:
    acct = accounts.create_account(db, "together-error", credits_mc=0).account_id
    with db.begin() as s:  # job_dup exists: inserting it again fails
        s.execute(insert(_J), _job(acct, "job_dup"))

    def joiner(job_id: str) -> Callable[[], Any]:
        return lambda: db.run_together(_INSERT_JOB, _job(acct, job_id), key=acct)

    _, joined, _ = _on_a_loop(
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


@pytest.mark.postgres
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
                assert (rt.db._together or {})[acct].queued == len(calls) - 1
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
def test_another_accounts_statements_never_wait_behind_a_stalled_account(db: Database) -> None:
    """Account A's row is held by another transaction, its claim in flight and two more
    queued behind it: account B's statements go out and commit meanwhile, alone."""
    a = accounts.create_account(db, "stalled", credits_mc=0).account_id
    b = accounts.create_account(db, "free", credits_mc=0).account_id

    def job(acct: str, job_id: str) -> Callable[[], Any]:
        return lambda: db.run_together(_INSERT_JOB, _job(acct, job_id), key=acct)

    _, joined, others = _on_a_loop(
        db,
        lambda: _queue_behind_a_locked_row(
            db,
            a,
            lambda: db.run_together(_TOUCH, {"a": a}, key=a),
            [job(a, "job_a1"), job(a, "job_a2")],
            others=(job(b, "job_b1"), job(b, "job_b2")),
        ),
    )
    assert [rows[0][0] for rows in others] == ["job_b1", "job_b2"]  # done while A waited
    assert [rows[0][0] for rows in joined] == ["job_a1", "job_a2"]
