"""``forget``'s note tells the truth, case by case, and each test checks the promise
against what then happens (issue 39): its own blob, identical copies, a quilt with active
neighbours, with only paused ones, with none, a renewal under way, and a memory forgotten
while still being written that then lands in a quilt kept renewed by its neighbours."""

from __future__ import annotations

import re

from sqlalchemy import select

from tests.helpers import account, epoch_seconds, land_all
from walkeep import pricing
from walkeep.clock import ManualClock
from walkeep.db.models import Blob, Memory
from walkeep.lifecycle import MemoryStatus
from walkeep.service.jobs import renew, sweep
from walkeep.service.operators import accounts
from walkeep.service.runtime import Runtime
from walkeep.service.tools import forget, store


def _store(rt: Runtime, acct: str, text: str, rid: str) -> str:
    return store.store(rt, acct, content=text, request_id=rid).memory_id


def _blob_of(rt: Runtime, memory_id: str) -> Blob:
    with rt.db.read() as s:
        blob = s.scalars(
            select(Blob).join(Memory, Memory.blob_pk == Blob.id).where(Memory.id == memory_id)
        ).one()
        s.expunge(blob)
        return blob


def _status(rt: Runtime, memory_id: str) -> str:
    with rt.db.read() as s:
        return str(s.scalar(select(Memory.status).where(Memory.id == memory_id)))


def _to_due(rt: Runtime, clock: ManualClock) -> None:
    s = rt.settings
    clock.advance(epoch_seconds(rt) * (s.initial_epochs - s.renew_threshold_epochs))


def _lapse_epoch(note: str) -> int:
    found = re.search(r"ends at epoch (\d+)", note)
    assert found, note
    return int(found.group(1))


def test_its_own_blob_lapses_at_the_epoch_the_note_names(rt: Runtime, clock: ManualClock) -> None:
    rt.relayer.quilts = False  # type: ignore[attr-defined]
    a = account(rt)
    mid = _store(rt, a, "alone in its blob", "r1")
    land_all(rt)
    note = forget.forget(rt, a, memory_id=mid, request_id="f1").note
    assert note.startswith("Renewal stopped for this memory;") and "quilt" not in note
    end = _lapse_epoch(note)
    assert end == _blob_of(rt, mid).end_epoch
    _to_due(rt, clock)
    assert renew.renew(rt).blobs_renewed == 0  # nothing renews it: it lapses there
    assert _blob_of(rt, mid).end_epoch == end


def test_identical_copies_count_only_the_memories_it_stopped(
    rt: Runtime, clock: ManualClock
) -> None:
    """A lapsed (expired) copy of the same content has the same blob_id: it was counted
    as stopped ("2 memories sharing this blob") though nothing was stopped for it."""
    rt.relayer.quilts = False  # type: ignore[attr-defined]
    a = account(rt, credits=1)  # the store alone: the first copy lapses unrenewed
    first = _store(rt, a, "said twice", "r1")
    land_all(rt)
    clock.advance(epoch_seconds(rt) * (rt.settings.initial_epochs + 1))
    renew.renew(rt)
    sweep.sweep(rt)
    assert _status(rt, first) == MemoryStatus.EXPIRED
    accounts.grant(rt.db, a, 5000, reason="more", current_epoch=rt.chain.current_epoch())
    again = _store(rt, a, "said twice", "r2")
    land_all(rt)
    assert _blob_of(rt, again).blob_id == _blob_of(rt, first).blob_id
    note = forget.forget(rt, a, memory_id=again, request_id="f").note
    assert note.startswith("Renewal stopped for this memory;"), note

    # Two kept copies share the blob: both stop, and the note says two.
    third = _store(rt, a, "said twice", "r3")
    land_all(rt)
    assert _status(rt, third) == MemoryStatus.ACTIVE
    fourth = _store(rt, a, "said twice", "r4")
    land_all(rt)
    note = forget.forget(rt, a, memory_id=fourth, request_id="f4").note
    assert note.startswith("Renewal stopped for 3 memories sharing this blob;"), note
    assert {_status(rt, m) for m in (again, third, fourth)} == {MemoryStatus.NO_RENEW}


def test_a_quilt_member_with_active_neighbours_stays_while_they_renew_it_unbilled(
    rt: Runtime, clock: ManualClock
) -> None:
    a = account(rt)
    ids_ = [_store(rt, a, f"neighbour {i} " + "y" * 40 * i, f"r{i}") for i in range(3)]
    land_all(rt)
    quilt = _blob_of(rt, ids_[0])
    note = forget.forget(rt, a, memory_id=ids_[0], request_id="f").note
    assert "packed in a Walrus quilt with 2 other active memories" in note
    assert "stays on Walrus while that quilt is renewed" in note and "no longer billed" in note
    _to_due(rt, clock)
    report = renew.renew(rt)
    after = _blob_of(rt, ids_[0])
    assert after.id == quilt.id and after.end_epoch > quilt.end_epoch  # still renewed
    with rt.db.read() as s:
        kept = sum(s.scalars(select(Memory.share_micro).where(Memory.id.in_(ids_[1:]))).all())
    k = after.end_epoch - quilt.end_epoch
    price = rt.settings.renewal_price_mc_per_unit_epoch
    assert report.captured_mc == pricing.share_renewal_cost_mc(kept, k, price)  # not billed


def test_a_quilt_member_whose_neighbours_are_all_forgotten_lapses_at_the_epoch_named(
    rt: Runtime, clock: ManualClock
) -> None:
    a = account(rt)
    ids_ = [_store(rt, a, f"soon gone {i}", f"r{i}") for i in range(3)]
    land_all(rt)
    for i in (1, 2):
        forget.forget(rt, a, memory_id=ids_[i], request_id=f"f{i}")
    note = forget.forget(rt, a, memory_id=ids_[0], request_id="f0").note
    assert "other active" not in note and "paused" not in note
    end = _lapse_epoch(note)
    _to_due(rt, clock)
    assert renew.renew(rt).blobs_renewed == 0
    assert _blob_of(rt, ids_[0]).end_epoch == end


def test_a_quilt_member_with_paused_neighbours_says_the_quilt_renews_if_they_resume(
    rt: Runtime, clock: ManualClock
) -> None:
    """Only active neighbours were counted: with paused ones the note promised a lapse at
    the end epoch, yet a top-up resumes them and the quilt — patch and all — renews."""
    a = account(rt, credits=3)  # the three stores, nothing for a renewal
    ids_ = [_store(rt, a, f"paused {i}", f"r{i}") for i in range(3)]
    land_all(rt)
    quilt = _blob_of(rt, ids_[0])
    _to_due(rt, clock)
    assert renew.renew(rt).paused_memories == 3
    note = forget.forget(rt, a, memory_id=ids_[0], request_id="f").note
    assert "with 2 other paused memories" in note and "renewed again only if they resume" in note
    assert _lapse_epoch(note) == quilt.end_epoch
    accounts.grant(rt.db, a, 5000, reason="top-up", current_epoch=rt.chain.current_epoch())
    renew.renew(rt)
    assert _blob_of(rt, ids_[0]).end_epoch > quilt.end_epoch  # renewed: it did not lapse
    assert _status(rt, ids_[0]) == MemoryStatus.NO_RENEW


def test_forgotten_during_a_renewal_under_way_names_the_end_that_renewal_gives(
    rt: Runtime, clock: ManualClock
) -> None:
    rt.relayer.quilts = False  # type: ignore[attr-defined]
    a = account(rt)
    mid = _store(rt, a, "renewed as it is forgotten", "r1")
    land_all(rt)
    before = _blob_of(rt, mid).end_epoch
    notes: list[str] = []

    def forget_now(_claim: object) -> None:
        notes.append(forget.forget(rt, a, memory_id=mid, request_id="f").note)

    rt.extras["renew_hooks"] = {"before_submit": forget_now}
    _to_due(rt, clock)
    assert renew.renew(rt).blobs_renewed == 1
    (note,) = notes
    after = _blob_of(rt, mid).end_epoch
    assert after > before and _lapse_epoch(note) == after, note
    assert "a renewal already under way" in note
    rt.extras["renew_hooks"] = {}
    _to_due(rt, clock)
    assert renew.renew(rt).blobs_renewed == 0 and _blob_of(rt, mid).end_epoch == after


def test_forgotten_while_storing_then_packed_with_live_neighbours_says_the_quilt_keeps_it(
    rt: Runtime, clock: ManualClock
) -> None:
    """The note said the memory "will lapse at the end of its initial paid epochs"; it
    landed in a quilt its neighbours keep renewing, so its patch stays on Walrus."""
    a = account(rt)
    ids_ = [_store(rt, a, f"in flight {i}", f"r{i}") for i in range(3)]
    note = forget.forget(rt, a, memory_id=ids_[0], request_id="f").note
    assert "still being written" in note
    assert "If it lands packed in a Walrus quilt with other memories of yours" in note
    assert "stays on Walrus while that quilt is renewed" in note
    land_all(rt)
    assert _status(rt, ids_[0]) == MemoryStatus.NO_RENEW
    quilt = _blob_of(rt, ids_[0])
    assert quilt.kind == "quilt" and _blob_of(rt, ids_[1]).id == quilt.id
    _to_due(rt, clock)
    report = renew.renew(rt)
    assert _blob_of(rt, ids_[0]).end_epoch > quilt.end_epoch  # kept by its neighbours
    with rt.db.read() as s:
        kept = sum(s.scalars(select(Memory.share_micro).where(Memory.id.in_(ids_[1:]))).all())
        forgotten = s.scalar(select(Memory.share_micro).where(Memory.id == ids_[0]))
    assert forgotten and kept + forgotten == quilt.share_micro
    k = _blob_of(rt, ids_[0]).end_epoch - quilt.end_epoch
    price = rt.settings.renewal_price_mc_per_unit_epoch
    assert report.captured_mc == pricing.share_renewal_cost_mc(kept, k, price)  # unbilled


def test_forgotten_while_storing_alone_says_it_lapses(rt: Runtime) -> None:
    rt.relayer.quilts = False  # type: ignore[attr-defined]
    a = account(rt)
    mid = _store(rt, a, "alone and forgotten", "r1")
    note = forget.forget(rt, a, memory_id=mid, request_id="f").note
    assert "still being written and it lapses at the end of its initial paid epochs" in note
    assert "quilt" not in note


def test_forgotten_while_storing_beside_a_kept_copy_says_the_copy_keeps_the_content(
    rt: Runtime,
) -> None:
    a = account(rt)
    kept = _store(rt, a, "the same words", "r1")
    land_all(rt)
    mid = _store(rt, a, "the same words", "r2")
    note = forget.forget(rt, a, memory_id=mid, request_id="f").note
    assert f"an identical memory you keep ({kept})" in note
    land_all(rt)
    with rt.db.read() as s:  # the copy landed on the kept memory's patch: one content
        a_, b_ = (s.scalar(select(Memory.blob_id).where(Memory.id == m)) for m in (kept, mid))
    assert a_ == b_ and _status(rt, kept) == MemoryStatus.ACTIVE
