"""Console: one-time sign-in links and the worker's last job runs.

``console_links`` holds only token hashes (``walkeep console-link``);
``job_runs`` is one row per worker job, upserted after every run, so the
web process's admin page can show when each job last ran and how it went.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from walkeep.db.models import UTCDateTime

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "console_links",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("token_hash", sa.String(64), nullable=False),
        sa.Column("account_id", sa.String(32), nullable=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("expires_at", UTCDateTime(), nullable=False),
        sa.Column("used_at", UTCDateTime(), nullable=True),
        sa.ForeignKeyConstraint(
            ["account_id"], ["accounts.id"], name=op.f("fk_console_links_account_id_accounts")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_console_links")),
        sa.UniqueConstraint("token_hash", name=op.f("uq_console_links_token_hash")),
    )
    op.create_table(
        "job_runs",
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("worker", sa.String(100), nullable=True),
        sa.Column("started_at", UTCDateTime(), nullable=False),
        sa.Column("finished_at", UTCDateTime(), nullable=False),
        sa.Column("ok", sa.Boolean(), nullable=False),
        sa.Column("duration_ms", sa.Integer(), nullable=False),
        sa.Column("summary", sa.String(1000), nullable=True),
        sa.Column("last_ok_at", UTCDateTime(), nullable=True),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_job_runs")),
    )


def downgrade() -> None:
    op.drop_table("job_runs")
    op.drop_table("console_links")
