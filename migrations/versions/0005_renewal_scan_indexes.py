"""Indexes for the renewal scan: blobs in (status, end_epoch, id) order, and
memories(blob_pk, status) for its "holds an active memory" test.

With stale statistics (right after a burst of inserts) PostgreSQL planned that
test as a bitmap AND over every active memory per blob: quadratic. And with
blobs indexed by (status, end_epoch) only, each batch sorted every due blob
before taking 200. Both are index walks now.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(op.f("ix_memories_blob_pk_status"), "memories", ["blob_pk", "status"])
    op.drop_index(op.f("ix_memories_blob_pk"), table_name="memories")
    op.create_index(op.f("ix_blobs_status_end_epoch_id"), "blobs", ["status", "end_epoch", "id"])
    op.drop_index(op.f("ix_blobs_status_end_epoch"), table_name="blobs")


def downgrade() -> None:
    op.create_index(op.f("ix_blobs_status_end_epoch"), "blobs", ["status", "end_epoch"])
    op.drop_index(op.f("ix_blobs_status_end_epoch_id"), table_name="blobs")
    op.create_index(op.f("ix_memories_blob_pk"), "memories", ["blob_pk"])
    op.drop_index(op.f("ix_memories_blob_pk_status"), table_name="memories")
