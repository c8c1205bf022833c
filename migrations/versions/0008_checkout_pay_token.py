"""Local TEST MODE checkouts: a one-time pay token per rendered checkout page.

The Pay action used to need nothing but the checkout link, which the agent
holds too (it is the top_up result): anyone with the link could mint credits.
Now the page rendered for the operator carries a fresh random token in a
hidden field; only its SHA-256 is stored here, it is compared in constant
time and cleared when used.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("checkout_sessions") as batch:
        batch.add_column(sa.Column("pay_token_hash", sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("checkout_sessions") as batch:
        batch.drop_column("pay_token_hash")
