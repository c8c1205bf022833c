"""The credits ledger: idempotent operations, holds, and no negative balance ever."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError

from walkeep import ledger
from walkeep.db import Database
from walkeep.errors import InsufficientBalance, NotFound, ValidationError
from walkeep.ledger import Kind, LedgerConflict
from walkeep.service.operators import accounts


def _account(db: Database, credits: int = 0) -> str:
    return accounts.create_account(db, f"acct-{credits}", credits_mc=credits * 1000).account_id


def _bal(db: Database, account_id: str) -> ledger.Balance:
    with db.read() as s:
        return ledger.balance(s, account_id)


def test_credit_is_idempotent_on_ref(db: Database) -> None:
    a = _account(db)
    with db.begin() as s:
        first = ledger.credit(s, a, 500_000, ref="topup:cs_1")
    with db.begin() as s:
        again = ledger.credit(s, a, 500_000, ref="topup:cs_1")
    assert again.id == first.id and again.replayed and not first.replayed
    assert _bal(db, a).balance_mc == 500_000


def test_same_ref_different_amount_is_a_conflict(db: Database) -> None:
    a = _account(db)
    with db.begin() as s:
        ledger.credit(s, a, 1000, ref="r1")
    with pytest.raises(LedgerConflict), db.begin() as s:
        ledger.credit(s, a, 2000, ref="r1")
    assert _bal(db, a).balance_mc == 1000


def test_refs_are_per_account(db: Database) -> None:
    a, b = _account(db), accounts.create_account(db, "other").account_id
    with db.begin() as s:
        ledger.credit(s, a, 1000, ref="same")
        ledger.credit(s, b, 1000, ref="same")
    assert _bal(db, a).balance_mc == _bal(db, b).balance_mc == 1000


def test_hold_capture_release_lifecycle(db: Database) -> None:
    a = _account(db, credits=10)
    with db.begin() as s:
        ledger.hold(s, a, 3000, ref="h1")
        ledger.hold(s, a, 2000, ref="h2")
    b = _bal(db, a)
    assert (b.balance_mc, b.held_mc, b.available_mc) == (10_000, 5000, 5000)
    with db.begin() as s:
        cap = ledger.capture(s, a, "h1")
        rel = ledger.release(s, a, "h2")
    assert cap.kind == Kind.CAPTURE and rel.kind == Kind.RELEASE
    b = _bal(db, a)
    assert (b.balance_mc, b.held_mc) == (7000, 0)
    with db.read() as s:
        assert ledger.recompute(s, a) == b
        assert ledger.open_holds(s, a) == []


def test_capture_and_release_apply_once_and_exclude_each_other(db: Database) -> None:
    a = _account(db, credits=10)
    with db.begin() as s:
        ledger.hold(s, a, 4000, ref="h")
    with db.begin() as s:
        c1 = ledger.capture(s, a, "h")
    with db.begin() as s:
        c2 = ledger.capture(s, a, "h")
    assert c1.id == c2.id and c2.replayed
    with pytest.raises(LedgerConflict), db.begin() as s:
        ledger.release(s, a, "h")
    b = _bal(db, a)
    assert (b.balance_mc, b.held_mc) == (6000, 0)

    with db.begin() as s:
        ledger.hold(s, a, 1000, ref="h2")
    with db.begin() as s:
        r1 = ledger.release(s, a, "h2")
        r2 = ledger.release(s, a, "h2")
    assert r1.id == r2.id
    with pytest.raises(LedgerConflict), db.begin() as s:
        ledger.capture(s, a, "h2")
    assert _bal(db, a) == ledger.Balance(6000, 0)


def test_concurrent_capture_and_release_of_one_hold_settle_it_once(db: Database) -> None:
    a = _account(db, credits=100)
    n = 12
    with db.begin() as s:
        for i in range(n):
            ledger.hold(s, a, 1000, ref=f"h{i}")
    barrier = threading.Barrier(2)

    def settle(op: str, i: int) -> str:
        barrier.wait()
        try:
            with db.begin() as s:
                (ledger.capture if op == "capture" else ledger.release)(s, a, f"h{i}")
            return op
        except (LedgerConflict, IntegrityError):
            return "refused"

    with ThreadPoolExecutor(2) as pool:
        for i in range(n):
            results = sorted(pool.map(lambda op, i=i: settle(op, i), ["capture", "release"]))
            assert results.count("refused") == 1, results
    with db.read() as s:
        assert ledger.open_holds(s, a) == []
        assert ledger.recompute(s, a) == ledger.balance(s, a)
        assert ledger.balance(s, a).held_mc == 0


def test_hold_beyond_available_writes_nothing(db: Database) -> None:
    a = _account(db, credits=1)
    with pytest.raises(InsufficientBalance) as err, db.begin() as s:
        ledger.hold(s, a, 1001, ref="big")
    assert err.value.data == {"needed_mc": 1001, "available_mc": 1000}
    with db.read() as s:
        assert ledger.find(s, a, "big") is None
    assert _bal(db, a) == ledger.Balance(1000, 0)


def test_debit_cannot_spend_held_credits(db: Database) -> None:
    a = _account(db, credits=10)
    with db.begin() as s:
        ledger.hold(s, a, 8000, ref="h")
    with pytest.raises(InsufficientBalance), db.begin() as s:
        ledger.debit(s, a, 3000, ref="d")
    with db.begin() as s:
        ledger.debit(s, a, 2000, ref="d")
    assert _bal(db, a) == ledger.Balance(8000, 8000)


def test_unknown_account_and_bad_amounts(db: Database) -> None:
    with pytest.raises(NotFound), db.begin() as s:
        ledger.hold(s, "acct_nope", 1, ref="x")
    a = _account(db)
    for bad in (0, -5):
        with pytest.raises(ValidationError), db.begin() as s:
            ledger.credit(s, a, bad, ref="x")
    with pytest.raises(TypeError), db.begin() as s:
        ledger.credit(s, a, 1.5, ref="x")  # type: ignore[arg-type]


def test_database_refuses_a_negative_balance_even_if_code_tried(db: Database) -> None:
    a = _account(db, credits=1)
    with pytest.raises(IntegrityError), db.begin() as s:
        s.execute(text("UPDATE accounts SET balance_mc = -1 WHERE id = :a"), {"a": a})
    with pytest.raises(IntegrityError), db.begin() as s:
        s.execute(text("UPDATE accounts SET held_mc = 2000 WHERE id = :a"), {"a": a})


def test_32_threads_race_for_10_credits(db: Database) -> None:
    """Exactly 10 one-credit holds succeed; the balance is never negative at any point."""
    a = _account(db, credits=10)
    start = threading.Barrier(32)
    stop = threading.Event()
    observed: list[tuple[int, int]] = []

    def watch() -> None:
        while not stop.is_set():
            b = _bal(db, a)
            observed.append((b.balance_mc, b.available_mc))

    def attempt(i: int) -> bool:
        start.wait()
        try:
            with db.begin() as s:
                ledger.hold(s, a, 1000, ref=f"race-{i}")
            return True
        except InsufficientBalance:
            return False

    watcher = threading.Thread(target=watch)
    watcher.start()
    with ThreadPoolExecutor(32) as pool:
        results = list(pool.map(attempt, range(32)))
    stop.set()
    watcher.join()

    assert results.count(True) == 10
    assert results.count(False) == 22
    assert observed, "the watcher must have sampled the balance"
    assert all(bal >= 0 and avail >= 0 for bal, avail in observed)
    with db.read() as s:
        final = ledger.balance(s, a)
        assert final == ledger.Balance(10_000, 10_000)
        assert ledger.recompute(s, a) == final
        assert len(ledger.open_holds(s, a)) == 10


def test_concurrent_replays_of_one_ref_post_once(db: Database) -> None:
    a = _account(db)
    barrier = threading.Barrier(16)

    def go(_: int) -> int:
        barrier.wait()
        with db.begin() as s:
            return ledger.credit(s, a, 700, ref="webhook:cs_1").id

    with ThreadPoolExecutor(16) as pool:
        ids = set(pool.map(go, range(16)))
    assert len(ids) == 1
    assert _bal(db, a).balance_mc == 700


@pytest.mark.parametrize(
    ("usd", "mc"),
    [
        ("5", 500_000),
        ("0.5", 50_000),
        ("0.01", 1000),
        ("10000.00", 1_000_000_000),
        ("1.10", 110_000),
    ],
)
def test_usd_parsing_is_exact(usd: str, mc: int) -> None:
    assert ledger.usd_to_mc(usd) == mc


@pytest.mark.parametrize("bad", ["0.001", "abc", "nan", "inf"])
def test_usd_parsing_rejects(bad: str) -> None:
    with pytest.raises(ValidationError):
        ledger.usd_to_mc(bad)


def test_display_helpers() -> None:
    assert ledger.credits_display(500_000) == 500
    assert ledger.credits_display(499_937) == 499.937
    assert ledger.mc_to_usd_str(499_937) == "4.99"
    assert ledger.mc_to_credits_ceil(1) == 1


def test_a_replayed_hold_is_a_replay_even_when_the_balance_no_longer_covers_it(
    db: Database,
) -> None:
    a = _account(db, credits=1)
    with db.begin() as s:
        first = ledger.hold(s, a, 1000, ref="h")
    with db.begin() as s:  # available is 0 now: a *new* hold would be refused
        again = ledger.hold(s, a, 1000, ref="h")
    assert again.replayed and again.id == first.id
    with pytest.raises(InsufficientBalance), db.begin() as s:
        ledger.hold(s, a, 1000, ref="h-new")


def test_capture_holds_settles_each_hold_once_with_running_balances(db: Database) -> None:
    a = _account(db, credits=10)
    with db.begin() as s:
        for n, amount in enumerate((1000, 2500, 500)):
            ledger.hold(s, a, amount, ref=f"h{n}")
    with db.begin() as s:
        assert ledger.capture_holds(s, a, [("h2", "m2"), ("h0", "m0"), ("h1", "m1")]) == 3
    assert _bal(db, a) == ledger.Balance(balance_mc=6000, held_mc=0)
    with db.read() as s:
        assert ledger.recompute(s, a) == _bal(db, a)
        entries = [ledger.find(s, a, f"h{n}:capture") for n in (2, 0, 1)]
    # In the order given, each entry records the balance right after it.
    assert [(e.balance_after_mc, e.held_after_mc, e.memo) for e in entries if e] == [
        (9500, 3500, "m2"),
        (8500, 2500, "m0"),
        (6000, 0, "m1"),
    ]
    # A hold already captured (or released) cannot be captured again in a batch:
    # the whole batch is refused and nothing moves.
    with db.begin() as s:
        ledger.hold(s, a, 1000, ref="h3")
    with pytest.raises(IntegrityError), db.begin() as s:
        ledger.capture_holds(s, a, [("h3", "m3"), ("h0", "again")])
    with db.begin() as s:
        ledger.release(s, a, "h3")
    with pytest.raises(IntegrityError), db.begin() as s:
        ledger.capture_holds(s, a, [("h3", "m3")])
    with pytest.raises(NotFound), db.begin() as s:
        ledger.capture_holds(s, a, [("nope", "m")])
    assert _bal(db, a) == ledger.Balance(balance_mc=6000, held_mc=0)


# --- batches (the renewal pass: one UPDATE and one INSERT for many accounts) --------------


def _named(db: Database, name: str, credits: int) -> str:
    return accounts.create_account(db, name, credits_mc=credits * 1000).account_id


def test_batch_hold_and_capture_write_what_one_at_a_time_would(db: Database) -> None:
    a, b, c = _named(db, "a", 10), _named(db, "b", 10), _named(db, "c", 10)
    with db.begin() as s:  # a reference account, settled one entry at a time
        one = ledger.hold(s, c, 3000, ref="r:c", memo="m")
    with db.begin() as s:
        held = ledger.hold_new_many(s, [(a, 3000, "r:a"), (b, 1500, "r:b")], memo="m")
    assert [(e.account_id, e.kind, e.amount_mc, e.ref) for e in held] == [
        (a, Kind.HOLD, 3000, "r:a"),
        (b, Kind.HOLD, 1500, "r:b"),
    ]
    assert (held[0].balance_after_mc, held[0].held_after_mc) == (
        one.balance_after_mc,
        one.held_after_mc,
    )
    with db.begin() as s:
        single = ledger.capture(s, c, "r:c", memo="m")
    with db.begin() as s:
        captured = ledger.capture_many(s, [(b, "r:b"), (a, "r:a")], memo="m")
    assert [(e.account_id, e.kind, e.amount_mc, e.ref, e.settles_id) for e in captured] == [
        (b, Kind.CAPTURE, 1500, "r:b:capture", held[1].id),
        (a, Kind.CAPTURE, 3000, "r:a:capture", held[0].id),
    ]
    assert (captured[1].balance_after_mc, captured[1].held_after_mc) == (
        single.balance_after_mc,
        single.held_after_mc,
    )
    with db.read() as s:
        for acct, spent in ((a, 3000), (b, 1500)):
            bal = ledger.balance(s, acct)
            assert (bal.balance_mc, bal.held_mc) == (10_000 - spent, 0)
            assert ledger.recompute(s, acct) == bal
            assert ledger.open_holds(s, acct) == []
            stored = ledger.find(s, acct, f"r:{'a' if acct == a else 'b'}:capture")
            assert stored is not None and stored.memo == "m"


def test_batch_hold_short_for_one_account_raises_and_rolls_back_all(db: Database) -> None:
    a, b = _named(db, "rich", 10), _named(db, "poor", 1)
    with pytest.raises(InsufficientBalance) as err, db.begin() as s:
        ledger.hold_new_many(s, [(a, 3000, "r:a"), (b, 1001, "r:b")])
    assert err.value.data == {"needed_mc": 1001, "available_mc": 1000}
    assert _bal(db, a).held_mc == _bal(db, b).held_mc == 0
    with db.read() as s:
        assert ledger.find(s, a, "r:a") is None


def test_batch_hold_refuses_a_reused_ref_and_capture_a_settled_hold(db: Database) -> None:
    a, b = _named(db, "a", 10), _named(db, "b", 10)
    with db.begin() as s:
        ledger.hold(s, a, 1000, ref="r:a")
        ledger.hold(s, b, 1000, ref="r:b")
    with pytest.raises(IntegrityError), db.begin() as s:  # a ref that is not new: a bug
        ledger.hold_new_many(s, [(a, 1000, "r:a"), (b, 1000, "r:b2")])
    with db.begin() as s:
        ledger.release(s, b, "r:b")
    with pytest.raises(IntegrityError), db.begin() as s:  # settled already: aborts
        ledger.capture_many(s, [(a, "r:a"), (b, "r:b")])
    with pytest.raises(NotFound), db.begin() as s:
        ledger.capture_many(s, [(a, "r:a"), (b, "r:nope")])
    with pytest.raises(ValueError), db.begin() as s:
        ledger.hold_new_many(s, [(a, 1, "x"), (a, 1, "y")])
    bal_a, bal_b = _bal(db, a), _bal(db, b)
    assert (bal_a.balance_mc, bal_a.held_mc) == (10_000, 1000)
    assert (bal_b.balance_mc, bal_b.held_mc) == (10_000, 0)
