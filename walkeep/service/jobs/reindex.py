"""Re-derive the search index from the memories themselves: the backfill job and ``walkeep index rebuild``.

The index is derived data (``walkeep/index/search.py``): the truth is each
memory's encrypted content. Two gaps are repaired here, in batches that commit
as they go, so an interrupted run resumes where it stopped and a running server
keeps answering throughout:

1. **rows without terms** — index rows written before the lexical index
   (migration 0014) hold vectors but no term hashes. Their memory's content is
   read back (decrypted with the account's key), chunked as it was, and the
   terms written into those rows. The worker's ``reindex`` job does this on its
   own after an upgrade, a batch per run, and logs how many remain.
2. **bare digests** — content hashes and request fingerprints stored as bare SHA-256
   before they were keyed are rewritten keyed (``walkeep/service/digests.py``), a batch
   per run, whatever the relayer.
3. **vectors in clear** — index vectors written before they were sealed are sealed in
   place (``IndexRows.seal_plain``), a batch per run; their values don't change.
4. **memories without rows** (``rebuild`` only) — a visible memory whose blob has
   no row of the active model (a model switch, rows lost) is embedded again.

Rows rewritten in place bump the account's index generation, so every process
drops what it built from the old rows; ``rebuild`` then writes a fresh segment.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import and_, func, select, update

from walkeep.db.models import Account, Embedding, IndexState, Memory
from walkeep.errors import NotFound, ValidationError
from walkeep.index import terms as termlib
from walkeep.index.rows import COPY_STRIDE
from walkeep.index.search import SearchIndex
from walkeep.lifecycle import VISIBLE
from walkeep.service import digests
from walkeep.service.runtime import Runtime

log = logging.getLogger(__name__)

BATCH_ROWS = 500
# Memories with no index row, read this many at a time (``Relayer.read_many``).
READ_BATCH = 64


@dataclass
class ReindexReport:
    accounts: int = 0
    rows_backfilled: int = 0
    memories_indexed: int = 0
    unreadable: int = 0
    remaining: int = 0
    segments_written: int = 0
    # Content hashes and request fingerprints stored bare before they were keyed, rewritten.
    digests_rekeyed: int = 0
    # Index vectors stored in clear before they were sealed, sealed.
    vectors_sealed: int = 0


def search_index(rt: Runtime) -> SearchIndex:
    """The runtime's own search index; relayers that rank remotely (MemWal) have none."""
    index = getattr(rt.relayer, "index", None)
    if not isinstance(index, SearchIndex):
        raise ValidationError(
            f"the {rt.relayer.name} relayer keeps its own index: nothing to rebuild here"
        )
    return index


def missing_terms(rt: Runtime, account_id: str | None = None) -> int:
    """Index rows of the active model that have no terms yet."""
    index = search_index(rt)
    q = select(func.count()).where(Embedding.model == index.model_id, Embedding.terms.is_(None))
    if account_id is not None:
        q = q.where(Embedding.account_id == account_id)
    with rt.db.read() as s:
        return int(s.scalar(q) or 0)


def backfill(rt: Runtime, *, max_rows: int = 5_000) -> ReindexReport:
    """The worker's ``reindex`` job: give up to ``max_rows`` term-less rows their terms,
    and key digests stored bare by an earlier version (walkeep/service/digests.py)."""
    report = ReindexReport(digests_rekeyed=digests.rekey(rt))
    index = getattr(rt.relayer, "index", None)
    if not isinstance(index, SearchIndex):
        return report  # a relayer that ranks remotely
    if not rt.extras.get("vectors_sealed"):
        report.vectors_sealed = index.rows.seal_plain(limit=max_rows)
        # New rows are always sealed: once a pass finds none, stop looking.
        rt.extras["vectors_sealed"] = report.vectors_sealed == 0
    with rt.db.read() as s:
        accounts = list(
            s.scalars(
                select(Embedding.account_id)
                .where(Embedding.model == index.model_id, Embedding.terms.is_(None))
                .distinct()
                .limit(100)
            )
        )
    for account_id in accounts:
        if report.rows_backfilled >= max_rows:
            break
        report.accounts += 1
        _backfill_account(rt, index, account_id, report, max_rows - report.rows_backfilled)
    if accounts:
        report.remaining = missing_terms(rt)
        log.info(
            "search index backfill: %s rows of %s accounts got their terms, %s remain",
            report.rows_backfilled,
            report.accounts,
            report.remaining,
        )
    return report


def rebuild(
    rt: Runtime,
    account: str | None = None,
    *,
    progress: Callable[[str, int, int], None] | None = None,
) -> ReindexReport:
    """``walkeep index rebuild``: backfill terms, index unindexed memories, write segments.

    ``progress(account_name, done, total)`` is called as rows and memories are done.
    Safe beside a running server; resumable (every batch commits).
    """
    index = search_index(rt)
    with rt.db.read() as s:
        q = select(Account.id, Account.name).order_by(Account.name)
        if account is not None:
            q = q.where((Account.id == account) | (Account.name == account))
        targets = list(s.execute(q))
    if account is not None and not targets:
        raise NotFound("no such account", {"account": account})
    report = ReindexReport()
    for account_id, name in targets:
        report.accounts += 1
        todo = missing_terms(rt, account_id) + len(_unindexed(rt, index, account_id))
        done = 0

        def tick(n: int, name: str = name, todo: int = todo) -> None:
            nonlocal done
            done += n
            if progress is not None:
                progress(name, min(done, todo), todo)

        tick(0)
        _backfill_account(rt, index, account_id, report, None, tick)
        unindexed = _unindexed(rt, index, account_id)
        for at in range(0, len(unindexed), READ_BATCH):
            batch = unindexed[at : at + READ_BATCH]
            texts = rt.relayer.read_many(account_id, [blob_id for _, blob_id in batch])
            for memory_namespace, blob_id in batch:
                if blob_id not in texts:
                    report.unreadable += 1
                else:
                    index.add(account_id, memory_namespace, blob_id, texts[blob_id])
                    report.memories_indexed += 1
                tick(1)
        if index.merge(account_id, full=True):
            report.segments_written += 1
    return report


def _unindexed(rt: Runtime, index: SearchIndex, account_id: str) -> list[tuple[str, str]]:
    """(namespace, blob_id) of visible memories with no row of the active model."""
    e = Embedding
    with rt.db.read() as s:
        rows = s.execute(
            select(Memory.namespace, Memory.blob_id)
            .outerjoin(
                e,
                and_(
                    e.account_id == Memory.account_id,
                    e.blob_id == Memory.blob_id,
                    e.namespace == Memory.namespace,
                    e.model == index.model_id,
                ),
            )
            .where(
                Memory.account_id == account_id,
                Memory.status.in_(list(VISIBLE)),
                Memory.blob_id.is_not(None),
                e.id.is_(None),
            )
            .distinct()
        ).all()
    return [(ns, b) for ns, b in rows if b is not None]


def _backfill_account(
    rt: Runtime,
    index: SearchIndex,
    account_id: str,
    report: ReindexReport,
    max_rows: int | None,
    tick: Callable[[int], None] | None = None,
) -> None:
    key = index.terms_key(account_id)
    if key is None:
        return
    changed = False
    after = 0
    while max_rows is None or max_rows > 0:
        with rt.db.read() as s:
            rows = s.execute(
                select(Embedding.id, Embedding.blob_id, Embedding.chunk)
                .where(
                    Embedding.account_id == account_id,
                    Embedding.model == index.model_id,
                    Embedding.terms.is_(None),
                    Embedding.id > after,
                )
                .order_by(Embedding.id)
                .limit(BATCH_ROWS if max_rows is None else min(BATCH_ROWS, max_rows))
            ).all()
        if not rows:
            break
        after = rows[-1][0]
        # The batch's blobs read together (a Walrus aggregator overlaps them); one that
        # is lapsed or foreign has nothing to read.
        blob_ids = list(dict.fromkeys(blob_id for _, blob_id, _ in rows))
        texts = rt.relayer.read_many(account_id, blob_ids)
        chunks_of = {b: index.chunk(texts[b]) if b in texts else None for b in blob_ids}
        report.unreadable += len(blob_ids) - len(texts)
        updates: list[dict[str, object]] = []
        for row_id, blob_id, chunk in rows:
            chunks = chunks_of[blob_id]
            part = chunk % COPY_STRIDE
            text = chunks[part] if chunks is not None and part < len(chunks) else ""
            updates.append({"id": row_id, "terms": termlib.pack(*termlib.term_vector(key, text))})
        with rt.db.begin() as s:
            s.execute(update(Embedding), updates)
        changed = True
        report.rows_backfilled += len(updates)
        if max_rows is not None:
            max_rows -= len(updates)
        if tick is not None:
            tick(len(updates))
    if changed:
        bump_generation(rt, account_id, index.model_id)


def bump_generation(rt: Runtime, account_id: str, model: str) -> None:
    """Rows were rewritten in place: every process must drop indexes built from them."""
    now = rt.clock.now()
    with rt.db.begin() as s:
        updated = s.execute(
            update(IndexState)
            .where(IndexState.account_id == account_id, IndexState.model == model)
            .values(generation=IndexState.generation + 1, updated_at=now)
        )
        if not updated.rowcount:  # type: ignore[attr-defined]
            s.add(IndexState(account_id=account_id, model=model, generation=1, updated_at=now))


__all__ = ["ReindexReport", "backfill", "bump_generation", "missing_terms", "rebuild"]
