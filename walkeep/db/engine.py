"""Engines and transactions that behave the same on SQLite and PostgreSQL.

SQLite (the embedded default) runs in WAL mode with a busy timeout and
foreign keys on. Its writers start with ``BEGIN IMMEDIATE`` so that a
read-then-write transaction can never fail to upgrade its lock half way
(the classic SQLITE_BUSY deadlock busy_timeout cannot resolve); read-only
sessions use a plain deferred ``BEGIN`` so they never block writers.
PostgreSQL uses READ COMMITTED plus row locks / conditional updates, written
where they are needed (ledger, job claims).

Why one file: every place SQLite and PostgreSQL must be made to behave alike (begin
modes, locks, pools, retries), read together so the two stay in step.
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import psycopg
from sqlalchemy import (
    Engine,
    Insert,
    Table,
    bindparam,
    create_engine,
    event,
    func,
    insert,
    select,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, DisconnectionError, OperationalError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.util import await_, greenlet_spawn

from walkeep import metrics, nowait
from walkeep.clock import Clock, SystemClock
from walkeep.db import together
from walkeep.db.together import Aborted, Statement, Together, pipeline
from walkeep.errors import ConfigurationError

T = TypeVar("T")
# How statements went out through the loop's queue (``run_together``).
_ALONE, _PIPELINED, _RERUN = (
    metrics.STATEMENTS_TOGETHER.labels(how) for how in ("alone", "pipelined", "rerun")
)

SQLITE_BUSY_TIMEOUT_MS = 30_000
# SQLite checkpoints the WAL itself (in the committing connection) past this many pages:
# a backstop, since the server checkpoints in the background long before (checkpoint.py).
AUTOCHECKPOINT_PAGES = 10_000


def _sqlite_on_connect(dbapi_conn: sqlite3.Connection, _record: Any) -> None:
    # Take transaction control away from the driver: we issue BEGIN ourselves.
    dbapi_conn.isolation_level = None
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute(f"PRAGMA wal_autocheckpoint={AUTOCHECKPOINT_PAGES}")
    # Deleted rows (a forgotten memory's index rows, spent request rows) are overwritten
    # with zeros instead of lingering in free pages of the file or its WAL.
    cur.execute("PRAGMA secure_delete=ON")
    cur.close()


def _sqlite_on_begin(conn: Any) -> None:
    # On the driver's connection, not through ``exec_driver_sql``: a statement through
    # SQLAlchemy's execution path cost ~25 µs of Python, on every write transaction.
    pooled = conn.connection
    _sqlite_begin(
        pooled.driver_connection,
        pooled.info,
        readonly=bool(conn.get_execution_options().get("walkeep_readonly")),
    )


def _sqlite_begin(driver: sqlite3.Connection, info: dict[Any, Any], *, readonly: bool) -> None:
    """Open a transaction on ``driver``: read-only ones deferred, writers ``BEGIN
    IMMEDIATE``. A caller that promised not to wait (walkeep/nowait.py) must not sit in
    SQLite's busy handler while another process holds the write lock: it asks once,
    with a busy timeout of 0. Each connection keeps the timeout it was last given and
    is switched only when the next caller wants the other one, so the common case (the
    event loop's stores, back to back) sends no PRAGMA at all; they were two per store.
    Errors come out as SQLAlchemy's (OperationalError: an outage, retryable)."""
    no_wait = nowait.active()
    ms = 0 if no_wait else SQLITE_BUSY_TIMEOUT_MS
    sql = "BEGIN" if readonly else "BEGIN IMMEDIATE"
    try:
        if info.get("walkeep_busy_timeout_ms", SQLITE_BUSY_TIMEOUT_MS) != ms:
            driver.execute(f"PRAGMA busy_timeout={ms}")
            info["walkeep_busy_timeout_ms"] = ms  # lives as long as the DBAPI connection
        driver.execute(sql)
    except sqlite3.Error as exc:
        busy = "locked" in str(exc) or "busy" in str(exc)
        if no_wait and busy and not readonly:
            raise nowait.WouldWait("another process holds the SQLite write lock") from exc
        raise DBAPIError.instance(sql, None, exc, sqlite3.Error, hide_parameters=True) from exc


# A PostgreSQL connection back in the pool for less than this is taken to be alive; one
# idle for longer (a server restart, a firewall that drops quiet connections) is pinged
# on checkout and replaced if dead. SQLAlchemy's pool_pre_ping pinged on *every*
# checkout: a round trip per store, 15 % of PostgreSQL's accept rate (bench/store.py).
# A connection that dies while in use fails its statement as an outage (retryable
# SERVICE_UNAVAILABLE) and SQLAlchemy discards the pool's other connections with it.
PING_AFTER_IDLE_SECONDS = 10.0


def _note_checkin(_dbapi_conn: Any, record: Any) -> None:
    record.info["walkeep_checked_in"] = time.monotonic()


def _ping_if_idle(dbapi_conn: Any, record: Any, _proxy: Any) -> None:
    since = record.info.get("walkeep_checked_in")
    if since is None or time.monotonic() - since < PING_AFTER_IDLE_SECONDS:
        return  # new, or in use moments ago
    try:
        with dbapi_conn.cursor() as cur:
            cur.execute("SELECT 1")
        dbapi_conn.rollback()  # the ping opened a transaction; leave none behind
    except Exception as exc:
        # The pool discards this connection and checks out (or opens) another.
        raise DisconnectionError("idle connection found dead on checkout") from exc


def sqlite_file(url: str) -> Path | None:
    """The database file of a SQLite URL (None: another database, or in memory)."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return None
    db = parsed.database
    return None if not db or db == ":memory:" else Path(db).expanduser().resolve()


def _create_private(path: Path) -> None:
    """Create a new SQLite file's directory 0700 and the file itself 0600 before SQLite
    opens it (SQLite gives its -wal/-shm files the database file's mode): it holds balances,
    key hashes and wrapped data keys, so other local users must not read it, whatever the
    umask. Existing files and directories are left as the operator set them."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    os.fchmod(fd, 0o600)  # whatever the umask
    os.close(fd)


def make_engine(url: str, **kwargs: Any) -> Engine:
    """Create an engine for ``url`` with Walkeep's per-dialect settings.

    ``hide_parameters``: a database error's text (logged with INTERNAL failures) names the
    statement but never its bound values — those are client content, ids and key hashes.
    """
    kwargs.setdefault("hide_parameters", True)
    u = make_url(url)
    if u.get_backend_name() == "sqlite":
        if u.database and u.database != ":memory:":
            _create_private(Path(u.database).expanduser())
        engine = create_engine(
            u,
            connect_args={
                "check_same_thread": False,
                "timeout": SQLITE_BUSY_TIMEOUT_MS / 1000,
            },
            pool_size=kwargs.pop("pool_size", 8),
            max_overflow=kwargs.pop("max_overflow", 16),
            **kwargs,
        )
        event.listen(engine, "connect", _sqlite_on_connect)
        event.listen(engine, "begin", _sqlite_on_begin)
        return engine
    if u.get_backend_name() == "postgresql":
        if u.get_driver_name() not in ("psycopg", "psycopg2", "psycopg_async"):
            raise ConfigurationError(
                f"unsupported PostgreSQL driver {u.get_driver_name()!r}: "
                "use postgresql+psycopg://user@host/db"
            )
        if u.get_driver_name() != "psycopg":
            u = u.set(drivername="postgresql+psycopg")
        engine = create_engine(u, **_pg_pool(kwargs))
        _listen_pg(engine)
        return engine
    raise ConfigurationError(
        f"unsupported database URL scheme {u.drivername!r}: use sqlite:///path or "
        "postgresql+psycopg://user@host/db"
    )


def _pg_pool(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Up to 30 connections per engine, 20 of them kept open: more than the requests a
    process runs at once. A connection beyond ``pool_size`` is closed when it is given
    back, so with the 10 kept before, 16 concurrent stores opened and closed a
    PostgreSQL backend (a process fork on the server) every few requests."""
    return {
        "pool_size": kwargs.pop("pool_size", 20),
        "max_overflow": kwargs.pop("max_overflow", 10),
        **kwargs,
    }


def _listen_pg(engine: Engine) -> None:
    event.listen(engine, "checkin", _note_checkin)
    event.listen(engine, "checkout", _ping_if_idle)


def _wait_for_locks_briefly(dbapi_conn: Any, _record: Any) -> None:
    """A connection for statements sent together (walkeep/db/together.py) waits at most
    ``LOCK_WAIT_MS`` for a lock. Set by a statement, committed, rather than as a startup
    option, which connection poolers such as PgBouncer refuse by default."""
    cursor = dbapi_conn.cursor()
    try:
        cursor.execute(f"SET lock_timeout = {int(together.LOCK_WAIT_MS)}")
    finally:
        cursor.close()
    dbapi_conn.commit()


# Set inside ``Database.on_loop``: this call's statements await on the event loop.
_ON_LOOP: ContextVar[bool] = ContextVar("walkeep_db_on_loop", default=False)


class _Sessions:
    """The ways into one engine: write sessions, read sessions, its pool (``run_alone``)."""

    def __init__(self, engine: Engine, clock: Clock, *, on_loop: bool = False) -> None:
        self.engine = engine
        # Its connections are psycopg's asyncio ones, awaited from a greenlet (on_loop).
        self.on_loop = on_loop
        # session.info["clock"] lets code deep in a transaction ask for "now".
        self.write = sessionmaker(engine, expire_on_commit=False, info={"clock": clock})
        self.read = sessionmaker(
            engine.execution_options(walkeep_readonly=True),
            expire_on_commit=False,
            info={"clock": clock},
        )


class Database:
    """Owns the engine and hands out transactional sessions.

    ``with db.begin() as s:`` is one write transaction (commit on success,
    rollback on exception). ``with db.read() as s:`` is a read-only one.
    """

    def __init__(self, url: str, clock: Clock | None = None, **engine_kwargs: Any) -> None:
        self.url = url
        self.clock: Clock = clock or SystemClock()
        self.engine = make_engine(url, **engine_kwargs)
        self.dialect = self.engine.dialect.name
        self._write_lock = threading.RLock() if self.dialect == "sqlite" else None
        # Callbacks of no-wait callers refused the write lock (see ``_call_when_free``).
        self._free_waiters: list[Callable[[], None]] = []
        self._free_guard = threading.Lock()
        self._threaded = _Sessions(self.engine, self.clock)
        self._direct: Any = None  # begin_direct's connection, opened once
        self._engine_kwargs = engine_kwargs
        # PostgreSQL, on first use of ``on_loop``: the same database through psycopg's
        # asyncio connections, for calls that run on the event loop.
        self._loop_engine: AsyncEngine | None = None
        self._on_loop: _Sessions | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        # The loop's statement in flight and those waiting for it (walkeep/db/together.py),
        # on connections of their own that wait at most together.LOCK_WAIT_MS for a lock.
        self._together: Together | None = None
        self._together_engine: AsyncEngine | None = None
        self._together_sessions: _Sessions | None = None

    def _sessions(self) -> _Sessions:
        if _ON_LOOP.get() and self._on_loop is not None:
            return self._on_loop
        return self._threaded

    async def on_loop(self, fn: Callable[[], T]) -> T:
        """Run the blocking function ``fn`` on the event loop: as it is on SQLite (an
        in-process library; the caller made sure nothing on its path waits —
        walkeep/nowait.py), and on PostgreSQL in a greenlet whose every statement
        *awaits* its round trip on the loop (SQLAlchemy's asyncio bridge), so other
        requests run meanwhile.

        Why not a worker thread: a store is well under a millisecond of Python around
        one statement, and through a thread the loop and the thread passed the GIL back
        and forth at every step; and a round trip to a remote database would hold one of
        the pool's 40 threads for its whole length, where here it holds nothing. On this
        machine's loopback the difference is small: two servers driven in alternating
        rounds with the ceiling (``bench/load.py``'s ``alternate``), 16 clients, one
        process each: 0.37 of the ceiling on the loop against 0.35 and 0.36 through
        threads. Each engine has its own pool; the thread one serves the worker threads
        (other tools, completion)."""
        if not self.is_postgres:
            return fn()
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            # asyncio connections belong to the loop that opened them. A server has one
            # loop for its life; tests may drive one Database from several in turn.
            self._drop_loop_engine()
            u = make_url(self.url).set(drivername="postgresql+psycopg_async")
            self._loop_engine = create_async_engine(
                u, hide_parameters=True, **_pg_pool(dict(self._engine_kwargs))
            )
            _listen_pg(self._loop_engine.sync_engine)
            self._on_loop = _Sessions(self._loop_engine.sync_engine, self.clock, on_loop=True)
            self._together_engine = create_async_engine(
                u,
                hide_parameters=True,
                pool_size=1,  # one statement or pipeline in flight at a time, and a spare
                max_overflow=1,
            )
            _listen_pg(self._together_engine.sync_engine)
            event.listen(self._together_engine.sync_engine, "connect", _wait_for_locks_briefly)
            self._together_sessions = _Sessions(
                self._together_engine.sync_engine, self.clock, on_loop=True
            )
            self._together = Together(self._send_together)
            self._loop = loop

        def on_this_loop() -> T:
            _ON_LOOP.set(True)
            return fn()

        # A copy of the caller's context: what the call sets stays in the call.
        return await greenlet_spawn(contextvars.copy_context().run, on_this_loop)  # type: ignore[no-any-return]

    async def close_loop(self) -> None:
        """Close the event loop's connections, on the loop that used them (a server's
        shutdown)."""
        for engine in self._forget_loop_engines():
            await engine.dispose()

    def _drop_loop_engine(self) -> None:
        """Forget the loop engine without its loop: its connections close as they are
        collected (the server ends them when their sockets close)."""
        for engine in self._forget_loop_engines():
            engine.sync_engine.dispose(close=False)

    def _forget_loop_engines(self) -> list[AsyncEngine]:
        engines = [e for e in (self._loop_engine, self._together_engine) if e is not None]
        self._loop_engine, self._on_loop, self._loop = None, None, None
        self._together, self._together_engine, self._together_sessions = None, None, None
        return engines

    @property
    def is_sqlite(self) -> bool:
        return self.dialect == "sqlite"

    @property
    def is_postgres(self) -> bool:
        return self.dialect == "postgresql"

    @property
    def sqlite_path(self) -> Path | None:
        return sqlite_file(self.url)

    @contextmanager
    def begin(self) -> Iterator[Session]:
        if self._write_lock is None:
            with self._sessions().write() as session, session.begin():
                yield session
            return
        # SQLite has one writer at a time. Waiting on SQLite's own lock means
        # sleeping in its busy handler (1 → 100 ms steps), which wrecks
        # throughput and tail latency under concurrency; a process-level mutex
        # hands the lock over immediately. (Other processes still meet the
        # busy timeout.) Re-entrant so a nested writer fails the same way it
        # would without the mutex instead of hanging.
        if not self._write_lock.acquire(blocking=not nowait.active()):
            nowait.refuse("this process's SQLite write lock", self._call_when_free)
        try:
            with self._threaded.write() as session, session.begin():
                yield session
        finally:
            self._write_lock.release()
            if self._free_waiters:
                self._wake_free_waiters()

    @contextmanager
    def begin_direct(self) -> Iterator[Direct]:
        """SQLite: one write transaction on a connection of its own, without a Session,
        for the store's claim — statements that run as ``Prepared`` on the driver anyway.
        A Session around them (pool checkout, transaction objects, events, the commit's
        bookkeeping) cost a quarter of the claim's Python on the event loop. Same write
        lock, same ``BEGIN IMMEDIATE`` and no-wait refusals as ``begin``; commit on
        success, rollback on exception; errors come out as SQLAlchemy's. The connection
        is used only under this process's write lock, so one is enough."""
        assert self._write_lock is not None, "begin_direct is for SQLite"
        if not self._write_lock.acquire(blocking=not nowait.active()):
            nowait.refuse("this process's SQLite write lock", self._call_when_free)
        try:
            if self._direct is None:
                # Opened (with the engine's connect settings) by the pool, then taken out
                # of it: its slot is free again, so a small pool cannot run short.
                self._direct = self.engine.raw_connection()
                self._direct.detach()
            pooled = self._direct
            driver: sqlite3.Connection = pooled.dbapi_connection  # pysqlite: the driver's
            _sqlite_begin(driver, pooled.info, readonly=False)
            try:
                yield Direct(self.engine.dialect, driver, {"clock": self.clock})
            except BaseException:
                if driver.in_transaction:
                    driver.rollback()
                raise
            try:
                driver.commit()
            except sqlite3.Error as exc:
                if driver.in_transaction:
                    driver.rollback()
                raise DBAPIError.instance(
                    "COMMIT", None, exc, sqlite3.Error, hide_parameters=True
                ) from exc
        finally:
            self._write_lock.release()
            if self._free_waiters:
                self._wake_free_waiters()

    def _call_when_free(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once this process's write lock is free: now, if it already
        is, else from the thread that releases it. Registering before looking closes the
        gap: a release after the look sees the waiter, one before it is seen by the look."""
        assert self._write_lock is not None
        with self._free_guard:
            self._free_waiters.append(callback)
        if self._write_lock.acquire(blocking=False):
            self._write_lock.release()
            self._wake_free_waiters()

    def _wake_free_waiters(self) -> None:
        with self._free_guard:
            waiters, self._free_waiters = self._free_waiters, []
        for callback in waiters:
            callback()

    def run_alone(self, statement: Prepared, params: Mapping[str, Any]) -> list[Any]:
        """Run ONE statement as a transaction of its own and return its rows (RETURNING).

        For work written as one statement, so no lock it takes outlives that statement:
        on PostgreSQL it runs in autocommit — not even the round trip a COMMIT would
        cost, nor the wait for the GIL before it, holds the lock longer — on psycopg's
        own connection, taken from the pool and switched to autocommit for the
        statement. Through a SQLAlchemy Connection the same statement cost ~0.4 ms more
        Python per call (connect, isolation-level options, parameter and result
        processing): a quarter of a store's time on the event loop (bench/store.py,
        py-spy). Errors surface as SQLAlchemy's (IntegrityError stays IntegrityError);
        a connection found broken is dropped from the pool. SQLite: an ordinary write
        transaction around the one statement."""
        if not self.is_postgres:
            with self.begin() as session:
                return statement.run(session, params)
        sessions = self._sessions()
        sql, values = statement.bind(sessions.engine.dialect, params)
        if sessions.on_loop:
            return self._alone_on_loop(sessions, sql, values)
        return self._pooled(sessions, sql, values, lambda c: _alone(c, sql, values))

    def run_together(
        self, statement: Prepared, params: Mapping[str, Any], *, key: str
    ) -> list[Any]:
        """``run_alone``, except that on the event loop on PostgreSQL the statement may
        share its transaction with others that arrived while one was in flight
        (walkeep/db/together.py): its rows or its own error all the same. ``key``: the
        row it locks first (an account), which orders the statements of a transaction."""
        sessions = self._sessions()
        queue, own = self._together, self._together_sessions
        if not (self.is_postgres and sessions.on_loop and queue is not None and own):
            return self.run_alone(statement, params)
        sql, values = statement.bind(sessions.engine.dialect, params)
        try:
            if queue.busy:
                rows: list[Any] = await_(queue.join((sql, values), key=key))
                _PIPELINED.inc()
                return rows
            queue.lead()
            try:
                rows = self._alone_on_loop(own, sql, values)
            finally:
                queue.release()
            _ALONE.inc()
            return rows
        except (Aborted, DBAPIError):
            # Undone — its own error, another's in its pipeline, or a row held past
            # LOCK_WAIT_MS: alone, with the pool's ordinary waits, it meets its outcome.
            _RERUN.inc()
            return self.run_alone(statement, params)

    def _alone_on_loop(self, sessions: _Sessions, sql: str, values: Mapping[str, Any]) -> list[Any]:
        """One statement in autocommit on a connection of ``sessions``, awaited."""
        return self._pooled(
            sessions, sql, values, lambda c: await_(pipeline(c, [(sql, values)]))[0]
        )

    async def _send_together(self, statements: list[Statement]) -> list[list[Any]]:
        """``Together``'s way out: one pipeline on a connection of its own pool."""
        sessions = self._together_sessions
        assert sessions is not None
        sql, values = statements[0]
        return await greenlet_spawn(  # type: ignore[no-any-return]
            self._pooled, sessions, sql, values, lambda c: await_(pipeline(c, statements))
        )

    @staticmethod
    def _pooled(
        sessions: _Sessions, sql: str, values: Mapping[str, Any], work: Callable[[Any], T]
    ) -> T:
        """``work(conn)`` on psycopg's own connection from ``sessions``' pool, which
        ``work`` switches to autocommit and this switches back before giving it back;
        psycopg's errors raised as SQLAlchemy's, naming ``sql``."""
        pooled = sessions.engine.raw_connection()
        conn: Any = pooled.driver_connection
        try:
            try:
                return work(conn)
            finally:
                # Back to transactions before the pool hands it out again — or never again:
                # a pooled connection left in autocommit would commit a later session's
                # statements one by one.
                try:
                    restored = _autocommit_off(conn, on_loop=sessions.on_loop)
                except BaseException:  # cancelled while restoring: not reusable either
                    pooled.invalidate()
                    raise
                if not restored:
                    pooled.invalidate()
        except psycopg.Error as exc:
            lost = sessions.engine.dialect.is_disconnect(
                exc,  # type: ignore[arg-type]
                pooled.dbapi_connection,
                None,
            )
            if lost:
                pooled.invalidate(exc)
            raise DBAPIError.instance(
                sql, values, exc, psycopg.Error, hide_parameters=True, connection_invalidated=lost
            ) from exc
        finally:
            pooled.close()

    @contextmanager
    def read(self, *, snapshot: bool = False) -> Iterator[Session]:
        """A read-only transaction. ``snapshot=True``: every statement in it sees the
        same committed state, for answers assembled from several queries (counts and
        the rows they count must agree). SQLite's deferred read transaction already is
        one snapshot (WAL); PostgreSQL's READ COMMITTED is not, so it runs REPEATABLE
        READ, which never fails a read-only transaction."""
        with self._sessions().read() as session, session.begin():
            if snapshot and self.is_postgres:
                session.connection(execution_options={"isolation_level": "REPEATABLE READ"})
            yield session

    def ping(self) -> None:
        """Raise ConfigurationError with a one-line reason if the database is unreachable."""
        try:
            with self.engine.connect() as conn:
                conn.execute(text("SELECT 1"))
                conn.rollback()
        except (OperationalError, DBAPIError) as exc:
            reason = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
            raise ConfigurationError(
                f"database unreachable ({redact(self.url)}): {reason}"
            ) from exc

    def dispose(self) -> None:
        self._drop_loop_engine()
        direct, self._direct = self._direct, None
        if direct is not None:
            direct.close()  # detached from the pool: closes it
        self.engine.dispose()


def is_outage(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or what caused it) means "the database is unreachable right now".

    Connection refused or dropped, pool exhausted, SQLite file locked or
    unopenable: all transient from a caller's point of view, so transports
    answer SERVICE_UNAVAILABLE (retry) instead of INTERNAL.
    """
    from sqlalchemy.exc import DisconnectionError, InterfaceError
    from sqlalchemy.exc import TimeoutError as PoolTimeout

    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, OperationalError | InterfaceError | DisconnectionError | PoolTimeout):
            return True
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return False


def is_bad_data(exc: BaseException | None) -> bool:
    """Whether the database refused a *value* (a NUL in PostgreSQL text, a number out
    of range): input the schema let through, so the caller gets VALIDATION_ERROR."""
    from sqlalchemy.exc import DataError

    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, DataError):
            return True
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return False


@dataclass(slots=True)
class Direct:
    """A write transaction on SQLite's driver connection (``Database.begin_direct``):
    what ``Prepared.run`` needs — the dialect and the connection — and ``info`` as a
    Session has it (``info["clock"]``)."""

    dialect: Any
    driver: sqlite3.Connection
    info: dict[str, Any]


# Where Prepared statements run: a Session's transaction, or a direct one on SQLite.
Tx = Session | Direct


class Prepared:
    """A Core statement on the store's hot path, run on the driver's own cursor.

    Why: through ``Session.execute`` a statement costs ~90 µs of Python on SQLite, of
    which SQLite itself takes ~12; a store runs five of them on the event loop
    (walkeep/nowait.py), where every microsecond is every request's. On PostgreSQL the
    store's claim is one statement (``Database.run_alone``), whose Python around the
    round trip was still a quarter of the store's. The SQL is SQLAlchemy's compilation
    of the same statement object and every value goes through its column type's bind
    processor for that dialect, so the rows written are the ones ``Session.execute``
    would write; errors are wrapped into SQLAlchemy's exceptions (IntegrityError stays
    IntegrityError). In a PostgreSQL *session* it is ``Session.execute``: there the
    transaction's round trips, not the Python, are the cost.

    ``keys``: for an INSERT without values, the columns its rows set (all, always)."""

    def __init__(self, statement: Any, keys: Sequence[str] | None = None) -> None:
        self.statement = statement
        self._keys = list(keys) if keys is not None else None
        # Per dialect class: (SQL, [(name in the SQL, bind processor)], fixed values).
        self._compiled: dict[type, tuple[str, list[tuple[str, Any]], dict[str, Any]]] = {}

    def run(self, session: Tx, params: Mapping[str, Any]) -> list[Any]:
        """Execute with ``params``; the rows it returned (RETURNING), as tuples."""
        if isinstance(session, Direct):
            dialect, driver = session.dialect, session.driver
        else:
            dialect, found = _driver_of(session)
            if found is None:
                result = session.execute(self.statement, params)
                return list(result.all()) if getattr(result, "returns_rows", False) else []
            driver = found
        sql, values = self.bind(dialect, params)
        cursor = driver.cursor()
        try:
            cursor.execute(sql, values)
            return cursor.fetchall()
        except sqlite3.Error as exc:
            raise DBAPIError.instance(
                sql, values, exc, sqlite3.Error, hide_parameters=True
            ) from exc
        finally:
            cursor.close()

    def bind(self, dialect: Any, params: Mapping[str, Any]) -> tuple[str, Any]:
        """The SQL for ``dialect`` and the driver's parameters for ``params``: a list
        for positional placeholders (SQLite's ``?``), a dict for named ones (psycopg's
        ``%(name)s``)."""
        compiled = self._compiled.get(type(dialect)) or self._compile(dialect)
        sql, binds, defaults = compiled
        given = {**defaults, **params} if defaults else params
        if dialect.positional:
            return sql, [p(given[name]) if p else given[name] for name, p in binds]
        return sql, {name: p(given[name]) if p else given[name] for name, p in binds}

    def _compile(self, dialect: Any) -> tuple[str, list[tuple[str, Any]], dict[str, Any]]:
        compiled = self.statement.compile(dialect=dialect, column_keys=self._keys)
        prefetch = [*compiled.insert_prefetch, *compiled.update_prefetch]
        if any(not getattr(c.default, "is_scalar", False) for c in prefetch):
            raise TypeError("Prepared statements only apply constant Python-side defaults")
        by_name = {name: bind for bind, name in compiled.bind_names.items()}
        names = compiled.positiontup if compiled.positional else list(by_name)
        binds = [
            (name, by_name[name].type.dialect_impl(dialect).bind_processor(dialect))
            for name in names
        ]
        # Literals in the statement are anonymous binds that carry their own value.
        fixed = {n: b.effective_value for n, b in by_name.items() if not b.required}
        self._compiled[type(dialect)] = (
            compiled.string,
            binds,
            {**fixed, **{c.key: c.default.arg for c in prefetch}},
        )
        return self._compiled[type(dialect)]


def _driver_of(session: Session) -> tuple[Any, sqlite3.Connection | None]:
    """The dialect of ``session``'s connection, and its SQLite driver connection (None on
    any other database), remembered for the session's current transaction: a store runs
    five ``Prepared`` statements in one, and ``Session.connection()`` cost as much Python
    as SQLite's own work on each."""
    txn = session.get_transaction()
    known = session.info.get("walkeep_driver")
    if known is not None and known[0] is txn:
        return known[1], known[2]
    conn = session.connection()
    driver = conn.connection.driver_connection if conn.dialect.name == "sqlite" else None
    session.info["walkeep_driver"] = (session.get_transaction(), conn.dialect, driver)
    return conn.dialect, driver  # type: ignore[return-value]


def _alone(conn: psycopg.Connection[Any], sql: str, values: Mapping[str, Any]) -> list[Any]:
    conn.autocommit = True
    cur = conn.execute(sql, values)
    return cur.fetchall() if cur.description else []


def _autocommit_off(conn: Any, *, on_loop: bool) -> bool:
    """Switch a connection ``run_alone`` used back out of autocommit; False if it cannot
    be (broken, or left mid-statement)."""
    if conn.broken:
        return False
    try:
        if on_loop:
            await_(conn.set_autocommit(False))
        else:
            conn.autocommit = False
    except Exception:
        return False
    return True


def rowcount(result: Any) -> int:
    """Rows matched by an UPDATE/DELETE (``Session.execute`` is typed as a plain Result)."""
    return int(getattr(result, "rowcount", 0) or 0)


def insert_if_absent(
    session: Session, table: Table, row: Mapping[str, Any], key: Sequence[str]
) -> Any | None:
    """``INSERT … ON CONFLICT (key) DO NOTHING RETURNING`` the primary key (its first
    column, for a composite one): the new row's id, or None when a row with that key exists (or is being inserted by a transaction
    that then commits).

    Why: between processes, a check-then-insert fails the whole transaction with a
    unique-key violation when another process inserts in between, and an insert caught
    as IntegrityError still makes PostgreSQL log the violation and abort a savepoint.
    ON CONFLICT makes the second inserter a no-op on both databases.
    """
    from sqlalchemy.dialects.postgresql import insert as pg_insert
    from sqlalchemy.dialects.sqlite import insert as sqlite_insert

    pg = session.get_bind().dialect.name == "postgresql"
    stmt = (pg_insert if pg else sqlite_insert)(table).values(**row)
    pk = next(iter(table.primary_key.columns))  # the first column of a composite key
    ignoring = stmt.on_conflict_do_nothing(index_elements=list(key)).returning(pk)
    return session.execute(ignoring).scalar_one_or_none()


def insert_all_absent(
    session: Session, table: Table, rows: Sequence[Mapping[str, Any]], key: Sequence[str]
) -> None:
    """:func:`insert_if_absent` for many rows at once (one executemany), returning nothing."""
    from sqlalchemy.dialects.postgresql import insert as pg_insert
    from sqlalchemy.dialects.sqlite import insert as sqlite_insert

    if not rows:
        return
    pg = session.get_bind().dialect.name == "postgresql"
    stmt = (pg_insert if pg else sqlite_insert)(table).on_conflict_do_nothing(
        index_elements=list(key)
    )
    session.execute(stmt, list(rows))


def insert_rows(session: Session, table: Table, rows: Sequence[Mapping[str, Any]]) -> None:
    """Insert plain rows (every row with the same keys) in one statement.

    On PostgreSQL, one ``INSERT … SELECT … FROM unnest(:col1, :col2, …)`` with
    an array per column: psycopg runs an ``executemany`` as one pipelined
    INSERT per row, which costs the server a bind/execute each (measured:
    ~12 ms against ~7 ms for 200 renewal items). SQLite runs in-process, where
    ``executemany`` is already the cheap way.
    """
    if not rows:
        return
    if session.get_bind().dialect.name != "postgresql":
        session.execute(insert(table), list(rows))
        return
    names = tuple(rows[0])
    session.execute(
        _unnest_insert(table, names), {name: [row[name] for row in rows] for name in names}
    )


_UNNEST_INSERTS: dict[tuple[str, tuple[str, ...]], Insert] = {}


def _unnest_insert(table: Table, names: tuple[str, ...]) -> Insert:
    key = (table.name, names)
    stmt = _UNNEST_INSERTS.get(key)
    if stmt is None:
        arrays = [bindparam(name, type_=ARRAY(table.c[name].type)) for name in names]
        source = func.unnest(*arrays).table_valued(*names).render_derived()
        stmt = insert(table).from_select(list(names), select(*source.c))
        _UNNEST_INSERTS[key] = stmt
    return stmt


def redact(url: str) -> str:
    """The URL without its password, for messages and logs."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return "<unparseable database URL>"
