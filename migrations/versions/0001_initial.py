"""Initial schema: accounts, keys, ledger, memories, blobs, renewals, requests, payments.

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from walkeep.db.models import UTCDateTime

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def _ts(name: str, nullable: bool = False) -> sa.Column:
    return sa.Column(name, UTCDateTime(), nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "accounts",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("balance_mc", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("held_mc", sa.BigInteger(), server_default="0", nullable=False),
        _ts("created_at"),
        _ts("disabled_at", nullable=True),
        sa.CheckConstraint("balance_mc >= 0", name=op.f("ck_accounts_balance_nonneg")),
        sa.CheckConstraint("held_mc >= 0", name=op.f("ck_accounts_held_nonneg")),
        sa.CheckConstraint("held_mc <= balance_mc", name=op.f("ck_accounts_held_le_balance")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_accounts")),
        sa.UniqueConstraint("name", name=op.f("uq_accounts_name")),
    )
    op.create_table(
        "api_keys",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("account_id", sa.String(32), nullable=False),
        sa.Column("key_hash", sa.String(64), nullable=False),
        sa.Column("prefix", sa.String(32), nullable=False),
        sa.Column("default_namespace", sa.String(255), nullable=True),
        _ts("created_at"),
        _ts("revoked_at", nullable=True),
        sa.ForeignKeyConstraint(
            ["account_id"], ["accounts.id"], name=op.f("fk_api_keys_account_id_accounts")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_keys")),
        sa.UniqueConstraint("key_hash", name=op.f("uq_api_keys_key_hash")),
        sa.UniqueConstraint("prefix", name=op.f("uq_api_keys_prefix")),
    )
    op.create_index(op.f("ix_api_keys_account_id"), "api_keys", ["account_id"])

    op.create_table(
        "ledger_entries",
        sa.Column("id", BigId, autoincrement=True, nullable=False),
        sa.Column("account_id", sa.String(32), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("amount_mc", sa.BigInteger(), nullable=False),
        sa.Column("ref", sa.String(200), nullable=False),
        sa.Column("settles_id", BigId, nullable=True),
        sa.Column("balance_after_mc", sa.BigInteger(), nullable=False),
        sa.Column("held_after_mc", sa.BigInteger(), nullable=False),
        sa.Column("memo", sa.String(500), nullable=True),
        _ts("created_at"),
        sa.CheckConstraint("amount_mc > 0", name=op.f("ck_ledger_entries_amount_positive")),
        sa.ForeignKeyConstraint(
            ["account_id"], ["accounts.id"], name=op.f("fk_ledger_entries_account_id_accounts")
        ),
        sa.ForeignKeyConstraint(
            ["settles_id"],
            ["ledger_entries.id"],
            name=op.f("fk_ledger_entries_settles_id_ledger_entries"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_ledger_entries")),
        sa.UniqueConstraint("account_id", "ref", name=op.f("uq_ledger_entries_account_id_ref")),
        sa.UniqueConstraint("settles_id", name=op.f("uq_ledger_entries_settles_id")),
    )
    op.create_index(
        op.f("ix_ledger_entries_account_id_kind_created_at"),
        "ledger_entries",
        ["account_id", "kind", "created_at"],
    )

    op.create_table(
        "renewals",
        sa.Column("id", BigId, autoincrement=True, nullable=False),
        sa.Column("digest", sa.String(100), nullable=False),
        sa.Column("network", sa.String(16), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("walrus_epoch", sa.Integer(), nullable=False),
        sa.Column("blob_count", sa.Integer(), nullable=False),
        sa.Column("cost_mc", sa.BigInteger(), nullable=False),
        sa.Column("wal_cost_frost", sa.BigInteger(), nullable=True),
        sa.Column("gas_used", sa.BigInteger(), nullable=True),
        sa.Column("tx_bytes", sa.Text(), nullable=True),
        sa.Column("worker", sa.String(100), nullable=True),
        sa.Column("error", sa.String(1000), nullable=True),
        _ts("created_at"),
        _ts("submitted_at", nullable=True),
        _ts("settled_at", nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_renewals")),
        sa.UniqueConstraint("digest", name=op.f("uq_renewals_digest")),
    )
    op.create_index(op.f("ix_renewals_status_created_at"), "renewals", ["status", "created_at"])

    op.create_table(
        "blobs",
        sa.Column("id", BigId, autoincrement=True, nullable=False),
        sa.Column("account_id", sa.String(32), nullable=True),
        sa.Column("blob_id", sa.String(64), nullable=False),
        sa.Column("blob_object_id", sa.String(80), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("storage_size", sa.BigInteger(), nullable=False),
        sa.Column("registered_epoch", sa.Integer(), nullable=False),
        sa.Column("end_epoch", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("renewals_performed", sa.Integer(), server_default="0", nullable=False),
        sa.Column("last_renewal_tx", sa.String(100), nullable=True),
        sa.Column("next_renewal_epoch", sa.Integer(), nullable=True),
        sa.Column("pending_renewal_id", BigId, nullable=True),
        _ts("renew_not_before", nullable=True),
        sa.Column("renew_failures", sa.Integer(), server_default="0", nullable=False),
        _ts("created_at"),
        _ts("updated_at"),
        sa.ForeignKeyConstraint(
            ["account_id"], ["accounts.id"], name=op.f("fk_blobs_account_id_accounts")
        ),
        sa.ForeignKeyConstraint(
            ["pending_renewal_id"],
            ["renewals.id"],
            name=op.f("fk_blobs_pending_renewal_id_renewals"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_blobs")),
        sa.UniqueConstraint("blob_object_id", name=op.f("uq_blobs_blob_object_id")),
    )
    op.create_index(op.f("ix_blobs_status_end_epoch"), "blobs", ["status", "end_epoch"])
    op.create_index(op.f("ix_blobs_account_id_blob_id"), "blobs", ["account_id", "blob_id"])

    op.create_table(
        "memories",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("account_id", sa.String(32), nullable=False),
        sa.Column("namespace", sa.String(255), nullable=False),
        sa.Column("metadata", sa.JSON(), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("content_hash", sa.String(64), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("blob_pk", BigId, nullable=True),
        sa.Column("cost_mc", sa.BigInteger(), nullable=False),
        sa.Column("attempt", sa.Integer(), server_default="1", nullable=False),
        sa.Column("job_id", sa.String(100), nullable=True),
        _ts("accepted_at"),
        _ts("deadline_at"),
        _ts("stored_at", nullable=True),
        _ts("forgotten_at", nullable=True),
        _ts("status_changed_at"),
        sa.Column("failure_reason", sa.String(500), nullable=True),
        sa.ForeignKeyConstraint(
            ["account_id"], ["accounts.id"], name=op.f("fk_memories_account_id_accounts")
        ),
        sa.ForeignKeyConstraint(["blob_pk"], ["blobs.id"], name=op.f("fk_memories_blob_pk_blobs")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_memories")),
    )
    op.create_index(
        op.f("ix_memories_account_id_namespace_status"),
        "memories",
        ["account_id", "namespace", "status"],
    )
    op.create_index(op.f("ix_memories_blob_pk"), "memories", ["blob_pk"])
    op.create_index(op.f("ix_memories_status_accepted_at"), "memories", ["status", "accepted_at"])
    op.create_index(
        op.f("ix_memories_account_id_content_hash"), "memories", ["account_id", "content_hash"]
    )

    op.create_table(
        "renewal_items",
        sa.Column("id", BigId, autoincrement=True, nullable=False),
        sa.Column("renewal_id", BigId, nullable=False),
        sa.Column("blob_pk", BigId, nullable=False),
        sa.Column("account_id", sa.String(32), nullable=True),
        sa.Column("epochs", sa.Integer(), nullable=False),
        sa.Column("old_end_epoch", sa.Integer(), nullable=False),
        sa.Column("new_end_epoch", sa.Integer(), nullable=False),
        sa.Column("cost_mc", sa.BigInteger(), nullable=False),
        sa.Column("hold_ref", sa.String(200), nullable=True),
        sa.ForeignKeyConstraint(
            ["account_id"], ["accounts.id"], name=op.f("fk_renewal_items_account_id_accounts")
        ),
        sa.ForeignKeyConstraint(
            ["blob_pk"], ["blobs.id"], name=op.f("fk_renewal_items_blob_pk_blobs")
        ),
        sa.ForeignKeyConstraint(
            ["renewal_id"], ["renewals.id"], name=op.f("fk_renewal_items_renewal_id_renewals")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_renewal_items")),
    )
    op.create_index(op.f("ix_renewal_items_renewal_id"), "renewal_items", ["renewal_id"])
    op.create_index(op.f("ix_renewal_items_blob_pk"), "renewal_items", ["blob_pk"])

    op.create_table(
        "requests",
        sa.Column("id", BigId, autoincrement=True, nullable=False),
        sa.Column("account_id", sa.String(32), nullable=False),
        sa.Column("tool", sa.String(32), nullable=False),
        sa.Column("request_id", sa.String(255), nullable=False),
        sa.Column("fingerprint", sa.String(64), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("memory_id", sa.String(32), nullable=True),
        sa.Column("response", sa.JSON(), nullable=True),
        _ts("created_at"),
        _ts("updated_at"),
        sa.ForeignKeyConstraint(
            ["account_id"], ["accounts.id"], name=op.f("fk_requests_account_id_accounts")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_requests")),
        sa.UniqueConstraint(
            "account_id", "tool", "request_id", name=op.f("uq_requests_account_id_tool_request_id")
        ),
    )

    op.create_table(
        "checkout_sessions",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("account_id", sa.String(32), nullable=False),
        sa.Column("request_id", sa.String(255), nullable=False),
        sa.Column("amount_cents", sa.BigInteger(), nullable=False),
        sa.Column("currency", sa.String(3), nullable=False),
        sa.Column("provider", sa.String(16), nullable=False),
        sa.Column("provider_session_id", sa.String(255), nullable=True),
        sa.Column("url", sa.Text(), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("payment_status", sa.String(32), nullable=True),
        sa.Column("idempotency_key", sa.String(255), nullable=False),
        sa.Column("credited_entry_id", BigId, nullable=True),
        _ts("expires_at"),
        _ts("created_at"),
        _ts("updated_at"),
        sa.ForeignKeyConstraint(
            ["account_id"], ["accounts.id"], name=op.f("fk_checkout_sessions_account_id_accounts")
        ),
        sa.ForeignKeyConstraint(
            ["credited_entry_id"],
            ["ledger_entries.id"],
            name=op.f("fk_checkout_sessions_credited_entry_id_ledger_entries"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_checkout_sessions")),
        sa.UniqueConstraint(
            "account_id", "request_id", name=op.f("uq_checkout_sessions_account_id_request_id")
        ),
        sa.UniqueConstraint(
            "provider_session_id", name=op.f("uq_checkout_sessions_provider_session_id")
        ),
    )
    op.create_index(
        op.f("ix_checkout_sessions_status_created_at"),
        "checkout_sessions",
        ["status", "created_at"],
    )

    op.create_table(
        "stripe_events",
        sa.Column("id", sa.String(255), nullable=False),
        sa.Column("type", sa.String(100), nullable=False),
        sa.Column("session_id", sa.String(255), nullable=True),
        _ts("received_at"),
        _ts("processed_at", nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_stripe_events")),
    )


def downgrade() -> None:
    for table in (
        "stripe_events",
        "checkout_sessions",
        "requests",
        "renewal_items",
        "memories",
        "blobs",
        "renewals",
        "ledger_entries",
        "api_keys",
        "accounts",
    ):
        op.drop_table(table)
