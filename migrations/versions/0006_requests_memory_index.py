"""Index requests by (account_id, memory_id).

Every completed or failed store updates its memory's request row by
(account_id, memory_id). Only (account_id, tool, request_id) was indexed, so
each of those updates scanned all of the account's requests: completion got
slower with every store an account had ever made (a backlog of a few
thousand writes drained at half speed).

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(
        op.f("ix_requests_account_id_memory_id"), "requests", ["account_id", "memory_id"]
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_requests_account_id_memory_id"), table_name="requests")
