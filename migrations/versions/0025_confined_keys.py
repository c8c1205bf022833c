"""API keys: the default namespace sealed at rest, and keys confined to it.

``api_keys.default_namespace`` was the one namespace name a copy of the database still
showed in clear (docs/security.md). It is now sealed under the account's field key
(``walkeep.service.sealed.seal_key_namespace``), which needs room for the ciphertext
(512 characters hold a 255-byte name) and, for rows already there, the master key — asked
for only when there are rows to rewrite. ``only_namespace`` marks a key confined to its
default namespace (``walkeep key create --only-namespace``). The downgrade opens the names
again and drops the flag: a confined key becomes an ordinary key of its namespace.

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-12
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from walkeep import crypto
from walkeep.db.migrate import migration_master_key

revision: str = "0025"
down_revision: str | None = "0024"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_CONTEXT = b"key-namespace"  # walkeep.service.sealed.KEY_NAMESPACE
_KEYS = sa.table(
    "api_keys", sa.column("id"), sa.column("account_id"), sa.column("default_namespace")
)


def _rows() -> list[tuple[str, str, str]]:
    """Every key with a default namespace: all in clear before this revision, all sealed
    after it (a name may itself start like a sealed field, so none is told by its look)."""
    conn = op.get_bind()
    rows = conn.execute(
        sa.select(_KEYS.c.id, _KEYS.c.account_id, _KEYS.c.default_namespace).where(
            _KEYS.c.default_namespace.is_not(None)
        )
    ).all()
    return [(pk, account_id, ns) for pk, account_id, ns in rows]


def _rewrite(rows: list[tuple[str, str]]) -> None:
    conn = op.get_bind()
    for pk, value in rows:
        conn.execute(sa.update(_KEYS).where(_KEYS.c.id == pk).values(default_namespace=value))


def upgrade() -> None:
    with op.batch_alter_table("api_keys") as batch:
        batch.alter_column("default_namespace", type_=sa.String(512), existing_type=sa.String(255))
        batch.add_column(
            sa.Column("only_namespace", sa.Boolean(), nullable=False, server_default=sa.false())
        )
    clear = _rows()
    if not clear:
        return
    master = migration_master_key("0025", "seals API keys' default namespaces")
    _rewrite(
        [
            (pk, crypto.seal_field(crypto.field_cipher(master, a), ns.encode(), context=_CONTEXT))
            for pk, a, ns in clear
        ]
    )


def downgrade() -> None:
    kept = _rows()
    if kept:
        master = migration_master_key("0025", "opens API keys' default namespaces")
        _rewrite(
            [
                (
                    pk,
                    crypto.open_field(
                        crypto.field_cipher(master, a), ns, context=_CONTEXT
                    ).decode(),
                )
                for pk, a, ns in kept
            ]
        )
    with op.batch_alter_table("api_keys") as batch:
        batch.drop_column("only_namespace")
        batch.alter_column("default_namespace", type_=sa.String(255), existing_type=sa.String(512))
