"""Alembic environment.

The database URL comes from, in order: an explicit ``sqlalchemy.url`` set on
the Config by ``walkeep.db.migrate`` (CLI, tests, ``walkeep serve``), else
Walkeep's settings (``WALKEEP_DATABASE_URL`` or the default SQLite file), so a
bare ``alembic upgrade head`` in the repo root migrates the configured database.
"""

from __future__ import annotations

from alembic import context

from walkeep.db.engine import make_engine
from walkeep.db.models import Base

config = context.config
target_metadata = Base.metadata


def _url() -> str:
    has_main = config.file_config.has_section(config.config_ini_section)
    url = config.get_main_option("sqlalchemy.url") if has_main else None
    if url:
        return url
    from walkeep.config import load_settings

    return load_settings().db_url


def run_migrations_offline() -> None:
    context.configure(
        url=_url(),
        target_metadata=target_metadata,
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
        render_as_batch=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = make_engine(_url(), pool_size=1, max_overflow=0)
    try:
        with engine.connect() as conn:
            _run(conn)
    finally:
        engine.dispose()


def _run(connection) -> None:  # type: ignore[no-untyped-def]
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
