"""Recall's visibility check read off an index: ``memories (account_id, blob_id, status,
namespace, blob_pk, stored_at, accepted_at)``.

``recall`` asks, for its top hits, which are visible memories of the account and
scope, and when each was stored. With ``(account_id, blob_id)`` every hit cost an
index page *and* its table row's page; at a million memories neither is usually in
the page cache, so the check was about twenty random reads from disk. The wider
index carries every column the check reads, so it is index-only: half the reads.
It has the old index's leading columns, so every query that used the old one uses
this one the same way; it replaces it rather than sitting beside it.

On PostgreSQL the index is built inside the migration's transaction (seconds per
million memories; writes to ``memories`` wait for it). SQLite keeps the table's
triggers: only an index changes.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-04
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_OLD = ["account_id", "blob_id"]
_NEW = ["account_id", "blob_id", "status", "namespace", "blob_pk", "stored_at", "accepted_at"]


# The conventional name (every column) is longer than PostgreSQL's 63 characters.
_NAME = "ix_memories_visibility"


def upgrade() -> None:
    op.create_index(_NAME, "memories", _NEW, unique=False)
    op.drop_index(op.f("ix_memories_" + "_".join(_OLD)), table_name="memories")


def downgrade() -> None:
    op.create_index(op.f("ix_memories_" + "_".join(_OLD)), "memories", _OLD, unique=False)
    op.drop_index(_NAME, table_name="memories")
