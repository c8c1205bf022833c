"""One account's live search index in a process: a segment on disk plus the rows after it.

``Shard`` answers a query from the memory-mapped segment (``walkeep/index/segment.py``)
and an in-memory *delta* of the rows written since the segment was built, as if
they were one index. It also knows which blobs are dead (no visible memory: all
forgotten, lapsed, or moved by compaction), so that they are left out *before*
the top-k cut and out of BM25's statistics: document count, average length and
document frequency are those of the live rows in the query's namespace scope.
The caller (``walkeep/index/search.py``) keeps it fresh; recall still checks
every hit against the memories table, so a blob that died a moment ago is never
shown even before the shard learns of it.

Row positions: ``0 … n_seg − 1`` are the segment's rows, then the delta's.

Why one file: one data structure — the delta, the dead mask, the scope cache and
BM25's accumulator are read and invalidated by each search path together.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field, replace

import numpy as np

from walkeep.index import ranking as rk
from walkeep.index.rows import RowBatch
from walkeep.index.segment import Segment, SegmentInvalid, quantise, usearch_exact_search

# An approximate search asks the graph for this many times more rows than it
# needs, because dead or out-of-scope rows are dropped after it answers.
_OVERSAMPLE = 2.0
# Below this share of the segment in scope, exact search over the scope's rows
# beats asking the graph for a great many neighbours and dropping most.
_ANN_MIN_SCOPE = 0.1
_EMPTY_I = np.zeros(0, dtype=np.int64)
_EMPTY_R = np.zeros(0, dtype=np.int32)
_EMPTY_TF = np.zeros(0, dtype=np.uint16)


@dataclass
class _Scope:
    """Which rows a query may see, and BM25's statistics over them."""

    ok: np.ndarray  # bool [n_total]
    seg_rows: np.ndarray | None  # positions of in-scope segment rows (None = all)
    live_rows: int
    avg_len: float
    all_ok: bool = False  # every row is in scope (no dead blob, no namespace filter)
    # A filter's rows (a subset of ``ok``): the only rows the query may return. BM25's
    # statistics stay those of ``ok``, so a memory scores the same filtered or not, and
    # ``seg_rows`` lists the segment's rows the filter keeps.
    keep: np.ndarray | None = None

    @property
    def allowed(self) -> np.ndarray:
        """The rows a query may return."""
        return self.ok if self.keep is None else self.keep

    @property
    def candidates(self) -> int:
        return self.live_rows if self.keep is None else int(self.keep.sum())


class _Once:
    """The query vector, asked for at most once: given, or computed when first needed."""

    def __init__(self, source: np.ndarray | Callable[[], np.ndarray]) -> None:
        self._source = source
        self._vec: np.ndarray | None = None

    def __call__(self) -> np.ndarray:
        if self._vec is None:
            src = self._source
            self._vec = src if isinstance(src, np.ndarray) else src()
        return self._vec


@dataclass(frozen=True)
class _Lexical:
    """A query's BM25: its best rows, and (while the search holds it) every row's score."""

    top_rows: np.ndarray
    acc: np.ndarray | None

    def scores(self, rows: np.ndarray) -> np.ndarray:
        return self.acc[rows] if self.acc is not None else np.zeros(len(rows))


_NO_WORDS = _Lexical(_EMPTY_I, None)


@dataclass
class Shard:
    """Segment + delta + dead blobs of one (account, model). Guard with ``lock``."""

    account_id: str
    dim: int
    generation: int
    segment: Segment | None
    segment_name: str | None = None
    lock: threading.RLock = field(default_factory=threading.RLock)
    max_id: int = 0
    dead_as_of: float = float("-inf")
    counted_at: float = float("-inf")
    # the delta
    d_ids: list[int] = field(default_factory=list)
    d_blob: list[int] = field(default_factory=list)
    d_ns: list[int] = field(default_factory=list)
    d_len: list[int] = field(default_factory=list)
    d_vecs: list[np.ndarray] = field(default_factory=list)
    d_post: dict[int, tuple[list[int], list[int]]] = field(default_factory=dict)
    d_idset: set[int] = field(default_factory=set)
    # blobs and namespaces the segment does not know
    new_blobs: list[str] = field(default_factory=list)
    new_codes: dict[str, int] = field(default_factory=dict)
    namespaces: list[str] = field(default_factory=list)
    ns_codes: dict[str, int] = field(default_factory=dict)
    dead: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    dead_version: int = 0
    # A merge was asked to give this shard's segment the graph it was built without (or
    # the checksums a segment from before them lacks).
    graph_requested: bool = False
    # Built from the database rows in this process (not opened from a file).
    from_rows: bool = False
    # When the segment's files were last compared with what was opened, and whether
    # they changed (so the shard must be opened again): SearchIndex._suspect.
    files_checked_at: float = float("-inf")
    reopen: bool = False
    # Derived arrays: of the delta and scopes (dropped when rows arrive or blobs die),
    # and of the segment's rows per namespace (dropped only when blobs die: at a million
    # rows they cost milliseconds, and rows arrive far more often than memories die).
    _cache: dict[str, object] = field(default_factory=dict)
    _seg_cache: dict[str, tuple[np.ndarray, np.ndarray | None, float]] = field(default_factory=dict)
    # BM25's accumulator over all rows, kept zeroed between queries (see _lexical).
    _acc: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float32))

    def __post_init__(self) -> None:
        seg = self.segment
        if seg is not None:
            self.max_id = seg.meta.high_water
            self.dead_as_of = seg.meta.dead_as_of
            self.namespaces = list(seg.meta.namespaces)
            self.dead = np.array(seg.dead, dtype=bool)
        self.ns_codes = {ns: i for i, ns in enumerate(self.namespaces)}

    # -- sizes -----------------------------------------------------------------------

    @property
    def n_seg(self) -> int:
        return self.segment.n if self.segment is not None else 0

    @property
    def n_delta(self) -> int:
        return len(self.d_ids)

    @property
    def n_blobs_seg(self) -> int:
        return len(self.segment.blob_ids) if self.segment is not None else 0

    @property
    def nbytes(self) -> int:
        """Bytes this shard may hold: the segment's files (mapped) and the delta."""
        seg = self.segment.nbytes if self.segment is not None else 0
        postings = sum(len(r) for r, _ in self.d_post.values())
        return (
            seg
            + self.n_delta * (4 * self.dim + 64)
            + postings * 16
            + len(self.dead)
            + self._acc.nbytes
        )

    # -- blobs -----------------------------------------------------------------------

    def code(self, blob_id: str) -> int | None:
        c = self.new_codes.get(blob_id)
        if c is None and self.segment is not None:
            c = self.segment.blob_code(blob_id)
        return c

    def blob_id(self, code: int) -> str:
        nb = self.n_blobs_seg
        if code < nb:
            assert self.segment is not None
            return bytes(self.segment.blob_ids[code]).decode("ascii")
        return self.new_blobs[code - nb]

    def _code_for(self, blob_id: str) -> int:
        c = self.code(blob_id)
        if c is None:
            c = self.n_blobs_seg + len(self.new_blobs)
            self.new_blobs.append(blob_id)
            self.new_codes[blob_id] = c
            self.dead = np.append(self.dead, False)
        return c

    def all_blob_ids(self) -> list[str]:
        """Every blob the shard knows, by code."""
        seg = [bytes(b).decode("ascii") for b in self.segment.blob_ids] if self.segment else []
        return seg + self.new_blobs

    def reset_dead(self, dead: np.ndarray) -> None:
        """Which blobs are dead, by code, all at once (a full re-read)."""
        assert dead.shape == self.dead.shape
        if not np.array_equal(dead, self.dead):
            self.dead = np.array(dead, dtype=bool)
            self.dead_version += 1
            self._cache.clear()
            self._seg_cache.clear()

    def set_dead(self, blob_id: str, dead: bool) -> None:
        c = self.code(blob_id)
        if c is not None and bool(self.dead[c]) != dead:
            self.dead[c] = dead
            self.dead_version += 1
            self._cache.clear()
            self._seg_cache.clear()

    def _ns_code(self, namespace: str) -> int:
        c = self.ns_codes.get(namespace)
        if c is None:
            c = self.ns_codes[namespace] = len(self.namespaces)
            self.namespaces.append(namespace)
        return c

    # -- growing ---------------------------------------------------------------------

    def has_row(self, row_id: int) -> bool:
        if row_id in self.d_idset:
            return True
        seg = self.segment
        if seg is None or row_id > seg.meta.high_water:
            return False
        i = int(np.searchsorted(seg.row_ids, row_id))
        return i < seg.n and int(seg.row_ids[i]) == row_id

    def append(self, batch: RowBatch) -> int:
        """Add rows the shard does not hold yet; returns how many were new."""
        added = 0
        base = self.n_seg
        for i in range(len(batch)):
            row_id = int(batch.ids[i])
            if self.has_row(row_id):
                continue
            pos = base + len(self.d_ids)
            self.d_ids.append(row_id)
            self.d_idset.add(row_id)
            self.d_blob.append(self._code_for(batch.blob_ids[i]))
            self.d_ns.append(self._ns_code(batch.namespaces[i]))
            keys, tfs = batch.terms[i]
            self.d_len.append(int(tfs.sum()))
            self.d_vecs.append(batch.vectors[i])
            for k, tf in zip(keys.tolist(), tfs.tolist(), strict=True):
                rows, freqs = self.d_post.setdefault(k, ([], []))
                rows.append(pos)
                freqs.append(tf)
            self.max_id = max(self.max_id, row_id)
            added += 1
        if added:
            self._cache.clear()
        return added

    def delta_postings(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The delta's postings, flat: (row positions, term keys, frequencies)."""
        rows: list[int] = []
        keys: list[int] = []
        tfs: list[int] = []
        for key, (r, f) in self.d_post.items():
            rows.extend(r)
            keys.extend([key] * len(r))
            tfs.extend(f)
        return (
            np.asarray(rows, dtype=np.int32),
            np.asarray(keys, dtype=np.uint64),
            np.asarray(tfs, dtype=np.uint16),
        )

    # -- arrays over all rows --------------------------------------------------------

    def _delta_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        cached = self._cache.get("delta")
        if cached is None:
            vecs = (
                np.vstack(self.d_vecs).astype(np.float32, copy=False)
                if self.d_vecs
                else np.zeros((0, self.dim), dtype=np.float32)
            )
            cached = (
                np.asarray(self.d_blob, dtype=np.int64),
                np.asarray(self.d_ns, dtype=np.int64),
                np.asarray(self.d_len, dtype=np.float64),
                vecs,
            )
            self._cache["delta"] = cached
        return cached  # type: ignore[return-value]

    def _row_blob(self, rows: np.ndarray) -> np.ndarray:
        out = np.empty(len(rows), dtype=np.int64)
        n = self.n_seg
        in_seg = rows < n
        if self.segment is not None:
            out[in_seg] = self.segment.row_blob[rows[in_seg]]
        d_blob = self._delta_arrays()[0]
        out[~in_seg] = d_blob[rows[~in_seg] - n]
        return out

    def _row_len(self, rows: np.ndarray) -> np.ndarray:
        n = self.n_seg
        if not self.n_delta and self.segment is not None:
            # np.asarray: a plain view of the mapped file, without np.memmap's per-call cost
            return np.asarray(self.segment.row_len)[rows]
        out = np.empty(len(rows), dtype=np.float64)
        in_seg = rows < n
        if self.segment is not None:
            out[in_seg] = self.segment.row_len[rows[in_seg]]
        out[~in_seg] = self._delta_arrays()[2][rows[~in_seg] - n]
        return out

    def _scope(self, namespace: str | None) -> _Scope | None:
        """The rows a query in ``namespace`` (None: all) may see; None if none exist."""
        key = f"scope:{namespace}"
        cached = self._cache.get(key)
        if cached is not None:
            return cached  # type: ignore[return-value]
        ns = None
        if namespace is not None:
            ns = self.ns_codes.get(namespace)
            if ns is None:
                return None
        d_blob, d_ns, d_len, _ = self._delta_arrays()
        parts: list[np.ndarray] = []
        total_len = 0.0
        seg_rows: np.ndarray | None = None
        seg = self.segment
        if seg is not None and seg.n:
            cached_seg = self._seg_cache.get(key)
            if cached_seg is None:
                ok_seg = ~self.dead[seg.row_blob]
                if ns is not None:
                    ok_seg &= seg.row_ns == ns
                rows_in = None if ok_seg.all() else np.flatnonzero(ok_seg)
                length = float(seg.row_len[ok_seg].sum(dtype=np.float64))
                cached_seg = self._seg_cache[key] = (ok_seg, rows_in, length)
            ok_seg, seg_rows, seg_len = cached_seg
            total_len += seg_len
            parts.append(ok_seg)
        ok_delta = ~self.dead[d_blob] if len(d_blob) else np.zeros(0, dtype=bool)
        if ns is not None and len(d_ns):
            ok_delta &= d_ns == ns
        total_len += float(d_len[ok_delta].sum()) if len(d_len) else 0.0
        parts.append(ok_delta)
        ok = np.concatenate(parts) if parts else np.zeros(0, dtype=bool)
        live = int(ok.sum())
        if live == 0:
            return None
        scope = _Scope(
            ok=ok,
            seg_rows=seg_rows,
            live_rows=live,
            avg_len=total_len / live,
            all_ok=live == len(ok),
        )
        self._cache[key] = scope
        return scope

    def _narrowed(self, scope: _Scope, only: Collection[str]) -> _Scope | None:
        """``scope`` kept to the rows of the blobs in ``only`` (None if none is in it).

        Built per query, not cached: the blobs a filter keeps change with every store.
        A bool per blob, then per row: ~1 ms at 100,000 rows."""
        blobs = np.zeros(len(self.dead), dtype=bool)
        wanted = list(only)
        if self.segment is not None:
            blobs[self.segment.blob_codes(wanted)] = True
        for blob_id in wanted:
            c = self.new_codes.get(blob_id)
            if c is not None:
                blobs[c] = True
        n = self.n_seg
        keep = np.empty(len(scope.ok), dtype=bool)
        if self.segment is not None and n:
            keep[:n] = blobs[self.segment.row_blob]
        if self.n_delta:
            keep[n:] = blobs[self._delta_arrays()[0]]
        keep &= scope.ok
        if not keep.any():
            return None
        return replace(scope, keep=keep, seg_rows=np.flatnonzero(keep[:n]), all_ok=False)

    # -- searching -------------------------------------------------------------------

    def live_rows(self, namespace: str | None) -> int:
        """Rows a query in ``namespace`` may see; with none, it can only answer nothing."""
        scope = self._scope(namespace)
        return 0 if scope is None else scope.live_rows

    def search(
        self,
        qvec: np.ndarray | Callable[[], np.ndarray] | None,
        qterms: np.ndarray | None,
        namespace: str | None,
        limit: int,
        ranking: rk.Ranking,
        only: Collection[str] | None = None,
    ) -> list[tuple[str, float]]:
        """The ``limit`` best live blobs in scope, best first, with scores in [0, 1];
        with ``only``, the best of those blobs alone (a filtered recall's candidates)."""
        scope = self._scope(namespace)
        if scope is not None and only is not None:
            scope = self._narrowed(scope, only)
        if scope is None or limit <= 0:
            return []
        # A memory of many chunks holds many rows: if the best rows name fewer than
        # ``limit`` blobs, widen the cut until they do or every row in scope is in it
        # (else a long memory's chunks would hide the others, and a caller reading
        # "fewer hits than asked" as "no more" would miss them).
        want = max(limit, 20)
        vector = _Once(qvec) if qvec is not None else None
        while True:
            ranked = self._ranked(vector, qterms, scope, want, ranking)
            if len(ranked) >= limit or want >= scope.candidates:
                break
            want = min(want * 4, scope.candidates)
        out = [(self.blob_id(code), score) for code, score in ranked[:limit]]
        if self.segment is not None:
            self.segment.release()
        return out

    def _ranked(
        self,
        qvec: _Once | None,
        qterms: np.ndarray | None,
        scope: _Scope,
        want: int,
        ranking: rk.Ranking,
    ) -> list[tuple[int, float]]:
        """(blob code, score) of the blobs among the best ``want`` rows, best first.

        Words first, meaning second: the query vector may still be on its way (the
        caller embeds it on another thread while this one scores the words), and
        the BM25 accumulator stays filled until the dense candidates have their
        lexical scores read off it.
        """
        with self._lexical(
            qterms if qterms is not None and len(qterms) and ranking != "dense" else None,
            scope,
            want,
        ) as lex:
            dense_rows, dense_cos = (
                self._dense(qvec(), scope, want)
                if qvec is not None and ranking != "lexical"
                else (_EMPTY_I, np.zeros(0))
            )
            cand = np.union1d(dense_rows, lex.top_rows)
            if len(cand) == 0:
                return []
            lexical = lex.scores(cand)
        if ranking == "lexical":
            cos = np.zeros(len(cand))
        else:
            assert qvec is not None
            cos = np.empty(len(cand))
            pos = np.searchsorted(dense_rows, cand)
            pos = np.minimum(pos, max(len(dense_rows) - 1, 0))
            known = (dense_rows[pos] == cand) if len(dense_rows) else np.zeros(len(cand), bool)
            cos[known] = dense_cos[pos[known]]
            if (~known).any():
                cos[~known] = self._cosine(qvec(), cand[~known])
        fused = rk.fuse(cos, lexical, ranking)
        order = np.argsort(-fused, kind="stable")
        blobs = self._row_blob(cand[order])
        _, first = np.unique(blobs, return_index=True)
        first.sort()
        return [(int(blobs[i]), round(float(fused[order[i]]), 4)) for i in first]

    def _dense(self, qvec: np.ndarray, scope: _Scope, want: int) -> tuple[np.ndarray, np.ndarray]:
        """In-scope rows nearest ``qvec`` (sorted by row) and their cosine."""
        rows: list[np.ndarray] = []
        sims: list[np.ndarray] = []
        seg = self.segment
        q8 = quantise(qvec[None, :])[0]
        if seg is not None and seg.n:
            in_scope = seg.n if scope.seg_rows is None else len(scope.seg_rows)
            if in_scope:
                r, s = self._dense_segment(seg, q8, scope, want, in_scope)
                rows.append(r)
                sims.append(s)
        n = self.n_seg
        if self.n_delta:
            vecs = self._delta_arrays()[3]
            ok = scope.allowed[n:]
            s = np.einsum("ij,j->i", vecs, qvec.astype(np.float32, copy=False))
            s = np.where(ok, s, -np.inf)
            k = min(want, len(s))
            top = np.argpartition(-s, k - 1)[:k] if k < len(s) else np.arange(len(s))
            top = top[np.isfinite(s[top])]
            rows.append(top + n)
            sims.append(s[top].astype(np.float64))
        if not rows:
            return _EMPTY_I, np.zeros(0)
        r_all = np.concatenate(rows).astype(np.int64)
        s_all = np.concatenate(sims)
        if len(r_all) > want:
            keep = np.argpartition(-s_all, want - 1)[:want]
            r_all, s_all = r_all[keep], s_all[keep]
        order = np.argsort(r_all)
        return r_all[order], s_all[order]

    def _dense_segment(
        self, seg: Segment, q8: np.ndarray, scope: _Scope, want: int, in_scope: int
    ) -> tuple[np.ndarray, np.ndarray]:
        exact_search = usearch_exact_search()
        if seg.ann is not None and in_scope >= _ANN_MIN_SCOPE * seg.n:
            count = min(seg.n, math.ceil(want * _OVERSAMPLE * seg.n / in_scope) + 16)
            m = seg.ann.search(q8, count)  # type: ignore[attr-defined]
            keys = np.asarray(m.keys, dtype=np.int64)
            if len(keys) and (int(keys.min()) < 0 or int(keys.max()) >= seg.n):
                raise SegmentInvalid("the graph named a row the segment does not have")
            dist = np.asarray(m.distances, dtype=np.float64)
            ok = scope.allowed[keys]
            if ok.sum() >= min(want, in_scope) or count >= seg.n:
                return keys[ok][:want], 1.0 - dist[ok][:want]
        # Exact: over all rows, or over the scope's rows gathered.
        if scope.seg_rows is None:
            data, index = seg.vec_i8, None
        else:
            index = scope.seg_rows
            data = seg.vec_i8[index]
        k = min(want, len(data))
        m = exact_search(np.ascontiguousarray(data), q8, k, "cos", exact=True)
        keys = np.asarray(m.keys, dtype=np.int64)
        dist = np.asarray(m.distances, dtype=np.float64)
        if index is not None:
            keys = index[keys]
        return keys, 1.0 - dist

    def _cosine(self, qvec: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """Exact cosine of ``qvec`` with the given rows (int8 for the segment's)."""
        out = np.empty(len(rows))
        n = self.n_seg
        in_seg = rows < n
        if in_seg.any():
            assert self.segment is not None
            v = self.segment.vec_i8[rows[in_seg]].astype(np.float32)
            norms = np.linalg.norm(v, axis=1)
            norms[norms == 0] = 1.0
            out[in_seg] = (v @ qvec.astype(np.float32)) / norms
        if (~in_seg).any():
            vecs = self._delta_arrays()[3]
            out[~in_seg] = vecs[rows[~in_seg] - n] @ qvec.astype(np.float32)
        return out

    def _df(self, key: int) -> int:
        """Rows holding term ``key``, in scope or not (a lookup, no postings read)."""
        seg = self.segment
        d = self.d_post.get(key)
        return (len(seg.postings(key)[0]) if seg is not None else 0) + (len(d[0]) if d else 0)

    def _postings(self, key: int) -> tuple[np.ndarray, np.ndarray]:
        """Every row holding term ``key`` (ascending positions, in scope or not) and its tf."""
        seg = self.segment
        r_seg, tf_seg = seg.postings(key) if seg is not None else (_EMPTY_R, _EMPTY_TF)
        d = self.d_post.get(key)
        if d is None:
            return r_seg, tf_seg  # the mapped slices, not copied
        return (
            np.concatenate([r_seg.astype(np.int64), np.asarray(d[0], dtype=np.int64)]),
            np.concatenate([tf_seg, np.asarray(d[1], dtype=np.uint16)]),
        )

    @contextlib.contextmanager
    def _lexical(self, qterms: np.ndarray | None, scope: _Scope, want: int) -> Iterator[_Lexical]:
        """BM25 over in-scope rows: the top ``want`` rows, and every row's score while open.

        The scores add up in an accumulator over all rows that the shard keeps (a row
        appears at most once in a term's postings, so ``acc[rows] += w`` is exact) and
        that is zeroed again, on leaving, only where it was written (or all at once,
        when the postings are many). At a million rows a question's words hold
        ~125,000 postings: allocating a fresh million-row array, scanning it for the
        rows hit and sorting them cost ~7 ms a query; in float64, with a full
        selection over the postings, ~6; this costs ~1.5.
        """
        parts: list[tuple[np.ndarray, np.ndarray, float]] = []
        idfs: list[float] = []
        keys = qterms.tolist() if qterms is not None else []
        # A long query's most common words are dropped first (ranking.MAX_QUERY_TERMS),
        # judged by their postings in the whole shard: known without reading them.
        kept = rk.kept_terms(np.fromiter((self._df(k) for k in keys), np.int64, len(keys)))
        for key in (k for k, keep in zip(keys, kept.tolist(), strict=True) if keep):
            rows, tfs = self._postings(key)
            if len(rows) and not scope.all_ok:
                ok = scope.ok[rows]
                rows, tfs = rows[ok], tfs[ok]
            # A query word found nowhere still counts in the ideal: matching one word of
            # three is a third of the query, however rare the other two are.
            idf = float(rk.idf(len(rows), scope.live_rows))
            idfs.append(idf)
            if len(rows) and scope.keep is not None:
                kept_rows = scope.keep[rows]
                rows, tfs = rows[kept_rows], tfs[kept_rows]
            if len(rows):
                parts.append((rows, tfs, idf))
        if not parts:
            yield _NO_WORDS
            return
        top_score = rk.ideal(np.asarray(idfs))
        acc = self._accumulator(self.n_seg + self.n_delta)
        written: list[np.ndarray] = []
        try:
            for rows, tfs, idf in parts:
                rows = rows.astype(np.intp)  # once: each fancy index below would cast it
                acc[rows] += rk.tf_weight(tfs, self._row_len(rows), scope.avg_len, idf / top_score)
                written.append(rows)
            yield _Lexical(self._best(acc, written, want), acc)
        finally:
            if sum(len(r) for r in written) * 8 > len(acc):
                acc.fill(0.0)  # one pass over the array beats scattered writes
            else:
                for w_rows in written:
                    acc[w_rows] = 0.0

    @staticmethod
    def _best(acc: np.ndarray, written: list[np.ndarray], want: int) -> np.ndarray:
        """The ``want`` rows of highest ``acc`` among those written, sorted by position.

        A row's score is at least its score in any one list, and the rows of one list
        are distinct: so the ``want``-th best score among the shortest list's rows is
        a floor every one of the best ``want`` rows reaches. Only the postings at or
        above it are candidates: selecting among all ~100,000 cost 1.5 ms a query.
        """
        rows = np.concatenate(written)
        shortest = min(written, key=len)
        if len(shortest) >= want:
            in_short = acc[shortest]
            floor = np.partition(in_short, len(in_short) - want)[len(in_short) - want]
            hit = np.unique(rows[acc[rows] >= floor])
        else:
            # Too few rows in the shortest list for a floor: the best want × lists
            # postings hold the best ``want`` rows (a row is in a list at most once).
            per_posting = acc[rows]
            m = min(len(rows), want * len(written))
            best = np.argpartition(-per_posting, m - 1)[:m] if m < len(rows) else slice(None)
            hit = np.unique(rows[best])
        k = min(want, len(hit))
        return np.sort(hit[np.argpartition(-acc[hit], k - 1)[:k]]).astype(np.int64, copy=False)

    def _accumulator(self, n_total: int) -> np.ndarray:
        """A zeroed float32 array over every row (the caller zeroes what it writes)."""
        if len(self._acc) < n_total:
            # room for rows arriving after this
            self._acc = np.zeros(n_total + 1024, dtype=np.float32)
        return self._acc


__all__ = ["Shard"]
