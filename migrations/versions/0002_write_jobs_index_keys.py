"""Self-run write jobs, the semantic index's vectors, per-account data keys.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from walkeep.db.models import UTCDateTime

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "write_jobs",
        sa.Column("id", sa.String(40), nullable=False),
        sa.Column("account_id", sa.String(32), nullable=False),
        sa.Column("namespace", sa.String(255), nullable=False),
        sa.Column("idempotency_key", sa.String(200), nullable=False),
        sa.Column("ciphertext", sa.LargeBinary(), nullable=True),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("epochs", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("not_before", UTCDateTime(), nullable=False),
        sa.Column("lease_until", UTCDateTime(), nullable=True),
        sa.Column("attempts", sa.Integer(), server_default="0", nullable=False),
        sa.Column("result", sa.JSON(), nullable=True),
        sa.Column("error", sa.String(1000), nullable=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["account_id"], ["accounts.id"], name=op.f("fk_write_jobs_account_id_accounts")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_write_jobs")),
        sa.UniqueConstraint("idempotency_key", name=op.f("uq_write_jobs_idempotency_key")),
    )
    op.create_index(op.f("ix_write_jobs_status_not_before"), "write_jobs", ["status", "not_before"])

    op.create_table(
        "embeddings",
        sa.Column("id", BigId, autoincrement=True, nullable=False),
        sa.Column("account_id", sa.String(32), nullable=False),
        sa.Column("namespace", sa.String(255), nullable=False),
        sa.Column("blob_id", sa.String(64), nullable=False),
        sa.Column("chunk", sa.Integer(), nullable=False),
        sa.Column("model", sa.String(64), nullable=False),
        sa.Column("dim", sa.Integer(), nullable=False),
        sa.Column("vector", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["account_id"], ["accounts.id"], name=op.f("fk_embeddings_account_id_accounts")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_embeddings")),
        sa.UniqueConstraint(
            "account_id",
            "blob_id",
            "model",
            "chunk",
            name=op.f("uq_embeddings_account_id_blob_id_model_chunk"),
        ),
    )
    op.create_index(
        op.f("ix_embeddings_account_id_namespace_model_id"),
        "embeddings",
        ["account_id", "namespace", "model", "id"],
    )

    op.create_table(
        "data_keys",
        sa.Column("account_id", sa.String(32), nullable=False),
        sa.Column("wrapped", sa.LargeBinary(), nullable=False),
        sa.Column("master_key_id", sa.String(32), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["account_id"], ["accounts.id"], name=op.f("fk_data_keys_account_id_accounts")
        ),
        sa.PrimaryKeyConstraint("account_id", name=op.f("pk_data_keys")),
    )


def downgrade() -> None:
    op.drop_table("data_keys")
    op.drop_index(op.f("ix_embeddings_account_id_namespace_model_id"), table_name="embeddings")
    op.drop_table("embeddings")
    op.drop_index(op.f("ix_write_jobs_status_not_before"), table_name="write_jobs")
    op.drop_table("write_jobs")
