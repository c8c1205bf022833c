"""Database adapter: engine/transactions, ORM models, migrations."""

from walkeep.db.engine import (
    Database,
    Prepared,
    insert_rows,
    is_bad_data,
    is_outage,
    make_engine,
    redact,
    rowcount,
)

__all__ = [
    "Database",
    "Prepared",
    "insert_rows",
    "is_bad_data",
    "is_outage",
    "make_engine",
    "redact",
    "rowcount",
]
