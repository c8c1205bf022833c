"""Usage counters on accounts, so quota checks don't scan every memory.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("accounts") as batch:
        batch.add_column(
            sa.Column("usage_bytes", sa.BigInteger(), server_default="0", nullable=False)
        )
        batch.add_column(sa.Column("usage_day", sa.Integer(), server_default="0", nullable=False))
        batch.add_column(
            sa.Column("usage_day_stores", sa.Integer(), server_default="0", nullable=False)
        )
    # Backfill from the memories that count (everything not failed or expired).
    op.execute(
        "UPDATE accounts SET usage_bytes = COALESCE((SELECT SUM(m.size_bytes) FROM memories m "
        "WHERE m.account_id = accounts.id AND m.status NOT IN ('failed', 'expired')), 0)"
    )


def downgrade() -> None:
    with op.batch_alter_table("accounts") as batch:
        batch.drop_column("usage_day_stores")
        batch.drop_column("usage_day")
        batch.drop_column("usage_bytes")
