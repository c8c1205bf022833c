"""Metadata an agent can filter on: ``memory_tags``, and memories by time off an index.

Recall and export take ``metadata`` filters, but the map is sealed (migration 0022), so
each ``name=value`` pair is also kept as a keyed token (``crypto.metadata_tag``) in
``memory_tags``; this fills it for every memory stored before, which needs the master
key (to open the sealed maps and key the tokens) when there are any. The new index
``ix_memories_stored`` gives a filtered recall its candidate blobs for a time range
without touching the table.

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-09
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from walkeep import crypto
from walkeep.db.migrate import migration_master_key

revision: str = "0024"
down_revision: str | None = "0023"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_STORED = "ix_memories_stored"


def upgrade() -> None:
    op.create_table(
        "memory_tags",
        sa.Column("account_id", sa.String(32), sa.ForeignKey("accounts.id"), primary_key=True),
        sa.Column("tag", sa.String(32), primary_key=True),
        sa.Column("memory_id", sa.String(32), sa.ForeignKey("memories.id"), primary_key=True),
    )
    op.create_index(
        _STORED, "memories", ["account_id", "stored_at", "status", "namespace", "blob_id"]
    )
    conn = op.get_bind()
    memories = sa.table(
        "memories", sa.column("id"), sa.column("account_id"), sa.column("metadata", sa.JSON)
    )
    rows = [
        (pk, account_id, md)
        for pk, account_id, md in conn.execute(
            sa.select(memories.c.id, memories.c.account_id, memories.c.metadata)
        )
        if md
    ]
    if not rows:
        return
    master = migration_master_key("0024", "indexes stored metadata for filters")
    tags = sa.table(
        "memory_tags", sa.column("account_id"), sa.column("tag"), sa.column("memory_id")
    )
    keys: dict[str, bytes] = {}
    batch: list[dict[str, str]] = []
    for pk, account_id, md in rows:
        if isinstance(md, str):  # sealed (0022)
            opened = crypto.open_field(
                crypto.field_cipher(master, account_id), md, context=b"metadata"
            )
            md = json.loads(opened)
        key = keys.get(account_id)
        if key is None:
            key = keys[account_id] = crypto.digest_key(master, account_id)
        batch.extend(
            {"account_id": account_id, "tag": t, "memory_id": pk}
            for t in {crypto.metadata_tag(key, str(k), str(v)) for k, v in md.items()}
        )
        if len(batch) >= 1000:
            conn.execute(sa.insert(tags), batch)
            batch = []
    if batch:
        conn.execute(sa.insert(tags), batch)


def downgrade() -> None:
    op.drop_index(_STORED, table_name="memories")
    op.drop_table("memory_tags")
