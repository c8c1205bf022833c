"""Automatic top-up: a saved card per account, and one row per automatic charge.

``auto_top_ups`` holds an account's rule (below/to runway epochs, monthly cap), its saved
card with the consent given for it, and the state (off | active | action_required |
disabled). ``auto_charges`` holds each charge, claimed before the provider is called;
``pending_account_id`` is UNIQUE and set only while a charge is pending, which is how both
databases allow at most one pending charge per account. ``checkout_sessions`` learns
setup-mode sessions (save a card, no payment) and payments that also save the card.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-06
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from walkeep.db.models import UTCDateTime

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    with op.batch_alter_table("checkout_sessions") as batch:
        batch.add_column(sa.Column("mode", sa.String(8), server_default="payment", nullable=False))
        batch.add_column(
            sa.Column("save_card", sa.Boolean(), server_default=sa.false(), nullable=False)
        )
        batch.add_column(sa.Column("customer_id", sa.String(255), nullable=True))
        batch.add_column(sa.Column("test_card", sa.String(32), nullable=True))
        batch.add_column(sa.Column("card_saved_at", UTCDateTime(), nullable=True))
    op.create_table(
        "auto_top_ups",
        sa.Column("account_id", sa.String(32), nullable=False),
        sa.Column("status", sa.String(20), server_default="off", nullable=False),
        sa.Column("below_runway_epochs", sa.Integer(), nullable=True),
        sa.Column("to_runway_epochs", sa.Integer(), nullable=True),
        sa.Column("monthly_cap_cents", sa.BigInteger(), nullable=True),
        sa.Column("provider", sa.String(16), nullable=True),
        sa.Column("customer_id", sa.String(255), nullable=True),
        sa.Column("payment_method_id", sa.String(255), nullable=True),
        sa.Column("card_brand", sa.String(32), nullable=True),
        sa.Column("card_last4", sa.String(4), nullable=True),
        sa.Column("consent_at", UTCDateTime(), nullable=True),
        sa.Column("consent_version", sa.String(32), nullable=True),
        sa.Column("consent_source", sa.String(100), nullable=True),
        sa.Column("consecutive_declines", sa.Integer(), server_default="0", nullable=False),
        sa.Column("next_attempt_at", UTCDateTime(), nullable=True),
        sa.Column("reason", sa.String(500), nullable=True),
        sa.Column("action_charge_id", sa.String(32), nullable=True),
        sa.Column("cap_alert_month", sa.String(7), nullable=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["account_id"], ["accounts.id"], name=op.f("fk_auto_top_ups_account_id_accounts")
        ),
        sa.PrimaryKeyConstraint("account_id", name=op.f("pk_auto_top_ups")),
    )
    op.create_index(op.f("ix_auto_top_ups_status"), "auto_top_ups", ["status"])
    op.create_index(
        op.f("ix_auto_top_ups_payment_method_id"), "auto_top_ups", ["payment_method_id"]
    )
    op.create_table(
        "auto_charges",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("account_id", sa.String(32), nullable=False),
        sa.Column("pending_account_id", sa.String(32), nullable=True),
        sa.Column("amount_cents", sa.BigInteger(), nullable=False),
        sa.Column("currency", sa.String(3), nullable=False),
        sa.Column("provider", sa.String(16), nullable=False),
        sa.Column("customer_id", sa.String(255), nullable=False),
        sa.Column("payment_method_id", sa.String(255), nullable=False),
        sa.Column("idempotency_key", sa.String(255), nullable=False),
        sa.Column("payment_intent_id", sa.String(255), nullable=True),
        sa.Column("status", sa.String(24), nullable=False),
        sa.Column("failure", sa.String(24), nullable=True),
        sa.Column("decline_code", sa.String(64), nullable=True),
        sa.Column("message", sa.String(500), nullable=True),
        sa.Column("trigger", sa.String(16), nullable=False),
        sa.Column("inputs", sa.JSON(), nullable=False),
        sa.Column("credited_entry_id", BigId, nullable=True),
        sa.Column("refunded_cents", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("disputed_cents", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("reversed_mc", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("reversal_shortfall_mc", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("submitted_at", UTCDateTime(), nullable=True),
        sa.Column("settled_at", UTCDateTime(), nullable=True),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["account_id"], ["accounts.id"], name=op.f("fk_auto_charges_account_id_accounts")
        ),
        sa.ForeignKeyConstraint(
            ["credited_entry_id"],
            ["ledger_entries.id"],
            name=op.f("fk_auto_charges_credited_entry_id_ledger_entries"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_auto_charges")),
        sa.UniqueConstraint("pending_account_id", name=op.f("uq_auto_charges_pending_account_id")),
        sa.UniqueConstraint("idempotency_key", name=op.f("uq_auto_charges_idempotency_key")),
        sa.UniqueConstraint("payment_intent_id", name=op.f("uq_auto_charges_payment_intent_id")),
    )
    op.create_index(
        op.f("ix_auto_charges_account_id_created_at"), "auto_charges", ["account_id", "created_at"]
    )
    op.create_index(
        op.f("ix_auto_charges_status_created_at"), "auto_charges", ["status", "created_at"]
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_auto_charges_status_created_at"), table_name="auto_charges")
    op.drop_index(op.f("ix_auto_charges_account_id_created_at"), table_name="auto_charges")
    op.drop_table("auto_charges")
    op.drop_index(op.f("ix_auto_top_ups_payment_method_id"), table_name="auto_top_ups")
    op.drop_index(op.f("ix_auto_top_ups_status"), table_name="auto_top_ups")
    op.drop_table("auto_top_ups")
    with op.batch_alter_table("checkout_sessions") as batch:
        batch.drop_column("card_saved_at")
        batch.drop_column("test_card")
        batch.drop_column("customer_id")
        batch.drop_column("save_card")
        batch.drop_column("mode")
