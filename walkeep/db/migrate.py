"""Run Alembic migrations from code (CLI, ``walkeep serve``, tests).

The migration scripts live in the top-level ``migrations`` package, which is
installed with Walkeep, so this works from a wheel as well as from a clone.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

import migrations


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(Path(migrations.__file__).parent))
    # ConfigParser interpolation: a literal % in a password must be doubled.
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str = "base") -> None:
    command.downgrade(alembic_config(url), revision)


def current_heads(url: str) -> set[str]:
    from alembic.runtime.migration import MigrationContext

    from walkeep.db.engine import make_engine

    engine = make_engine(url, pool_size=1, max_overflow=0)
    try:
        with engine.connect() as conn:
            return set(MigrationContext.configure(conn).get_current_heads())
    finally:
        engine.dispose()
