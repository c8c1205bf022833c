"""store: ordering, holds, idempotency, racing replays, failures — on the local network."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError

from tests.helpers import account, land_all
from walkeep import ledger, usage
from walkeep.api.app import readiness
from walkeep.db.models import Account, LedgerEntry, Memory, Request, WriteJob
from walkeep.errors import (
    InsufficientBalance,
    QuotaExceeded,
    RelayerUnavailable,
    ValidationError,
)
from walkeep.service.jobs import completion, sweep
from walkeep.service.operators import accounts
from walkeep.service.runtime import Runtime
from walkeep.service.tools import runway, store, topup


def _bal(rt: Runtime, a: str) -> ledger.Balance:
    with rt.db.read() as s:
        return ledger.balance(s, a)


def _count(rt: Runtime, model, *where) -> int:  # type: ignore[no-untyped-def]
    with rt.db.read() as s:
        return int(s.scalar(select(func.count()).select_from(model).where(*where)) or 0)


def test_store_accepts_then_lands_and_bills_once(rt: Runtime) -> None:
    a = account(rt, credits=10)
    r = store.store(rt, a, content="User prefers dark mode", request_id="req-42")
    assert r.status == "storing" and r.memory_id.startswith("mem_")
    assert r.namespace == "default" and r.cost_credits == 1
    # Held, not yet captured.
    assert _bal(rt, a) == ledger.Balance(10_000, 1000)

    assert completion.settle(rt, r.memory_id) == completion.Outcome.LANDED
    assert _bal(rt, a) == ledger.Balance(9000, 0)
    view = runway.check_runway(rt, a, r.memory_id).memories[0]
    assert view.status == "active"
    assert view.end_epoch == rt.chain.current_epoch() + rt.settings.initial_epochs
    assert view.runway_epochs == rt.settings.initial_epochs
    assert view.renewals_performed == 0 and view.last_renewal_tx is None

    again = store.store(rt, a, content="User prefers dark mode", request_id="req-42")
    assert again.status == "stored" and again.memory_id == r.memory_id
    assert _bal(rt, a) == ledger.Balance(9000, 0)
    assert _count(rt, WriteJob) == 1
    with rt.db.read() as s:
        assert ledger.recompute(s, a) == ledger.balance(s, a)


def test_replay_in_flight_joins_without_a_second_write(rt: Runtime) -> None:
    a = account(rt)
    first = store.store(rt, a, content="fact", request_id="r1")
    second = store.store(rt, a, content="fact", request_id="r1")
    assert second.status == "storing" and second.memory_id == first.memory_id
    assert _count(rt, WriteJob) == 1
    assert _bal(rt, a).held_mc == 1000


def test_same_request_id_different_arguments_is_refused(rt: Runtime) -> None:
    a = account(rt)
    store.store(rt, a, content="one", request_id="r1")
    for kwargs in (
        {"content": "two"},
        {"content": "one", "namespace": "other"},
        {"content": "one", "metadata": {"k": "v"}},
    ):
        with pytest.raises(ValidationError) as err:
            store.store(rt, a, request_id="r1", **kwargs)  # type: ignore[arg-type]
        assert err.value.data["field"] == "request_id"


def test_insufficient_balance_writes_nothing_and_says_how_to_recover(rt: Runtime) -> None:
    a = account(rt, credits=0)
    with pytest.raises(InsufficientBalance) as err:
        store.store(rt, a, content="hello", request_id="r-broke")
    top_up = err.value.data["top_up"]
    assert top_up["tool"] == "top_up" and top_up["arguments"]["amount_usd"] >= 0.5
    assert "same request_id" in top_up["then"]
    # Regression (issue 13): minimum_usd said 0.01 (the shortfall) while top_up refuses < 0.50.
    assert top_up["minimum_usd"] == 0.5
    assert topup.top_up(rt, a, top_up["minimum_usd"], "t-min").amount_usd == 0.5
    assert _count(rt, Memory) == 0 and _count(rt, Request) == 0
    assert _count(rt, LedgerEntry, LedgerEntry.account_id == a) == 0
    assert _count(rt, WriteJob) == 0

    accounts.grant(rt.db, a, 500_000, reason="top-up stand-in")
    r = store.store(rt, a, content="hello", request_id="r-broke")
    assert r.status == "storing"


def test_size_quota_is_exact_and_checked_first(rt: Runtime) -> None:
    a = account(rt, credits=0)  # quota wins over balance: checked first
    limit = rt.settings.max_memory_bytes
    assert limit == 256 * 1024
    with pytest.raises(QuotaExceeded) as err:
        store.store(rt, a, content="x" * (limit + 1), request_id="big")
    assert err.value.data["limit_bytes"] == limit
    accounts.grant(rt.db, a, 100_000, reason="t")
    ok = store.store(rt, a, content="x" * limit, request_id="exact")
    assert ok.status == "storing" and ok.cost_credits == 4  # 4 × 64 KiB units


def test_usage_quotas(rt: Runtime) -> None:
    rt.settings.max_stores_per_day = 2
    a = account(rt)
    store.store(rt, a, content="a", request_id="1")
    store.store(rt, a, content="b", request_id="2")
    with pytest.raises(QuotaExceeded) as err:
        store.store(rt, a, content="c", request_id="3")
    assert err.value.data == {"limit": "max_stores_per_day", "limit_count": 2, "used_count": 2}
    # A replay is not a new store: it still answers after the limit is reached.
    assert store.store(rt, a, content="a", request_id="1").status == "storing"

    rt.settings.max_stores_per_day = 100
    rt.settings.max_total_bytes = 10
    with pytest.raises(QuotaExceeded) as err:
        store.store(rt, a, content="0123456789", request_id="4")
    assert err.value.data["limit_bytes"] == 10 and err.value.data["used_bytes"] == 2


def test_daily_count_restarts_each_utc_day_and_the_byte_limit_is_inclusive(
    rt: Runtime, clock
) -> None:  # type: ignore[no-untyped-def]
    rt.settings.max_stores_per_day = 1
    rt.settings.max_total_bytes = 3
    a = account(rt)
    store.store(rt, a, content="ab", request_id="1")
    with pytest.raises(QuotaExceeded):
        store.store(rt, a, content="c", request_id="2")
    clock.advance(days=1)
    store.store(rt, a, content="c", request_id="2")  # a new day; 3 bytes == the limit
    with rt.db.read() as s:
        row = s.get(Account, a)
        assert row is not None
        assert (row.usage_bytes, row.usage_day_stores) == (3, 1)
        assert row.usage_day == usage.day_number(clock.now())
    rt.settings.max_stores_per_day = 10
    with pytest.raises(QuotaExceeded) as err:
        store.store(rt, a, content="d", request_id="3")
    assert err.value.data["limit"] == "max_total_bytes" and err.value.data["used_bytes"] == 3


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"content": ""}, "content"),
        ({"content": "   "}, "content"),
        ({"content": "x", "request_id": ""}, "request_id"),
        ({"content": "x", "request_id": "r" * 256}, "request_id"),
        ({"content": "x", "namespace": ""}, "namespace"),
        ({"content": "x", "namespace": "é" * 128}, "namespace"),  # 256 UTF-8 bytes
        ({"content": "x", "metadata": {f"k{i}": "v" for i in range(33)}}, "metadata"),
        ({"content": "x", "metadata": {"k": "v" * 1025}}, "metadata"),
    ],
)
def test_validation(rt: Runtime, kwargs: dict, field: str) -> None:  # type: ignore[type-arg]
    a = account(rt)
    args = {"request_id": "r", **kwargs}
    with pytest.raises(ValidationError) as err:
        store.store(rt, a, **args)
    assert err.value.data["field"] == field
    assert _count(rt, Memory) == 0


def test_metadata_is_bounded_as_a_whole_and_the_bound_is_inclusive(rt: Runtime) -> None:
    """Each key within its own limits, yet 17 × 1,024 characters of values: refused as a
    whole (16 KiB of compact UTF-8 JSON), naming the field; exactly at the bound, accepted."""
    a = account(rt)
    big = {f"k{i:02d}": "é" * 1024 for i in range(17)}  # 2 bytes a character
    with pytest.raises(ValidationError) as err:
        store.store(rt, a, content="x", request_id="md-big", metadata=big)
    assert err.value.data == {
        "field": "metadata",
        "max_bytes": 16 * 1024,
        "bytes": store.metadata_bytes(big),
    }
    assert _count(rt, Memory) == 0
    exact = {"k": "v" * 1016, **{f"k{i:02d}": "v" * 1015 for i in range(15)}}
    assert store.metadata_bytes(exact) == 16 * 1024
    store.store(rt, a, content="x", request_id="md-exact", metadata=exact)
    assert _count(rt, Memory) == 1


def test_relayer_unavailable_at_accept_bills_nothing_and_replay_retries(rt: Runtime) -> None:
    a = account(rt, credits=5)
    rt.extras["faults"].unreachable = True
    rt.relayer.invalidate_health()
    with pytest.raises(RelayerUnavailable):
        store.store(rt, a, content="fact", request_id="r1")
    assert _bal(rt, a) == ledger.Balance(5000, 0)
    assert _count(rt, Memory) == 0 and _count(rt, Request) == 0

    rt.extras["faults"].unreachable = False
    rt.relayer.invalidate_health()
    r = store.store(rt, a, content="fact", request_id="r1")
    assert r.status == "storing"
    land_all(rt)
    assert _bal(rt, a) == ledger.Balance(4000, 0)


def test_a_full_write_backlog_refuses_new_stores_until_it_drains(rt: Runtime) -> None:
    """Load shedding: past the backlog limit a store fails closed (nothing held) and a
    replay with the same request_id goes through once writes have landed."""
    rt.relayer.max_backlog = 3  # type: ignore[attr-defined]
    a = account(rt, credits=10)
    for i in range(3):
        store.store(rt, a, content=f"fact {i}", request_id=f"r{i}")
    rt.relayer.invalidate_health()  # type: ignore[attr-defined]
    with pytest.raises(RelayerUnavailable) as err:
        store.store(rt, a, content="one too many", request_id="r3")
    assert "3 accepted writes are still completing" in err.value.message
    assert err.value.data["retry"] is True
    report = readiness(rt)  # what operators see: still ready, writes paused
    assert report["ready"] is True and report["writes"] == "paused"
    assert _bal(rt, a) == ledger.Balance(10_000, 3000)  # only the three accepted hold
    assert _count(rt, Memory) == 3

    land_all(rt)
    rt.relayer.invalidate_health()  # type: ignore[attr-defined]
    assert readiness(rt)["writes"] == "ok"
    assert store.store(rt, a, content="one too many", request_id="r3").status == "storing"


def test_a_replay_gets_its_answer_even_while_the_backend_is_down(rt: Runtime) -> None:
    a = account(rt, credits=5)
    r = store.store(rt, a, content="kept", request_id="r1")
    land_all(rt)
    rt.extras["faults"].unreachable = True
    rt.relayer.invalidate_health()  # type: ignore[attr-defined]
    again = store.store(rt, a, content="kept", request_id="r1")
    assert again.status == "stored" and again.memory_id == r.memory_id
    with pytest.raises(RelayerUnavailable):  # a new store still fails closed
        store.store(rt, a, content="new", request_id="r2")


def test_a_claim_failing_for_another_reason_surfaces_instead_of_spinning(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An integrity error that is not "this request_id exists" (here: a foreign key)
    must not be mistaken for a racing replay for ever."""
    a = account(rt, credits=5)
    calls = []
    real_row = store._row

    def bad_row(m: Memory) -> dict[str, object]:
        calls.append(m.id)
        return {**real_row(m), "account_id": "acct_nobody"}

    monkeypatch.setattr(store, "_row", bad_row)
    with pytest.raises(IntegrityError):
        store.store(rt, a, content="fact", request_id="r1")
    assert len(calls) == 1 + store.CLAIM_TRIES
    assert _bal(rt, a) == ledger.Balance(5000, 0)
    assert _count(rt, Memory) == 0 and _count(rt, Request) == 0 and _count(rt, WriteJob) == 0


def test_terminal_failure_releases_and_the_request_id_is_not_poisoned(rt: Runtime) -> None:
    a = account(rt, credits=5)
    rt.relayer.fail_next_jobs = 1
    r = store.store(rt, a, content="fact", request_id="r1")
    assert completion.settle(rt, r.memory_id) == completion.Outcome.FAILED
    assert _bal(rt, a) == ledger.Balance(5000, 0)
    again = store.store(rt, a, content="fact", request_id="r1")
    assert again.status == "storing" and again.memory_id == r.memory_id
    assert completion.settle(rt, r.memory_id) == completion.Outcome.LANDED
    assert _bal(rt, a) == ledger.Balance(4000, 0)
    assert store.store(rt, a, content="fact", request_id="r1").status == "stored"
    with rt.db.read() as s:
        acct = s.get(Account, a)
        assert acct is not None and acct.usage_bytes == usage.recount(s, a) == len("fact")
        kinds = [
            e.kind
            for e in s.scalars(
                select(LedgerEntry).where(LedgerEntry.account_id == a).order_by(LedgerEntry.id)
            )
        ]
    assert kinds == ["grant", "hold", "release", "hold", "capture"]


def test_write_past_its_deadline_is_released_and_never_uploads_later(rt: Runtime, clock) -> None:  # type: ignore[no-untyped-def]
    """Issue 13.2: a failed attempt must never write afterwards. Its job is fenced
    (cancelled with the failure, in one transaction): no orphan the operator pays
    for, and a retry of the request writes one copy, not two."""

    rt.relayer.latency_ms = 10 * 60 * 60 * 1000  # far beyond the deadline
    rt.relayer.quilts = False
    a = account(rt, credits=5)
    r = store.store(rt, a, content="slow", request_id="r1")
    assert completion.settle(rt, r.memory_id) == completion.Outcome.PENDING
    clock.advance(rt.settings.completion_deadline_seconds + 1)
    assert completion.settle(rt, r.memory_id) == completion.Outcome.FAILED
    assert _bal(rt, a) == ledger.Balance(5000, 0)

    with rt.db.read() as s:
        job_id = s.scalar(select(Memory.job_id).where(Memory.id == r.memory_id))
        assert usage.recount(s, a) == s.get(Account, a).usage_bytes == 0  # type: ignore[union-attr]
    clock.advance(10 * 60 * 60)
    assert rt.relayer.poll(job_id).state == "failed"  # cancelled: it never uploads
    assert land_all(rt).landed == 0
    assert list(rt.chain.owned_blobs()) == []
    assert sweep.sweep(rt).orphans == 0
    assert _bal(rt, a) == ledger.Balance(5000, 0)
    assert runway.check_runway(rt, a).account.total_memories == 0  # type: ignore[union-attr]

    # The retry writes exactly one copy.
    rt.relayer.latency_ms = 0
    assert store.store(rt, a, content="slow", request_id="r1").memory_id == r.memory_id
    assert land_all(rt).landed == 1
    assert len(list(rt.chain.owned_blobs())) == 1
    assert _bal(rt, a) == ledger.Balance(4000, 0)


def test_a_write_being_uploaded_at_its_deadline_is_not_failed(rt: Runtime, clock) -> None:  # type: ignore[no-untyped-def]
    """The fence's other side: a write someone holds a lease on (uploading right now)
    is not failed at its deadline; it lands and is billed."""
    rt.relayer.quilts = False
    a = account(rt, credits=5)
    r = store.store(rt, a, content="uploading", request_id="r1")
    with rt.db.read() as s:
        job_id = s.scalar(select(Memory.job_id).where(Memory.id == r.memory_id))
    clock.advance(rt.settings.completion_deadline_seconds + 1)
    assert rt.relayer._lease([job_id], clock.now()) == [job_id]  # another worker's upload
    assert completion.settle(rt, r.memory_id) == completion.Outcome.PENDING
    rt.relayer._unlease([job_id])  # …which finished (here: gave the job back)
    assert completion.settle(rt, r.memory_id) == completion.Outcome.LANDED
    assert _bal(rt, a) == ledger.Balance(4000, 0)


def test_50_concurrent_stores_with_one_request_id(rt: Runtime) -> None:
    a = account(rt, credits=100)
    barrier = threading.Barrier(50)

    def go(_: int) -> tuple[str, str]:
        barrier.wait()
        res = store.store(rt, a, content="the same fact", request_id="dup")
        return res.memory_id, res.status

    with ThreadPoolExecutor(50) as pool:
        results = list(pool.map(go, range(50)))
    assert len({mid for mid, _ in results}) == 1
    assert {st for _, st in results} == {"storing"}
    assert _count(rt, WriteJob) == 1 and _count(rt, Memory) == 1
    land_all(rt)
    with rt.db.read() as s:
        captures = s.scalar(
            select(func.count())
            .select_from(LedgerEntry)
            .where(LedgerEntry.account_id == a, LedgerEntry.kind == "capture")
        )
    assert captures == 1
    assert _bal(rt, a) == ledger.Balance(99_000, 0)


def test_100_concurrent_distinct_stores_against_40_credits(rt: Runtime) -> None:
    a = account(rt, credits=40)
    barrier = threading.Barrier(100)
    stop = threading.Event()
    seen: list[int] = []

    def watch() -> None:
        while not stop.is_set():
            b = _bal(rt, a)
            seen.append(min(b.balance_mc, b.available_mc))

    def go(i: int) -> str:
        barrier.wait()
        try:
            return store.store(rt, a, content=f"fact number {i}", request_id=f"r{i}").status
        except InsufficientBalance:
            return "refused"

    watcher = threading.Thread(target=watch)
    watcher.start()
    with ThreadPoolExecutor(100) as pool:
        results = list(pool.map(go, range(100)))
    land_all(rt)
    stop.set()
    watcher.join()
    assert results.count("storing") == 40 and results.count("refused") == 60
    assert min(seen) >= 0
    assert _bal(rt, a) == ledger.Balance(0, 0)
    assert _count(rt, Memory, Memory.status == "active") == 40


def test_the_fast_claim_writes_everything_or_nothing_and_a_refusal_says_why(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    outcomes: list[bool] = []
    # PostgreSQL: one statement; SQLite: one transaction on the driver, without a Session.
    name = "_claim_at_once" if rt.db.is_postgres else "_claim_direct"
    fast = getattr(store, name)

    def spy(*args, **kwargs) -> bool:  # type: ignore[no-untyped-def]
        outcomes.append(fast(*args, **kwargs))
        return outcomes[-1]

    monkeypatch.setattr(store, name, spy)
    a = account(rt, credits=1)
    first = store.store(rt, a, content="the first fact", request_id="one")
    assert first.status == "storing"
    with pytest.raises(InsufficientBalance):
        store.store(rt, a, content="the second fact", request_id="two")
    # Refused, the fast claim wrote nothing and the one-at-a-time transaction named the
    # reason.
    assert outcomes == [True, False]
    assert _count(rt, Request) == _count(rt, WriteJob) == _count(rt, Memory) == 1
    assert _count(rt, LedgerEntry, LedgerEntry.kind == "hold") == 1
    assert store.store(rt, a, content="the first fact", request_id="one").memory_id == (
        first.memory_id
    )
    assert _bal(rt, a) == ledger.Balance(1000, 1000)
    with rt.db.read() as s:
        assert ledger.recompute(s, a) == ledger.balance(s, a)
