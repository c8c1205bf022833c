"""Database adapter: engine/transactions, ORM models, migrations."""

from walkeep.db.engine import (
    Database,
    Direct,
    Prepared,
    Tx,
    insert_all_absent,
    insert_if_absent,
    insert_rows,
    is_bad_data,
    is_outage,
    make_engine,
    redact,
    rowcount,
    sqlite_file,
)

__all__ = [
    "Database",
    "Direct",
    "Prepared",
    "Tx",
    "insert_all_absent",
    "insert_if_absent",
    "insert_rows",
    "is_bad_data",
    "is_outage",
    "make_engine",
    "redact",
    "rowcount",
    "sqlite_file",
]
