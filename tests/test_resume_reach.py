"""Credits arriving resume paused memories, and ``memories.resumed`` promises only what a
renewal will keep (issue 39): a memory whose blob ends before the next renewal pass is
due is reported apart, never counted as resumed; the renewal pass, which renews what it
resumes straight away, counts everything it resumes."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import select

from tests.helpers import account, epoch_seconds, land_all
from walkeep.clock import ManualClock
from walkeep.db.models import AlertEvent, Blob, Memory
from walkeep.lifecycle import MemoryStatus
from walkeep.service import alerts
from walkeep.service.jobs import renew, sweep
from walkeep.service.runtime import Runtime
from walkeep.service.tools import store, topup


def _events(rt: Runtime, acct: str, type_: str) -> list[dict[str, Any]]:
    with rt.db.read() as s:
        bodies = s.scalars(
            select(AlertEvent.body)
            .where(AlertEvent.account_id == acct, AlertEvent.type == type_)
            .order_by(AlertEvent.created_at, AlertEvent.id)
        ).all()
    return [json.loads(b)["data"] for b in bodies]


def _end(rt: Runtime, memory_id: str) -> int:
    with rt.db.read() as s:
        return int(
            s.scalar(
                select(Blob.end_epoch)
                .join(Memory, Memory.blob_pk == Blob.id)
                .where(Memory.id == memory_id)
            )
            or 0
        )


def _status(rt: Runtime, memory_id: str) -> str:
    with rt.db.read() as s:
        return str(s.scalar(select(Memory.status).where(Memory.id == memory_id)))


def _two_paused(rt: Runtime, clock: ManualClock, left: float = 10) -> tuple[str, str, str]:
    """An account with two paused memories in two quilts: ``soon`` ends with the current
    epoch, ``left`` seconds from now; ``later`` ends an epoch after that."""
    step = epoch_seconds(rt)
    acct = account(rt, credits=2)  # the two stores, nothing for renewals
    alerts.set_alert_webhook(rt, acct, "http://127.0.0.1:9/hook")
    soon = store.store(rt, acct, content="ends first", request_id="r1").memory_id
    land_all(rt)
    clock.advance(step)
    later = store.store(rt, acct, content="ends an epoch later", request_id="r2").memory_id
    land_all(rt)
    assert _end(rt, later) == _end(rt, soon) + 1
    clock.advance(step * (rt.settings.initial_epochs - 2))  # runways 1 and 2: both due
    assert renew.renew(rt).paused_memories == 2
    info = rt.chain.epoch_info()
    assert info.started_at is not None and _end(rt, soon) == info.epoch + 1
    # ``left`` seconds before the epoch ends (ten: the next pass, a minute away, is late).
    clock.advance((info.started_at - clock.now()).total_seconds() + info.duration_seconds - left)
    assert rt.chain.current_epoch() == info.epoch
    return acct, soon, later


def _pay(rt: Runtime, acct: str, request_id: str) -> None:
    url = topup.top_up(rt, acct, "5.00", request_id).checkout_url
    cid = url.rsplit("/", 1)[1]
    assert topup.pay_local(rt, cid, topup.issue_pay_token(rt, cid)) is True


def test_a_top_up_counts_as_resumed_only_what_a_renewal_reaches_in_time(
    rt: Runtime, clock: ManualClock
) -> None:
    acct, soon, later = _two_paused(rt, clock)
    end = _end(rt, soon)
    _pay(rt, acct, "pay-1")
    (resumed,) = _events(rt, acct, "memories.resumed")
    # Before: {"resumed_memories": 2}, for a memory that lapsed ten seconds later.
    assert resumed["resumed_memories"] == 1
    assert resumed["ending_before_renewal"] == 1 and resumed["ends_at_epoch"] == end
    assert "lapse" in resumed["note"]
    # Both are active: whichever pass comes first may still save the first one.
    assert _status(rt, soon) == _status(rt, later) == MemoryStatus.ACTIVE

    # The next pass, a minute later: the first has lapsed, the second is renewed — what
    # the alert said.
    clock.advance(rt.settings.renew_interval_seconds)
    report = renew.renew(rt)
    assert report.blobs_renewed == 1 and _end(rt, later) > end + 1
    assert sweep.sweep(rt).expired_memories == 1
    assert _status(rt, soon) == MemoryStatus.EXPIRED
    assert _status(rt, later) == MemoryStatus.ACTIVE
    (expired,) = _events(rt, acct, "memories.expired")
    assert expired["memory_ids"] == [soon]


def test_a_top_up_with_time_to_spare_counts_every_memory_it_resumes(
    rt: Runtime, clock: ManualClock
) -> None:
    acct, _soon, _later = _two_paused(rt, clock, left=epoch_seconds(rt) / 2)  # in time
    _pay(rt, acct, "pay-1")
    (resumed,) = _events(rt, acct, "memories.resumed")
    assert resumed == {"resumed_memories": 2}


def test_the_renewal_pass_renews_at_once_what_it_resumes_and_counts_it(
    rt: Runtime, clock: ManualClock
) -> None:
    """Credits that arrive without resuming (here: a ledger credit) are found by the
    renewal pass, which resumes and renews in one go: ten seconds are enough."""
    from walkeep import ledger

    acct, soon, _later = _two_paused(rt, clock)
    end = _end(rt, soon)
    with rt.db.begin() as s:
        ledger.credit(s, acct, 50_000, ref="direct", kind=ledger.Kind.GRANT, memo="direct")
    report = renew.renew(rt)
    assert report.resumed_memories == 2 and report.blobs_renewed == 2
    assert _end(rt, soon) > end  # renewed before its epoch ended
    (resumed,) = _events(rt, acct, "memories.resumed")
    assert resumed == {"resumed_memories": 2}
