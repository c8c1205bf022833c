"""How ``walkeep serve`` runs: one web process, or N sharing one port (``--workers N``).

One process (the default) is uvicorn serving one app, with the scheduler's jobs in a
background thread unless ``--no-worker``.

``--workers N`` (PostgreSQL only) turns the process the operator started into a
supervisor: uvicorn's ``Multiprocess`` starts N web processes that share the listening
socket, and each builds its own Runtime (database pool, relayer, completer) from the
settings the supervisor resolved. Completion is safe across them because write jobs are
worked under leases in the database (``walkeep.backends.self_relayer``), not because
anything here coordinates them.

The scheduler runs in the supervisor, never in a web process. Exactly one process must
run it, and the supervisor is the only process that lives as long as the server:
uvicorn replaces web processes on its own (a dead or hung one, all of them on SIGHUP,
one more or one fewer on SIGTTIN/SIGTTOU), so a role won by one of them would move
with it, or vanish with no one left to take it over.

Everything that must happen once happens in the supervisor before any web process
starts (the caller does migrations and first run; ``serve_many`` adds the console
secret): N processes racing to create the same files would be safe, but not obviously so.
"""

from __future__ import annotations

import asyncio
import ctypes
import functools
import gc
import logging
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI
from sqlalchemy.engine import make_url
from uvicorn.config import STARTUP_FAILURE
from uvicorn.supervisors.multiprocess import Multiprocess

try:  # what uvicorn's "auto" picks: httptools when installed (a dependency), else h11
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as _HttpProtocol
except ImportError:  # pragma: no cover
    from uvicorn.protocols.http.h11_impl import H11Protocol as _HttpProtocol  # type: ignore[assignment]

from walkeep.api.app import create_app
from walkeep.config import Settings
from walkeep.errors import ConfigurationError
from walkeep.pressure import Heartbeat
from walkeep.service.runtime import Runtime

log = logging.getLogger(__name__)

# How long the supervisor waits for every web process to finish start-up before it
# prints the banner anyway (they are alive, only slow: requests queue on the socket).
READY_SECONDS = 120.0
# How often the supervisor's completer looks for writes the web processes accepted.
SUPERVISOR_POLL_SECONDS = 0.25


def freeze_start_up_heap() -> None:
    """Take everything start-up built (modules, the MCP and pydantic schemas, SQLAlchemy's
    mappers: ~250,000 objects) out of the cyclic garbage collector's sight.

    Otherwise every full collection walks all of it again: measured here at 150–175 ms,
    every 1–2 s under load, with every request of the process stopped meanwhile. That
    pause *was* the store benchmark's p99. None of these objects ever becomes garbage, so
    there is nothing to miss; what requests allocate later is collected as before."""
    gc.collect()
    gc.freeze()


class HeaderDeadline(_HttpProtocol):
    """uvicorn's HTTP protocol, closing a connection that does not finish a request's
    headers within ``header_read_seconds``.

    uvicorn has no such deadline: its keep-alive timer is disarmed by the first byte of a
    request, and nothing is armed before the first request at all, so a client sending
    half a request line (or nothing) held its connection for as long as it liked. ASGI
    middleware cannot help (it sees a request only once its headers are complete), so
    the deadline lives here. Armed when the connection opens and again after every
    answer; at expiry the connection is closed only if it is still waiting for headers
    (a request being read or answered has its own deadlines: ``BodyLimit``).
    """

    _header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[arg-type]
        self._arm_header_deadline()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm_header_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        super().connection_lost(exc)

    def _arm_header_deadline(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
        seconds = getattr(self.config, "header_read_seconds", None)
        if seconds:
            self._header_timer = self.loop.call_later(seconds, self._header_deadline_passed)

    def _header_deadline_passed(self) -> None:
        self._header_timer = None
        waiting = (self.cycle is None or self.cycle.response_complete) and not getattr(
            self, "pipeline", None
        )
        if waiting and not self.transport.is_closing():
            self.transport.close()


class WalkeepConfig(uvicorn.Config):
    """uvicorn's Config, carrying the header deadline :class:`HeaderDeadline` reads
    (a Config is what reaches each web process of ``--workers N``)."""

    def __init__(self, app: Any, *, header_read_seconds: float, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self.header_read_seconds = header_read_seconds


def server_config(app: Any, settings: Settings, **kwargs: Any) -> WalkeepConfig:
    """How Walkeep runs uvicorn, one process or many: the header deadline, and proxy
    headers trusted only from the proxies the operator names (``forwarded_allow_ips``).

    uvicorn's default trusts ``X-Forwarded-For`` from 127.0.0.1: any local process —
    or a proxy forwarding whatever its client sent — then chose the client address the
    console's sign-in throttle counts by. Unnamed, no proxy is trusted.
    """
    proxies = settings.forwarded_allow_ips.strip()
    return WalkeepConfig(
        app,
        header_read_seconds=settings.header_read_seconds,
        http=HeaderDeadline,
        log_level="warning",
        proxy_headers=bool(proxies),
        forwarded_allow_ips=proxies or None,
        **kwargs,
    )


def check_workers(settings: Settings, workers: int) -> None:
    """Refuse ``--workers N`` where it cannot work, before anything is opened or bound."""
    if workers < 1:
        raise ConfigurationError(f"--workers must be at least 1, got {workers}")
    if workers > 1 and make_url(settings.db_url).get_backend_name() == "sqlite":
        raise ConfigurationError(
            f"--workers {workers} needs PostgreSQL: SQLite has one writer, so more web "
            "processes would only queue for it; set WALKEEP_DATABASE_URL=postgresql+psycopg://… "
            "or serve with one process"
        )


class InProcessWorker:
    """The scheduler's jobs (renewal, sweep, the complete_writes safety net…) in this
    process, started and stopped with the server; or none (``enabled=False``, or SQLite
    with another worker holding the database's worker lock, which is said on stderr)."""

    def __init__(self, rt: Runtime, *, enabled: bool) -> None:
        self.rt = rt
        self.scheduler: Any = None
        self._lock: Any = None
        if not enabled:
            return
        from walkeep.scheduler.jobs import acquire_worker_lock, build_scheduler

        try:
            self._lock = acquire_worker_lock(rt)
            self.scheduler = build_scheduler(rt, blocking=False)
        except ConfigurationError as exc:
            print(f"walkeep: not running the worker in-process: {exc}", file=sys.stderr)

    def start(self) -> None:
        if self.scheduler is not None:
            self.scheduler.start()

    def stop(self) -> None:
        """Stop scheduling; jobs in hand finish (loops check the stop flag between batches)."""
        self.rt.extras.setdefault("stop", threading.Event()).set()
        if self.scheduler is not None:
            self.scheduler.shutdown(wait=True)
            self.scheduler = None
        if self._lock is not None:
            self._lock.release()
            self._lock = None


def serve_one(
    rt: Runtime,
    *,
    host: str,
    port: int,
    banner: str,
    scheduler: bool,
    sock: socket.socket | None = None,
) -> None:
    """One process: the app, its completer and (unless ``scheduler=False``) the jobs.
    ``sock``: the listening socket, bound by the caller before start-up changed anything."""
    worker = InProcessWorker(rt, enabled=scheduler)
    application = create_app(
        rt, on_start=worker.start if worker.scheduler else None, on_stop=worker.stop
    )

    class Server(uvicorn.Server):
        """uvicorn that prints the banner once it is listening, after start-up logs."""

        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets=sockets)
            if self.started:
                freeze_start_up_heap()
                print(banner, file=sys.stderr, flush=True)

    Server(server_config(application, rt.settings, host=host, port=port)).run(
        sockets=[sock] if sock is not None else None
    )


def web_app(settings: Settings, supervisor: int | None = None) -> FastAPI:
    """The app factory each web process calls (``--workers N``): its own Runtime,
    database pool and relayer; no scheduler and no completer (the supervisor runs both,
    so completion's embedding and registration never take a web process's GIL).

    ``supervisor``: its pid. The web process dies with it (:func:`die_with_parent`) and
    reads its completer's heartbeat for ``/readyz``."""
    from walkeep import logs
    from walkeep.bootstrap import build_runtime

    if supervisor is not None:
        die_with_parent(supervisor)
    logs.setup(settings.log_level, fmt=settings.log_format)
    logs.access_log(settings.access_log)
    try:
        rt = build_runtime(settings, with_completer=False)
    except Exception:
        # uvicorn replaces a web process that crashes, forever; one that exits with
        # STARTUP_FAILURE makes the supervisor stop them all and say so instead.
        log.exception("web process could not start")
        sys.exit(STARTUP_FAILURE)
    rt.pressure.share(pressure_board(settings))
    if supervisor is not None:
        rt.extras["completer_heartbeat"] = Heartbeat(completer_board(settings))
    app = create_app(rt, on_stop=InProcessWorker(rt, enabled=False).stop)
    freeze_start_up_heap()
    return app


def pressure_board(settings: Settings) -> Path:
    """Where the web processes post request pressure for the supervisor's completer."""
    return settings.data_dir / "pressure"


def completer_board(settings: Settings) -> Path:
    """Where the supervisor posts that its completer is alive, for the web processes."""
    return settings.data_dir / "completer"


# A web process whose supervisor is gone stops taking requests at once (SIGTERM: uvicorn
# finishes the requests in hand) and is gone after this long, whatever it was doing.
ORPHAN_GRACE_SECONDS = 10.0
PARENT_POLL_SECONDS = 0.5
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(parent: int) -> None:
    """End this web process when ``parent`` (its supervisor) dies, however it dies.

    After a ``kill -9`` of the supervisor its web processes kept accepting stores whose
    holds never settled (the completer lived in the dead process), ``/readyz`` still said
    ready, and a new ``serve`` could not bind the port they held. Linux delivers SIGTERM
    at the parent's death (``PR_SET_PDEATHSIG``); a thread also watches the parent pid
    (the portable way, and the backstop should the signal come before this was set), and
    exits outright if a graceful stop takes longer than ``ORPHAN_GRACE_SECONDS``.
    """
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        except (OSError, AttributeError) as exc:  # no prctl: the watch below still holds
            log.debug("PR_SET_PDEATHSIG unavailable: %s", exc)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_SECONDS)
        log.warning("the supervisor (pid %s) is gone: this web process stops", parent)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(ORPHAN_GRACE_SECONDS)
        os._exit(1)

    threading.Thread(target=watch, name="walkeep-parent-watch", daemon=True).start()


class CompleterBeat:
    """The supervisor's side of :class:`walkeep.pressure.Heartbeat`: a thread posting
    every second while its completer is alive (started, running, not hung)."""

    EVERY_SECONDS = 1.0

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.heartbeat = Heartbeat(completer_board(rt.settings))
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name="walkeep-completer-beat", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while True:
            if self.rt.completer is not None and self.rt.completer.alive():
                self.heartbeat.post()
            if self._stop.wait(self.EVERY_SECONDS):
                return

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)


class Supervisor(Multiprocess):
    """uvicorn's supervisor, printing the banner once every web process is ready."""

    def __init__(self, config: uvicorn.Config, sockets: list[Any], banner: str) -> None:
        super().__init__(config, sockets)
        self.banner = banner

    def init_processes(self) -> None:
        super().init_processes()
        if self._wait_until_ready():
            print(self.banner, file=sys.stderr, flush=True)

    def _wait_until_ready(self) -> bool:
        """True once all are ready (or after READY_SECONDS if they are merely slow);
        False if one died or a signal arrived (the run loop then handles it)."""
        waiting = list(self.processes)
        deadline = time.monotonic() + READY_SECONDS
        while waiting and time.monotonic() < deadline:
            if self.signal_queue or not all(p.process.is_alive() for p in waiting):
                return False
            waiting = [p for p in waiting if not p.is_ready(timeout=1)]
            if waiting:
                time.sleep(0.1)
        return True

    @property
    def failed_to_start(self) -> bool:
        """A web process exited before serving: uvicorn stops them all, we say so."""
        return any(p.exitcode == STARTUP_FAILURE for p in self.processes)


def serve_many(
    rt: Runtime,
    *,
    host: str,
    port: int,
    workers: int,
    banner: str,
    scheduler: bool,
    sock: socket.socket | None = None,
) -> bool:
    """Supervise ``workers`` web processes on one port; the jobs run here, once.

    ``rt`` is the supervisor's own Runtime. Its completer finishes every web process's
    accepted writes here, off the request path: the write queue is in the database, so
    it looks at it every ``SUPERVISOR_POLL_SECONDS`` instead of being woken per accept
    (a packed write waits for its quilt window anyway). Returns False if a web process
    failed to start (its error is already on stderr).
    """
    from walkeep.api.console import load_console_secret

    # Created here, once: every web process signs and checks console cookies with it.
    load_console_secret(rt.settings)
    config = server_config(
        functools.partial(web_app, rt.settings, os.getpid()),
        rt.settings,
        factory=True,
        host=host,
        port=port,
        workers=workers,
    )
    if sock is None:
        sock = config.bind_socket()
    supervisor = Supervisor(config, [sock], banner)  # installs its signal handlers
    worker = InProcessWorker(rt, enabled=scheduler)
    worker.start()
    beat = CompleterBeat(rt)
    if rt.completer is not None:
        rt.completer.max_sleep = SUPERVISOR_POLL_SECONDS
        # Steps aside while the web processes are saturated (walkeep/pressure.py).
        rt.pressure.share(pressure_board(rt.settings))
        rt.completer.start()
    beat.start()  # before the web processes start: they are ready once it is fresh
    try:
        supervisor.run()  # until SIGINT/SIGTERM: web processes drain, then return
    finally:
        worker.stop()
        beat.stop()
        if rt.completer is not None:
            rt.completer.stop()
        sock.close()
    return not supervisor.failed_to_start
