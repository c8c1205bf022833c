"""When each API key was last used, to within a minute: ``api_keys.last_used_at``.

An operator deciding which key to revoke (``walkeep key list``) needs to know which
keys are still in use. Writing on every request would turn each tool call into a
write; the time is recorded when a key is looked up (a process's key cache refreshes)
and only if the stored time is older than about a minute, so a busy key costs at most
one small update a minute. Existing keys start with no time (never seen since).

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from walkeep.db.models import UTCDateTime

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("api_keys") as batch:
        batch.add_column(sa.Column("last_used_at", UTCDateTime(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("api_keys") as batch:
        batch.drop_column("last_used_at")
