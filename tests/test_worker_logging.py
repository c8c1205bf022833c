"""An idle worker is quiet: a job logs at INFO only when it did something; a heartbeat
line sums up the quiet runs."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import pytest

from walkeep.scheduler import jobs


@dataclass
class Report:
    landed: int = 0
    pending: int = 0


def _run(monkeypatch: pytest.MonkeyPatch, rt, report: object) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setitem(jobs.JOBS, "probe", (lambda _rt: report, "renew_interval_seconds"))
    jobs.run_job(rt, "probe")


def test_idle_runs_are_quiet_and_the_heartbeat_counts_them(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, rt
) -> None:  # type: ignore[no-untyped-def]
    jobs.heartbeat()  # reset the tally
    caplog.clear()
    caplog.set_level(logging.INFO, logger="walkeep.worker")
    _run(monkeypatch, rt, Report())
    _run(monkeypatch, rt, Report(pending=3))  # a backlog alone is not work
    assert [r.getMessage() for r in caplog.records] == []
    _run(monkeypatch, rt, Report(landed=2))
    done = [r for r in caplog.records if r.getMessage() == "job done"]
    assert len(done) == 1 and done[0].landed == 2  # type: ignore[attr-defined]
    caplog.clear()
    jobs.heartbeat()
    (beat,) = caplog.records
    assert beat.getMessage() == "worker alive"
    assert (beat.job_runs, beat.runs_with_work) == (3, 1)  # type: ignore[attr-defined]


def test_did_work_reads_pydantic_reports_and_never_hides_the_unknown() -> None:
    from walkeep.service.tools.topup import ReconcileReport

    assert not jobs.did_work(jobs.report_fields(ReconcileReport(pending=2)))
    assert jobs.did_work(jobs.report_fields(ReconcileReport(credited=1)))
    assert jobs.did_work(jobs.report_fields("something odd"))
    assert not jobs.did_work(jobs.report_fields(None))


def test_the_scheduler_has_a_heartbeat(rt) -> None:  # type: ignore[no-untyped-def]
    sched = jobs.build_scheduler(rt, blocking=False)
    beat = sched.get_job("heartbeat")
    assert beat is not None and beat.trigger.interval.total_seconds() == jobs.HEARTBEAT_SECONDS
