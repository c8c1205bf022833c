"""Migrations: up, down, up again on both databases, and no drift from the models."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, inspect

from walkeep.db import make_engine
from walkeep.db import migrate as migrations
from walkeep.db.models import Base

EXPECTED_TABLES = {
    "accounts",
    "api_keys",
    "ledger_entries",
    "memories",
    "blobs",
    "renewals",
    "renewal_items",
    "requests",
    "checkout_sessions",
    "stripe_events",
}


def _tables(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        return set(inspect(engine).get_table_names()) - {"alembic_version"}
    finally:
        engine.dispose()


def test_upgrade_downgrade_upgrade(fresh_db_url: str) -> None:
    migrations.upgrade(fresh_db_url)
    assert _tables(fresh_db_url) >= EXPECTED_TABLES
    assert len(migrations.current_heads(fresh_db_url)) == 1
    migrations.downgrade(fresh_db_url, "base")
    assert _tables(fresh_db_url) == set()
    migrations.upgrade(fresh_db_url)
    assert _tables(fresh_db_url) == {t.name for t in Base.metadata.sorted_tables}


def test_models_match_migrations(db_url: str) -> None:
    engine = create_engine(db_url)
    try:
        with engine.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={"compare_type": True})
            diff = compare_metadata(ctx, Base.metadata)
    finally:
        engine.dispose()
    assert diff == [], f"models and migrations drifted: {diff}"


def test_hot_query_indexes_exist(db_url: str) -> None:
    engine = create_engine(db_url)
    try:
        insp = inspect(engine)
        blob_ix = {tuple(ix["column_names"]) for ix in insp.get_indexes("blobs")}
        mem_ix = {tuple(ix["column_names"]) for ix in insp.get_indexes("memories")}
        req_uq = {tuple(u["column_names"]) for u in insp.get_unique_constraints("requests")}
        req_ix = {tuple(ix["column_names"]) for ix in insp.get_indexes("requests")}
    finally:
        engine.dispose()
    assert ("status", "end_epoch", "id") in blob_ix  # due-for-renewal scan, in order
    assert ("account_id", "namespace", "status") in mem_ix
    assert ("account_id", "tool", "request_id") in req_uq
    assert ("account_id", "memory_id") in req_ix  # completion updates a memory's request


def test_blobs_leave_room_for_hot_leases(db_url: str) -> None:
    """A renewal's lease touches no indexed column; on PostgreSQL the blobs table keeps
    half of each page free so that update stays on its page (migration 0012). SQLite
    has no such option, and the migration must leave it alone."""
    engine = create_engine(db_url)
    try:
        options = inspect(engine).get_table_options("blobs")
        dialect = engine.dialect.name
    finally:
        engine.dispose()
    if dialect == "postgresql":
        assert options.get("postgresql_with") == {"fillfactor": "50"}
    else:
        assert "postgresql_with" not in options
