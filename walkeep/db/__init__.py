"""Database adapter: engine/transactions, ORM models, migrations."""

from walkeep.db.engine import Database, make_engine, redact, rowcount

__all__ = ["Database", "make_engine", "redact", "rowcount"]
