"""Test harness: every database test runs on SQLite, or on PostgreSQL when
``WALKEEP_TEST_DATABASE_URL=postgresql+psycopg://…`` is set.

Isolation: each pytest-xdist worker gets its own PostgreSQL database, created
and dropped here (so parallel and concurrent runs never collide), truncated
between tests; on SQLite each test gets a copy of a freshly migrated file.

CI strictness: with ``CI=true`` and a PostgreSQL URL, a test that would be
skipped fails instead, so a CI run can never pass by silently not testing
PostgreSQL.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from walkeep.clock import ManualClock
from walkeep.db import Database
from walkeep.db import migrate as migrations
from walkeep.db.models import Base

PG_URL = os.environ.get("WALKEEP_TEST_DATABASE_URL", "").strip()
ON_PG = PG_URL.startswith("postgresql")
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
PG_HINT = (
    "PostgreSQL-only test: set WALKEEP_TEST_DATABASE_URL="
    "postgresql+psycopg://postgres@127.0.0.1:5432/test to run it"
)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "postgres: needs PostgreSQL")
    if PG_URL and not ON_PG:
        raise pytest.UsageError(
            f"WALKEEP_TEST_DATABASE_URL must be a postgresql+psycopg:// URL, got {PG_URL!r}"
        )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if ON_PG:
        return
    skip = pytest.mark.skip(reason=PG_HINT)
    for item in items:
        if "postgres" in item.keywords:
            item.add_marker(skip)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Say how many PostgreSQL-only tests were skipped, and how to run them: ``-q`` (in
    addopts) prints "N skipped" without the reasons, so the note must come from here."""
    skipped = terminalreporter.stats.get("skipped", [])
    n = sum(1 for report in skipped if PG_HINT in str(getattr(report, "longrepr", "")))
    if n:
        terminalreporter.write_line(
            f"{n} PostgreSQL-only test{'s' if n != 1 else ''} skipped on SQLite: set "
            "WALKEEP_TEST_DATABASE_URL=postgresql+psycopg://postgres@127.0.0.1:5432/test "
            "to run them"
        )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    outcome = yield
    report = outcome.get_result()
    if IN_CI and ON_PG and report.skipped:
        report.outcome = "failed"
        report.longrepr = (
            f"CI=true with PostgreSQL configured: a skip is a failure ({report.longrepr})"
        )


# --- PostgreSQL: one database per xdist worker -----------------------------------------


def _admin_url() -> str:
    return (
        make_url(PG_URL).set(drivername="postgresql+psycopg").render_as_string(hide_password=False)
    )


def _pg_create_database(prefix: str) -> str:
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    engine = create_engine(_admin_url(), isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as c:
            c.execute(text(f'CREATE DATABASE "{name}"'))
    except Exception as exc:
        engine.dispose()
        msg = (
            f"PostgreSQL at {make_url(PG_URL).render_as_string(hide_password=True)} unusable: {exc}"
        )
        if IN_CI:
            pytest.fail(msg, pytrace=False)
        pytest.skip(msg)
    engine.dispose()
    return make_url(_admin_url()).set(database=name).render_as_string(hide_password=False)


def _pg_drop_database(url: str) -> None:
    name = make_url(url).database
    engine = create_engine(_admin_url(), isolation_level="AUTOCOMMIT")
    with engine.connect() as c:
        c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    engine.dispose()


@pytest.fixture(scope="session")
def _pg_worker_db(worker_id: str) -> Iterator[str]:
    url = _pg_create_database(f"wk_test_{worker_id}")
    migrations.upgrade(url)
    yield url
    _pg_drop_database(url)


@pytest.fixture(scope="session")
def _sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("template") / "walkeep.db"
    migrations.upgrade(f"sqlite:///{path}")
    return path


@pytest.fixture
def sqlite_db(_sqlite_template: Path, tmp_path: Path, clock: ManualClock) -> Iterator[Database]:
    """A migrated SQLite database even in the PostgreSQL run: for tests about SQLite's
    own locks and log."""
    path = tmp_path / "walkeep.db"
    shutil.copyfile(_sqlite_template, path)
    database = Database(f"sqlite:///{path}", clock=clock)
    yield database
    database.dispose()


def _truncate_all(url: str) -> None:
    engine = create_engine(url)
    names = ", ".join(f'"{t.name}"' for t in Base.metadata.sorted_tables)
    with engine.begin() as c:
        c.execute(text(f"TRUNCATE {names} RESTART IDENTITY CASCADE"))
    engine.dispose()


@pytest.fixture
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A migrated, empty database for this test."""
    if ON_PG:
        url: str = request.getfixturevalue("_pg_worker_db")
        _truncate_all(url)
        return url
    template: Path = request.getfixturevalue("_sqlite_template")
    path = tmp_path / "walkeep.db"
    shutil.copyfile(template, path)
    return f"sqlite:///{path}"


@pytest.fixture
def fresh_db_url(tmp_path: Path) -> Iterator[str]:
    """An empty, unmigrated database (for migration tests)."""
    if ON_PG:
        url = _pg_create_database("wk_test_fresh")
        yield url
        _pg_drop_database(url)
    else:
        yield f"sqlite:///{tmp_path / 'fresh.db'}"


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(datetime(2026, 11, 30, 12, 0, tzinfo=UTC))


@pytest.fixture
def db(db_url: str, clock: ManualClock) -> Iterator[Database]:
    database = Database(db_url, clock=clock)
    yield database
    database.dispose()


# --- a whole Walkeep runtime on the local network ----------------------------------------

TEST_MASTER_KEY = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="  # fixed: tests only
TEST_MASTER_KEY_BYTES = bytes(range(32))  # TEST_MASTER_KEY decoded


@pytest.fixture
def settings(tmp_path: Path, db_url: str):  # type: ignore[no-untyped-def]
    from walkeep.config import Settings

    return Settings(
        data_dir=tmp_path / "data",
        database_url=db_url,
        local_write_latency_ms=0,
        # Quilts are on (the default) but a quilt is written as soon as its writes are
        # polled: tests move the clock to exercise the window (tests/test_quilts.py).
        quilt_window_seconds=0,
        master_key=TEST_MASTER_KEY,
        public_url="http://127.0.0.1:8080",
    )


@pytest.fixture
def rt(settings, clock: ManualClock, db: Database):  # type: ignore[no-untyped-def]
    """A Runtime with the real local backends, a ManualClock and no background threads:
    tests drive completion and jobs explicitly."""
    from walkeep.bootstrap import build_runtime

    runtime = build_runtime(settings, clock=clock, database=db, with_completer=False)
    yield runtime
