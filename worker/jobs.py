"""The worker's jobs: APScheduler 3 wiring around service-layer functions.

Each job coalesces missed runs, never runs twice at once in this process
(``max_instances=1``), has its own interval (``WALKEEP_<JOB>_INTERVAL_SECONDS``),
logs one structured line per run and records its duration. No business logic
lives here: every job is a function in ``walkeep.service``.
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
from walkeep.errors import ConfigurationError
from walkeep.service import completion, renew
from walkeep.service.runtime import Runtime

log = logging.getLogger("walkeep.worker")


def _reconcile_payments(rt: Runtime) -> Any:
    from walkeep.service import topup

    return topup.reconcile_payments(rt)


def _deliver_alerts(rt: Runtime) -> Any:
    from walkeep.service import alerts

    return alerts.deliver_alerts(rt)


# name → (job function, interval setting)
JOBS: dict[str, tuple[Callable[[Runtime], Any], str]] = {
    "complete_writes": (completion.complete_writes, "complete_writes_interval_seconds"),
    "renew": (renew.renew, "renew_interval_seconds"),
    "reconcile_renewals": (renew.reconcile_renewals, "reconcile_renewals_interval_seconds"),
    "sweep": (renew.sweep, "sweep_interval_seconds"),
    "reconcile_payments": (_reconcile_payments, "reconcile_payments_interval_seconds"),
    "deliver_alerts": (_deliver_alerts, "deliver_alerts_interval_seconds"),
}


def run_job(rt: Runtime, name: str) -> Any:
    """Run one job now, with logging and metrics (also used by tests and the CLI)."""
    fn, _ = JOBS[name]
    started = time.perf_counter()
    try:
        report = fn(rt)
    except Exception:
        metrics.JOB_RUNS.labels(name, "error").inc()
        log.exception("job failed", extra={"job": name})
        raise
    elapsed = time.perf_counter() - started
    metrics.JOB_RUNS.labels(name, "ok").inc()
    metrics.JOB_DURATION.labels(name).observe(elapsed)
    fields = (
        dataclasses.asdict(report)
        if dataclasses.is_dataclass(report) and not isinstance(report, type)
        else {"result": report}
    )
    log.info("job done", extra={"job": name, "seconds": round(elapsed, 4), **fields})
    return report


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
    for name, (_fn, interval) in JOBS.items():
        sched.add_job(
            _safe(rt, name),
            "interval",
            seconds=float(getattr(rt.settings, interval)),
            id=name,
            name=name,
            next_run_time=datetime.now().astimezone(),
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
    path = rt.db.sqlite_path
    if path is None:
        return None
    lock = WorkerLock(path)
    lock.acquire()
    return lock
