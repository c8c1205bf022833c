"""Exact quilt shares: each quilt's apportioned total, and what each quilt renewal billed.

- ``blobs.share_micro``: a quilt's apportioned shares — the sum of its patches' fixed
  shares, in millionths of a unit — fixed when it lands (NULL for a plain blob);
- ``renewal_items.share_micro`` and ``.unbilled_micro``: for a quilt's renewal, the kept
  members' shares it billed and the rest of the quilt's apportioned shares (Walkeep's
  cost). The two sum to ``blobs.share_micro``, so ``walkeep verify`` checks the bill
  exactly (walkeep/pricing.py says the rule). NULL on renewals made before this
  migration: those were billed by the rule before, and verify says so.

Shares used to be rounded up one by one, so a quilt's shares could sum to more than the
quilt (a renewal of a quilt whose members were all kept was billed up to 1 mc above the
whole quilt's cost). Every existing quilt whose distinct patch shares sum above its units
is re-apportioned here by largest remainder, with the old shares as weights: the shares
then sum exactly to the quilt's units, and no share rises (each new share is at most the
old one). Quilts already within their units keep their shares. Renewals, renewal items
and ledger entries made before are never rewritten.

The arithmetic is written out here, not imported, so that this migration means the same
thing whatever walkeep/pricing.py becomes.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

MICRO = 1_000_000
MIB = 1024 * 1024


def _largest_remainder(total: int, weights: list[int]) -> list[int]:
    """``total`` split in proportion to ``weights``: floors, then one each to the largest
    remainders (ties to the earlier weight). Sums exactly to ``total``."""
    whole = sum(weights)
    floors = [total * w // whole for w in weights]
    order = sorted(range(len(weights)), key=lambda i: -(total * weights[i] % whole))
    for i in order[: total - sum(floors)]:
        floors[i] += 1
    return floors


def upgrade() -> None:
    op.add_column("blobs", sa.Column("share_micro", sa.BigInteger(), nullable=True))
    op.add_column("renewal_items", sa.Column("share_micro", sa.BigInteger(), nullable=True))
    op.add_column("renewal_items", sa.Column("unbilled_micro", sa.BigInteger(), nullable=True))
    conn = op.get_bind()
    units = {
        int(pk): -(-int(size) // MIB) * MICRO
        for pk, size in conn.execute(
            sa.text("SELECT id, storage_size FROM blobs WHERE kind = 'quilt'")
        )
    }
    if not units:
        return
    # Each quilt's patches (a patch held by identical copies is one patch, one share).
    patches: dict[int, list[tuple[str, int]]] = defaultdict(list)
    for pk, patch_id, share in conn.execute(
        sa.text(
            "SELECT m.blob_pk, m.blob_id, MAX(m.share_micro) FROM memories m "
            "JOIN blobs b ON b.id = m.blob_pk "
            "WHERE b.kind = 'quilt' AND m.share_micro IS NOT NULL AND m.blob_id IS NOT NULL "
            "GROUP BY m.blob_pk, m.blob_id ORDER BY m.blob_pk, m.blob_id"
        )
    ):
        patches[int(pk)].append((str(patch_id), int(share)))
    new_shares: list[dict[str, object]] = []
    totals: list[dict[str, object]] = []
    for pk, whole in units.items():
        held = patches.get(pk, [])
        total = sum(share for _, share in held)
        if total > whole:
            weights = [share for _, share in held]
            for (patch_id, old), new in zip(held, _largest_remainder(whole, weights), strict=True):
                if new != old:
                    new_shares.append({"p_pk": pk, "p_patch": patch_id, "p_share": new})
            total = whole
        totals.append({"p_pk": pk, "p_total": total})
    if new_shares:
        conn.execute(
            sa.text(
                "UPDATE memories SET share_micro = :p_share "
                "WHERE blob_pk = :p_pk AND blob_id = :p_patch"
            ),
            new_shares,
        )
    conn.execute(sa.text("UPDATE blobs SET share_micro = :p_total WHERE id = :p_pk"), totals)


def downgrade() -> None:
    # The re-apportioned member shares stay: they are the smaller, exact ones. Plain
    # ALTER TABLE … DROP COLUMN on both databases: a batch copy of ``blobs`` on SQLite
    # would trip over the triggers on ``memories`` that name it (migration 0013).
    for table, column in (
        ("renewal_items", "unbilled_micro"),
        ("renewal_items", "share_micro"),
        ("blobs", "share_micro"),
    ):
        op.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
