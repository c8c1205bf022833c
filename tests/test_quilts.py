"""Quilts through the service layer, on the local network: packing, identifiers, billing
that lands or fails per quilt, renewal and forget, crash safety and compaction."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

import pytest
from sqlalchemy import func, select, update

from tests.helpers import account, epoch_seconds, land_all, writes_in_order
from walkeep import ledger, pricing
from walkeep.clock import ManualClock
from walkeep.db.models import Blob, LedgerEntry, Memory, WriteJob
from walkeep.index.embedder import HashEmbedder
from walkeep.lifecycle import MemoryStatus
from walkeep.protocol.quilt import decode_patch_id
from walkeep.service.jobs import completion, renew, sweep
from walkeep.service.runtime import Runtime
from walkeep.service.tools import export, forget, recall, runway, store


def _memories(rt: Runtime, *ids: str) -> list[Memory]:
    with rt.db.read() as s:
        rows = {m.id: m for m in s.scalars(select(Memory).where(Memory.id.in_(ids)))}
    return [rows[i] for i in ids]


def _blob(rt: Runtime, pk: int) -> Blob:
    with rt.db.read() as s:
        b = s.get(Blob, pk)
        assert b is not None
        return b


def _owned_objects(rt: Runtime) -> list[str]:
    return [b.blob_object_id for b in rt.chain.owned_blobs()]


def _captures(rt: Runtime, account_id: str) -> int:
    with rt.db.read() as s:
        return int(
            s.scalar(
                select(func.count())
                .select_from(LedgerEntry)
                .where(LedgerEntry.account_id == account_id, LedgerEntry.kind == "capture")
            )
            or 0
        )


def _store(rt: Runtime, a: str, text: str, rid: str) -> str:
    return store.store(rt, a, content=text, request_id=rid).memory_id


def test_an_accounts_small_stores_land_as_one_quilt_and_are_billed_together(
    rt: Runtime,
) -> None:
    a, b = account(rt, credits=20), account(rt, credits=20)
    mine = [_store(rt, a, f"fact number {i} about the user", f"a{i}") for i in range(5)]
    theirs = [_store(rt, b, f"another account's fact {i}", f"b{i}") for i in range(3)]
    assert land_all(rt).landed == 8

    objects = _owned_objects(rt)
    assert len(objects) == 2  # one Blob object per account, not one per memory
    ms = _memories(rt, *mine)
    quilt = _blob(rt, ms[0].blob_pk or 0)
    assert quilt.kind == "quilt" and quilt.patch_count == 5
    assert {m.blob_pk for m in ms} == {quilt.id}
    assert all(m.status == MemoryStatus.ACTIVE for m in ms)
    # Each memory's blob_id is its own patch id: the quilt id + version + its columns.
    assert len({m.blob_id for m in ms}) == 5
    for m in ms:
        assert m.blob_id is not None and len(m.blob_id) == 50
        ref = decode_patch_id(m.blob_id)
        assert ref.quilt_blob_id == quilt.blob_id and ref.version == 1
        assert 1 <= ref.start_col < ref.end_col
    # A share of the quilt's units each, proportional, never more than alone.
    alone = pricing.storage_units(pricing.encoded_blob_length(100)) * pricing.MICRO
    assert all(m.share_micro is not None and 0 < m.share_micro <= alone for m in ms)
    units = pricing.storage_units(quilt.storage_size) * pricing.MICRO
    assert units <= sum(m.share_micro or 0 for m in ms) <= units + 5

    # Other account, other quilt: a quilt is one owner, one schedule, one pause state.
    other = _memories(rt, *theirs)
    assert {m.blob_pk for m in other} != {quilt.id} and len({m.blob_pk for m in other}) == 1
    # Billed once each, at landing.
    assert _captures(rt, a) == 5 and _captures(rt, b) == 3
    with rt.db.read() as s:
        assert ledger.balance(s, a) == ledger.Balance(15_000, 0)

    # The identifiers work everywhere the spec promises them.
    view = runway.check_runway(rt, a, ms[2].blob_id or "").memories
    assert [v.memory_id for v in view] == [ms[2].id]
    hits = recall.recall(rt, a, query="fact number 3 about the user", limit=5).results
    assert hits and hits[0].blob_id == ms[3].blob_id
    assert hits[0].content == "fact number 3 about the user"
    exported = {m.memory_id: m for m in export.export(rt, a).memories}
    assert exported[ms[1].id].blob_id == ms[1].blob_id
    assert exported[ms[1].id].quilt_id == quilt.blob_id
    assert exported[ms[1].id].blob_object_id == quilt.blob_object_id
    assert exported[ms[1].id].content == "fact number 1 about the user"


def test_the_window_gathers_writes_and_a_full_quilt_goes_early(rt: Runtime, clock) -> None:  # type: ignore[no-untyped-def]
    relayer = rt.relayer
    relayer.quilt_window = timedelta(seconds=5)  # type: ignore[attr-defined]
    a = account(rt)
    first = _store(rt, a, "written at t=0", "w1")
    clock.advance(3)
    second = _store(rt, a, "written at t=3", "w2")
    assert land_all(rt).landed == 0  # the window is still open: nothing written yet
    assert _owned_objects(rt) == []
    clock.advance(2)  # the oldest write's window closes
    assert land_all(rt).landed == 2
    m1, m2 = _memories(rt, first, second)
    assert m1.blob_pk == m2.blob_pk  # both in the one quilt
    assert len(_owned_objects(rt)) == 1

    # A full quilt's worth of patches is written without waiting for the window.
    relayer.quilt_max_patches = 3  # type: ignore[attr-defined]
    ids_ = [_store(rt, a, f"burst {i}", f"b{i}") for i in range(4)]
    assert land_all(rt).landed == 3  # one full quilt; the fourth waits for its window
    clock.advance(5)
    assert land_all(rt).landed == 1
    pks = [m.blob_pk for m in _memories(rt, *ids_)]
    assert sorted(Counter(pks).values()) == [1, 3]


def test_the_byte_bound_splits_quilts(rt: Runtime) -> None:
    relayer = rt.relayer
    relayer.quilt_max_bytes = 2500  # type: ignore[attr-defined]
    a = account(rt)
    ids_ = [_store(rt, a, c * 1200, f"r{c}") for c in "xyz"]
    assert land_all(rt).landed == 3
    pks = [m.blob_pk for m in _memories(rt, *ids_)]
    # 2 × ~1.2 KB fit in 2.5 KB, the third does not
    assert sorted(Counter(pks).values()) == [1, 2]


def test_a_failed_quilt_fails_every_member_and_bills_none(rt: Runtime) -> None:
    a = account(rt, credits=10)
    ids_ = [_store(rt, a, f"doomed {i}", f"d{i}") for i in range(4)]
    rt.relayer.fail_next_jobs = 1  # type: ignore[attr-defined]
    assert land_all(rt).failed == 4
    assert {m.status for m in _memories(rt, *ids_)} == {MemoryStatus.FAILED}
    with rt.db.read() as s:
        assert ledger.balance(s, a) == ledger.Balance(10_000, 0)
    assert _owned_objects(rt) == []
    # The same request_ids retry and land, billed once each.
    again = [_store(rt, a, f"doomed {i}", f"d{i}") for i in range(4)]
    assert again == ids_
    assert land_all(rt).landed == 4
    assert _captures(rt, a) == 4
    with rt.db.read() as s:
        assert ledger.balance(s, a) == ledger.Balance(6_000, 0)


def test_identical_content_is_one_patch_and_forget_stops_every_copy(rt: Runtime) -> None:
    a = account(rt)
    same = [_store(rt, a, "the same sentence", f"s{i}") for i in range(2)]
    other = _store(rt, a, "a different sentence", "o1")
    land_all(rt)
    later = _store(rt, a, "the same sentence", "s-later")  # a later quilt, same content
    land_all(rt)
    m1, m2, m3, mo = _memories(rt, *same, later, other)
    assert m1.blob_id == m2.blob_id == m3.blob_id != mo.blob_id
    assert m3.blob_pk == m1.blob_pk  # points at the kept patch, not its new copy

    forget.forget(rt, a, memory_id=m1.blob_id or "", request_id="f1")
    statuses = {m.id: m.status for m in _memories(rt, *same, later, other)}
    assert statuses == {
        same[0]: MemoryStatus.NO_RENEW,
        same[1]: MemoryStatus.NO_RENEW,
        later: MemoryStatus.NO_RENEW,
        other: MemoryStatus.ACTIVE,
    }


def _to_due(rt: Runtime, clock) -> None:  # type: ignore[no-untyped-def]
    """Move the clock until the memories stored now are due for renewal."""
    s = rt.settings
    clock.advance(epoch_seconds(rt) * (s.initial_epochs - s.renew_threshold_epochs))


def test_forgetting_one_member_keeps_the_quilt_renewing_and_never_raises_a_price(
    rt: Runtime, clock
) -> None:  # type: ignore[no-untyped-def]
    a = account(rt, credits=100)
    ids_ = [_store(rt, a, f"member {i} " + "x" * 100 * (i + 1), f"m{i}") for i in range(3)]
    land_all(rt)
    ms = _memories(rt, *ids_)
    quilt = _blob(rt, ms[0].blob_pk or 0)
    forget.forget(rt, a, memory_id=ids_[0], request_id="f0")

    _to_due(rt, clock)
    report = renew.renew(rt)
    assert report.blobs_renewed == 1  # one extend_blob call for the whole quilt
    # The explorer shows that renewal as one blob, a quilt of its 3 patches.
    from walkeep.backends.localnet.explorer import quilt_sizes, tx_json

    net = rt.extras["localnet"]
    rec = net.transaction_record(report.digests[0])
    (call,) = tx_json(rec, quilt_sizes(net, rec))["calls"]
    assert call["blob_object_id"] == quilt.blob_object_id and call["quilt_patches"] == 3
    after = _blob(rt, quilt.id)
    assert after.end_epoch > quilt.end_epoch and after.renewals_performed == 1
    # The account paid exactly the kept members' fixed shares, not the forgotten one's.
    k = after.end_epoch - quilt.end_epoch
    expected = pricing.share_renewal_cost_mc(
        (ms[1].share_micro or 0) + (ms[2].share_micro or 0),
        k,
        rt.settings.renewal_price_mc_per_unit_epoch,
    )
    assert report.captured_mc == expected
    assert expected < pricing.renewal_cost_mc(
        quilt.storage_size, k, rt.settings.renewal_price_mc_per_unit_epoch
    )
    # Still active and renewed: the kept members show the new end epoch.
    views = {v.memory_id: v for v in runway.check_runway(rt, a).memories}
    assert views[ids_[1]].end_epoch == after.end_epoch and views[ids_[1]].status == "active"
    note = forget.forget(rt, a, memory_id=ids_[1], request_id="f1").note
    assert "quilt" in note and "1 other active" in note

    # Forget the rest: the quilt stops renewing and lapses at its end epoch.
    forget.forget(rt, a, memory_id=ids_[2], request_id="f2")
    _to_due(rt, clock)
    assert renew.renew(rt).blobs_renewed == 0
    assert _blob(rt, quilt.id).end_epoch == after.end_epoch


def test_crash_between_quilt_upload_and_registration_bills_each_member_once(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch, clock: ManualClock
) -> None:
    from walkeep.backends.self_relayer import SelfRelayer

    a = account(rt, credits=10)
    ids_ = [_store(rt, a, f"crash {i}", f"c{i}") for i in range(3)]

    class Crash(Exception):
        pass

    real = SelfRelayer._record_uploaded

    def crash(self, uploaded):  # type: ignore[no-untyped-def]
        raise Crash("killed after the quilt was written, before it was recorded")

    monkeypatch.setattr(SelfRelayer, "_record_uploaded", crash)
    with pytest.raises(Crash):
        completion.drain_due(rt)
    monkeypatch.setattr(SelfRelayer, "_record_uploaded", real)
    assert len(_owned_objects(rt)) == 1  # the quilt exists on chain, unknown to Walkeep

    # Recovery: the writes are written again (the first quilt is an orphan the sweep
    # records and never renews); each member is registered and billed exactly once.
    assert land_all(rt).landed == 3
    assert len(_owned_objects(rt)) == 2
    assert sweep.sweep(rt).orphans == 0  # first sighting: it may be a write landing now
    clock.advance(sweep.ORPHAN_GRACE.total_seconds())
    swept = sweep.sweep(rt)
    assert swept.orphans == 1
    ms = _memories(rt, *ids_)
    assert {m.status for m in ms} == {MemoryStatus.ACTIVE} and len({m.blob_pk for m in ms}) == 1
    assert _captures(rt, a) == 3
    with rt.db.read() as s:
        assert ledger.balance(s, a) == ledger.Balance(7_000, 0)
        assert ledger.recompute(s, a) == ledger.balance(s, a)


def test_crash_after_upload_is_recorded_never_writes_the_quilt_twice(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    from walkeep.backends.self_relayer import SelfRelayer

    a = account(rt, credits=10)
    ids_ = [_store(rt, a, f"indexed later {i}", f"i{i}") for i in range(3)]

    def crash(self, ready):  # type: ignore[no-untyped-def]
        raise RuntimeError("killed while embedding")

    monkeypatch.setattr(SelfRelayer, "_index_and_land", crash)
    with pytest.raises(RuntimeError):
        completion.drain_due(rt)
    monkeypatch.undo()
    assert land_all(rt).landed == 3
    assert len(_owned_objects(rt)) == 1  # recorded as uploaded: never written again
    assert _captures(rt, a) == 3
    assert {m.status for m in _memories(rt, *ids_)} == {MemoryStatus.ACTIVE}


def test_quilts_off_stores_each_memory_alone(rt: Runtime) -> None:
    rt.relayer.quilts = False  # type: ignore[attr-defined]
    a = account(rt)
    ids_ = [_store(rt, a, f"alone {i}", f"x{i}") for i in range(3)]
    land_all(rt)
    ms = _memories(rt, *ids_)
    assert len({m.blob_pk for m in ms}) == 3 and len(_owned_objects(rt)) == 3
    for m in ms:
        b = _blob(rt, m.blob_pk or 0)
        assert b.kind == "blob" and m.blob_id == b.blob_id and m.share_micro is None


def test_compaction_moves_live_members_exactly_once(rt: Runtime, clock) -> None:  # type: ignore[no-untyped-def]
    # A long target runway makes re-packing one live member cheaper than extending a
    # quilt that is mostly forgotten bytes (pricing: units × epochs either way).
    s = rt.settings
    s.initial_epochs, s.renew_threshold_epochs, s.target_runway_epochs = 2, 1, 20
    # 1.7 MB of text is ~1,800 chunks: minutes of MiniLM on a slow core, for a test about
    # compaction, not ranking. The hashed embedder indexes it in a second.
    rt.relayer.index.embedder = HashEmbedder()  # type: ignore[attr-defined]
    a = account(rt, credits=1000)
    ids_ = [_store(rt, a, f"{i} " + "big memory " * 20_000, f"big{i}") for i in range(8)]
    land_all(rt)
    ms = _memories(rt, *ids_)
    old = _blob(rt, ms[0].blob_pk or 0)
    assert old.kind == "quilt" and old.patch_count == 8
    for i in range(7):
        forget.forget(rt, a, memory_id=ids_[i], request_id=f"f{i}")
    keep = ids_[7]
    before = _memories(rt, keep)[0]

    clock.advance(epoch_seconds(rt))  # due: runway 1 = threshold
    report = renew.renew(rt)
    assert report.compactions == 1 and report.blobs_renewed == 0  # not extended
    # Until the new quilt lands the member stays where it was, and recall finds it.
    assert _memories(rt, keep)[0].blob_id == before.blob_id
    hit = recall.recall(rt, a, query="7 big memory big memory", limit=1).results[0]
    assert hit.blob_id == before.blob_id

    land_all(rt)
    moved = _memories(rt, keep)[0]
    assert moved.blob_id != before.blob_id and moved.blob_pk != old.id
    new = _blob(rt, moved.blob_pk or 0)
    assert new.kind == "quilt" and new.end_epoch > old.end_epoch
    assert decode_patch_id(moved.blob_id or "").quilt_blob_id == new.blob_id
    hit = recall.recall(rt, a, query="7 big memory big memory", limit=1).results[0]
    assert hit.blob_id == moved.blob_id and hit.content.startswith("7 big memory")
    # Once: the old patch (same text, no memory on it now) and the forgotten members
    # never surface beside it.
    hits = recall.recall(rt, a, query="big memory", limit=10).results
    assert [h.blob_id for h in hits] == [moved.blob_id]
    # Exactly once: nothing more moves, and the old quilt is never renewed again.
    assert completion.complete_writes(rt).landed == 0
    assert _memories(rt, keep)[0].blob_id == moved.blob_id
    clock.advance(hours=2)  # past the hold-back
    renew.renew(rt)
    assert _blob(rt, old.id).renewals_performed == 0
    with rt.db.read() as sess:
        forgotten = sess.scalar(
            select(func.count()).select_from(Memory).where(Memory.blob_pk == old.id)
        )
    assert forgotten == 7  # the forgotten members stay on the old quilt, which lapses


def test_memories_stored_before_quilts_keep_renewing(rt: Runtime, clock) -> None:  # type: ignore[no-untyped-def]
    """Existing data: single blobs with no share keep their identifiers and renew."""
    rt.relayer.quilts = False  # type: ignore[attr-defined]
    a = account(rt)
    old = _store(rt, a, "stored before quilts existed", "old")
    land_all(rt)
    with rt.db.begin() as s:  # what migration 0007 leaves for such a memory
        s.execute(update(Blob).values(kind="blob", patch_count=None))
    rt.relayer.quilts = True  # type: ignore[attr-defined]
    new = _store(rt, a, "stored with quilts", "new")
    land_all(rt)
    _to_due(rt, clock)
    assert renew.renew(rt).blobs_renewed == 2
    m_old, m_new = _memories(rt, old, new)
    assert _blob(rt, m_old.blob_pk or 0).kind == "blob"
    assert _blob(rt, m_new.blob_pk or 0).kind == "quilt"
    assert len(m_old.blob_id or "") == 43


def test_a_quilt_write_that_missed_its_deadline_never_uploads(rt: Runtime, clock) -> None:  # type: ignore[no-untyped-def]
    a = account(rt, credits=10)
    faults = rt.extras["faults"]
    mid = _store(rt, a, "accepted just before storage went down", "late")
    faults.unreachable = True
    assert land_all(rt).landed == 0  # backs off
    clock.advance(rt.settings.completion_deadline_seconds + 1)
    assert land_all(rt).failed == 1
    with rt.db.read() as s:
        job = s.scalar(select(WriteJob).where(WriteJob.idempotency_key == f"{mid}:1"))
        assert job is not None and job.status == "cancelled" and job.ciphertext is None
        assert ledger.balance(s, a) == ledger.Balance(10_000, 0)
    faults.unreachable = False
    clock.advance(minutes=10)
    assert land_all(rt).landed == 0  # storage is back: the failed attempt stays unwritten
    assert _owned_objects(rt) == []
    # The retry writes exactly one copy.
    assert _store(rt, a, "accepted just before storage went down", "late") == mid
    assert land_all(rt).landed == 1
    assert len(_owned_objects(rt)) == 1


def test_a_dead_processs_leases_run_out_in_seconds_a_live_ones_do_not(rt: Runtime, clock) -> None:  # type: ignore[no-untyped-def]
    """Leases belong to live processes: a holder renews its leases by heartbeat, so a
    crashed one's writes are taken over once ``lease_seconds`` (20 s) pass — not after
    a long fixed lease (it was 300 s: a SIGKILLed server's stores sat for 5 minutes)."""
    from walkeep.backends.self_relayer import SelfRelayer

    relayer = rt.relayer
    assert isinstance(relayer, SelfRelayer) and relayer.lease_seconds <= 20
    a = account(rt)
    mids = [_store(rt, a, f"in flight when the process died {i}", f"d{i}") for i in range(2)]
    with rt.db.read() as s:
        job_ids = list(s.scalars(select(WriteJob.id)))
    # Another process leases the writes and is about to upload them.
    other = SelfRelayer(
        rt.db,
        clock,
        relayer.store,
        relayer.keyring,
        relayer.index,
        relayer.owner,
        quilts=True,
        quilt_window_seconds=0,
    )
    assert sorted(other._lease(job_ids, clock.now())) == sorted(job_ids)
    other._held.clear()  # …and dies: its heartbeat stops with it
    assert land_all(rt).landed == 0  # the lease is still running
    clock.advance(relayer.lease_seconds + 1)
    assert land_all(rt).landed == 2  # taken over within seconds
    assert {m.status for m in _memories(rt, *mids)} == {MemoryStatus.ACTIVE}

    # A live holder keeps its lease for as long as it works.
    more = _store(rt, a, "held by a live process", "live")
    with rt.db.read() as s:
        job = s.scalar(select(WriteJob.id).where(WriteJob.idempotency_key == f"{more}:1"))
    assert other._lease([job or ""], clock.now()) == [job]
    for _ in range(3):
        clock.advance(relayer.lease_seconds - 5)
        assert other.heartbeat() == 1
        assert land_all(rt).landed == 0
    other._held.clear()
    clock.advance(relayer.lease_seconds + 1)
    assert land_all(rt).landed == 1


def test_registration_locks_the_account_before_the_request_rows(rt: Runtime, clock) -> None:  # type: ignore[no-untyped-def]
    """A store's claim locks the account, then inserts its request row; a replay's insert
    waits for a request row being updated. Registration must take the same order
    (accounts, then requests), or a replay racing a registration deadlocks (PostgreSQL
    aborted the replay: a 503 in test_serve_workers). Pinned for both paths."""
    a = account(rt)
    _store(rt, a, "one of a pair", "p1")
    _store(rt, a, "two of a pair", "p2")
    clock.advance(5)
    batched = writes_in_order(rt, lambda: land_all(rt))
    assert "accounts" in batched and "requests" in batched, batched
    assert max(i for i, t in enumerate(batched) if t == "accounts") < batched.index("requests")

    # The one-by-one path a failed batch falls back to.
    alone = _store(rt, a, "registered alone", "p3")
    clock.advance(5)
    (memory,) = _memories(rt, alone)
    rt.relayer.work_due()  # type: ignore[attr-defined]  # lands the write, unregistered
    landed = rt.relayer.poll(memory.job_id)
    one = writes_in_order(rt, lambda: completion._register(rt, memory, landed))
    assert one.index("accounts") < one.index("requests"), one


def test_quilt_shares_count_each_kept_patch_once_read_off_the_index(rt: Runtime) -> None:
    """A quilt's kept shares sum every kept patch once: copies of identical content point
    at one patch and pay once. The sum streams off ``memories (blob_pk, status, blob_id,
    share_micro)`` and only quilts holding a copy get the distinct pass; it must agree
    with the distinct sum over the memory rows, for every status set it is asked for."""
    from sqlalchemy import event, text

    from tests.conftest import ON_PG
    from walkeep.service.renewal_price import ACTIVE_ONLY, KEPT, quilt_shares

    a, b = account(rt, credits=100), account(rt, credits=100)
    ids_ = [_store(rt, a, f"member {i} " + "y" * 40 * (i + 1), f"m{i}") for i in range(4)]
    ids_ += [_store(rt, a, "the same sentence", f"same{i}") for i in range(2)]
    ids_.append(_store(rt, b, "another account's member", "b0"))
    land_all(rt)
    ids_.append(_store(rt, a, "the same sentence", "same-later"))  # points at the first
    ids_.append(_store(rt, a, "a second quilt's own member", "q2"))
    land_all(rt)
    forget.forget(rt, a, memory_id=ids_[0], request_id="f0")
    with rt.db.begin() as s:
        s.execute(update(Memory).where(Memory.id == ids_[1]).values(status=MemoryStatus.PAUSED))
    with rt.db.read() as s:
        rows = list(
            s.execute(select(Memory.blob_pk, Memory.blob_id, Memory.share_micro, Memory.status))
        )
    quilts = sorted({pk for pk, *_ in rows if pk is not None})
    assert len(quilts) == 3

    def by_the_rows(statuses: tuple[MemoryStatus, ...]) -> dict[int, int]:
        patches = {(pk, bid, share) for pk, bid, share, st in rows if st in statuses}
        total: Counter[int] = Counter()
        for pk, _, share in patches:
            total[pk] += share
        return dict(total)

    # Not vacuous: the first quilt holds a patch three times, so a plain sum differs.
    plain = Counter[int]()
    for pk, _, share, st in rows:
        if st in KEPT:
            plain[pk] += share
    assert plain != Counter(by_the_rows(KEPT))

    statements: list[str] = []

    def seen(conn, cursor, statement, *args):  # type: ignore[no-untyped-def]
        statements.append(statement)

    event.listen(rt.db.engine, "before_cursor_execute", seen)
    try:
        with rt.db.read() as s:
            for statuses in (KEPT, ACTIVE_ONLY):
                assert quilt_shares(s, quilts, statuses) == by_the_rows(statuses)
            assert quilt_shares(s, [], KEPT) == {}
    finally:
        event.remove(rt.db.engine, "before_cursor_execute", seen)
    if not ON_PG:  # PostgreSQL's planner reads a table this small whole; SQLite's plan is fixed
        with rt.db.read() as s:
            first = statements[0].replace("?", "1")  # every parameter a placeholder
            plan = " ".join(str(r[-1]) for r in s.execute(text("EXPLAIN QUERY PLAN " + first)))
        assert "COVERING INDEX ix_memories_blob_pk_status_blob_id_share_micro" in plan, plan
