"""PostgreSQL connections are pinged on checkout only after sitting idle (walkeep/db/engine.py):
a busy pool pays no round trip per request, and a dead idle connection is still replaced."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import OperationalError

from walkeep.db import Database, engine, is_outage

pytestmark = pytest.mark.postgres


@pytest.fixture
def one_connection(db_url: str) -> Iterator[Database]:
    database = Database(db_url, pool_size=1, max_overflow=0)
    yield database
    database.dispose()


def _backend_pid(db: Database) -> int:
    with db.read() as s:
        return int(s.execute(text("SELECT pg_backend_pid()")).scalar_one())


def _kill(db_url: str, pid: int) -> None:
    admin = create_engine(db_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        assert c.execute(text("SELECT pg_terminate_backend(:p)"), {"p": pid}).scalar()
    admin.dispose()


def test_a_dead_connection_that_sat_idle_is_replaced_before_use(
    one_connection: Database, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = _backend_pid(one_connection)
    _kill(db_url, first)
    monkeypatch.setattr(engine, "PING_AFTER_IDLE_SECONDS", 0.0)  # it has been idle "long"
    second = _backend_pid(one_connection)  # no error: the ping found it dead
    assert second != first


def test_a_connection_used_moments_ago_is_not_pinged(one_connection: Database, db_url: str) -> None:
    """Proof that no ping happens: a connection killed between two quick uses is not
    noticed at checkout, so its next statement fails — as an outage (retryable), after
    which the pool opens a fresh one."""
    first = _backend_pid(one_connection)
    _kill(db_url, first)
    with pytest.raises(OperationalError) as failed:
        _backend_pid(one_connection)
    assert is_outage(failed.value)
    assert _backend_pid(one_connection) != first
