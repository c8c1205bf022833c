"""Quilts: many memories in one Walrus blob; leases held by live processes.

- ``memories.blob_id``: the memory's own public identifier — its quilt patch id
  when it is packed in a quilt, else its blob's blob_id (back-filled here, so
  memories stored before quilts keep the identifier they always had).
- ``memories.share_micro``: a packed memory's fixed share of its quilt's
  encoded storage units, in millionths of a unit; what its renewal costs.
  NULL for a memory that is a blob of its own (it pays the whole blob).
- ``blobs.kind`` (``blob`` | ``quilt``) and ``blobs.patch_count``.
- ``write_jobs.lease_owner``: the process holding a job's lease, which it keeps
  alive with a heartbeat, so a crashed process's writes are taken over in
  seconds instead of at the end of a long fixed lease.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("memories") as batch:
        batch.add_column(sa.Column("blob_id", sa.String(length=64), nullable=True))
        batch.add_column(sa.Column("share_micro", sa.BigInteger(), nullable=True))
    op.execute(
        "UPDATE memories SET blob_id = "
        "(SELECT blobs.blob_id FROM blobs WHERE blobs.id = memories.blob_pk) "
        "WHERE blob_pk IS NOT NULL"
    )
    op.create_index(op.f("ix_memories_account_id_blob_id"), "memories", ["account_id", "blob_id"])
    op.create_index(op.f("ix_memories_job_id"), "memories", ["job_id"])
    with op.batch_alter_table("blobs") as batch:
        batch.add_column(
            sa.Column("kind", sa.String(length=8), server_default="blob", nullable=False)
        )
        batch.add_column(sa.Column("patch_count", sa.Integer(), nullable=True))
    with op.batch_alter_table("write_jobs") as batch:
        batch.add_column(sa.Column("lease_owner", sa.String(length=100), nullable=True))
    op.create_index(op.f("ix_write_jobs_status_account_id"), "write_jobs", ["status", "account_id"])


def downgrade() -> None:
    op.drop_index(op.f("ix_write_jobs_status_account_id"), table_name="write_jobs")
    with op.batch_alter_table("write_jobs") as batch:
        batch.drop_column("lease_owner")
    with op.batch_alter_table("blobs") as batch:
        batch.drop_column("patch_count")
        batch.drop_column("kind")
    op.drop_index(op.f("ix_memories_job_id"), table_name="memories")
    op.drop_index(op.f("ix_memories_account_id_blob_id"), table_name="memories")
    with op.batch_alter_table("memories") as batch:
        batch.drop_column("share_micro")
        batch.drop_column("blob_id")
