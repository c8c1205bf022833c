"""Per-account memory counts kept by triggers, and the indexes check_runway's summary walks.

``check_runway`` without a memory id used to load every memory of the account
with its blob; at a million memories that took seconds. The counts now come
from one ``memory_counts`` row per account, maintained by triggers on
``memories`` (insert, update of status, delete) in the same transaction as
every change: no code path can forget to update them, and a rolled-back
change rolls its count back too. One column per listed status, so a change
is ONE upsert of ONE row; ``accepting``, ``storing`` and ``failed`` are not
counted, so the accept of a store and the failure of one that never landed write
nothing here (check_runway counts storing memories off the index: the write backlog
bounds them). A store's claim takes the account's row lock; had it also counted
here, at the end of its statement, it would take this row's lock after the
account's — the opposite order from registration (a status change, then the
capture), and the two deadlocked under load. On PostgreSQL the triggers are per statement (one grouped upsert for a
sweep of 100,000 memories), on SQLite per row.

The two indexes serve the summary without touching table rows: ``memories
(account_id, status, id, blob_pk)`` gives the smallest memory ids of one status
and their blobs (expired, storing, the id-ordered walk of a big runway bucket);
``blobs (account_id, status, end_epoch, id)`` gives an account's live blobs in
runway order, and its blobs past end_epoch that the sweep has not expired yet.

SQLite drops a table's triggers when a batch migration recreates it: a later
migration that batch-alters ``memories`` must create these triggers again
(tests/test_runway_summary.py fails if they are missing).

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Counted memory status -> its column (frozen here: a migration is a snapshot).
COUNTED = {
    "active": "active",
    "paused": "paused",
    "no-renew": "no_renew",
    "expired": "expired",
}
_IN_COUNTED = "(" + ", ".join(f"'{s}'" for s in COUNTED) + ")"
_COLS = ", ".join(COUNTED.values())
_ADD = ", ".join(f"{c} = memory_counts.{c} + excluded.{c}" for c in COUNTED.values())


def _deltas(new: str | None, old: str | None, as_int: str) -> list[str]:
    """One ``+1/-1/0`` expression per counted status: (new is s) - (old is s)."""

    def is_(side: str, status: str) -> str:
        return as_int.format(f"{side} = '{status}'")

    out = []
    for status in COUNTED:
        plus = is_(new, status) if new else "0"
        out.append(f"{plus} - {is_(old, status)}" if old else plus)
    return out


_UPSERT = (
    f"INSERT INTO memory_counts (account_id, {_COLS}) {{rows}} "
    f"ON CONFLICT (account_id) DO UPDATE SET {_ADD}"
)
_CHANGED = "{old} <> {new} AND ({old} IN {c} OR {new} IN {c})"

# SQLite: row triggers, one upsert of the account's row per counted change (rows are
# updated in place, so a transaction changing thousands of memories stays linear).
SQLITE_TRIGGERS = [
    ("memory_counts_insert", "INSERT", "NEW", None, f"NEW.status IN {_IN_COUNTED}"),
    (
        "memory_counts_update",
        "UPDATE OF status",
        "NEW",
        "OLD",
        _CHANGED.format(old="OLD.status", new="NEW.status", c=_IN_COUNTED),
    ),
    ("memory_counts_delete", "DELETE", None, "OLD", f"OLD.status IN {_IN_COUNTED}"),
]


def _sqlite_trigger(name: str, event: str, new: str | None, old: str | None, when: str) -> str:
    values = ", ".join(_deltas(new and f"{new}.status", old and f"{old}.status", "({0})"))
    rows = f"VALUES ({new or old}.account_id, {values})"
    return (
        f"CREATE TRIGGER {name} AFTER {event} ON memories FOR EACH ROW WHEN {when} "
        f"BEGIN {_UPSERT.format(rows=rows)}; END"
    )


# PostgreSQL: statement triggers over transition tables, one grouped upsert per
# statement. Row triggers would update the account's row once per memory, and a
# transaction that updates one row N times leaves N versions that every later
# update walks (O(N^2): the sweep expiring 100,000 memories, a COPY).
# (Transition tables rule out UPDATE OF status: the join keeps changed statuses only.)
def _pg_upsert(source: str, new: str | None, old: str | None, where: str) -> str:
    sums = ", ".join(
        f"SUM({d})" for d in _deltas(new and f"{new}.status", old and f"{old}.status", "({0})::int")
    )
    acct = f"{new or old}.account_id"
    rows = f"SELECT {acct}, {sums} FROM {source} WHERE {where} GROUP BY {acct}"
    return _UPSERT.format(rows=rows)


_PG_INSERT = _pg_upsert("new_rows n", "n", None, f"n.status IN {_IN_COUNTED}")
_PG_DELETE = _pg_upsert("old_rows o", None, "o", f"o.status IN {_IN_COUNTED}")
_PG_UPDATE = _pg_upsert(
    "old_rows o JOIN new_rows n ON n.id = o.id",
    "n",
    "o",
    _CHANGED.format(old="o.status", new="n.status", c=_IN_COUNTED),
)
PG_FUNCTION = f"""
CREATE FUNCTION walkeep_memory_counts() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        {_PG_INSERT};
    ELSIF TG_OP = 'DELETE' THEN
        {_PG_DELETE};
    ELSE
        {_PG_UPDATE};
    END IF;
    RETURN NULL;
END
$$
"""
PG_TRIGGERS = [
    ("memory_counts_insert", "INSERT", "NEW TABLE AS new_rows"),
    ("memory_counts_update", "UPDATE", "OLD TABLE AS old_rows NEW TABLE AS new_rows"),
    ("memory_counts_delete", "DELETE", "OLD TABLE AS old_rows"),
]


def upgrade() -> None:
    op.create_table(
        "memory_counts",
        sa.Column("account_id", sa.String(32), nullable=False),
        *(
            sa.Column(col, sa.BigInteger(), server_default="0", nullable=False)
            for col in COUNTED.values()
        ),
        sa.ForeignKeyConstraint(
            ["account_id"], ["accounts.id"], name=op.f("fk_memory_counts_account_id_accounts")
        ),
        sa.PrimaryKeyConstraint("account_id", name=op.f("pk_memory_counts")),
    )
    op.create_index(
        op.f("ix_memories_account_id_status_id_blob_pk"),
        "memories",
        ["account_id", "status", "id", "blob_pk"],
    )
    op.create_index(
        op.f("ix_blobs_account_id_status_end_epoch_id"),
        "blobs",
        ["account_id", "status", "end_epoch", "id"],
    )

    # Triggers first, then the backfill: on PostgreSQL CREATE TRIGGER locks out
    # writers of memories until this migration commits, so no change falls between.
    if op.get_bind().dialect.name == "postgresql":
        op.execute(PG_FUNCTION)
        for name, event, tables in PG_TRIGGERS:
            op.execute(
                f"CREATE TRIGGER {name} AFTER {event} ON memories REFERENCING {tables} "
                "FOR EACH STATEMENT EXECUTE FUNCTION walkeep_memory_counts()"
            )
    else:
        for trigger in SQLITE_TRIGGERS:
            op.execute(_sqlite_trigger(*trigger))
    sums = ", ".join(f"SUM(CASE WHEN status = '{s}' THEN 1 ELSE 0 END)" for s in COUNTED)
    op.execute(
        f"INSERT INTO memory_counts (account_id, {_COLS}) "
        f"SELECT account_id, {sums} FROM memories WHERE status IN {_IN_COUNTED} "
        "GROUP BY account_id"
    )


def downgrade() -> None:
    postgres = op.get_bind().dialect.name == "postgresql"
    for name, *_ in PG_TRIGGERS:
        op.execute(f"DROP TRIGGER IF EXISTS {name}" + (" ON memories" if postgres else ""))
    if postgres:
        op.execute("DROP FUNCTION IF EXISTS walkeep_memory_counts()")
    op.drop_index(op.f("ix_blobs_account_id_status_end_epoch_id"), table_name="blobs")
    op.drop_index(op.f("ix_memories_account_id_status_id_blob_pk"), table_name="memories")
    op.drop_table("memory_counts")
