"""walkeep.db.Prepared writes exactly what Session.execute writes (it runs the same compiled
statement on SQLite's raw cursor, values through the same bind processors), keeps
SQLAlchemy's exceptions, and applies a statement's literals and constant defaults."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import insert, select, text
from sqlalchemy.exc import IntegrityError

from walkeep import ledger
from walkeep.db import Database, Prepared
from walkeep.db.models import Memory, WriteJob, table
from walkeep.service import accounts
from walkeep.service.store import _MEMORY_COLUMNS

# The columns a store's claim sets on a new memory.
_MEMORY_KEYS = _MEMORY_COLUMNS


def _memory_row(account_id: str, memory_id: str) -> dict[str, object]:
    at = datetime(2026, 12, 1, 14, 3, 7, 123456, tzinfo=UTC)
    return {
        "id": memory_id,
        "account_id": account_id,
        "namespace": "notes",
        "metadata": {"topic": "café ☕", "empty": ""},
        "size_bytes": 42,
        "content_hash": "ab" * 32,
        "status": "storing",
        "cost_mc": 1234,
        "attempt": 2,
        "job_id": None,
        "accepted_at": at,
        "deadline_at": at + timedelta(hours=1),
        "status_changed_at": at,
    }


def test_prepared_rows_are_the_rows_session_execute_writes(db: Database) -> None:
    acct = accounts.create_account(db, "prepared", credits_mc=ledger.usd_to_mc("1"))
    prepared = Prepared(insert(table(Memory)), keys=_MEMORY_KEYS)
    with db.begin() as s:
        s.execute(insert(table(Memory)), _memory_row(acct.account_id, "mem_by_session"))
        prepared.run(s, _memory_row(acct.account_id, "mem_by_prepared"))
    columns = ", ".join(c.name for c in table(Memory).c if c.name != "id")
    with db.read() as s:
        # As stored, not as read back through the ORM's types.
        stored = {
            memory_id: s.execute(
                text(f"SELECT {columns} FROM memories WHERE id = :id"), {"id": memory_id}
            ).one()
            for memory_id in ("mem_by_session", "mem_by_prepared")
        }
        assert stored["mem_by_prepared"] == stored["mem_by_session"]
        assert s.get(Memory, "mem_by_prepared").metadata_ == {"topic": "café ☕", "empty": ""}  # type: ignore[union-attr]
        assert s.scalar(select(Memory.attempt).where(Memory.id == "mem_by_prepared")) == 2


def test_prepared_keeps_sqlalchemys_integrity_error(db: Database) -> None:
    acct = accounts.create_account(db, "dupes", credits_mc=0)
    prepared = Prepared(insert(table(Memory)), keys=_MEMORY_KEYS)
    with db.begin() as s:
        prepared.run(s, _memory_row(acct.account_id, "mem_once"))
    with pytest.raises(IntegrityError), db.begin() as s:
        prepared.run(s, _memory_row(acct.account_id, "mem_once"))


def test_prepared_update_applies_its_literals_and_returns_rows(db: Database) -> None:
    acct = accounts.create_account(db, "literals", credits_mc=ledger.usd_to_mc("1"))
    now = datetime(2026, 12, 1, tzinfo=UTC)
    job = {
        "id": "job_prepared",
        "account_id": acct.account_id,
        "namespace": "default",
        "idempotency_key": "k-prepared",
        "ciphertext": b"\x00\x01",
        "size_bytes": 2,
        "epochs": 3,
        "status": "pending",
        "not_before": now,
        "created_at": now,
        "updated_at": now,
    }
    with db.begin() as s:
        Prepared(insert(table(WriteJob)), keys=tuple(job)).run(s, job)
        bump = Prepared(
            table(WriteJob)
            .update()
            .where(table(WriteJob).c.id == job["id"])
            .values(attempts=table(WriteJob).c.attempts + 5)  # 5: an anonymous literal
            .returning(table(WriteJob).c.attempts)
        )
        assert bump.run(s, {}) == [(5,)]  # attempts started at its default, 0
