"""Run Alembic migrations from code (CLI, ``walkeep serve``, tests).

The scripts live in the repository's top-level ``migrations/`` folder. The wheel ships
that folder as ``walkeep._migrations`` (see setup.py) rather than as a generic
top-level ``migrations`` package, so this looks there first and falls back to the
checkout's folder (an editable install or a plain clone on ``sys.path``).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from alembic import command
from alembic.config import Config

from walkeep.errors import ConfigurationError

_CHECKOUT_MIGRATIONS = Path(__file__).resolve().parents[2] / "migrations"


def script_location() -> Path:
    """The folder holding ``env.py`` and ``versions/``: installed copy, else the checkout's."""
    spec = importlib.util.find_spec("walkeep._migrations")
    if spec is not None and spec.origin:
        return Path(spec.origin).parent
    if (_CHECKOUT_MIGRATIONS / "env.py").is_file():
        return _CHECKOUT_MIGRATIONS
    raise ConfigurationError(
        "Walkeep's migration scripts are missing: reinstall the package "
        "(pip install --force-reinstall walkeep)"
    )


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(script_location()))
    # ConfigParser interpolation: a literal % in a password must be doubled.
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def upgrade(url: str, revision: str = "head", *, master_key: bytes | None = None) -> None:
    """``master_key``: for migrations that seal what an earlier version stored in clear
    (0022); without it they read the configured one."""
    cfg = alembic_config(url)
    if master_key is not None:
        cfg.attributes["master_key"] = master_key
    command.upgrade(cfg, revision)


def downgrade(url: str, revision: str = "base", *, master_key: bytes | None = None) -> None:
    cfg = alembic_config(url)
    if master_key is not None:
        cfg.attributes["master_key"] = master_key
    command.downgrade(cfg, revision)


def migration_master_key(revision: str, needs: str) -> bytes:
    """The master key a migration seals or opens stored fields with (called inside one).

    The one :func:`upgrade`/:func:`downgrade` was given, else the configured one; a
    database with rows to rewrite and no master key to be found is refused, not guessed
    at. ``needs`` says what for, in the error.
    """
    from alembic import op

    from walkeep import crypto
    from walkeep.config import load_settings

    given = op.get_context().config.attributes.get("master_key")  # type: ignore[union-attr]
    if isinstance(given, bytes):
        return given
    settings = load_settings()
    path = Path(settings.data_dir).expanduser() / crypto.MASTER_KEY_FILENAME
    if settings.master_key is None and not path.exists():
        raise ConfigurationError(
            f"migration {revision} {needs} and needs the master key that wrote them: "
            f"set WALKEEP_MASTER_KEY or WALKEEP_DATA_DIR (no {path})"
        )
    return crypto.load_master_key(settings)


def current_heads(url: str) -> set[str]:
    from alembic.runtime.migration import MigrationContext

    from walkeep.db.engine import make_engine

    engine = make_engine(url, pool_size=1, max_overflow=0)
    try:
        with engine.connect() as conn:
            return set(MigrationContext.configure(conn).get_current_heads())
    finally:
        engine.dispose()
