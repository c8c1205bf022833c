"""Leave room on ``blobs`` pages so a renewal's lease is a HOT update (PostgreSQL).

A renewal batch writes each of its blobs twice: the lease (``pending_renewal_id``,
``updated_at``: no indexed column) when it is claimed, and the new end epoch when
the chain confirms it. On full pages PostgreSQL cannot keep the leased version on
the same page, so the lease inserted a new entry into each of the table's five
indexes for every blob: 4–8 ms per 200-blob batch, the largest single statement of
a renewal pass (auto_explain on ``bench/renew.py``). With free space on the page
the lease is a heap-only tuple: no index is touched, and the dead version is pruned
the next time the page is read. A batch leases neighbouring rows — every row of a
page — so the room must hold a page's worth of leases: at 70 % 43 % of leases were
HOT, at 50 % 94 %, and the lease's server time fell from 3.0 to 1.1 ms per batch.
The price is a blobs table twice as large, which quilts keep small (one row per
~600 memories). Existing pages keep their layout until they are rewritten
(``VACUUM FULL``); new and updated rows use it.

SQLite has no fillfactor; nothing changes there.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

FILLFACTOR = 50


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"ALTER TABLE blobs SET (fillfactor = {FILLFACTOR})")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE blobs RESET (fillfactor)")
