"""``walkeep worker`` (and ``python -m worker``): the scheduler in the foreground.

SIGTERM/SIGINT stop scheduling new runs and wait for the jobs in hand; the
renewal and completion loops check the stop flag between batches, so the
batch being submitted is always recorded before exit.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Literal

from walkeep.scheduler.jobs import (
    WorkerLock,
    acquire_worker_lock,
    build_scheduler,
    log,
    schedule_note,
)
from walkeep.service.runtime import Runtime


def run_forever(
    rt: Runtime,
    *,
    metrics_port: int | None = None,
    metrics_host: str = "127.0.0.1",
    lock: WorkerLock | Literal["acquire"] | None = "acquire",
) -> None:
    """Run the jobs until SIGTERM/SIGINT. ``lock``: the worker lock the caller already
    holds (``walkeep worker`` takes it, and serves metrics, before it changes anything),
    or ``"acquire"`` to take it here."""
    if lock == "acquire":
        lock = acquire_worker_lock(rt)
    if metrics_port is not None:
        from walkeep import metrics

        bound = metrics.serve(metrics_port, metrics_host)
        log.info("metrics served", extra={"url": f"http://{metrics_host}:{bound}/metrics"})
    stop: threading.Event = rt.extras.setdefault("stop", threading.Event())
    sched = build_scheduler(rt, blocking=True)

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("stopping: finishing the jobs in hand", extra={"signal": signum})
        stop.set()
        threading.Thread(target=lambda: sched.shutdown(wait=True), daemon=True).start()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    log.info(
        "worker started",
        extra={"jobs": [j.id for j in sched.get_jobs()], "schedule": schedule_note(rt)},
    )
    try:
        sched.start()
    finally:
        if lock is not None:
            lock.release()
        log.info("worker stopped")
