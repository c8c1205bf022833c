"""``SearchIndex``: hybrid recall over an account's memories, bounded in memory, fast after a restart.

Three layers, each derived from the one before (``../shared/DESIGN.md`` §8):

1. the memories themselves (encrypted content in the blob store) — the truth;
2. index rows in the database (``walkeep/index/rows.py``): per chunk, its vector
   and its keyed term hashes, written when a write lands;
3. per (account, model) a segment on disk (``walkeep/index/segment.py``) plus,
   in each process, the rows written since (``walkeep/index/shard.py``).

A query costs one round trip to learn the account's newest row id and index
generation, loads only newer rows, and answers from memory-mapped files; a
fresh process opens the segment instead of re-reading a million rows. Once the
rows after the segment reach ``merge_rows``, a background thread writes the next
generation (under a per-directory file lock, so one process per host does it)
and every process switches to it on its next query.

Trust nothing on disk blindly: a segment from another model, analyzer or index
generation, or whose files disagree with their description (sizes, checksums,
codes out of range: ``walkeep/index/segment.py`` says what is checked when), is
rebuilt from the rows; so is one whose files change on disk while a process has
it open (a stat of each, at most every ``refresh_seconds``), whose large files
fail their check on the background thread that runs it, or whose search raises.
An empty answer is never taken from a shard the database contradicts: if the
database has a visible memory in scope with index rows the shard holds, the
shard re-reads late rows and which blobs are dead, then, if it still sees
nothing, is rebuilt. Each rebuild logs a warning and counts in
``walkeep_index_segment_rebuilds_total``. On PostgreSQL, where a transaction can
commit a lower row id after a higher one, the rows just below each mark are
recounted every ``recount_seconds``.

Dead blobs (no visible memory left: forgotten, lapsed, compacted away) are learnt
from ``memories.status_changed_at`` at most every ``refresh_seconds``, and from a
full scan when a segment is written; the recall service still checks each hit.

The cache of shards is bounded in bytes across accounts (``cache_bytes``, counting
each segment's files as if resident) and evicts the least recently used.

Why one file: one account's shard lifecycle — open, check, build, merge, replace,
evict — under one per-account lock and one cache; each step decides which of the
others comes next.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from sqlalchemy import exists, select
from sqlalchemy.exc import SQLAlchemyError

from walkeep import metrics
from walkeep.db import Database
from walkeep.db.models import Embedding, Memory
from walkeep.errors import WalkeepError
from walkeep.index import ranking as rk
from walkeep.index import segment as seglib
from walkeep.index import terms as termlib
from walkeep.index.embedder import Embedder
from walkeep.index.rows import IndexRows, RowBatch
from walkeep.index.shard import Shard
from walkeep.lifecycle import VISIBLE
from walkeep.nowait import WouldWait

log = logging.getLogger(__name__)

MERGE_ROWS = 20_000
RECOUNT_SECONDS = 10.0
REFRESH_SECONDS = 1.0
# Rows just below a mark that a late PostgreSQL commit may still add.
STRAGGLER_WINDOW = 5_000
DEFAULT_CACHE_BYTES = 2 * 2**30

_SAFE = re.compile(r"[^A-Za-z0-9._-]")


class SearchIndex:
    """Hybrid (lexical + dense) search over each account's index rows."""

    def __init__(
        self,
        db: Database,
        embedder: Embedder,
        terms_key: Callable[[str], bytes | None],
        vector_cipher: Callable[[str], AESGCM],
        *,
        root: Path,
        ranking: rk.Ranking = "hybrid",
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        merge_rows: int = MERGE_ROWS,
        ann_min_rows: int = seglib.ANN_MIN_ROWS,
        recount_seconds: float = RECOUNT_SECONDS,
        refresh_seconds: float = REFRESH_SECONDS,
        verify_inline_bytes: int = seglib.VERIFY_INLINE_BYTES,
        background: bool = True,
    ) -> None:
        self._db = db
        self.rows = IndexRows(db, embedder, terms_key, vector_cipher)
        self.terms_key = terms_key
        self.root = root
        seglib.private_dir(root)  # also tightens a directory an older version left 0755
        self.ranking: rk.Ranking = ranking
        self.cache_bytes = cache_bytes
        self.merge_rows = merge_rows
        self.ann_min_rows = ann_min_rows
        self.recount_seconds = recount_seconds
        self.refresh_seconds = refresh_seconds
        self.verify_inline_bytes = verify_inline_bytes
        self.background = background
        self._shards: OrderedDict[tuple[str, str], Shard] = OrderedDict()
        self._lock = threading.Lock()
        self._account_locks: dict[str, threading.Lock] = {}
        self._merging: set[str] = set()
        self._exact_ids = db.is_sqlite  # writers serialised: ids commit in order

    @property
    def embedder(self) -> Embedder:
        return self.rows.embedder

    @embedder.setter
    def embedder(self, embedder: Embedder) -> None:
        """Switch models (tests; a deployment restarts): other models' rows are never read."""
        self.rows.embedder = embedder

    @property
    def model_id(self) -> str:
        return self.embedder.model_id

    # -- writing (the landing path) ---------------------------------------------------

    def chunk(self, text: str) -> list[str]:
        return self.rows.chunk(text)

    def add(self, account_id: str, namespace: str, blob_id: str, text: str) -> int:
        return self.rows.add(account_id, namespace, blob_id, text)

    def add_many(self, items: Sequence[tuple[str, str, str, str]]) -> int:
        return self.rows.add_many(items)

    def indexed(self, account_id: str, blob_id: str, namespace: str | None = None) -> bool:
        return self.rows.indexed(account_id, blob_id, namespace)

    # -- searching --------------------------------------------------------------------

    def search(
        self,
        account_id: str,
        namespace: str | None,
        query: str,
        limit: int,
        only: Collection[str] | None = None,
    ) -> list[tuple[str, float]]:
        """Up to ``limit`` (blob_id, score) of live memories' blobs, best first; with
        ``only``, of those blobs alone (scores as without it)."""
        if limit <= 0:
            return []
        ranking = self.ranking
        qterms = None
        if ranking != "dense":
            key = self.terms_key(account_id)
            if key is None:
                return []  # no data key: the account never stored anything
            qterms = termlib.hash_terms(key, termlib.terms(query))
        qvec = _embed_aside(self.embedder, query) if ranking != "lexical" else None
        tried: list[Shard] = []
        try:
            return self._search(account_id, namespace, qvec, qterms, limit, tried, only)
        except _EmbeddingFailed as exc:
            raise exc.cause from None  # the model's failure, not the index's
        except (SQLAlchemyError, WalkeepError, WouldWait, MemoryError):
            raise  # the database, the caller or the machine: a rebuild would not help
        except Exception as exc:
            # Anything else raised by a shard means its arrays (or a bug) broke the search:
            # answer from one rebuilt from the rows. A second failure is not damage.
            self._replace(
                account_id,
                tried[-1] if tried else None,
                "search_failed",
                f"a search raised {type(exc).__name__}: {exc}",
            )
            return self._search(account_id, namespace, qvec, qterms, limit, [], only)

    def _search(
        self,
        account_id: str,
        namespace: str | None,
        qvec: Callable[[], np.ndarray] | None,
        qterms: np.ndarray | None,
        limit: int,
        tried: list[Shard],
        only: Collection[str] | None,
    ) -> list[tuple[str, float]]:
        ranking = self.ranking
        shard = self.shard(account_id)
        tried.append(shard)
        with shard.lock:
            hits = shard.search(qvec, qterms, namespace, limit, ranking, only)
            upto = shard.max_id
            blind = not hits and shard.live_rows(namespace) == 0
        if not blind or not self._db_has_visible(account_id, namespace, upto):
            return hits
        # The shard sees no live row in scope, but the database has a visible memory
        # there with index rows the shard holds. What may lag first: late rows, and
        # which blobs are dead (read in full, not just what changed).
        log.info("search index of %s saw nothing the database has: re-checking it", account_id)
        with shard.lock:
            self._recheck(account_id, shard)
            hits = shard.search(qvec, qterms, namespace, limit, ranking, only)
            blind = not hits and shard.live_rows(namespace) == 0
        if not blind or shard.from_rows:
            if blind:  # built from the rows just now: the check, not the shard, is wrong
                log.warning("search index of %s disagrees with the database", account_id)
            return hits
        shard = self._replace(account_id, shard, "contradicted", "it saw no memory in scope")
        with shard.lock:
            return shard.search(qvec, qterms, namespace, limit, ranking, only)

    def shard(self, account_id: str, *, merging: bool = False) -> Shard:
        """The account's shard, brought up to date with the database."""
        max_id, generation = self.rows.head(account_id)
        key = (account_id, self.model_id)
        with self._lock:
            shard = self._shards.get(key)
            if shard is not None:
                self._shards.move_to_end(key)
        if (
            shard is None
            or shard.generation != generation
            or self._moved(account_id, shard)
            or self._suspect(shard)
        ):
            with self._account_lock(account_id):
                with self._lock:
                    shard = self._shards.get(key)
                if (
                    shard is None
                    or shard.generation != generation
                    or self._moved(account_id, shard)
                    or shard.reopen
                ):
                    shard = self._open_or_build(account_id, generation)
                elif shard.segment is not None and shard.segment.failed is not None:
                    shard = self._build_instead(
                        account_id, generation, "damaged", shard.segment.failed
                    )
                with self._lock:
                    self._shards[key] = shard
                    self._shards.move_to_end(key)
        with shard.lock:
            if max_id > shard.max_id:
                shard.append(self.rows.load(account_id, above=shard.max_id, upto=max_id))
            self._recount(account_id, shard)
            self._refresh_dead(account_id, shard)
            pending = shard.n_delta
            # Built at once without its graph (a first start, or a damaged or stale segment
            # rebuilt so the recall that found it can answer): a large account would
            # otherwise search exactly until merge_rows more rows arrived. A segment from
            # before checksums is rewritten with them the same way.
            seg = shard.segment
            rewrite = (
                seg is not None
                and ((not seg.meta.ann and shard.n_seg >= self.ann_min_rows) or seg.legacy)
                and not shard.graph_requested
            )
            if rewrite:
                shard.graph_requested = True
        if (pending >= self.merge_rows or rewrite) and not merging:
            self._merge_soon(account_id)
        self._evict(keep=key)
        return shard

    # -- opening, building, merging ----------------------------------------------------

    def directory(self, account_id: str) -> Path:
        return self.root / _SAFE.sub("_", account_id) / _SAFE.sub("_", self.model_id)

    def _moved(self, account_id: str, shard: Shard) -> bool:
        """Whether another process published a newer generation than the shard's."""
        current = seglib.current(self.directory(account_id))
        return (current.name if current else None) != shard.segment_name

    def _suspect(self, shard: Shard) -> bool:
        """Whether the shard's segment failed its background check, or its files changed
        on disk since it was opened (a stat each, at most every ``refresh_seconds``): in
        place, a write of the same size is seen at once through the mapping."""
        seg = shard.segment
        if seg is None or seg.path is None:
            return False
        if seg.failed is not None or shard.reopen:
            return True
        now = self._db.clock.time()
        if abs(now - shard.files_checked_at) < self.refresh_seconds:
            return False
        shard.files_checked_at = now
        shard.reopen = seg.changed_on_disk()
        return shard.reopen

    def _open_or_build(self, account_id: str, generation: int) -> Shard:
        path = seglib.current(self.directory(account_id))
        if path is not None:
            try:
                seg = seglib.open_segment(
                    path,
                    account_id=account_id,
                    model=self.model_id,
                    dim=self.embedder.dim,
                    analyzer=termlib.ANALYZER_VERSION,
                    verify_inline_bytes=self.verify_inline_bytes,
                )
                if seg.meta.generation == generation:
                    if seg.pending:
                        self._verify_soon(account_id, seg)
                    shard = Shard(account_id, self.embedder.dim, generation, seg, path.name)
                    shard.files_checked_at = self._db.clock.time()
                    self._check_stragglers(account_id, shard, seg)
                    return shard
                log.info(
                    "search index of %s is from generation %s: rebuilding",
                    account_id,
                    seg.meta.generation,
                )
                metrics.INDEX_REBUILDS.labels(reason="stale").inc()
            except seglib.SegmentInvalid as exc:
                log.warning(
                    "search index of %s at %s is unusable (%s): rebuilding", account_id, path, exc
                )
                metrics.INDEX_REBUILDS.labels(reason="stale" if exc.stale else "damaged").inc()
        return self._build(account_id, generation, with_ann=False)

    def _verify_soon(self, account_id: str, seg: seglib.Segment) -> None:
        """Check the segment's large files (too big to hash at open) on another thread;
        until then it answers by exact search, and if they fail, the next query of the
        account rebuilds it (``_suspect``). Inline when not in the background (tests)."""
        if not self.background:
            seg.verify_pending()  # SegmentInvalid: the caller rebuilds
            return

        def run() -> None:
            try:
                seg.verify_pending()
            except Exception as exc:  # SegmentInvalid, or usearch refusing the graph
                seg.failed = f"{exc}"

        threading.Thread(target=run, name=f"index-verify-{account_id}", daemon=True).start()

    def _replace(self, account_id: str, bad: Shard | None, reason: str, why: str) -> Shard:
        """Put a shard built from the rows in place of ``bad`` (None: whichever is cached)."""
        key = (account_id, self.model_id)
        with self._account_lock(account_id):
            with self._lock:
                cached = self._shards.get(key)
            if bad is not None and cached is not None and cached is not bad:
                return cached  # another thread replaced it already
            _, generation = self.rows.head(account_id)
            shard = self._build_instead(account_id, generation, reason, why)
            with self._lock:
                self._shards[key] = shard
                self._shards.move_to_end(key)
        return shard

    def _build_instead(self, account_id: str, generation: int, reason: str, why: str) -> Shard:
        log.warning(
            "search index of %s cannot be trusted (%s): rebuilding it from the database",
            account_id,
            why,
        )
        metrics.INDEX_REBUILDS.labels(reason=reason).inc()
        return self._build(account_id, generation, with_ann=False)

    def _build(
        self,
        account_id: str,
        generation: int,
        *,
        with_ann: bool,
        progress: Callable[[int], None] | None = None,
    ) -> Shard:
        """A shard from the rows alone, written to disk as a new generation."""
        as_of = self._db.clock.time()
        max_id, _ = self.rows.head(account_id)
        batch = self.rows.load(account_id, upto=max_id, progress=progress)
        if batch.missing_terms:
            log.warning(
                "%s of %s's index rows have no terms yet: run `walkeep index rebuild`",
                batch.missing_terms,
                account_id,
            )
        seg = self._segment_from(account_id, generation, batch, as_of, with_ann)
        root = self.directory(account_id)
        with _file_lock(root, blocking=False) as locked:
            if locked:
                seglib.save(seg, root)
        if seg.path is None:
            # Another thread or process is writing a generation: serve this one from
            # memory and switch to theirs when it is published.
            current = seglib.current(root)
            shard = Shard(
                account_id, self.embedder.dim, generation, seg, current.name if current else None
            )
        else:
            shard = Shard(account_id, self.embedder.dim, generation, seg, seg.path.name)
        shard.from_rows = True
        return shard

    def _segment_from(
        self, account_id: str, generation: int, batch: RowBatch, as_of: float, with_ann: bool
    ) -> seglib.Segment:
        dead = self._dead_blobs(account_id, set(batch.blob_ids))
        return seglib.build(
            account_id=account_id,
            model=self.model_id,
            dim=self.embedder.dim,
            analyzer=termlib.ANALYZER_VERSION,
            generation=generation,
            row_ids=batch.ids,
            blob_ids=batch.blob_ids,
            namespaces=batch.namespaces,
            vec_i8=seglib.quantise(batch.vectors),
            row_terms=batch.terms,
            dead_blobs=dead,
            dead_as_of=as_of,
            ann_min_rows=self.ann_min_rows if with_ann else 2**62,
        )

    def _merge_soon(self, account_id: str) -> None:
        with self._lock:
            if account_id in self._merging:
                return
            self._merging.add(account_id)

        def run() -> None:
            try:
                self.merge(account_id)
            except Exception:
                log.exception("merging the search index of %s failed", account_id)
            finally:
                with self._lock:
                    self._merging.discard(account_id)

        if self.background:
            threading.Thread(target=run, name=f"index-merge-{account_id}", daemon=True).start()
        else:
            run()

    def merge(
        self,
        account_id: str,
        *,
        full: bool = False,
        progress: Callable[[int], None] | None = None,
    ) -> bool:
        """Write the next generation: the segment plus the rows after it (the graph
        extended, not rebuilt), or with ``full`` everything anew from the rows.

        One process per host at a time (a file lock): if another holds it, this
        returns False and that process's generation will be picked up instead.
        """
        root = self.directory(account_id)
        with _file_lock(root, blocking=False) as locked:
            if not locked:
                return False
            as_of = self._db.clock.time()
            max_id, generation = self.rows.head(account_id)
            shard = None if full else self.shard(account_id, merging=True)
            if shard is not None and shard.segment is not None and shard.segment.path is not None:
                seg = self._extended(account_id, shard, generation)
            else:
                seg = None
            if seg is None:
                batch = self.rows.load(account_id, upto=max_id, progress=progress)
                seg = self._segment_from(account_id, generation, batch, as_of, with_ann=True)
            seglib.save(seg, root)
            assert seg.path is not None
            log.info(
                "search index of %s: generation %s written (%s rows)",
                account_id,
                seg.path.name,
                seg.n,
            )
        return True

    def _extended(self, account_id: str, shard: Shard, generation: int) -> seglib.Segment | None:
        """``shard``'s segment extended by its delta; None when only a full build will do.

        The delta is copied under the shard's lock, and the slow part — the dead-blob
        scan, the graph's new links, the postings' sort — runs outside it, so recalls of
        the account go on while a merge is written.
        """
        seg = shard.segment
        assert seg is not None
        try:
            # Every file hashed again: copied into the next generation, a damaged array
            # would get a fresh checksum that matches it.
            seg.verify_all()
        except seglib.SegmentInvalid as exc:
            log.warning(
                "search index of %s failed its check before a merge (%s): writing it anew",
                account_id,
                exc,
            )
            metrics.INDEX_REBUILDS.labels(reason="damaged").inc()
            return None
        with shard.lock:
            if shard.generation != generation or any(i <= seg.meta.high_water for i in shard.d_ids):
                return None  # rows rewritten, or late commits below the mark: start over
            d_blob, d_ns, d_len, vecs = shard._delta_arrays()
            post_row, post_key, post_tf = shard.delta_postings()
            row_ids = np.asarray(shard.d_ids, dtype=np.int64)
            new_blobs = list(shard.new_blobs)
            namespaces = list(shard.namespaces)
        nb = len(seg.blob_ids)
        blob_ids = [bytes(b).decode("ascii") for b in seg.blob_ids] + new_blobs
        dead_blobs = self._dead_blobs(account_id, set(blob_ids))
        dead = np.fromiter((b in dead_blobs for b in blob_ids), bool, len(blob_ids))
        assert len(dead) == nb + len(new_blobs)
        return seglib.extend(
            seg,
            generation=generation,
            row_ids=row_ids,
            row_blob=d_blob,
            row_ns=d_ns,
            row_len=d_len,
            vec_i8=seglib.quantise(vecs).reshape(len(row_ids), self.embedder.dim),
            new_blobs=new_blobs,
            namespaces=namespaces,
            dead=dead,
            dead_as_of=self._db.clock.time(),
            post_row=post_row,
            post_key=post_key,
            post_tf=post_tf,
            ann_min_rows=self.ann_min_rows,
        )

    def _check_stragglers(self, account_id: str, shard: Shard, seg: seglib.Segment) -> None:
        """On PostgreSQL, rows just below the segment's mark committed after it was written."""
        if self._exact_ids or seg.n == 0:
            return
        hw = seg.meta.high_water
        lo = max(0, hw - STRAGGLER_WINDOW)
        have = seg.n - int(np.searchsorted(seg.row_ids, lo, side="right"))
        if self.rows.count(account_id, lo, hw) != have:
            shard.append(self.rows.load(account_id, above=lo, upto=hw))

    def _recount(self, account_id: str, shard: Shard) -> None:
        if self._exact_ids:
            return
        now = self._db.clock.time()
        if abs(now - shard.counted_at) < self.recount_seconds:
            return
        shard.counted_at = now
        hw = shard.segment.meta.high_water if shard.segment is not None else 0
        lo = max(0, hw - STRAGGLER_WINDOW)
        seg_have = 0
        if shard.segment is not None:
            seg_have = shard.n_seg - int(np.searchsorted(shard.segment.row_ids, lo, side="right"))
        held = seg_have + shard.n_delta
        if self.rows.count(account_id, lo, shard.max_id) != held:
            log.info("search index of %s missed late rows: loading them", account_id)
            shard.append(self.rows.load(account_id, above=lo, upto=shard.max_id))

    # -- dead blobs -------------------------------------------------------------------

    def _db_has_visible(self, account_id: str, namespace: str | None, upto: int) -> bool:
        """Whether a visible memory in scope has index rows (in scope, up to ``upto``):
        each such row is live and in scope, so a shard holding the rows to ``upto`` that
        sees none is wrong. One indexed probe; asked only when a shard sees nothing."""
        indexed = exists().where(
            Embedding.account_id == account_id,
            Embedding.model == self.model_id,
            Embedding.blob_id == Memory.blob_id,
            Embedding.id <= upto,
        )
        conds = [Memory.account_id == account_id, Memory.status.in_(list(VISIBLE))]
        if namespace is not None:
            indexed = indexed.where(Embedding.namespace == namespace)
            conds.append(Memory.namespace == namespace)
        q = select(Memory.id).where(*conds, indexed)
        with self._db.read() as s:
            return s.execute(q.limit(1)).first() is not None

    def _recheck(self, account_id: str, shard: Shard) -> None:
        """Late rows and every blob's death read again (the caller holds the shard's lock)."""
        shard.counted_at = float("-inf")
        self._recount(account_id, shard)
        blob_ids = shard.all_blob_ids()
        dead = self._dead_blobs(account_id, set(blob_ids))
        shard.reset_dead(np.fromiter((b in dead for b in blob_ids), bool, len(blob_ids)))

    def _dead_blobs(self, account_id: str, indexed: set[str]) -> set[str]:
        """Indexed blobs no visible memory points at (a full scan: only when writing)."""
        with self._db.read() as s:
            rows = s.execute(
                select(Memory.blob_id, Memory.status).where(
                    Memory.account_id == account_id, Memory.blob_id.is_not(None)
                )
            ).all()
        referenced: set[str] = set()
        live: set[str] = set()
        for blob_id, status in rows:
            assert blob_id is not None
            referenced.add(blob_id)
            if status in VISIBLE:
                live.add(blob_id)
        # A blob no memory points at yet is landing (kept live); one whose memories all
        # left it (forgotten, lapsed, compacted away) is dead.
        return {b for b in indexed if b in referenced and b not in live}

    def _refresh_dead(self, account_id: str, shard: Shard) -> None:
        """Learn which blobs died or came back since the shard last looked."""
        now = self._db.clock.time()
        if now - shard.dead_as_of < self.refresh_seconds and now >= shard.dead_as_of:
            return
        since = None
        if shard.dead_as_of > float("-inf"):
            # Overlap a little: on PostgreSQL a change can commit after a later one,
            # and status_changed_at comes from each writer's own clock.
            since = datetime.fromtimestamp(shard.dead_as_of, UTC) - timedelta(
                seconds=2 if self._exact_ids else 30
            )
        with self._db.read() as s:
            q = select(Memory.blob_id).where(
                Memory.account_id == account_id, Memory.blob_id.is_not(None)
            )
            if since is not None:
                q = q.where(Memory.status_changed_at >= since)
            changed = {b for (b,) in s.execute(q.distinct()) if b is not None}
            live: set[str] = set()
            for chunk in _chunks(sorted(changed), 500):
                live.update(
                    s.scalars(
                        select(Memory.blob_id)
                        .where(
                            Memory.account_id == account_id,
                            Memory.blob_id.in_(chunk),
                            Memory.status.in_(list(VISIBLE)),
                        )
                        .distinct()
                    )
                )
        for blob_id in changed:
            shard.set_dead(blob_id, blob_id not in live)
        shard.dead_as_of = now

    # -- cache ------------------------------------------------------------------------

    def _account_lock(self, account_id: str) -> threading.Lock:
        with self._lock:
            return self._account_locks.setdefault(account_id, threading.Lock())

    def _evict(self, keep: tuple[str, str]) -> None:
        with self._lock:
            total = sum(s.nbytes for s in self._shards.values())
            while len(self._shards) > 1 and total > self.cache_bytes:
                oldest = next(iter(self._shards))
                if oldest == keep:
                    self._shards.move_to_end(keep)
                    oldest = next(iter(self._shards))
                total -= self._shards.pop(oldest).nbytes

    def cache_info(self) -> dict[str, int]:
        """Loaded shards and the bytes they may occupy (for metrics and tests)."""
        with self._lock:
            return {
                "shards": len(self._shards),
                "rows": sum(s.n_seg + s.n_delta for s in self._shards.values()),
                "bytes": sum(s.nbytes for s in self._shards.values()),
            }

    def clear_cache(self) -> None:
        with self._lock:
            self._shards.clear()


# Query embeddings run here while the asking thread brings the shard up to date (a
# database round trip) and scores the words: onnxruntime and numpy release the GIL,
# so at a million rows a warm recall costs the longer of the two, not their sum.
_EMBED_POOL = ThreadPoolExecutor(
    max_workers=max(2, os.cpu_count() or 2), thread_name_prefix="embed"
)


class _EmbeddingFailed(Exception):
    """Embedding the query failed: the model's fault, never a reason to rebuild an index."""

    def __init__(self, cause: Exception) -> None:
        super().__init__(str(cause))
        self.cause = cause


def _embed_aside(embedder: Embedder, query: str) -> Callable[[], np.ndarray]:
    """The query's vector, being computed on another thread; call to wait for it.

    If every helper is busy (many recalls at once), the asking thread embeds it
    itself when it needs it rather than queue behind the others.
    """
    future = _EMBED_POOL.submit(lambda: embedder.embed([query])[0])

    def result() -> np.ndarray:
        try:
            if future.cancel():
                return embedder.embed([query])[0]
            return future.result()
        except Exception as exc:
            raise _EmbeddingFailed(exc) from exc

    return result


def _chunks(items: list[str], size: int) -> Iterator[list[str]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


@contextlib.contextmanager
def _file_lock(root: Path, *, blocking: bool) -> Iterator[bool]:
    """An exclusive lock on ``root/lock`` (one writer of a directory per host)."""
    seglib.private_dir(root)
    fd = os.open(root / "lock", os.O_RDWR | os.O_CREAT, 0o600)
    with open(fd, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


__all__ = ["DEFAULT_CACHE_BYTES", "MERGE_ROWS", "SearchIndex"]
