"""``store(…, expires_at=…)``: a memory that matters until a date, paid for in epochs.

It leaves recall and export at the second it names (not when its blob lapses), is
written and renewed only as far as the end of the epoch holding that second, and the
account pays only for the epochs it needs — a plain blob and a quilt's share, checked
against the price formula and by ``walkeep verify``. Expiries do not alert; lapses do.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from sqlalchemy import select

from tests.helpers import account, epoch_seconds, land_all
from walkeep import ledger, pricing
from walkeep.db.models import Account, Blob, Memory, RenewalItem
from walkeep.errors import ValidationError
from walkeep.lifecycle import MemoryStatus
from walkeep.service.jobs import renew, sweep
from walkeep.service.operators import console, verify
from walkeep.service.runtime import Runtime
from walkeep.service.tools import balance, export, recall, runway, store

MICRO = pricing.MICRO


def _in_epoch(rt: Runtime, epochs_ahead: int, seconds: int = 60) -> datetime:
    """An instant ``seconds`` into the epoch ``epochs_ahead`` of the current one."""
    info = rt.chain.epoch_info()
    assert info.started_at is not None
    return info.started_at + timedelta(seconds=info.duration_seconds * epochs_ahead + seconds)


def _mem(rt: Runtime, mid: str) -> Memory:
    with rt.db.read() as s:
        m = s.get(Memory, mid)
        assert m is not None
        return m


def _blob(rt: Runtime, mid: str) -> Blob:
    with rt.db.read() as s:
        b = s.scalar(select(Blob).join(Memory, Memory.blob_pk == Blob.id).where(Memory.id == mid))
        assert b is not None
        return b


def _balance(rt: Runtime, a: str) -> int:
    with rt.db.read() as s:
        return ledger.balance(s, a).balance_mc


def _advance_to_epoch(rt: Runtime, clock, epoch: int) -> None:  # type: ignore[no-untyped-def]
    clock.advance(epoch_seconds(rt) * (epoch - rt.chain.current_epoch()))
    assert rt.chain.current_epoch() == epoch


def test_an_expiry_hides_the_memory_at_the_second_it_names(rt: Runtime, clock) -> None:  # type: ignore[no-untyped-def]
    a = account(rt)
    at = rt.clock.now() + timedelta(hours=1)
    mid = store.store(
        rt, a, content="The hotel code is 4471.", request_id="r1", expires_at=at.isoformat()
    ).memory_id
    land_all(rt)
    v = runway.check_runway(rt, a, mid).memories[0]
    assert v.expires_at == at and v.status == "active"
    assert [h.memory_id for h in recall.recall(rt, a, query="hotel code").results] == [mid]
    clock.advance((at - rt.clock.now()).total_seconds() - 0.001)  # a millisecond before
    assert [h.memory_id for h in recall.recall(rt, a, query="hotel code").results] == [mid]
    assert [m.memory_id for m in export.export(rt, a).memories] == [mid]
    clock.advance(0.001)  # exactly expires_at
    assert rt.clock.now() == at
    assert recall.recall(rt, a, query="hotel code").results == []
    assert export.export(rt, a).memories == []
    v = runway.check_runway(rt, a, mid).memories[0]
    assert v.status == "expired" and v.expires_at == at and v.next_renewal_epoch is None
    # The sweep marks it, frees its bytes, and raises no alert (it was asked for).
    report = sweep.sweep(rt)
    assert report.expired_by_date == 1 and report.lapsed_paid_memories == 0
    assert _mem(rt, mid).status == MemoryStatus.EXPIRED
    with rt.db.read() as s:
        acct = s.get(Account, a)
        assert acct is not None and acct.usage_bytes == 0
    summary = runway.check_runway(rt, a).account
    assert summary is not None and summary.active == 0 and summary.total_memories == 1


def test_a_date_means_the_end_of_that_day_utc_and_the_past_is_refused(rt: Runtime) -> None:
    a = account(rt)
    day = (rt.clock.now() + timedelta(days=2)).date()
    mid = store.store(
        rt, a, content="Conference week.", request_id="r1", expires_at=day.isoformat()
    ).memory_id
    assert _mem(rt, mid).expires_at == datetime(day.year, day.month, day.day, tzinfo=rt.clock.now().tzinfo) + timedelta(days=1)  # fmt: skip
    for bad in (
        (rt.clock.now() - timedelta(seconds=1)).isoformat(),
        rt.clock.now().isoformat(),
        "2027-01-31T10:00:00",  # no offset
        "next tuesday",
    ):
        with pytest.raises(ValidationError) as exc:
            store.store(rt, a, content="x", request_id=f"bad-{bad}", expires_at=bad)
        assert exc.value.data["field"] == "expires_at"


def test_a_short_lived_store_is_written_and_billed_for_the_epochs_it_needs(
    rt: Runtime,
) -> None:
    a = account(rt)
    current = rt.chain.current_epoch()
    at = _in_epoch(rt, 1)  # needs the blob to end at current + 2: 2 of the 5 epochs
    before = _balance(rt, a)
    res = store.store(rt, a, content="Standup moved today.", request_id="r1", expires_at=at)
    price = rt.settings.store_price_mc_per_64kib
    expected = pricing.store_cost_mc(20, price) * 2 // rt.settings.initial_epochs
    assert expected < pricing.store_cost_mc(20, price)
    assert res.cost_credits == ledger.credits_display(expected)
    land_all(rt)
    assert _balance(rt, a) == before - expected
    assert _mem(rt, res.memory_id).expires_epoch == current + 1
    assert _blob(rt, res.memory_id).end_epoch == current + 2  # never lost before it expires


def test_renewals_stop_at_the_expiry_epoch_and_bill_exactly_solo(rt: Runtime, clock) -> None:  # type: ignore[no-untyped-def]
    rt.relayer.quilts = False
    a = account(rt)
    c = rt.chain.current_epoch()
    mid = store.store(
        rt, a, content="Quarterly plan.", request_id="r1", expires_at=_in_epoch(rt, 8)
    ).memory_id
    land_all(rt)
    blob = _blob(rt, mid)
    assert blob.end_epoch == c + 5  # the initial epochs: it expires later than that
    price = rt.settings.renewal_price_mc_per_unit_epoch
    ends = []
    for epoch in range(c + 1, c + 12):
        _advance_to_epoch(rt, clock, epoch)
        sweep.sweep(rt)
        before = _balance(rt, a)
        report = renew.renew(rt)
        after = _blob(rt, mid)
        if report.transactions:
            k = after.end_epoch - ends[-1] if ends else after.end_epoch - blob.end_epoch
            assert before - _balance(rt, a) == pricing.renewal_cost_mc(blob.storage_size, k, price)
            assert all(verify.verify_digest(rt, d).ok for d in report.digests)
            ends.append(after.end_epoch)
    # Extended at c+3 to c+8, then only one more epoch (to the end of the expiry's
    # epoch, c+9), then never again.
    assert ends == [c + 8, c + 9]
    assert verify.verify_memory(rt, mid).ok
    # It expired at its second (in epoch c+8) and its blob lapsed after that epoch.
    assert _mem(rt, mid).status == MemoryStatus.EXPIRED


def test_a_quilt_bills_each_share_for_its_own_epochs_and_stops_at_the_last_needed(
    rt: Runtime, clock
) -> None:  # type: ignore[no-untyped-def]
    a = account(rt)
    c = rt.chain.current_epoch()
    keep = store.store(rt, a, content="Keep forever: the founding date.", request_id="k")
    short = store.store(
        rt, a, content="Until c+6: the offsite.", request_id="s", expires_at=_in_epoch(rt, 6)
    )
    land_all(rt)
    quilt = _blob(rt, keep.memory_id)
    assert quilt.kind == "quilt" and quilt.id == _blob(rt, short.memory_id).id
    assert quilt.end_epoch == c + 5
    s_keep, s_short = _mem(rt, keep.memory_id).share_micro, _mem(rt, short.memory_id).share_micro
    assert s_keep and s_short
    price = rt.settings.renewal_price_mc_per_unit_epoch

    _advance_to_epoch(rt, clock, c + 3)
    before = _balance(rt, a)
    report = renew.renew(rt)
    # short needs the quilt to c+7 only: extended that far (2 epochs), both billed for
    # both — never a share for an epoch its member does not need.
    assert report.transactions == 1 and _blob(rt, keep.memory_id).end_epoch == c + 7
    assert before - _balance(rt, a) == pricing.share_renewal_cost_mc(s_keep + s_short, 2, price)
    assert all(verify.verify_digest(rt, d).ok for d in report.digests)

    _advance_to_epoch(rt, clock, c + 5)
    before = _balance(rt, a)
    report = renew.renew(rt)
    assert report.transactions == 1 and _blob(rt, keep.memory_id).end_epoch == c + 10
    # short needs nothing more (its epoch is paid): only keep's share is billed.
    assert before - _balance(rt, a) == pricing.share_renewal_cost_mc(s_keep, 3, price)
    with rt.db.read() as s:
        item = s.scalars(select(RenewalItem).order_by(RenewalItem.id.desc())).first()
        assert item is not None and item.share_micro == s_keep
    assert all(verify.verify_digest(rt, d).ok for d in report.digests)
    assert verify.verify_memory(rt, keep.memory_id).ok
    _advance_to_epoch(rt, clock, c + 7)
    assert sweep.sweep(rt).lapsed_paid_memories == 0
    assert _mem(rt, short.memory_id).status == MemoryStatus.EXPIRED


def test_a_quilt_of_expiring_members_is_never_extended_past_the_last_epoch_needed(
    rt: Runtime, clock
) -> None:  # type: ignore[no-untyped-def]
    a = account(rt)
    c = rt.chain.current_epoch()
    one = store.store(rt, a, content="Until c+5.", request_id="1", expires_at=_in_epoch(rt, 5))
    two = store.store(rt, a, content="Until c+6.", request_id="2", expires_at=_in_epoch(rt, 6))
    land_all(rt)
    assert _blob(rt, one.memory_id).id == _blob(rt, two.memory_id).id
    lapsed = 0
    for epoch in range(c + 1, c + 10):
        _advance_to_epoch(rt, clock, epoch)
        lapsed += sweep.sweep(rt).lapsed_paid_memories
        renew.renew(rt)
        assert _blob(rt, one.memory_id).end_epoch <= c + 7
    assert _blob(rt, one.memory_id).end_epoch == c + 7
    # Both expired before their quilt lapsed: nothing was lost, so nothing alerts, and
    # the operator console does not ask anyone to act on them.
    assert lapsed == 0
    (row,) = [r for r in console.account_summaries(rt) if r.account_id == a]
    assert row.lapsed == 0 and not row.needs_action
    assert {_mem(rt, m.memory_id).status for m in (one, two)} == {MemoryStatus.EXPIRED}


def test_check_balance_counts_only_the_epochs_memories_still_need(rt: Runtime, clock) -> None:  # type: ignore[no-untyped-def]
    rt.relayer.quilts = False
    a = account(rt)
    store.store(rt, a, content="Soon gone.", request_id="1", expires_at=_in_epoch(rt, 2))
    land_all(rt)
    # Its blob is paid to the end of its expiry's epoch: nothing left to renew.
    assert balance.check_balance(rt, a).est_runway_funded.startswith("nothing to renew")
    store.store(rt, a, content="Kept.", request_id="2")
    land_all(rt)
    assert "of renewals funded" in balance.check_balance(rt, a).est_runway_funded
