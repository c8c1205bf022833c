"""A quilt's kept shares read off an index: ``memories (blob_pk, status, blob_id, share_micro)``.

``check_balance`` and the renewal pass sum each quilt's kept members' shares. With
``(blob_pk, status)`` every member's row was read from the table; at a million
memories (about 1,700 quilts) that was 0.8 s on SQLite and 0.7 s on PostgreSQL of
every ``check_balance``. The wider index has the same leading columns, so every
query that used the old one uses this one the same way; it replaces it rather than
sitting beside it, so a store writes no more index entries than before.

On PostgreSQL the index is built inside the migration's transaction (a few seconds
per million memories, writes to ``memories`` wait for it). SQLite keeps the table's
triggers: only an index changes, the table is not recreated.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-04
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_OLD = ["blob_pk", "status"]
_NEW = ["blob_pk", "status", "blob_id", "share_micro"]


def upgrade() -> None:
    op.create_index(op.f("ix_memories_" + "_".join(_NEW)), "memories", _NEW, unique=False)
    op.drop_index(op.f("ix_memories_" + "_".join(_OLD)), table_name="memories")


def downgrade() -> None:
    op.create_index(op.f("ix_memories_" + "_".join(_OLD)), "memories", _OLD, unique=False)
    op.drop_index(op.f("ix_memories_" + "_".join(_NEW)), table_name="memories")
