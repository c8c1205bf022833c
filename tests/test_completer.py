"""The in-process completer, in both modes: a database queue (self-run relayer) and
per-memory polling (remote relayers such as MemWal)."""

from __future__ import annotations

import os
import sys
import threading
import time
from datetime import timedelta
from typing import Any

import pytest

from tests.helpers import account
from walkeep.pressure import Pressure
from walkeep.service.jobs import completion
from walkeep.service.runtime import Runtime
from walkeep.service.tools import runway, store


class RemoteLike:
    """The self-run relayer seen through a remote relayer's interface: accept and poll
    only (no in-transaction accept, no work queue), counting polls."""

    content_listable = False
    name = "remote-like"

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.polls = 0

    def health(self) -> Any:
        return self.inner.health()

    def accept(self, **kw: Any) -> str:
        return str(self.inner.accept(**kw))

    def poll(self, job_id: str) -> Any:
        self.polls += 1
        return self.inner.poll(job_id)

    def read(self, *a: Any) -> Any:
        return self.inner.read(*a)

    def search(self, *a: Any) -> Any:
        return self.inner.search(*a)

    def list_contents(self, *a: Any) -> Any:
        return None


def _statuses(rt: Runtime, a: str) -> list[str]:
    return sorted(m.status for m in runway.check_runway(rt, a).memories)


def test_queue_mode_lands_everything_that_is_due(rt: Runtime) -> None:
    rt.completer = completion.Completer(rt)
    rt.completer.start()
    try:
        a = account(rt, credits=20)
        for i in range(12):
            store.store(rt, a, content=f"queued fact {i}", request_id=f"q{i}")
        assert rt.completer.wait_idle(30)
        assert _statuses(rt, a) == ["active"] * 12
    finally:
        rt.completer.stop()


def test_polling_mode_batches_and_respects_the_relayers_due_time(rt: Runtime, clock) -> None:  # type: ignore[no-untyped-def]
    remote = RemoteLike(rt.relayer)
    rt.relayer = remote  # type: ignore[assignment]
    rt.completer = completion.Completer(rt)
    assert not rt.completer._queue_mode
    rt.completer.start()
    try:
        a = account(rt, credits=20)
        for i in range(6):
            store.store(rt, a, content=f"polled fact {i}", request_id=f"p{i}")
        assert rt.completer.wait_idle(30)
        assert _statuses(rt, a) == ["active"] * 6

        # A write the relayer says is due in an hour: polled once, then scheduled for
        # the hinted time (capped) — not hammered with exponential retries.
        remote.inner.latency_ms = 3_600_000
        remote.inner.quilt_window = timedelta(hours=1)  # a packed write waits for its window
        slow = store.store(rt, a, content="slow", request_id="slow").memory_id
        completer = rt.completer

        def rescheduled() -> float | None:
            with completer._cv:
                due = [i.due for i in completer._heap if i.memory_id == slow]
            return due[0] - time.monotonic() if due and remote.polls >= 7 else None

        deadline = time.monotonic() + 10
        while (wait := rescheduled()) is None and time.monotonic() < deadline:
            time.sleep(
                0.005
            )  # waiting for the background thread's first poll, not for time to pass
        assert wait is not None and wait > 30, wait
    finally:
        rt.completer.stop()


@pytest.mark.skipif(sys.platform != "linux", reason="per-thread nice is Linux behaviour")
def test_completion_runs_at_background_priority() -> None:
    """Requests get the CPU first: a completer thread lowers its own priority and
    only its own (the thread that started it keeps its nice value)."""
    seen: list[int] = []

    def body() -> None:
        completion._lower_priority(completion.Completer.NICE)
        seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))

    mine = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    t = threading.Thread(target=body)
    t.start()
    t.join()
    assert seen == [min(19, mine + completion.Completer.NICE)]
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == mine


def test_a_store_wakes_the_queue_thread_only_if_it_would_sleep_past_the_write(
    rt: Runtime,
) -> None:
    """A packed write is due when its quilt window closes, which a thread sleeping until
    then already plans to wake for: waking it per accept cost a lease and a next-due query
    per store, on the requests' GIL (bench/store.py)."""
    c = completion.Completer(rt)  # not started: we play its thread's part
    assert c._queue_mode
    with c._cv:
        c._sleeping_until = time.monotonic() + 60  # asleep, looking again in a minute
    c.submit("mem_due_in_2min", delay=120)
    assert c.pending() == 0  # it looks before then anyway: not woken
    c.submit("mem_due_in_5s", delay=5)
    assert c.pending() == 1  # it would sleep past this one: woken
    with c._cv:
        c._sleeping_until = None  # busy, not sleeping: nothing tells when it looks next
    c.submit("mem_due_in_2min_too", delay=120)
    assert c.pending() == 2


def test_the_queue_thread_takes_no_work_while_requests_saturate_the_process(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Completion steps aside for a burst before it leases anything, not only between
    embedding batches: each round's lease, upload and first batch used to run mid-burst."""
    now = [100.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds  # the completer's waits move this clock, nothing else does

    rt.pressure = Pressure(monotonic=lambda: now[0], sleep=sleep)
    a = account(rt, credits=20)
    for i in range(3):
        store.store(rt, a, content=f"fact during a burst {i}", request_id=f"b{i}")
    for _ in range(Pressure.SATURATED_AT):
        rt.pressure.enter()  # a burst is in flight, as the web app counts it
    burst_at = now[0]
    rounds_at: list[float] = []
    drain = completion.drain_due

    def watched(rt_: Runtime, limit: int = completion.BATCH) -> completion.Drained:
        rounds_at.append(now[0])
        return drain(rt_, limit)

    monkeypatch.setattr(completion, "drain_due", watched)
    rt.completer = completion.Completer(rt)
    rt.completer.start()
    try:
        assert rt.completer.wait_idle(30)
    finally:
        rt.completer.stop()
    assert rounds_at and rounds_at[0] >= burst_at + Pressure.HOLD_SECONDS
    assert _statuses(rt, a) == ["active"] * 3  # then it all lands
