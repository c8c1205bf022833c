"""Each blob counts its own active, paused and no-renew memories, kept by triggers.

``check_runway``'s summary must show a kept memory whose blob lapsed since the last
sweep as expired, so it counted those memories: one probe of ``memories (blob_pk,
status)`` per lapsed blob. Right after an epoch boundary that can be tens of
thousands of blobs (50,000 lapsed, the sweep not yet run: 110 ms of a 100 ms target
at a million memories, bench/summary.py). With the counts on the blob row it is a
sum over the account's lapsed blobs, read off the blobs alone; the renewal's due
scan and the summary's least runway read "holds an active memory" the same way,
instead of probing ``memories`` once per blob.

Maintained by triggers on ``memories`` (insert, update of status or blob_pk, delete)
in the same transaction as every change, as ``memory_counts`` (migration 0011) is:
no code path can forget them, and a rolled-back change rolls its count back. A
memory counts on the blob it points at while its status is active, paused or
no-renew. The counts are increments, so two transactions changing memories of one
blob never lose each other's change; on PostgreSQL a statement's blobs are locked
in id order first, so two statements touching the same blobs in different orders
cannot deadlock on them.

On PostgreSQL the triggers are per statement (a sweep of 100,000 memories is one
grouped update), on SQLite per row. SQLite drops a table's triggers when a batch
migration recreates it: a later migration that batch-alters ``memories`` must
create these again (tests/test_runway_summary.py fails if they are missing).

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Kept memory status -> its column on blobs (frozen here: a migration is a snapshot).
KEPT = {
    "active": "active_memories",
    "paused": "paused_memories",
    "no-renew": "no_renew_memories",
}
_IN_KEPT = "(" + ", ".join(f"'{s}'" for s in KEPT) + ")"


def _set(sign: str, side: str, as_int: str) -> str:
    """``col = col ± (side.status = 'x')`` for every kept status."""
    return ", ".join(
        f"{col} = {col} {sign} {as_int.format(f'{side}.status = {chr(39)}{st}{chr(39)}')}"
        for st, col in KEPT.items()
    )


def _counted(side: str) -> str:
    return f"{side}.blob_pk IS NOT NULL AND {side}.status IN {_IN_KEPT}"


# SQLite: row triggers, one UPDATE of the blob's row per counted change.
def _sqlite_apply(sign: str, side: str) -> str:
    return f"UPDATE blobs SET {_set(sign, side, '({0})')} WHERE id = {side}.blob_pk;"


SQLITE_TRIGGERS = [
    ("blob_counts_insert", "INSERT", _counted("NEW"), _sqlite_apply("+", "NEW")),
    (
        "blob_counts_update",
        "UPDATE OF status, blob_pk",
        f"(OLD.status IS NOT NEW.status OR OLD.blob_pk IS NOT NEW.blob_pk) "
        f"AND (({_counted('OLD')}) OR ({_counted('NEW')}))",
        _sqlite_apply("-", "OLD") + " " + _sqlite_apply("+", "NEW"),
    ),
    ("blob_counts_delete", "DELETE", _counted("OLD"), _sqlite_apply("-", "OLD")),
]


def _sqlite_trigger(name: str, event: str, when: str, body: str) -> str:
    return (
        f"CREATE TRIGGER {name} AFTER {event} ON memories FOR EACH ROW WHEN {when} BEGIN {body} END"
    )


# PostgreSQL: statement triggers over transition tables. Each branch sums the changed
# rows' signed counts per blob into arrays (in blob id order); the common tail locks
# those blobs in that order and applies the sums.
def _pg_rows(source: str, side: str, sign: str, where: str) -> str:
    cols = ", ".join(f"{sign}({side}.status = '{st}')::int" for st in KEPT)
    return f"SELECT {side}.blob_pk, {cols} FROM {source} WHERE {where} AND {_counted(side)}"


_N = range(len(KEPT))
_D = ", ".join(f"d{i}" for i in _N)


def _pg_collect(rows: str) -> str:
    arrays = ", ".join(f"array_agg(d{i} ORDER BY blob_pk)" for i in _N)
    sums = ", ".join(f"SUM(d{i})" for i in _N)
    nonzero = " OR ".join(f"d{i} <> 0" for i in _N)
    return (
        f"SELECT array_agg(blob_pk ORDER BY blob_pk), {arrays} "
        f"INTO ids, {', '.join(f'c{i}' for i in _N)} "
        f"FROM (SELECT blob_pk, {sums} FROM ({rows}) AS x (blob_pk, {_D}) GROUP BY blob_pk) "
        f"AS g (blob_pk, {_D}) WHERE {nonzero}"
    )


_CHANGED = "(o.status, o.blob_pk) IS DISTINCT FROM (n.status, n.blob_pk)"
_PAIRS = "old_rows o JOIN new_rows n ON n.id = o.id"
_APPLY = ", ".join(f"{col} = b.{col} + u.d{i}" for i, col in enumerate(KEPT.values()))
PG_FUNCTION = f"""
CREATE FUNCTION walkeep_blob_counts() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    ids bigint[];
    {" ".join(f"c{i} int[];" for i in _N)}
BEGIN
    IF TG_OP = 'INSERT' THEN
        {_pg_collect(_pg_rows("new_rows n", "n", "+", "TRUE"))};
    ELSIF TG_OP = 'DELETE' THEN
        {_pg_collect(_pg_rows("old_rows o", "o", "-", "TRUE"))};
    ELSE
        {
    _pg_collect(
        _pg_rows(_PAIRS, "o", "-", _CHANGED) + " UNION ALL " + _pg_rows(_PAIRS, "n", "+", _CHANGED)
    )
};
    END IF;
    IF ids IS NULL THEN
        RETURN NULL;
    END IF;
    PERFORM 1 FROM blobs WHERE id = ANY(ids) ORDER BY id FOR NO KEY UPDATE;
    UPDATE blobs b SET {_APPLY}
        FROM unnest(ids, {", ".join(f"c{i}" for i in _N)}) AS u (id, {_D})
        WHERE b.id = u.id;
    RETURN NULL;
END
$$
"""
PG_TRIGGERS = [
    ("blob_counts_insert", "INSERT", "NEW TABLE AS new_rows"),
    ("blob_counts_update", "UPDATE", "OLD TABLE AS old_rows NEW TABLE AS new_rows"),
    ("blob_counts_delete", "DELETE", "OLD TABLE AS old_rows"),
]


def upgrade() -> None:
    for col in KEPT.values():
        op.add_column("blobs", sa.Column(col, sa.BigInteger(), server_default="0", nullable=False))
    # Triggers first, then the backfill: on PostgreSQL CREATE TRIGGER locks out
    # writers of memories until this migration commits, so no change falls between.
    if op.get_bind().dialect.name == "postgresql":
        op.execute(PG_FUNCTION)
        for name, event, tables in PG_TRIGGERS:
            op.execute(
                f"CREATE TRIGGER {name} AFTER {event} ON memories REFERENCING {tables} "
                "FOR EACH STATEMENT EXECUTE FUNCTION walkeep_blob_counts()"
            )
    else:
        for trigger in SQLITE_TRIGGERS:
            op.execute(_sqlite_trigger(*trigger))
    counts = ", ".join(
        f"{col} = (SELECT count(*) FROM memories m WHERE m.blob_pk = blobs.id "
        f"AND m.status = '{st}')"
        for st, col in KEPT.items()
    )
    op.execute(
        f"UPDATE blobs SET {counts} WHERE id IN "
        f"(SELECT blob_pk FROM memories WHERE status IN {_IN_KEPT} AND blob_pk IS NOT NULL)"
    )
    _summary_index(include=list(KEPT.values()))


def _summary_index(include: list[str]) -> None:
    """PostgreSQL: the summary's blobs index carries the counts, so the lapsed sums and
    the least runway are index-only scans. Read from the table instead, 35,000 lapsed
    blobs took 97 ms of random heap reads (bench/summary.py); off the index, 10 ms.
    SQLite has no INCLUDE; its index stays as it is."""
    if op.get_bind().dialect.name != "postgresql":
        return
    name = op.f("ix_blobs_account_id_status_end_epoch_id")
    op.drop_index(name, table_name="blobs")
    op.create_index(
        name,
        "blobs",
        ["account_id", "status", "end_epoch", "id"],
        postgresql_include=include,
    )


def downgrade() -> None:
    _summary_index(include=[])
    postgres = op.get_bind().dialect.name == "postgresql"
    for name, *_ in PG_TRIGGERS:
        op.execute(f"DROP TRIGGER IF EXISTS {name}" + (" ON memories" if postgres else ""))
    if postgres:
        op.execute("DROP FUNCTION IF EXISTS walkeep_blob_counts()")
    with op.batch_alter_table("blobs") as batch:
        for col in KEPT.values():
            batch.drop_column(col)
