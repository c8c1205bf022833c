"""Console sessions that end on the server (sign-out, key revocation).

A console cookie is signed, and a signature alone keeps working for its whole
lifetime wherever the cookie is copied. ``console_sessions`` holds one row per
signed-in session; the cookie names it, and the session is good only while its
row is open.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from walkeep.db.models import UTCDateTime

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "console_sessions",
        sa.Column("id", sa.String(48), nullable=False),
        sa.Column("account_id", sa.String(32), nullable=True),
        sa.Column("key_id", sa.String(32), nullable=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("expires_at", UTCDateTime(), nullable=False),
        sa.Column("ended_at", UTCDateTime(), nullable=True),
        sa.ForeignKeyConstraint(
            ["account_id"], ["accounts.id"], name=op.f("fk_console_sessions_account_id_accounts")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_console_sessions")),
    )
    op.create_index(
        op.f("ix_console_sessions_account_id"), "console_sessions", ["account_id"], unique=False
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_console_sessions_account_id"), table_name="console_sessions")
    op.drop_table("console_sessions")
