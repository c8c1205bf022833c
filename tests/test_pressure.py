"""Background embedding steps aside while requests saturate the process
(walkeep/pressure.py), within a bound, and never on an event loop."""

from __future__ import annotations

import anyio
import pytest
from starlette.testclient import TestClient

from walkeep.api.app import create_app
from walkeep.index.embedder import MiniLMEmbedder
from walkeep.pressure import Pressure
from walkeep.service.runtime import Runtime


class FakeTime:
    """A monotonic clock that only moves when slept on, recording the sleeps."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


@pytest.fixture
def fake() -> FakeTime:
    return FakeTime()


@pytest.fixture
def pressure(fake: FakeTime) -> Pressure:
    return Pressure(monotonic=fake.monotonic, sleep=fake.sleep)


def test_a_few_concurrent_calls_are_not_a_burst(pressure: Pressure, fake: FakeTime) -> None:
    for _ in range(Pressure.SATURATED_AT - 1):
        pressure.enter()
    assert not pressure.saturated()
    pressure.step_aside()
    assert fake.slept == []


def test_a_burst_holds_for_a_moment_after_it_ends(pressure: Pressure, fake: FakeTime) -> None:
    for _ in range(Pressure.SATURATED_AT):
        pressure.enter()
    for _ in range(Pressure.SATURATED_AT):
        pressure.leave()
    assert pressure.in_flight == 0
    assert pressure.saturated()  # requests come and go within a burst
    fake.now += Pressure.HOLD_SECONDS
    assert not pressure.saturated()


def test_background_work_waits_out_a_burst(pressure: Pressure, fake: FakeTime) -> None:
    for _ in range(Pressure.SATURATED_AT):
        pressure.enter()
    pressure.step_aside()  # the burst ends (nothing re-arms it): waits HOLD_SECONDS
    # In steps of POLL_SECONDS (floating point may need one more step than the hold).
    steps = round(Pressure.HOLD_SECONDS / Pressure.POLL_SECONDS)
    assert steps <= len(fake.slept) <= steps + 1
    assert all(s == Pressure.POLL_SECONDS for s in fake.slept)


def test_an_endless_burst_delays_background_work_by_the_bound_only(
    pressure: Pressure, fake: FakeTime
) -> None:
    # A pressure that re-arms on every poll: requests never stop arriving.
    def busy_sleep(seconds: float) -> None:
        fake.sleep(seconds)
        pressure.enter()
        pressure.leave()

    pressure._sleep = busy_sleep
    for _ in range(Pressure.SATURATED_AT):
        pressure.enter()
    pressure.step_aside()
    steps = round(Pressure.MAX_STEP_ASIDE_SECONDS / Pressure.POLL_SECONDS)
    assert steps <= len(fake.slept) <= steps + 1
    waited = len(fake.slept)
    pressure.step_aside()  # the same stretch: no more waiting until it ends
    pressure.step_aside()
    assert len(fake.slept) == waited


def test_an_event_loop_never_waits(pressure: Pressure, fake: FakeTime) -> None:
    for _ in range(Pressure.SATURATED_AT):
        pressure.enter()

    async def on_the_loop() -> None:
        pressure.step_aside()

    anyio.run(on_the_loop)
    assert fake.slept == []


def test_the_web_app_counts_every_request_in_flight(rt: Runtime) -> None:
    seen: list[int] = []
    app = create_app(rt)

    @app.get("/probe-in-flight")
    def probe() -> dict[str, int]:
        seen.append(rt.pressure.in_flight)
        return {}

    with TestClient(app) as client:
        assert client.get("/probe-in-flight").status_code == 200
        assert client.post("/mcp", json={}).status_code in (400, 401)  # the fast path too
    assert seen == [1]
    assert rt.pressure.in_flight == 0  # and counted out, whatever the outcome


def test_embedding_steps_aside_between_batches_only() -> None:
    calls: list[int] = []
    embedder = MiniLMEmbedder()
    embedder.between_batches = lambda: calls.append(1)
    embedder.embed(["one short query"])
    assert calls == []  # a query is one batch: recall never waits
    embedder.embed([f"memory number {i}" for i in range(70)])  # 32 + 32 + 6
    assert len(calls) == 2


def test_the_runtime_wires_its_embedder_to_its_pressure(rt: Runtime) -> None:
    embedder = rt.extras["embedder"]
    assert isinstance(embedder, MiniLMEmbedder)  # what the test settings ask for
    assert embedder.between_batches == rt.pressure.step_aside


def test_processes_of_one_server_share_their_pressure(tmp_path, fake: FakeTime) -> None:  # type: ignore[no-untyped-def]
    """``--workers N``: the web processes post saturation on a shared board and the
    supervisor's completer, which serves no requests, steps aside for it."""
    web = Pressure(monotonic=fake.monotonic, sleep=fake.sleep)
    supervisor = Pressure(monotonic=fake.monotonic, sleep=fake.sleep)
    web.share(tmp_path / "pressure")
    supervisor.share(tmp_path / "pressure")
    assert not supervisor.saturated()  # a fresh board: nothing posted
    for _ in range(Pressure.SATURATED_AT - 1):
        web.enter()
    assert not supervisor.saturated()  # a few calls are not a burst, here either
    web.enter()
    assert supervisor.saturated()
    supervisor.step_aside()
    assert fake.slept and sum(fake.slept) >= Pressure.HOLD_SECONDS  # waited it out
    assert not supervisor.saturated()
    lone = Pressure(monotonic=fake.monotonic, sleep=fake.sleep)
    web.enter()
    assert not lone.saturated()  # not sharing the board: sees only its own requests


def test_a_board_from_before_a_reboot_is_not_a_burst(tmp_path, fake: FakeTime) -> None:  # type: ignore[no-untyped-def]
    """The monotonic clock restarts with the machine; a value posted before that is
    ahead of now and must not keep completion waiting."""
    board = tmp_path / "pressure"
    before = Pressure(monotonic=lambda: 1_000_000.0)
    before.share(board)
    for _ in range(Pressure.SATURATED_AT):
        before.enter()
    after = Pressure(monotonic=fake.monotonic, sleep=fake.sleep)  # fake.now is 100 s
    after.share(board)
    assert not after.saturated()
