"""The lexical index: keyed term hashes beside each chunk's vector, and index generations.

``embeddings.terms`` holds a chunk's distinct term hashes and their frequencies
(walkeep/index/terms.py: keyed per account, no readable word); NULL on rows written
before this revision, which the first start backfills (walkeep/index/search.py,
``walkeep index rebuild``). ``index_state`` counts, per account and model, how many
times the rows were rewritten in place, so every process drops a cached or persisted
index built before a rewrite. ``memories (account_id, status_changed_at)`` lets an
index learn which of an account's memories were forgotten, lapsed or revived since
it last looked, without reading the account's million memories. The index reads
an account's rows by id whatever their namespace, so ``embeddings (account_id, model,
id)`` replaces the per-namespace ``(account_id, namespace, model, id)``: without it,
finding an account's newest row read every one of its rows (210 ms at a million).

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from walkeep.db.models import UTCDateTime

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("embeddings", sa.Column("terms", sa.LargeBinary(), nullable=True))
    op.create_index(
        op.f("ix_embeddings_account_id_model_id"), "embeddings", ["account_id", "model", "id"]
    )
    op.drop_index(op.f("ix_embeddings_account_id_namespace_model_id"), table_name="embeddings")
    op.create_table(
        "index_state",
        sa.Column("account_id", sa.String(32), nullable=False),
        sa.Column("model", sa.String(64), nullable=False),
        sa.Column("generation", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["account_id"], ["accounts.id"], name=op.f("fk_index_state_account_id_accounts")
        ),
        sa.PrimaryKeyConstraint("account_id", "model", name=op.f("pk_index_state")),
    )
    op.create_index(
        op.f("ix_memories_account_id_status_changed_at"),
        "memories",
        ["account_id", "status_changed_at"],
    )


def downgrade() -> None:
    op.create_index(
        op.f("ix_embeddings_account_id_namespace_model_id"),
        "embeddings",
        ["account_id", "namespace", "model", "id"],
    )
    op.drop_index(op.f("ix_embeddings_account_id_model_id"), table_name="embeddings")
    op.drop_index(op.f("ix_memories_account_id_status_changed_at"), table_name="memories")
    op.drop_table("index_state")
    with op.batch_alter_table("embeddings") as batch:
        batch.drop_column("terms")
