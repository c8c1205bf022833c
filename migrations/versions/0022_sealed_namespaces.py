"""Namespaces stored as keyed tokens, their names and all metadata sealed.

A copy of the database showed every namespace and metadata value in clear
(walkeep/service/sealed.py says what is stored instead). This creates
``namespace_names`` and rewrites what an earlier version stored: each namespace of
``memories``, ``embeddings`` and ``write_jobs`` becomes its token (one UPDATE per
account and namespace), each name is kept sealed, every non-empty metadata map is
sealed, and every account's search index generation is bumped, because the index
files on each host name namespaces as they were. That needs the master key: the one
``walkeep.db.migrate.upgrade`` is given, else the configured one; a database with
rows to rewrite and no master key to be found is refused, not guessed at.

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-06
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

from walkeep import crypto
from walkeep.db.migrate import migration_master_key
from walkeep.db.models import UTCDateTime

revision: str = "0022"
down_revision: str | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TABLES = ("memories", "embeddings", "write_jobs")


def _master_key() -> bytes:
    return migration_master_key("0022", "seals stored namespaces and metadata")


def upgrade() -> None:
    op.create_table(
        "namespace_names",
        sa.Column("account_id", sa.String(32), sa.ForeignKey("accounts.id"), primary_key=True),
        sa.Column("token", sa.String(32), primary_key=True),
        sa.Column("sealed", sa.String(512), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
    )
    conn = op.get_bind()
    pairs: set[tuple[str, str]] = set()
    for name in _TABLES:
        t = _t(name)
        pairs.update(conn.execute(sa.select(t.c.account_id, t.c.namespace).distinct()))
    memories = _t("memories", sa.column("id"), sa.column("metadata", sa.JSON))
    metadata = [
        (pk, account_id, md)
        for pk, account_id, md in conn.execute(
            sa.select(memories.c.id, memories.c.account_id, memories.c.metadata)
        )
        if md
    ]
    if not pairs and not metadata:
        return
    master = _master_key()
    now = datetime.now(UTC)
    names = sa.table(
        "namespace_names",
        sa.column("account_id"),
        sa.column("token"),
        sa.column("sealed"),
        sa.column("created_at", UTCDateTime()),
    )
    for account_id, ns in sorted(pairs):
        token = crypto.keyed_token(crypto.digest_key(master, account_id), b"namespace", ns.encode())
        cipher = crypto.field_cipher(master, account_id)
        sealed = crypto.seal_field(cipher, ns.encode(), context=b"namespace-name")
        conn.execute(
            sa.insert(names).values(
                account_id=account_id, token=token, sealed=sealed, created_at=now
            )
        )
        for name in _TABLES:
            t = _t(name)
            conn.execute(
                sa.update(t)
                .where(t.c.account_id == account_id, t.c.namespace == ns)
                .values(namespace=token)
            )
    for pk, account_id, md in metadata:
        data = json.dumps(md, ensure_ascii=False, separators=(",", ":"), sort_keys=True)
        cipher = crypto.field_cipher(master, account_id)
        sealed = crypto.seal_field(cipher, data.encode(), context=b"metadata")
        conn.execute(sa.update(memories).where(memories.c.id == pk).values(metadata=sealed))
    # Index files name namespaces as they were: every account's index is rebuilt.
    state = sa.table(
        "index_state",
        sa.column("account_id"),
        sa.column("model"),
        sa.column("generation"),
        sa.column("updated_at", UTCDateTime()),
    )
    conn.execute(sa.update(state).values(generation=state.c.generation + 1, updated_at=now))
    have = set(conn.execute(sa.select(state.c.account_id, state.c.model)))
    e = _t("embeddings", sa.column("model"))
    for account_id, model in conn.execute(sa.select(e.c.account_id, e.c.model).distinct()):
        if (account_id, model) not in have:
            conn.execute(
                sa.insert(state).values(
                    account_id=account_id, model=model, generation=1, updated_at=now
                )
            )


def _t(name: str, *extra: sa.ColumnClause[object]) -> sa.TableClause:
    return sa.table(name, sa.column("account_id"), sa.column("namespace"), *extra)


def downgrade() -> None:
    """Names and metadata back in clear (with the master key), then the table dropped."""
    conn = op.get_bind()
    names = sa.table(
        "namespace_names", sa.column("account_id"), sa.column("token"), sa.column("sealed")
    )
    kept = list(conn.execute(sa.select(names.c.account_id, names.c.token, names.c.sealed)))
    memories = _t("memories", sa.column("id"), sa.column("metadata", sa.JSON))
    sealed_md = [
        (pk, account_id, md)
        for pk, account_id, md in conn.execute(
            sa.select(memories.c.id, memories.c.account_id, memories.c.metadata)
        )
        if isinstance(md, str)
    ]
    if kept or sealed_md:
        master = _master_key()
        for account_id, token, stored in kept:
            cipher = crypto.field_cipher(master, account_id)
            name = crypto.open_field(cipher, stored, context=b"namespace-name").decode()
            for table in _TABLES:
                t = _t(table)
                conn.execute(
                    sa.update(t)
                    .where(t.c.account_id == account_id, t.c.namespace == token)
                    .values(namespace=name)
                )
        for pk, account_id, md in sealed_md:
            cipher = crypto.field_cipher(master, account_id)
            value = json.loads(crypto.open_field(cipher, md, context=b"metadata"))
            conn.execute(sa.update(memories).where(memories.c.id == pk).values(metadata=value))
    op.drop_table("namespace_names")
