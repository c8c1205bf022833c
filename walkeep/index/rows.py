"""Index rows: per chunk of a memory's plaintext, its vector and its keyed term hashes.

The database keeps these rows; everything a query reads is derived from them
(``walkeep/index/search.py``). One row per chunk of a blob's plaintext, tagged with
the account, namespace, model id and dimension; vectors of different models are
never compared. The terms are the chunk's distinct term hashes and frequencies
under the account's key (``walkeep/index/terms.py``): no readable word. Rows are
append-only, so "rows with id > the last id seen" is all a reader needs to catch
up; forgetting is the recall service's filter and the index's dead-blob mask, not
a delete (identical content stored again reuses the rows).

Identical content in two namespaces of one account is one blob_id (encryption
is deterministic per account), but the table's unique key is (account, blob_id,
model, chunk) — without the namespace. So each namespace's copy of a blob's
rows uses its own block of chunk numbers: ``chunk = copy * 1024 + part``
(copy 0 for the first namespace that indexed the blob, 1 for the next, …). A
second namespace reuses the first copy's vectors and terms instead of re-embedding.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

import numpy as np
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from sqlalchemy import func, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.sql.elements import ColumnElement

from walkeep import crypto
from walkeep.db import Database
from walkeep.db.models import Account, Embedding, IndexState
from walkeep.errors import NotFound
from walkeep.index import terms
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


@dataclass
class RowBatch:
    """Index rows read back for building a search index, in id order."""

    ids: np.ndarray  # int64
    blob_ids: list[str]
    namespaces: list[str]
    vectors: np.ndarray  # float32 (n, dim); a row of another dimension is zero
    terms: list[tuple[np.ndarray, np.ndarray]]  # per row: (hashes uint64, tf uint16)
    missing_terms: int = 0  # rows written before the lexical index (terms NULL)

    def __len__(self) -> int:
        return len(self.ids)


class IndexRows:
    """The index rows of one embedding model: one per chunk of a blob's plaintext,
    holding its vector and its keyed term hashes (``walkeep/index/terms.py``).

    ``add`` embeds (slow, background write path only). Rows are append-only, so
    "rows with id > the last id seen" is all a reader needs to catch up; a rewrite
    in place (the terms backfill) bumps ``index_state.generation`` instead.
    Thread-safe.
    """

    def __init__(
        self,
        db: Database,
        embedder: Embedder,
        terms_key: Callable[[str], bytes | None],
        vector_cipher: Callable[[str], AESGCM],
    ) -> None:
        self._db = db
        self.embedder = embedder
        self.terms_key = terms_key
        self.vector_cipher = vector_cipher

    @property
    def model_id(self) -> str:
        return self.embedder.model_id

    # -- writing -------------------------------------------------------------------

    def chunk(self, text: str) -> list[str]:
        """The pieces of ``text`` that get one row each (see :func:`chunk_text`)."""
        return chunk_text(text)

    def _key(self, account_id: str) -> bytes:
        key = self.terms_key(account_id)
        if key is None:
            # Content is encrypted before it is indexed, so its key exists.
            raise NotFound("unknown account", {"account_id": account_id})
        return key

    def _seal(self, account_id: str, vector: bytes) -> bytes:
        return crypto.seal_vector(self.vector_cipher(account_id), vector, account_id)

    def _open(self, account_id: str, stored: bytes) -> bytes:
        """A row's float32 bytes: sealed rows are opened; a row written before vectors were
        sealed (exactly ``4 * dim`` bytes) is read as it is until :meth:`seal_plain`
        rewrites it."""
        if len(stored) == 4 * self.embedder.dim:
            return stored
        return crypto.open_vector(self.vector_cipher(account_id), stored, account_id)

    def _packed_terms(self, account_id: str, chunks: Sequence[str]) -> list[bytes]:
        key = self._key(account_id)
        return [terms.pack(*terms.term_vector(key, c)) for c in chunks]

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
        pairs: list[tuple[bytes, bytes | None]]
        if copies:
            # Same blob_id in this account ⇒ same plaintext: reuse a copy's rows.
            # Opened and sealed again: a fresh nonce, so no two rows share bytes.
            pairs = [
                (self._seal(account_id, self._open(account_id, v)), t)
                for v, t in self._copy_rows(account_id, blob_id, min(copies))
            ]
            if any(t is None for _, t in pairs):
                chunks = self.chunk(text)
                pairs = [
                    (v, t)
                    for (v, _), t in zip(
                        pairs, self._packed_terms(account_id, chunks), strict=False
                    )
                ]
        else:
            chunks = self.chunk(text)
            if not chunks:
                return 0
            packed = self._packed_terms(account_id, chunks)
            vectors = (
                self._seal(account_id, encode_vector(v)) for v in self.embedder.embed(chunks)
            )
            pairs = list(zip(vectors, packed, strict=True))
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
                                "terms": packed_terms,
                                "created_at": now,
                            }
                            for i, (vec, packed_terms) in enumerate(pairs)
                        ],
                    )
                    return len(pairs)
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
        model = self.embedder.model_id
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
        # reuses the first copy's rows through ``add``, after the bulk insert. Bulk-
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
        written += self._add_bulk(todo)
        for item in copies_later:
            written += self.add(*item)
        return written

    def _add_bulk(self, todo: list[tuple[str, str, str, str, list[str]]]) -> int:
        """Embed every chunk of ``todo`` in one call and insert them in one transaction."""
        if not todo:
            return 0
        model, dim = self.embedder.model_id, self.embedder.dim
        flat = [c for *_, chunks in todo for c in chunks]
        vectors = [encode_vector(v) for v in self.embedder.embed(flat)]
        now = self._db.clock.now()
        rows: list[dict[str, object]] = []
        pos = 0
        for account_id, namespace, blob_id, _text, chunks in todo:
            packed = self._packed_terms(account_id, chunks)
            for i in range(len(chunks)):
                rows.append(
                    {
                        "account_id": account_id,
                        "namespace": namespace,
                        "blob_id": blob_id,
                        "chunk": i,
                        "model": model,
                        "dim": dim,
                        "vector": self._seal(account_id, vectors[pos]),
                        "terms": packed[i],
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
        """Existing copies of this blob's rows: copy number → namespace."""
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

    def _copy_rows(
        self, account_id: str, blob_id: str, copy: int
    ) -> list[tuple[bytes, bytes | None]]:
        lo = copy * COPY_STRIDE
        with self._db.read() as s:
            rows = s.execute(
                select(Embedding.vector, Embedding.terms)
                .where(
                    Embedding.account_id == account_id,
                    Embedding.blob_id == blob_id,
                    Embedding.model == self.embedder.model_id,
                    Embedding.chunk >= lo,
                    Embedding.chunk < lo + COPY_STRIDE,
                )
                .order_by(Embedding.chunk)
            ).all()
        return [(bytes(v), None if t is None else bytes(t)) for v, t in rows]

    def indexed(self, account_id: str, blob_id: str, namespace: str | None = None) -> bool:
        """Whether ``blob_id`` has rows of the active model (in ``namespace``, if given)."""
        conds = [
            Embedding.account_id == account_id,
            Embedding.blob_id == blob_id,
            Embedding.model == self.embedder.model_id,
        ]
        if namespace is not None:
            conds.append(Embedding.namespace == namespace)
        with self._db.read() as s:
            return s.scalar(select(Embedding.id).where(*conds).limit(1)) is not None

    def seal_plain(self, *, limit: int = 1000) -> int:
        """Seal up to ``limit`` vectors stored in clear (before vectors were sealed); how many.

        The values do not change, so no index built from them goes stale: no generation
        bump. Run by the worker's ``reindex`` job until none are left."""
        plain = func.length(Embedding.vector) == 4 * Embedding.dim
        with self._db.begin() as s:
            rows = s.execute(
                select(Embedding.id, Embedding.account_id, Embedding.vector)
                .where(plain)
                .order_by(Embedding.id)
                .limit(limit)
            ).all()
            for row_id, account_id, vec in rows:
                s.execute(
                    update(Embedding)
                    .where(Embedding.id == row_id)
                    .values(vector=self._seal(account_id, bytes(vec)))
                )
        return len(rows)

    # -- reading -------------------------------------------------------------------

    def _conds(self, account_id: str) -> list[ColumnElement[bool]]:
        return [Embedding.account_id == account_id, Embedding.model == self.embedder.model_id]

    def head(self, account_id: str) -> tuple[int, int]:
        """(newest row id, generation) of the account's rows: one round trip per query.

        ORDER BY … LIMIT 1 rather than max(): with stale statistics PostgreSQL
        aggregates over every index entry instead of reading the last one.
        """
        newest = (
            select(Embedding.id)
            .where(*self._conds(account_id))
            .order_by(Embedding.id.desc())
            .limit(1)
            .scalar_subquery()
        )
        generation = (
            select(IndexState.generation)
            .where(IndexState.account_id == account_id, IndexState.model == self.model_id)
            .scalar_subquery()
        )
        with self._db.read() as s:
            row = s.execute(select(newest, generation)).one()
        return int(row[0] or 0), int(row[1] or 0)

    def count(self, account_id: str, above: int, upto: int) -> int:
        """Rows with ``above < id <= upto`` (an index-only range)."""
        with self._db.read() as s:
            return int(
                s.scalar(
                    select(func.count()).where(
                        *self._conds(account_id), Embedding.id > above, Embedding.id <= upto
                    )
                )
                or 0
            )

    def load(
        self,
        account_id: str,
        *,
        above: int = 0,
        upto: int | None = None,
        ids: Collection[int] | None = None,
        blob_ids: Collection[str] | None = None,
        batch: int = 20_000,
        progress: Callable[[int], None] | None = None,
    ) -> RowBatch:
        """The account's rows with ``above < id <= upto`` (or those ``ids`` / ``blob_ids``),
        in id order, streamed from the database in batches."""
        dim = self.embedder.dim
        conds = self._conds(account_id)
        if ids is not None:
            conds.append(Embedding.id.in_(list(ids)))
        elif blob_ids is not None:
            conds.append(Embedding.blob_id.in_(list(blob_ids)))
        else:
            conds.append(Embedding.id > above)
            if upto is not None:
                conds.append(Embedding.id <= upto)
        out_ids: list[int] = []
        out_blobs: list[str] = []
        out_ns: list[str] = []
        vecs: list[bytes] = []
        out_terms: list[tuple[np.ndarray, np.ndarray]] = []
        missing = 0
        last = above if ids is None and blob_ids is None else None
        zero = bytes(4 * dim)
        with self._db.read() as s:
            while True:
                q = (
                    select(
                        Embedding.id,
                        Embedding.blob_id,
                        Embedding.namespace,
                        Embedding.dim,
                        Embedding.vector,
                        Embedding.terms,
                    )
                    .where(*conds)
                    .order_by(Embedding.id)
                )
                if last is not None:
                    q = q.where(Embedding.id > last).limit(batch)
                rows = s.execute(q).all()
                for row_id, blob_id, namespace, row_dim, vec, packed in rows:
                    out_ids.append(row_id)
                    out_blobs.append(blob_id)
                    out_ns.append(namespace)
                    vec = bytes(vec)
                    if len(vec) == 4 * dim + crypto.VECTOR_OVERHEAD:
                        vec = self._open(account_id, vec)
                    if row_dim != dim or len(vec) != 4 * dim:
                        # Same model id, other dimension: corrupt or misconfigured. Keep
                        # the row (as a zero vector that never ranks) so counts align.
                        log.error("index row %s has dim %s, expected %s", row_id, row_dim, dim)
                        vec = zero
                    vecs.append(bytes(vec))
                    if packed is None:
                        missing += 1
                    out_terms.append(terms.unpack(None if packed is None else bytes(packed)))
                if progress is not None:
                    progress(len(rows))
                if last is None or len(rows) < batch:
                    break
                last = rows[-1][0]
        return RowBatch(
            ids=np.asarray(out_ids, dtype=np.int64),
            blob_ids=out_blobs,
            namespaces=out_ns,
            vectors=decode_vectors(vecs, dim),
            terms=out_terms,
            missing_terms=missing,
        )


__all__ = [
    "CHUNK_CHARS",
    "CHUNK_OVERLAP",
    "COPY_STRIDE",
    "MAX_CHUNKS",
    "IndexRows",
    "RowBatch",
    "chunk_text",
    "decode_vectors",
    "encode_vector",
]
