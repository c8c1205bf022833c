"""The worker's pace follows the epoch length: renewal happens at the threshold, early,
even when epochs are short (issue 30)."""

from __future__ import annotations

import pytest

from tests.helpers import account, land_all
from walkeep.bootstrap import build_runtime
from walkeep.config import Settings
from walkeep.errors import ConfigurationError
from walkeep.scheduler.jobs import build_scheduler, job_intervals, schedule_note
from walkeep.service.jobs import renew
from walkeep.service.tools import runway, store


def _interval(rt, name: str) -> float:  # type: ignore[no-untyped-def]
    """The interval the scheduler the worker runs would use (never started here)."""
    sched = build_scheduler(rt, blocking=False)
    return float(sched.get_job(name).trigger.interval.total_seconds())


def test_short_epochs_renew_at_the_threshold_not_at_the_last_epoch(
    settings: Settings,
    clock,
    db,  # type: ignore[no-untyped-def]
) -> None:
    """Regression: with 30-s epochs the 60-s renew interval renewed (or paused) at
    runway 1. Drive the renewal pass at the interval the worker schedules it."""
    fast = settings.model_copy(update={"local_epoch_seconds": 30})
    rt = build_runtime(fast, clock=clock, database=db, with_completer=False, configure_network=True)
    try:
        a = account(rt)
        mid = store.store(rt, a, content="renew me early", request_id="r1").memory_id
        land_all(rt)
        every = _interval(rt, "renew")
        assert every <= 15
        threshold = fast.renew_threshold_epochs
        seen: list[int] = []
        for _ in range(200):
            before = runway.check_runway(rt, a, mid).memories[0]
            renew.renew(rt)
            after = runway.check_runway(rt, a, mid).memories[0]
            if after.renewals_performed:
                assert before.runway_epochs == threshold, seen
                break
            seen.append(before.runway_epochs)
            clock.advance(every)
        else:
            pytest.fail("never renewed")
        assert after.status == "active" and after.runway_epochs == fast.target_runway_epochs
    finally:
        rt.extras["localnet"].close()


def test_intervals_follow_the_epoch_and_an_explicit_impossible_one_is_refused(
    settings: Settings,
) -> None:
    defaults = job_intervals(settings, 3600)
    assert defaults["renew"] == 60 and defaults["sweep"] == 600  # long epochs: as set
    short = job_intervals(settings, 30)
    assert short["renew"] == 15 and short["reconcile_renewals"] == 15 and short["sweep"] == 30
    assert short["complete_writes"] == settings.complete_writes_interval_seconds
    explicit = settings.model_copy(update={"renew_interval_seconds": 60})
    with pytest.raises(ConfigurationError, match="WALKEEP_RENEW_INTERVAL_SECONDS=60"):
        job_intervals(explicit, 30)
    assert (
        job_intervals(explicit.model_copy(update={"renew_interval_seconds": 10}), 30)["renew"] == 10
    )


def test_the_start_line_says_how_often_renewal_looks(settings: Settings, clock, db) -> None:  # type: ignore[no-untyped-def]
    fast = settings.model_copy(update={"local_epoch_seconds": 30})
    rt = build_runtime(fast, clock=clock, database=db, with_completer=False, configure_network=True)
    try:
        note = schedule_note(rt)
        assert "every 15 s (derived from the epoch)" in note and "epochs last 30 s" in note
    finally:
        rt.extras["localnet"].close()


def test_a_refused_interval_says_what_its_job_is_for(settings: Settings) -> None:
    """Regression (issue 39): a too-long sweep interval was refused "to renew at the
    threshold" — the sweep renews nothing. Each refused job is named with its purpose,
    all of them in one message."""
    slow_sweep = settings.model_copy(update={"sweep_interval_seconds": 600})
    with pytest.raises(ConfigurationError) as refused:
        job_intervals(slow_sweep, 30)
    text = str(refused.value)
    assert "WALKEEP_SWEEP_INTERVAL_SECONDS=600" in text and "once per epoch" in text
    assert "reports lapses" in text and "it does not renew" in text
    assert "threshold" not in text  # nothing about renewing early: that is not its job
    both = slow_sweep.model_copy(
        update={"renew_interval_seconds": 60, "reconcile_renewals_interval_seconds": 60}
    )
    with pytest.raises(ConfigurationError) as refused:
        job_intervals(both, 30)
    text = str(refused.value)
    for variable in ("RENEW_INTERVAL", "RECONCILE_RENEWALS_INTERVAL", "SWEEP_INTERVAL"):
        assert f"WALKEEP_{variable}_SECONDS=" in text
    assert "runway is at the threshold" in text and "settles a renewal interrupted" in text
