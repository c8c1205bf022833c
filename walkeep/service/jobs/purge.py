"""Forget forgets: a memory that left service loses its derived data, and the index its rows.

A memory leaves service when it is forgotten or superseded (``no-renew``), when its
``expires_at`` passes or its blob lapses (``expired``), or when its write fails
(``walkeep/service/leaving.py`` says how). Besides its receipt, the database held for it
a keyed content hash, its sealed metadata and metadata tags, and its index rows (vectors,
term hashes). :func:`purge` deletes them, and bumps the account's index generation so
that every process on every host drops the index it built and builds the next one from
the rows that are left; on this host it writes the new index files at once (the old
generation's files are removed), then, on SQLite, truncates the write-ahead log, which
``secure_delete`` leaves holding the pages.

What stays, and why:

* the memory's row (id, status, dates, size, cost, namespace token): ``check_runway``
  answers for it, and the ledger and statements refer to it. The namespace token is a
  keyed digest, readable by no one without the master key;
* index rows shared with a memory that is still live or still being written in the same
  namespace (identical content is one blob, indexed once per namespace): they stay
  while that one lives;
* the encrypted blob on Walrus, which cannot be deleted: it lapses as today.

When: the sweep purges an account once its oldest departure not yet purged is
``WALKEEP_PURGE_WITHIN_HOURS / 2`` old, so departures are batched (a purge rebuilds the
account's index) and none waits longer than the setting (default 24 h) while the sweep
runs at least every half of it. ``walkeep index purge`` purges at once.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import delete, func, select, tuple_, update
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import ColumnElement

from walkeep.db import checkpoint, rowcount
from walkeep.db.models import Embedding, IndexState, Memory, MemoryTag
from walkeep.lifecycle import IN_FLIGHT, VISIBLE, MemoryStatus
from walkeep.service.runtime import Runtime

log = logging.getLogger(__name__)

# Out of service: forgotten (or superseded), lapsed, or never landed.
LEFT = (MemoryStatus.NO_RENEW, MemoryStatus.EXPIRED, MemoryStatus.FAILED)
# A memory whose derived data was purged has this content hash (a live one never does).
PURGED = ""
BATCH = 1000


@dataclass
class PurgeReport:
    accounts: list[str] = field(default_factory=list)
    memories: int = 0
    index_rows: int = 0
    segments_written: int = 0


def _unpurged() -> tuple[ColumnElement[bool], ColumnElement[bool]]:
    return (Memory.status.in_(list(LEFT)), Memory.content_hash != PURGED)


def due(rt: Runtime) -> PurgeReport:
    """The sweep's step: purge each account whose oldest unpurged departure is half the
    window old."""
    window = timedelta(hours=rt.settings.purge_within_hours)
    before = rt.clock.now() - window / 2
    with rt.db.read() as s:
        accounts = list(
            s.scalars(
                select(Memory.account_id)
                .where(*_unpurged())
                .group_by(Memory.account_id)
                .having(func.min(Memory.status_changed_at) <= before)
            )
        )
    return purge(rt, accounts)


def purge(rt: Runtime, accounts: list[str]) -> PurgeReport:
    """Purge every departed memory of ``accounts`` now (see the module's docstring)."""
    report = PurgeReport()
    for account_id in accounts:
        memories, rows = _purge_rows(rt, account_id)
        report.accounts.append(account_id)
        report.memories += memories
        report.index_rows += rows
        index = getattr(rt.relayer, "index", None)
        if rows and index is not None and index.merge(account_id, full=True):
            report.segments_written += 1
        if memories:
            log.info(
                "purged %s departed memories of %s (%s index rows)", memories, account_id, rows
            )
    if report.memories and rt.db.is_sqlite and not checkpoint.truncate(rt.db):
        log.warning("the write-ahead log was busy after a purge; the next checkpoint cuts it")
    return report


def _purge_rows(rt: Runtime, account_id: str) -> tuple[int, int]:
    """(memories purged, index rows deleted) for one account, a batch per transaction."""
    memories = rows = 0
    while True:
        with rt.db.begin() as s:
            departed = s.execute(
                select(Memory.id, Memory.namespace, Memory.blob_id, Memory.content_hash)
                .where(Memory.account_id == account_id, *_unpurged())
                .limit(BATCH)
            ).all()
            if not departed:
                return memories, rows
            pairs = {(ns, b) for _, ns, b, _ in departed if b is not None}
            hashes = {h for *_, h in departed}
            # Kept: what a live or in-flight memory of the same namespace still uses (the
            # same blob; or, not landed yet, the same content, which will be that blob).
            live = set(
                s.execute(
                    select(Memory.namespace, Memory.blob_id).where(
                        Memory.account_id == account_id,
                        Memory.status.in_(list(VISIBLE | IN_FLIGHT)),
                        Memory.blob_id.in_([b for _, b in pairs]),
                    )
                )
            )
            pending = set(
                s.execute(
                    select(Memory.namespace, Memory.content_hash).where(
                        Memory.account_id == account_id,
                        Memory.status.in_(list(IN_FLIGHT)),
                        Memory.content_hash.in_(list(hashes)),
                    )
                )
            )
            gone = [
                (ns, b)
                for _, ns, b, h in departed
                if b is not None and (ns, b) not in live and (ns, h) not in pending
            ]
            if gone:
                _bump_generation(s, account_id, rt.clock.now())
                deleted = s.execute(
                    delete(Embedding).where(
                        Embedding.account_id == account_id,
                        tuple_(Embedding.namespace, Embedding.blob_id).in_(sorted(set(gone))),
                    )
                )
                rows += rowcount(deleted)
            ids = [m for m, *_ in departed]
            s.execute(
                delete(MemoryTag).where(
                    MemoryTag.account_id == account_id, MemoryTag.memory_id.in_(ids)
                )
            )
            s.execute(
                update(Memory).where(Memory.id.in_(ids)).values(content_hash=PURGED, metadata_={})
            )
            memories += len(departed)


def _bump_generation(s: Session, account_id: str, now: datetime) -> None:
    """Rows were deleted, which a cached index (trusting "rows only grow") can't see:
    every process drops what it built for this account."""
    models = set(
        s.scalars(select(Embedding.model).where(Embedding.account_id == account_id).distinct())
    )
    known = set(s.scalars(select(IndexState.model).where(IndexState.account_id == account_id)))
    s.execute(
        update(IndexState)
        .where(IndexState.account_id == account_id)
        .values(generation=IndexState.generation + 1, updated_at=now)
    )
    for model in models - known:
        s.add(IndexState(account_id=account_id, model=model, generation=1, updated_at=now))
