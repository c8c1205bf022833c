"""Memories an agent can correct and bound: ``supersedes``/``superseded_by``/``expires_at``.

A store may name the memory it corrects (``memories.supersedes``); when the new write
lands, the old one's ``superseded_by`` is set in the transaction that registers it, so
the link is the record of which replaced which. A store may also say until when it
matters (``memories.expires_at``); ``memories.expires_epoch`` is the Walrus epoch that
holds that instant, fixed at accept so that renewal (which caps a blob at the last
epoch a live member needs) and billing read one integer instead of re-deriving epochs
from timestamps in SQL on two dialects.

Recall's visibility check now also reads ``expires_at``: the covering index
``ix_memories_visibility`` (migration 0018) gains it as its last column, so the check
stays index-only; its leading columns are unchanged, so every query that used it still
does. The sweep finds passed expiries by ``ix_memories_expires_at``.

Plain ``ALTER TABLE … ADD/DROP COLUMN`` on both databases: a batch copy of ``memories``
on SQLite would drop its triggers (migrations 0011, 0013).

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-08
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from walkeep.db.models import UTCDateTime

revision: str = "0023"
down_revision: str | None = "0022"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


_VISIBILITY = "ix_memories_visibility"
_VISIBILITY_COLUMNS = [
    "account_id",
    "blob_id",
    "status",
    "namespace",
    "blob_pk",
    "stored_at",
    "accepted_at",
]


def upgrade() -> None:
    op.add_column("memories", sa.Column("supersedes", sa.String(length=32), nullable=True))
    op.add_column("memories", sa.Column("superseded_by", sa.String(length=32), nullable=True))
    op.add_column("memories", sa.Column("expires_at", UTCDateTime(), nullable=True))
    op.add_column("memories", sa.Column("expires_epoch", sa.Integer(), nullable=True))
    op.drop_index(_VISIBILITY, table_name="memories")
    op.create_index(_VISIBILITY, "memories", [*_VISIBILITY_COLUMNS, "expires_at"], unique=False)
    # The sweep's "whose expiry has passed".
    op.create_index(op.f("ix_memories_expires_at"), "memories", ["expires_at"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_memories_expires_at"), table_name="memories")
    op.drop_index(_VISIBILITY, table_name="memories")
    op.create_index(_VISIBILITY, "memories", _VISIBILITY_COLUMNS, unique=False)
    for table, column in (
        ("memories", "expires_epoch"),
        ("memories", "expires_at"),
        ("memories", "superseded_by"),
        ("memories", "supersedes"),
    ):
        op.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
