"""The semantic index: chunk vectors in the ``embeddings`` table, cosine top-k in numpy.

Why this shape (notes/embeddings.md §5): at Walkeep's scale an exact scan over
an in-process float32 matrix answers in well under a millisecond for 10,000
vectors, needs no database extension (the CI Python's sqlite3 can't load one,
Debian's PostgreSQL has no pgvector) and runs the same on SQLite and
PostgreSQL. The database stays the source of truth; each process keeps a
cache it tops up incrementally, so a vector written by another process is
visible on the next query.

Layout of a row: one vector per chunk of a blob's plaintext, tagged with the
account, namespace, model id and dimension. Vectors of different models are
never compared. Rows are append-only: forgetting is filtered by the caller
against the memories table (``search(..., exclude=...)`` helps it keep ``limit``
results), so "rows with id > the last id seen" is all a cache needs to load.

Identical content in two namespaces of one account is one blob_id (encryption
is deterministic per account), but the table's unique key is (account, blob_id,
model, chunk) — without the namespace. So each namespace's copy of a blob's
vectors uses its own block of chunk numbers: ``chunk = copy * 1024 + part``
(copy 0 for the first namespace that indexed the blob, 1 for the next, …). A
second namespace reuses the first copy's vectors instead of re-embedding.
"""

from __future__ import annotations

import logging
import re
import threading
from collections import OrderedDict
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

import numpy as np
from sqlalchemy import func, insert, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.sql.elements import ColumnElement

from walkeep.db import Database
from walkeep.db.models import Account, Embedding
from walkeep.errors import NotFound
from walkeep.index.embedder import Embedder

log = logging.getLogger(__name__)

CHUNK_CHARS = 1000
CHUNK_OVERLAP = 100
# 512 chunks ≈ 460 KB of text, well past the 256 KiB default memory size limit;
# text beyond the cap is not indexed (a search can't find it, a read still can).
MAX_CHUNKS = 512
# Chunk numbers per namespace copy of a blob (> MAX_CHUNKS). 32-bit INTEGER
# column: room for two million copies.
COPY_STRIDE = 1024
_ADD_ATTEMPTS = 8
# How often (per cached matrix, by the database's clock) a cache re-verifies
# that it holds every row below its high-water mark; see _fresh_matrix.
RECOUNT_SECONDS = 10.0

_SENTENCE_END = re.compile(r"""[.!?。！？][)"'\]]*\s+|\n\s*""")
_SPACE = re.compile(r"\s+")


def encode_vector(v: np.ndarray) -> bytes:
    """The column format: little-endian float32."""
    return np.asarray(v, dtype="<f4").tobytes()


def decode_vectors(blobs: Sequence[bytes], dim: int) -> np.ndarray:
    """Rows of ``encode_vector`` bytes back into an (n, dim) float32 matrix."""
    if not blobs:
        return np.zeros((0, dim), dtype=np.float32)
    return np.frombuffer(b"".join(blobs), dtype="<f4").reshape(len(blobs), dim).astype(np.float32)


def chunk_text(
    text: str,
    size: int = CHUNK_CHARS,
    overlap: int = CHUNK_OVERLAP,
    max_chunks: int = MAX_CHUNKS,
) -> list[str]:
    """Split ``text`` into ~``size``-character pieces overlapping by ~``overlap``.

    Cuts prefer a sentence end or line break in the second half of the window,
    then any whitespace, then a hard cut (for text without spaces). The
    overlap keeps a fact that straddles a cut whole in at least one chunk.
    At most ``max_chunks`` chunks; the rest of a longer text is not indexed.
    """
    if size <= 2 * overlap:
        raise ValueError("chunk size must exceed twice the overlap")
    text = text.strip()
    if not text:
        return []
    if len(text) <= size:
        return [text]
    chunks: list[str] = []
    n = len(text)
    start = 0
    while start < n and len(chunks) < max_chunks:
        end = min(start + size, n)
        if end < n:
            end = _cut(text, start + size // 2, end)
        piece = text[start:end].strip()
        if piece:
            chunks.append(piece)
        if end >= n:
            break
        nxt = end - overlap
        # Start the overlap at a word boundary rather than mid-word.
        m = _SPACE.search(text, nxt, end)
        start = m.end() if m else nxt
    return chunks


def _cut(text: str, lo: int, hi: int) -> int:
    """Best cut position in text[lo:hi]: after a sentence end, else a space, else ``hi``."""
    last = None
    for m in _SENTENCE_END.finditer(text, lo, hi):
        last = m
    if last is not None:
        return last.end()
    space = max(text.rfind(" ", lo, hi), text.rfind("\t", lo, hi))
    return space + 1 if space >= lo else hi


@dataclass(eq=False)
class _Matrix:
    """One cached (account, namespace-or-all, model) matrix, grown by appends."""

    dim: int
    lock: threading.Lock = field(default_factory=threading.Lock)
    vecs: np.ndarray = field(init=False)
    codes: np.ndarray = field(init=False)
    n: int = 0
    max_id: int = 0
    counted_at: float = float("-inf")
    blob_ids: list[str] = field(default_factory=list)
    code_of: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.vecs = np.zeros((0, self.dim), dtype=np.float32)
        self.codes = np.zeros(0, dtype=np.int64)
        self.n = 0
        self.max_id = 0
        self.counted_at = float("-inf")
        self.blob_ids = []
        self.code_of = {}

    @property
    def nbytes(self) -> int:
        return int(self.vecs.nbytes + self.codes.nbytes)

    def append(self, ids: list[int], blob_ids: list[str], vectors: np.ndarray) -> None:
        k = len(ids)
        if k == 0:
            return
        need = self.n + k
        if need > len(self.vecs):
            cap = max(need, 2 * len(self.vecs), 256)
            vecs = np.zeros((cap, self.dim), dtype=np.float32)
            vecs[: self.n] = self.vecs[: self.n]
            codes = np.zeros(cap, dtype=np.int64)
            codes[: self.n] = self.codes[: self.n]
            self.vecs, self.codes = vecs, codes
        self.vecs[self.n : need] = vectors
        for i, b in enumerate(blob_ids):
            code = self.code_of.get(b)
            if code is None:
                code = self.code_of[b] = len(self.blob_ids)
                self.blob_ids.append(b)
            self.codes[self.n + i] = code
        self.n = need
        self.max_id = max(self.max_id, max(ids))


CacheKey = tuple[str, str | None, str]


class VectorIndex:
    """Per-account semantic index over blob plaintexts.

    ``add`` embeds (slow, background write path only); ``search`` embeds the
    query and scores it against a cached matrix of the account's vectors.
    Thread-safe. Caches are bounded by ``cache_max_rows`` vectors in total and
    ``cache_max_entries`` matrices, evicted least-recently-used first.

    Freshness: each query checks the newest row id of its (account, namespace,
    model) with one index seek and loads only newer rows, so a write by another
    process is visible on the next query. On PostgreSQL a row whose transaction
    commits out of id order is picked up by a recount at most
    ``recount_seconds`` later.
    """

    def __init__(
        self,
        db: Database,
        embedder: Embedder,
        *,
        cache_max_rows: int = 200_000,
        cache_max_entries: int = 256,
        recount_seconds: float = RECOUNT_SECONDS,
    ) -> None:
        self._db = db
        self._recount_seconds = recount_seconds
        self.embedder = embedder
        self._cache_max_rows = cache_max_rows
        self._cache_max_entries = cache_max_entries
        self._caches: OrderedDict[CacheKey, _Matrix] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def model_id(self) -> str:
        return self.embedder.model_id

    # -- writing -------------------------------------------------------------------

    def chunk(self, text: str) -> list[str]:
        """The pieces of ``text`` that get one vector each (see :func:`chunk_text`)."""
        return chunk_text(text)

    def add(self, account_id: str, namespace: str, blob_id: str, text: str) -> int:
        """Index ``text`` (the plaintext of ``blob_id``) for one namespace; returns rows written.

        Idempotent per (account, namespace, blob_id, model): a repeat, or the
        loser of a concurrent double add, writes nothing and returns 0.
        Embedding happens outside any transaction; the rows of one add are
        inserted in one transaction, so a blob is indexed completely or not at all.
        """
        model, dim = self.embedder.model_id, self.embedder.dim
        copies = self._copies(account_id, blob_id)
        if namespace in copies.values():
            return 0
        vectors: list[bytes]
        if copies:
            # Same blob_id in this account ⇒ same plaintext: reuse a copy's vectors.
            vectors = self._copy_vectors(account_id, blob_id, min(copies))
        else:
            chunks = self.chunk(text)
            if not chunks:
                return 0
            vectors = [encode_vector(v) for v in self.embedder.embed(chunks)]
        for _ in range(_ADD_ATTEMPTS):
            try:
                with self._db.begin() as s:
                    rows = s.execute(
                        select(Embedding.namespace, Embedding.chunk).where(
                            Embedding.account_id == account_id,
                            Embedding.blob_id == blob_id,
                            Embedding.model == model,
                        )
                    ).all()
                    if any(ns == namespace for ns, _ in rows):
                        return 0
                    copy = max((c // COPY_STRIDE for _, c in rows), default=-1) + 1
                    now = self._db.clock.now()
                    s.execute(
                        insert(Embedding),
                        [
                            {
                                "account_id": account_id,
                                "namespace": namespace,
                                "blob_id": blob_id,
                                "chunk": copy * COPY_STRIDE + i,
                                "model": model,
                                "dim": dim,
                                "vector": vec,
                                "created_at": now,
                            }
                            for i, vec in enumerate(vectors)
                        ],
                    )
                    return len(vectors)
            except IntegrityError:
                # A concurrent add took the same chunk numbers (PostgreSQL; SQLite
                # serialises writers): look again, it may have been this namespace.
                # Or the account doesn't exist (foreign key), which no retry fixes.
                with self._db.read() as s:
                    if s.get(Account, account_id) is None:
                        raise NotFound("unknown account", {"account_id": account_id}) from None
        raise RuntimeError(f"could not index blob {blob_id}: chunk numbers kept colliding")

    def add_many(self, items: Sequence[tuple[str, str, str, str]]) -> int:
        """Index many ``(account_id, namespace, blob_id, text)`` at once.

        The background write path lands writes in batches: embedding all their
        chunks in one call and inserting in one transaction is several times
        cheaper than one ``add`` each. Same idempotency as ``add``; on any
        conflict it falls back to ``add`` per item. Returns rows written.
        """
        model, dim = self.embedder.model_id, self.embedder.dim
        todo: list[tuple[str, str, str, str, list[str]]] = []
        written = 0
        # One query for what is already indexed, instead of one per item.
        known: dict[tuple[str, str], set[str]] = {}
        with self._db.read() as s:
            for account_id in {i[0] for i in items}:
                blob_ids = [i[2] for i in items if i[0] == account_id]
                for b, ns in s.execute(
                    select(Embedding.blob_id, Embedding.namespace)
                    .where(
                        Embedding.account_id == account_id,
                        Embedding.blob_id.in_(blob_ids),
                        Embedding.model == model,
                    )
                    .distinct()
                ):
                    known.setdefault((account_id, b), set()).add(ns)
        # A blob already indexed, or met earlier in this batch (identical content is one
        # patch: two stores of the same text within a quilt window share a blob id),
        # reuses the first copy's vectors through ``add``, after the bulk insert. Bulk-
        # inserting it too would violate the index's UNIQUE key and send the whole batch
        # down the one-``add``-per-item path, embedding every text separately.
        in_batch: set[tuple[str, str]] = set()
        copies_later: list[tuple[str, str, str, str]] = []
        for account_id, namespace, blob_id, text in items:
            copies = known.get((account_id, blob_id), set())
            if namespace in copies:
                continue
            if copies or (account_id, blob_id) in in_batch:
                copies_later.append((account_id, namespace, blob_id, text))
                continue
            chunks = self.chunk(text)
            if chunks:
                in_batch.add((account_id, blob_id))
                todo.append((account_id, namespace, blob_id, text, chunks))
        written += self._add_bulk(todo, model, dim)
        for item in copies_later:
            written += self.add(*item)
        return written

    def _add_bulk(
        self, todo: list[tuple[str, str, str, str, list[str]]], model: str, dim: int
    ) -> int:
        """Embed every chunk of ``todo`` in one call and insert them in one transaction."""
        if not todo:
            return 0
        flat = [c for *_, chunks in todo for c in chunks]
        vectors = [encode_vector(v) for v in self.embedder.embed(flat)]
        now = self._db.clock.now()
        rows: list[dict[str, object]] = []
        pos = 0
        for account_id, namespace, blob_id, _text, chunks in todo:
            for i in range(len(chunks)):
                rows.append(
                    {
                        "account_id": account_id,
                        "namespace": namespace,
                        "blob_id": blob_id,
                        "chunk": i,
                        "model": model,
                        "dim": dim,
                        "vector": vectors[pos],
                        "created_at": now,
                    }
                )
                pos += 1
        try:
            with self._db.begin() as s:
                s.execute(insert(Embedding), rows)
            return len(rows)
        except IntegrityError:
            # Someone indexed one of these concurrently: settle item by item.
            return sum(self.add(a, ns, b, text) for a, ns, b, text, _chunks in todo)

    def _copies(self, account_id: str, blob_id: str) -> dict[int, str]:
        """Existing copies of this blob's vectors: copy number → namespace."""
        with self._db.read() as s:
            rows = s.execute(
                select(Embedding.namespace, Embedding.chunk).where(
                    Embedding.account_id == account_id,
                    Embedding.blob_id == blob_id,
                    Embedding.model == self.embedder.model_id,
                    Embedding.dim == self.embedder.dim,
                )
            ).all()
        return {c // COPY_STRIDE: ns for ns, c in rows}

    def _copy_vectors(self, account_id: str, blob_id: str, copy: int) -> list[bytes]:
        lo = copy * COPY_STRIDE
        with self._db.read() as s:
            rows = s.scalars(
                select(Embedding.vector)
                .where(
                    Embedding.account_id == account_id,
                    Embedding.blob_id == blob_id,
                    Embedding.model == self.embedder.model_id,
                    Embedding.chunk >= lo,
                    Embedding.chunk < lo + COPY_STRIDE,
                )
                .order_by(Embedding.chunk)
            ).all()
        return [bytes(v) for v in rows]

    def indexed(self, account_id: str, blob_id: str, namespace: str | None = None) -> bool:
        """Whether ``blob_id`` has vectors of the active model (in ``namespace``, if given)."""
        conds = [
            Embedding.account_id == account_id,
            Embedding.blob_id == blob_id,
            Embedding.model == self.embedder.model_id,
        ]
        if namespace is not None:
            conds.append(Embedding.namespace == namespace)
        with self._db.read() as s:
            return s.scalar(select(Embedding.id).where(*conds).limit(1)) is not None

    # -- reading -------------------------------------------------------------------

    def search(
        self,
        account_id: str,
        namespace: str | None,
        query: str,
        limit: int,
        *,
        exclude: Collection[str] = (),
    ) -> list[tuple[str, float]]:
        """Top ``limit`` distinct blob_ids by cosine similarity to ``query``, best first.

        ``namespace=None`` searches all of the account's namespaces. A blob's
        score is its best chunk's, rounded to 4 decimals. Blob ids in
        ``exclude`` (e.g. forgotten ones) are skipped before the cut, so the
        caller still gets up to ``limit`` live results. No similarity
        threshold: MiniLM scores of unrelated texts reach 0.5, so ranking is
        the signal, not the absolute value.
        """
        if limit <= 0:
            return []
        q = self.embedder.embed([query])[0]
        m = self._fresh_matrix(account_id, namespace)
        with m.lock:
            if m.n == 0:
                return []
            # einsum, not ``@``: a matrix-vector product through OpenBLAS fans out to
            # its thread pool, which on a busy 2-core host measured 16 ms median
            # for 10k x 384 against 0.6 ms for einsum's single-threaded SIMD loop.
            scores = np.einsum("ij,j->i", m.vecs[: m.n], q.astype(np.float32, copy=False))
            nblobs = len(m.blob_ids)
            if nblobs == m.n and m.codes[m.n - 1] == m.n - 1:
                best = scores  # one chunk per blob, in code order
            else:
                best = np.full(nblobs, -np.inf, dtype=np.float32)
                np.maximum.at(best, m.codes[: m.n], scores)
            if exclude:
                for b in exclude:
                    code = m.code_of.get(b)
                    if code is not None:
                        best[code] = -np.inf
            k = min(limit, nblobs)
            top = np.argpartition(-best, k - 1)[:k] if k < nblobs else np.arange(nblobs)
            top = top[np.argsort(-best[top], kind="stable")]
            return [(m.blob_ids[c], round(float(best[c]), 4)) for c in top if best[c] > -np.inf]

    def _filters(self, account_id: str, namespace: str | None) -> list[ColumnElement[bool]]:
        # Only indexed columns (account_id, namespace, model, id): the per-query
        # freshness count then reads the index alone, never the 1.5 KB rows.
        conds = [Embedding.account_id == account_id, Embedding.model == self.embedder.model_id]
        if namespace is not None:
            conds.insert(1, Embedding.namespace == namespace)
        return conds

    def _fresh_matrix(self, account_id: str, namespace: str | None) -> _Matrix:
        key: CacheKey = (account_id, namespace, self.embedder.model_id)
        with self._lock:
            m = self._caches.get(key)
            if m is None:
                m = self._caches[key] = _Matrix(dim=self.embedder.dim)
            self._caches.move_to_end(key)
        conds = self._filters(account_id, namespace)
        with m.lock:
            # Per query: the newest id. ORDER BY … LIMIT 1 rather than max(): with
            # stale statistics PostgreSQL aggregates over every index entry
            # (3.5 ms at 10k) instead of reading the last one (0.06 ms).
            with self._db.read() as s:
                max_id = (
                    s.scalar(
                        select(Embedding.id).where(*conds).order_by(Embedding.id.desc()).limit(1)
                    )
                    or 0
                )
            if max_id > m.max_id:
                self._load(m, conds, since=m.max_id)
            elif max_id < m.max_id:  # rows were deleted (not done today): start over
                m.reset()
                self._load(m, conds, since=0)
            # "ids above the high-water mark" is exact on SQLite, whose writers are
            # serialised, but on PostgreSQL a transaction holding a lower id can
            # commit after one holding a higher id. Every ``recount_seconds`` a
            # count of the rows up to the mark (an index-only range, O(rows))
            # catches such a straggler; it is the only bounded staleness here.
            now = self._db.clock.time()
            if now - m.counted_at >= self._recount_seconds or now < m.counted_at:
                with self._db.read() as s:
                    upto = int(
                        s.scalar(select(func.count()).where(*conds, Embedding.id <= m.max_id)) or 0
                    )
                m.counted_at = now
                if upto != m.n:
                    log.info("vector cache %s missed %s late rows: reloading", key, upto - m.n)
                    m.reset()
                    self._load(m, conds, since=0)
        self._evict(keep=key)
        return m

    def _load(self, m: _Matrix, conds: list[ColumnElement[bool]], since: int) -> None:
        with self._db.read() as s:
            rows = s.execute(
                select(Embedding.id, Embedding.blob_id, Embedding.dim, Embedding.vector)
                .where(*conds, Embedding.id > since)
                .order_by(Embedding.id)
            ).all()
        if not rows:
            return
        blobs = []
        for row_id, blob_id, dim, vec in rows:
            if dim != m.dim or len(vec) != 4 * m.dim:
                # Same model id, other dimension: corrupt or misconfigured. Keep the
                # row (as a zero vector that never ranks) so counts stay aligned.
                log.error(
                    "embedding row %s (blob %s) has dim %s, expected %s",
                    row_id,
                    blob_id,
                    dim,
                    m.dim,
                )
                vec = bytes(4 * m.dim)
            blobs.append(bytes(vec))
        m.append([r[0] for r in rows], [r[1] for r in rows], decode_vectors(blobs, m.dim))

    def _evict(self, keep: CacheKey) -> None:
        with self._lock:
            total = sum(c.n for c in self._caches.values())
            while len(self._caches) > 1 and (
                total > self._cache_max_rows or len(self._caches) > self._cache_max_entries
            ):
                oldest = next(iter(self._caches))
                if oldest == keep:
                    self._caches.move_to_end(keep)
                    oldest = next(iter(self._caches))
                total -= self._caches.pop(oldest).n

    def cache_info(self) -> dict[str, int]:
        """Cached matrices and vectors (for metrics and tests)."""
        with self._lock:
            return {
                "matrices": len(self._caches),
                "rows": sum(c.n for c in self._caches.values()),
                "bytes": sum(c.nbytes for c in self._caches.values()),
            }

    def clear_cache(self) -> None:
        with self._lock:
            self._caches.clear()


__all__ = [
    "CHUNK_CHARS",
    "CHUNK_OVERLAP",
    "COPY_STRIDE",
    "MAX_CHUNKS",
    "VectorIndex",
    "chunk_text",
    "decode_vectors",
    "encode_vector",
]
