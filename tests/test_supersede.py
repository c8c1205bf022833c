"""``store(…, supersedes=…)``: a correction replaces a memory atomically when it lands.

The window (old visible until the new one lands, never neither, never both once landed),
refusals at accept (NOT_FOUND, VALIDATION_ERROR naming the state and successor), a new
store that never lands (the old one untouched and nothing billed), two corrections racing
(exactly one wins; the loser is released unbilled and its replay answers why), replays,
and the race decided by the database with two connections at once.
"""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from sqlalchemy import select

from tests.helpers import account, land_all
from walkeep import ledger
from walkeep.db.models import Memory
from walkeep.errors import InsufficientBalance, NotFound, ValidationError
from walkeep.lifecycle import MemoryStatus
from walkeep.service import leaving
from walkeep.service.jobs import completion
from walkeep.service.runtime import Runtime
from walkeep.service.tools import export, forget, recall, runway, store


def _stored(rt: Runtime, a: str, content: str, rid: str, **kw: object) -> str:
    mid = store.store(rt, a, content=content, request_id=rid, **kw).memory_id  # type: ignore[arg-type]
    land_all(rt)
    return mid


def _recalled(rt: Runtime, a: str, query: str) -> set[str]:
    return {h.memory_id for h in recall.recall(rt, a, query=query, limit=50).results}


def _exported(rt: Runtime, a: str) -> set[str]:
    return {m.memory_id for m in export.export(rt, a).memories}


def _view(rt: Runtime, a: str, mid: str) -> runway.RunwayMemory:
    return runway.check_runway(rt, a, mid).memories[0]


def _cost(rt: Runtime, mid: str) -> int:
    with rt.db.read() as s:
        m = s.get(Memory, mid)
        assert m is not None
        return m.cost_mc


def _available(rt: Runtime, a: str) -> int:
    with rt.db.read() as s:
        return ledger.balance(s, a).available_mc


def test_old_stays_until_the_correction_lands_then_only_the_new_one_is_seen(rt: Runtime) -> None:
    a = account(rt)
    old = _stored(rt, a, "Dana's office is in room 401.", "r-old")
    res = store.store(
        rt, a, content="Dana's office moved to room 512.", request_id="r-new", supersedes=old
    )
    new = res.memory_id
    # Accepted, not landed: the old one is still the answer, untouched.
    assert _recalled(rt, a, "Dana office room") == {old}
    assert _view(rt, a, old).superseded_by is None
    assert _view(rt, a, old).status == "active"
    assert _view(rt, a, new).supersedes == old
    land_all(rt)
    # Landed: only the new one, in recall and export; the old one stopped renewing.
    assert _recalled(rt, a, "Dana office room") == {new}
    assert old not in _exported(rt, a) and new in _exported(rt, a)
    v_old, v_new = _view(rt, a, old), _view(rt, a, new)
    assert v_old.status == "no-renew" and v_old.superseded_by == new
    assert v_old.next_renewal_epoch is None
    assert v_new.status == "active" and v_new.supersedes == old
    assert [m.supersedes for m in export.export(rt, a).memories] == [old]


def test_a_blob_id_names_the_memory_and_its_identical_copies_leave_with_it(rt: Runtime) -> None:
    a = account(rt)
    first = _stored(rt, a, "The deploy key rotates monthly.", "r1")
    copy = _stored(rt, a, "The deploy key rotates monthly.", "r2")
    hit = recall.recall(rt, a, query="deploy key").results[0]
    new = _stored(rt, a, "The deploy key rotates weekly.", "r3", supersedes=hit.blob_id)
    # The newest copy is the one corrected; both copies leave recall (one blob).
    assert _view(rt, a, new).supersedes == copy
    assert _recalled(rt, a, "deploy key rotates") == {new}
    assert {_view(rt, a, m).superseded_by for m in (first, copy)} == {new}


def test_unknown_target_is_not_found_and_nothing_is_written_or_billed(rt: Runtime) -> None:
    a, b = account(rt), account(rt)
    theirs = _stored(rt, b, "Another account's fact.", "r1")
    before = _available(rt, a)
    for ident in ("mem_doesnotexist", theirs):
        with pytest.raises(NotFound):
            store.store(rt, a, content="x", request_id=f"r-{ident}", supersedes=ident)
    assert _available(rt, a) == before
    with rt.db.read() as s:
        assert s.scalars(select(Memory.id).where(Memory.account_id == a)).all() == []


def test_forgotten_or_superseded_target_is_a_validation_error_naming_its_state(
    rt: Runtime,
) -> None:
    a = account(rt)
    gone = _stored(rt, a, "Old fact one.", "r1")
    forget.forget(rt, a, memory_id=gone, request_id="f1")
    with pytest.raises(ValidationError) as exc:
        store.store(rt, a, content="New fact one.", request_id="r2", supersedes=gone)
    assert exc.value.data["state"] == "forgotten" and "superseded_by" not in exc.value.data

    old = _stored(rt, a, "Old fact two.", "r3")
    new = _stored(rt, a, "New fact two.", "r4", supersedes=old)
    before = _available(rt, a)
    with pytest.raises(ValidationError) as exc:
        store.store(rt, a, content="Newer fact two.", request_id="r5", supersedes=old)
    assert exc.value.data["state"] == "superseded"
    assert exc.value.data["superseded_by"] == new
    assert _available(rt, a) == before
    # A replay of the winner still answers as it did: the check is not re-run on it.
    replay = store.store(rt, a, content="New fact two.", request_id="r4", supersedes=old)
    assert replay.status == "stored" and replay.memory_id == new


def test_a_correction_that_never_lands_leaves_the_old_one_active_and_is_not_billed(
    rt: Runtime,
) -> None:
    a = account(rt)
    old = _stored(rt, a, "The printer is on floor 2.", "r1")
    before = _available(rt, a)
    rt.relayer.fail_next_jobs = 1  # the relayer fails the write terminally
    new = store.store(rt, a, content="The printer is on floor 3.", request_id="r2", supersedes=old)
    assert _available(rt, a) < before  # held while in flight
    assert completion.settle(rt, new.memory_id) == completion.Outcome.FAILED
    assert _available(rt, a) == before
    v = _view(rt, a, old)
    assert v.status == "active" and v.superseded_by is None
    assert _recalled(rt, a, "printer floor") == {old}
    # Its replay retries it (the old one is still in service) and then it lands.
    again = store.store(
        rt, a, content="The printer is on floor 3.", request_id="r2", supersedes=old
    )
    assert again.memory_id == new.memory_id and again.status == "storing"
    land_all(rt)
    assert _view(rt, a, old).superseded_by == new.memory_id
    assert _available(rt, a) == before - _cost(rt, new.memory_id)


def test_an_unfunded_correction_changes_nothing(rt: Runtime) -> None:
    a = account(rt, credits=1)
    old = _stored(rt, a, "The wiki lives at wiki.example.", "r1")
    assert _available(rt, a) == 0
    with pytest.raises(InsufficientBalance):
        store.store(rt, a, content="The wiki moved.", request_id="r2", supersedes=old)
    land_all(rt)
    v = _view(rt, a, old)
    assert v.status == "active" and v.superseded_by is None
    assert _recalled(rt, a, "wiki") == {old}


def test_two_corrections_racing_exactly_one_wins_the_loser_is_released_unbilled(
    rt: Runtime,
) -> None:
    a = account(rt)
    old = _stored(rt, a, "The standup is at 9:30.", "r0")
    before = _available(rt, a)
    one = store.store(rt, a, content="The standup is at 10:00.", request_id="r1", supersedes=old)
    two = store.store(rt, a, content="The standup is at 10:15.", request_id="r2", supersedes=old)
    land_all(rt)  # both land in one quilt, one transaction: the first registered wins
    winner, loser = (one, two) if _view(rt, a, old).superseded_by == one.memory_id else (two, one)
    assert _view(rt, a, old).superseded_by == winner.memory_id
    with rt.db.read() as s:
        lost = s.get(Memory, loser.memory_id)
        assert lost is not None and lost.status == MemoryStatus.FAILED
    # Only the winner was billed.
    assert _available(rt, a) == before - _cost(rt, winner.memory_id)
    assert _recalled(rt, a, "standup") == {winner.memory_id}
    # The loser's replay answers the error, naming the winner; it is not retried.
    with pytest.raises(ValidationError) as exc:
        store.store(
            rt,
            a,
            content="The standup is at 10:15." if loser is two else "The standup is at 10:00.",
            request_id="r2" if loser is two else "r1",
            supersedes=old,
        )
    assert exc.value.data["superseded_by"] == winner.memory_id
    assert _available(rt, a) == before - _cost(rt, winner.memory_id)


def test_replaying_a_correction_in_flight_joins_it(rt: Runtime) -> None:
    a = account(rt)
    old = _stored(rt, a, "Lunch is at noon.", "r0")
    first = store.store(rt, a, content="Lunch is at 1pm.", request_id="r1", supersedes=old)
    again = store.store(rt, a, content="Lunch is at 1pm.", request_id="r1", supersedes=old)
    assert again.memory_id == first.memory_id and again.status == "storing"
    # Same request_id, different target: refused as any changed replay is.
    other = _stored(rt, a, "Dinner is at 7pm.", "r2")
    with pytest.raises(ValidationError):
        store.store(rt, a, content="Lunch is at 1pm.", request_id="r1", supersedes=other)
    land_all(rt)
    assert _view(rt, a, old).superseded_by == first.memory_id


def test_superseding_in_the_landing_transaction_leaves_no_window_after_a_crash(
    rt: Runtime,
) -> None:
    """Registration and supersede are one transaction: if it fails, neither happened (the
    write is settled again later, with its supersede); there is no state in which the new
    memory is active and the old one is still in service."""
    a = account(rt)
    old = _stored(rt, a, "The VPN host is vpn1.", "r0")
    new = store.store(rt, a, content="The VPN host is vpn2.", request_id="r1", supersedes=old)
    boom = RuntimeError("crash after supersede, before commit")
    real = leaving.supersede

    def crash(*args, **kw):  # type: ignore[no-untyped-def]
        assert real(*args, **kw)
        raise boom

    completion.supersede = crash  # type: ignore[assignment]
    try:
        land_all(rt)
    except RuntimeError:
        pass
    finally:
        completion.supersede = real  # type: ignore[assignment]
    assert _view(rt, a, old).superseded_by is None and _view(rt, a, old).status == "active"
    assert _view(rt, a, new.memory_id).status == "storing"
    # The worker's next pass (a restart) completes both together.
    land_all(rt)
    assert _view(rt, a, old).superseded_by == new.memory_id
    assert _view(rt, a, new.memory_id).status == "active"


def test_the_database_decides_a_race_between_two_connections(rt: Runtime) -> None:
    """Two transactions supersede the same memory at once (threads, one connection each):
    exactly one changes it, on SQLite and on PostgreSQL."""
    a = account(rt)
    olds = [_stored(rt, a, f"Fact number {i} before.", f"o{i}") for i in range(6)]
    now = rt.clock.now()
    for old in olds:
        results: list[bool] = []
        gate = threading.Barrier(2)

        def race(
            new_id: str,
            old: str = old,
            gate: threading.Barrier = gate,
            results: list[bool] = results,
        ) -> None:
            gate.wait()
            with rt.db.begin() as s:
                results.append(leaving.supersede(s, a, old, new_id, now))

        threads = [threading.Thread(target=race, args=(f"mem_racer{i}",)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(results) == [False, True]
        with rt.db.read() as s:
            m = s.get(Memory, old)
            assert m is not None and m.superseded_by in {"mem_racer0", "mem_racer1"}
            assert m.status == MemoryStatus.NO_RENEW


def test_expired_target_is_a_validation_error(rt: Runtime, clock) -> None:  # type: ignore[no-untyped-def]
    a = account(rt)
    soon = rt.clock.now() + timedelta(minutes=5)
    old = _stored(rt, a, "Parking is free this week.", "r0", expires_at=soon.isoformat())
    clock.advance(301)
    with pytest.raises(ValidationError) as exc:
        store.store(rt, a, content="Parking costs $5.", request_id="r1", supersedes=old)
    assert exc.value.data["state"] == "expired"
