"""Alerts: per-account webhook settings, the event outbox, delivery attempts.

Events are inserted in the same transaction as the state change that causes
them (pause, resume, top-up credit, failed renewal, low balance), so none is
lost or invented on a crash; the ``deliver_alerts`` job sends them.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from walkeep.db.models import UTCDateTime

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "alert_settings",
        sa.Column("account_id", sa.String(32), nullable=False),
        sa.Column("url", sa.String(2000), nullable=False),
        sa.Column("secret", sa.String(100), nullable=False),
        sa.Column("threshold_epochs", sa.Integer(), nullable=False),
        sa.Column("balance_low", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["account_id"], ["accounts.id"], name=op.f("fk_alert_settings_account_id_accounts")
        ),
        sa.PrimaryKeyConstraint("account_id", name=op.f("pk_alert_settings")),
    )
    op.create_table(
        "alert_events",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("account_id", sa.String(32), nullable=False),
        sa.Column("type", sa.String(40), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer(), server_default="0", nullable=False),
        sa.Column("next_attempt_at", UTCDateTime(), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("delivered_at", UTCDateTime(), nullable=True),
        sa.ForeignKeyConstraint(
            ["account_id"], ["accounts.id"], name=op.f("fk_alert_events_account_id_accounts")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_alert_events")),
    )
    op.create_index(
        op.f("ix_alert_events_status_next_attempt_at"),
        "alert_events",
        ["status", "next_attempt_at"],
    )
    op.create_index(
        op.f("ix_alert_events_account_id_created_at"), "alert_events", ["account_id", "created_at"]
    )
    op.create_table(
        "alert_deliveries",
        sa.Column("id", BigId, autoincrement=True, nullable=False),
        sa.Column("event_id", sa.String(32), nullable=False),
        sa.Column("account_id", sa.String(32), nullable=False),
        sa.Column("url", sa.String(2000), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("status_code", sa.Integer(), nullable=True),
        sa.Column("error", sa.String(500), nullable=True),
        sa.Column("duration_ms", sa.Integer(), nullable=False),
        sa.Column("attempted_at", UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["event_id"],
            ["alert_events.id"],
            name=op.f("fk_alert_deliveries_event_id_alert_events"),
        ),
        sa.ForeignKeyConstraint(
            ["account_id"], ["accounts.id"], name=op.f("fk_alert_deliveries_account_id_accounts")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_alert_deliveries")),
    )
    op.create_index(op.f("ix_alert_deliveries_event_id"), "alert_deliveries", ["event_id"])
    op.create_index(
        op.f("ix_alert_deliveries_account_id_attempted_at"),
        "alert_deliveries",
        ["account_id", "attempted_at"],
    )


def downgrade() -> None:
    op.drop_table("alert_deliveries")
    op.drop_table("alert_events")
    op.drop_table("alert_settings")
