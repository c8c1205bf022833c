"""Console sign-in attempts counted in the database, shared by every web process.

The throttle (10 attempts a minute per client address and per target) was kept in
each web process, so N processes allowed N times as many guesses.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "sign_in_attempts",
        sa.Column("bucket", sa.String(64), nullable=False),
        sa.Column("window_start", sa.BigInteger(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("bucket", name=op.f("pk_sign_in_attempts")),
    )
    op.create_index(
        op.f("ix_sign_in_attempts_window_start"),
        "sign_in_attempts",
        ["window_start"],
        unique=False,
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_sign_in_attempts_window_start"), table_name="sign_in_attempts")
    op.drop_table("sign_in_attempts")
