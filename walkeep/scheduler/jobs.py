"""The worker's jobs: APScheduler 3 wiring around service-layer functions.

Each job coalesces missed runs, never runs twice at once in this process
(``max_instances=1``), has its own interval (``WALKEEP_<JOB>_INTERVAL_SECONDS``)
and records its duration. A run logs a line only when it did something (an idle
worker would otherwise write five lines every interval); a heartbeat line every
``HEARTBEAT_SECONDS`` says the worker is alive and sums up the quiet runs. No business
logic lives here: every job is a function in ``walkeep.service``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import logging
import os
import threading
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.schedulers.base import BaseScheduler
from apscheduler.schedulers.blocking import BlockingScheduler

from walkeep import metrics
from walkeep.config import Settings
from walkeep.errors import ConfigurationError
from walkeep.service.jobs import autotopup, completion, reconcile, reindex, renew, sweep
from walkeep.service.operators import console
from walkeep.service.runtime import Runtime
from walkeep.service.tools.views import short_duration

log = logging.getLogger("walkeep.worker")

HEARTBEAT_SECONDS = 600.0
# Report fields that describe a backlog rather than work done in this run.
_STATE_FIELDS = frozenset({"pending", "waiting", "skipped"})


def _reconcile_payments(rt: Runtime) -> Any:
    from walkeep.service.tools import topup

    return topup.reconcile_payments(rt)


def _deliver_alerts(rt: Runtime) -> Any:
    from walkeep.service import alerts

    return alerts.deliver_alerts(rt)


# name → (job function, interval setting)
JOBS: dict[str, tuple[Callable[[Runtime], Any], str]] = {
    "complete_writes": (completion.complete_writes, "complete_writes_interval_seconds"),
    "renew": (renew.renew, "renew_interval_seconds"),
    "reconcile_renewals": (reconcile.reconcile_renewals, "reconcile_renewals_interval_seconds"),
    "sweep": (sweep.sweep, "sweep_interval_seconds"),
    "reconcile_payments": (_reconcile_payments, "reconcile_payments_interval_seconds"),
    "deliver_alerts": (_deliver_alerts, "deliver_alerts_interval_seconds"),
    "auto_top_up": (autotopup.auto_top_up, "auto_top_up_interval_seconds"),
    "reindex": (reindex.backfill, "reindex_interval_seconds"),
}


# Jobs whose work is measured in epochs, and how often per epoch each must run at least.
# A blob sits at the renewal threshold (runway == WALKEEP_RENEW_THRESHOLD_EPOCHS) for one
# epoch: a pass twice per epoch sees it there, so renewal is early, not at runway 1 (30-s
# epochs with the 60-s default renewed and paused at runway 1). A crashed renewal's
# intent leases its blobs until reconcile settles it, so reconcile keeps the same pace;
# the sweep reports lapses (memories.expired) within the epoch they happen. Automatic
# top-up keeps the renewal pass funded, so it looks as often as the pass does.
PER_EPOCH: dict[str, int] = {"renew": 2, "reconcile_renewals": 2, "sweep": 1, "auto_top_up": 2}
# What each of those jobs is for, said when an interval set for it is refused: an
# operator who lengthens the sweep's interval should not read that renewal suffers.
PURPOSE: dict[str, str] = {
    "renew": "the renewal pass extends blobs while their runway is at the threshold; "
    "any slower and they renew (or pause) at their last epoch",
    "reconcile_renewals": "reconciliation settles a renewal interrupted by a crash; "
    "until it does, that renewal's blobs are leased and no pass renews them",
    "sweep": "the sweep reports lapses (memories.expired alerts, statuses) within the "
    "epoch they happen; it does not renew",
    "auto_top_up": "automatic top-up charges a saved card before the renewal pass would "
    "pause memories for want of credits",
}


def job_intervals(settings: Settings, epoch_seconds: int | None) -> dict[str, float]:
    """Each job's interval in seconds: its setting, capped by the epoch length.

    A default longer than an epoch allows is shortened (derived from the epoch); an
    interval the operator set explicitly is refused instead (ConfigurationError naming
    every such variable and what its job is for): a worker that cannot keep pace must
    not start as if it could. ``epoch_seconds`` None (chain unreachable at start, or not
    known yet): the settings as they are.
    """
    out: dict[str, float] = {}
    refused: list[str] = []
    for name, (_fn, setting) in JOBS.items():
        configured = float(getattr(settings, setting))
        per_epoch = PER_EPOCH.get(name)
        if per_epoch is None or epoch_seconds is None or configured <= epoch_seconds / per_epoch:
            out[name] = configured
            continue
        bound = epoch_seconds / per_epoch
        if setting in settings.model_fields_set:
            times = "once" if per_epoch == 1 else f"{per_epoch}×"
            refused.append(
                f"WALKEEP_{setting.upper()}={configured:g}: {name} must run at least "
                f"{times} per epoch (every {bound:g} s or less) — {PURPOSE[name]}"
            )
        out[name] = bound
    if refused:
        raise ConfigurationError(
            f"job intervals cannot keep up with {short_duration(epoch_seconds or 0)} epochs: "
            + "; ".join(refused)
            + ". Lower them, or unset them to derive them from the epoch length"
        )
    return out


def epoch_seconds_of(rt: Runtime) -> int | None:
    """The chain's epoch length, or None if the chain does not answer now (logged)."""
    try:
        return int(rt.chain.epoch_info().duration_seconds)
    except Exception as exc:
        log.warning("epoch length unknown (%s); job intervals as configured", exc)
        return None


def schedule_note(rt: Runtime, intervals: dict[str, float] | None = None) -> str:
    """One line for the start banner and the worker's log: how often renewal looks."""
    epoch = epoch_seconds_of(rt)
    intervals = intervals or job_intervals(rt.settings, epoch)
    every = short_duration(intervals["renew"])
    if epoch is None:
        return f"renewal pass every {every}"
    derived = intervals["renew"] < float(rt.settings.renew_interval_seconds)
    return (
        f"renewal pass every {every}{' (derived from the epoch)' if derived else ''}; "
        f"epochs last {short_duration(epoch)}; blobs renew at "
        f"{rt.settings.renew_threshold_epochs} epochs of runway"
    )


def run_job(rt: Runtime, name: str) -> Any:
    """Run one job now, with logging and metrics (also used by tests and the CLI)."""
    fn, _ = JOBS[name]
    started = time.perf_counter()
    started_at = rt.clock.now()
    try:
        report = fn(rt)
    except Exception as exc:
        metrics.JOB_RUNS.labels(name, "error").inc()
        log.exception("job failed", extra={"job": name})
        _record_run(rt, name, started_at, started, ok=False, summary=f"{type(exc).__name__}")
        raise
    elapsed = time.perf_counter() - started
    metrics.JOB_RUNS.labels(name, "ok").inc()
    metrics.JOB_DURATION.labels(name).observe(elapsed)
    fields = report_fields(report)
    busy = did_work(fields)
    with _TALLY_LOCK:
        _TALLY["runs"] += 1
        _TALLY["busy"] += int(busy)
    if busy:
        log.info("job done", extra={"job": name, "seconds": round(elapsed, 4), **fields})
    else:
        log.debug("job idle", extra={"job": name, "seconds": round(elapsed, 4)})
    _record_run(rt, name, started_at, started, ok=True, summary=_summary(fields))
    return report


def report_fields(report: Any) -> dict[str, Any]:
    """A job's report as a flat dict (dataclass, pydantic model, or anything else)."""
    if dataclasses.is_dataclass(report) and not isinstance(report, type):
        return dataclasses.asdict(report)
    dump = getattr(report, "model_dump", None)
    if callable(dump):
        return dict(dump())
    return {"result": report}


def did_work(fields: dict[str, Any]) -> bool:
    """True when a run changed something: any non-zero count that is not a backlog gauge.

    A report we cannot read counts as work, so nothing unknown is hidden.
    """
    counts = {k: v for k, v in fields.items() if isinstance(v, int) and not isinstance(v, bool)}
    if not counts:
        return fields.get("result") is not None
    return any(v for k, v in counts.items() if k not in _STATE_FIELDS)


_TALLY_LOCK = threading.Lock()
_TALLY = {"runs": 0, "busy": 0}


def heartbeat() -> None:
    """One INFO line per interval: alive, and how many runs were quiet since the last one."""
    with _TALLY_LOCK:
        runs, busy = _TALLY["runs"], _TALLY["busy"]
        _TALLY["runs"] = _TALLY["busy"] = 0
    log.info("worker alive", extra={"job_runs": runs, "runs_with_work": busy})


def _summary(fields: dict[str, Any]) -> str:
    """The report's scalar figures, for the admin console (lists are left out)."""
    return ", ".join(
        f"{k}={v}" for k, v in fields.items() if isinstance(v, int | float | str | bool)
    )


def _record_run(
    rt: Runtime, name: str, started_at: datetime, t0: float, *, ok: bool, summary: str
) -> None:
    """Upsert the job's last run where the web console can read it; never fail the job."""
    try:
        console.record_job_run(
            rt.db,
            name,
            started_at=started_at,
            duration_ms=int((time.perf_counter() - t0) * 1000),
            ok=ok,
            summary=summary,
            worker=renew.worker_name(),
        )
    except Exception:
        log.warning("could not record the job run", exc_info=True, extra={"job": name})


def _safe(rt: Runtime, name: str) -> Callable[[], None]:
    def go() -> None:
        stop: threading.Event = rt.extras.setdefault("stop", threading.Event())
        if stop.is_set():
            return
        # A failure is logged in run_job; the next run retries.
        with contextlib.suppress(Exception):
            run_job(rt, name)

    return go


def build_scheduler(rt: Runtime, *, blocking: bool) -> BaseScheduler:
    defaults = {"coalesce": True, "max_instances": 1, "misfire_grace_time": 60}
    sched: BaseScheduler = (
        BlockingScheduler(job_defaults=defaults, timezone="UTC")
        if blocking
        else BackgroundScheduler(job_defaults=defaults, timezone="UTC", daemon=True)
    )
    intervals = job_intervals(rt.settings, epoch_seconds_of(rt))
    for name in JOBS:
        sched.add_job(
            _safe(rt, name),
            "interval",
            seconds=intervals[name],
            id=name,
            name=name,
            next_run_time=datetime.now().astimezone(),
        )
    sched.add_job(heartbeat, "interval", seconds=HEARTBEAT_SECONDS, id="heartbeat")
    from walkeep.egress import start_notice

    policy = rt.settings.egress_policy
    notice = start_notice(policy, default=rt.settings.alert_egress_allow is None)
    # Said at start, loudly when tenants' webhooks may reach beyond the public internet.
    log.log(
        logging.WARNING if policy.networks or policy.hosts else logging.INFO,
        f"alert webhooks may reach {notice}",
    )
    return sched


class WorkerLock:
    """On SQLite only one worker may run: an OS lock next to the database file.

    Released automatically if the process dies. PostgreSQL needs no lock:
    workers claim rows with FOR UPDATE SKIP LOCKED.
    """

    def __init__(self, db_path: Path) -> None:
        self.path = db_path.with_name(db_path.name + ".worker.lock")
        self._fd: int | None = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise ConfigurationError(
                f"another Walkeep worker is already running against this SQLite database "
                f"(lock {self.path}). SQLite supports one worker; stop the other one, or use "
                "PostgreSQL (WALKEEP_DATABASE_URL=postgresql+psycopg://…) to run several."
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def acquire_worker_lock(rt: Runtime) -> WorkerLock | None:
    return worker_lock_for(rt.db.sqlite_path)


def worker_lock_for(db_path: Path | None) -> WorkerLock | None:
    """Take the SQLite database's worker lock (ConfigurationError if another worker
    holds it); None on PostgreSQL. ``walkeep worker`` takes it before it configures the
    local network, so a second worker is refused with nothing changed."""
    if db_path is None:
        return None
    lock = WorkerLock(db_path)
    lock.acquire()
    return lock
