"""An account's search index on disk: one immutable, memory-mapped snapshot per generation.

A segment holds every index row of one (account, model) up to a row id (its
high-water mark), in forms that answer a query without reading the database:

* dense: the vectors quantised to int8 (each scaled so its largest component is
  127: cosine is scale-free, so int8 keeps the ranking of float32 to within a
  few in a thousand), and above ``ANN_MIN_ROWS`` an HNSW graph (usearch) over
  them. Below that, exact search over the int8 rows is as fast and exact.
* lexical: postings in CSR form — sorted distinct term hashes, offsets, then the
  rows and term frequencies — plus each row's length in terms.
* which blob and namespace each row belongs to, and which blobs were dead
  (no visible memory) when it was written.

Files are written to a new directory, flushed, then published by renaming a
``CURRENT`` pointer over the old one, so a reader sees the old generation or the
new one, never half of either; readers map files with ``mmap`` (only the pages a
query touches become resident) and a process that still maps an old generation
keeps reading it until it notices ``CURRENT`` moved. ``meta.json`` describes the
files (sizes, model, dimension, row count, an xxh3-128 checksum of each file):
anything that does not match is treated as missing, and the caller rebuilds from
the database.

Every file has an xxh3-128 checksum in ``meta.json``; what is checked when, and
what it costs, is ``walkeep/index/integrity.py``'s. A format-1 segment (before
checksums) is opened under the range checks alone and rewritten with checksums by
a background merge.

Why one file: one on-disk format — how its arrays are built, extended, written and
opened are its four sides, and a change to the format touches all four together.
"""

from __future__ import annotations

import contextlib
import json
import logging
import mmap
import os
import shutil
import time
import zlib
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from walkeep.index import integrity
from walkeep.index.integrity import LARGE_FILES, VERIFY_INLINE_BYTES

log = logging.getLogger(__name__)

FORMAT = 2  # 2: a checksum per file in meta.json
# Formats still opened (under the range checks alone) and rewritten by a merge: an
# upgrade must not rebuild every account's index from the database at once.
LEGACY_FORMATS = frozenset({1})
# Below this many rows exact search over int8 vectors is as fast as the graph
# (measured: 50,000 rows in 1.8 ms with usearch's exact kernel) and exact.
ANN_MIN_ROWS = 50_000
# HNSW parameters: 32 links per node, 256 candidates while building, 512 while
# searching. On bench/recall_scale.py's million rows (int8 alone keeps 0.984 of the exact
# float32 top 10): 16 links built 128 wide kept 0.93 (searching 128 wide: 0.84, 1024:
# 0.95); 32 links built 256 wide keep 0.977 at the same query time (29–30 ms warm recall
# both), for a graph file of 630 MiB instead of 508 and ~3× the build time (20 min at a
# million rows on 2 busy cores; a merge only adds its new rows). A graph built with the
# old parameters keeps them until `walkeep index rebuild`.
ANN_CONNECTIVITY = 32
ANN_EXPANSION_ADD = 256
ANN_EXPANSION_SEARCH = 512

_ARRAYS = (
    "row_ids",
    "row_blob",
    "row_ns",
    "row_len",
    "vec_i8",
    "blob_ids",
    "blob_keys",
    "blob_sorted",
    "dead",
    "term_keys",
    "term_off",
    "post_row",
    "post_tf",
)


class SegmentInvalid(Exception):
    """A segment on disk is missing, from another model, stale or damaged.

    ``stale``: written for another model, analyzer or format (not damage).
    """

    def __init__(self, message: str, *, stale: bool = False) -> None:
        super().__init__(message)
        self.stale = stale


@dataclass
class Meta:
    format: int
    account_id: str
    model: str
    dim: int
    analyzer: int
    generation: int
    rows: int
    high_water: int
    ids_crc: int
    dead_as_of: float  # database clock (epoch seconds) of the dead-blob snapshot
    namespaces: list[str]
    ann: bool
    sizes: dict[str, int]
    checksums: dict[str, str] = field(default_factory=dict)  # file → xxh3-128 (format 2)


def quantise(vectors: np.ndarray) -> np.ndarray:
    """float32 rows → int8 rows scaled so each row's largest component is ±127."""
    v = np.asarray(vectors, dtype=np.float32)
    if len(v) == 0:
        return np.zeros((0, v.shape[1] if v.ndim == 2 else 0), dtype=np.int8)
    peak = np.abs(v).max(axis=1, keepdims=True)
    peak[peak == 0] = 1.0
    return np.rint(v / peak * 127.0).astype(np.int8)


@dataclass
class Segment:
    """The arrays of one generation (memory-mapped when opened from disk)."""

    meta: Meta
    row_ids: np.ndarray  # int64 [n], ascending
    row_blob: np.ndarray  # int32 [n] → blob code
    row_ns: np.ndarray  # int32 [n] → index into meta.namespaces
    row_len: np.ndarray  # uint32 [n], terms in the row
    vec_i8: np.ndarray  # int8 [n, dim]
    blob_ids: np.ndarray  # bytes (S64) [B], by code
    blob_keys: np.ndarray  # bytes (S64) [B], sorted
    blob_sorted: np.ndarray  # int32 [B]: the code of each of blob_keys
    dead: np.ndarray  # bool [B] as of meta.dead_as_of
    term_keys: np.ndarray  # uint64 [T], ascending
    term_off: np.ndarray  # int64 [T + 1]
    post_row: np.ndarray  # int32 [P]
    post_tf: np.ndarray  # uint16 [P]
    ann: object | None = None  # usearch.index.Index (a view of the file) or None
    path: Path | None = None
    # Each file's (size, inode, mtime, ctime) when opened: changed_on_disk() compares.
    identity: dict[str, list[int]] = field(default_factory=dict)
    # Large files not verified yet (see the module doc): verify_pending() checks them.
    pending: tuple[str, ...] = ()
    # Why verify_pending() refused the files (set by the thread that ran it), or None.
    failed: str | None = None

    @property
    def n(self) -> int:
        return int(self.meta.rows)

    @property
    def nbytes(self) -> int:
        """What the segment can occupy if all of it becomes resident."""
        return int(sum(self.meta.sizes.values()))

    @property
    def legacy(self) -> bool:
        """Written before checksums: opened under range checks, to be rewritten."""
        return self.meta.format != FORMAT

    def changed_on_disk(self) -> bool:
        """Whether any of the files was written to, replaced or removed since it was
        opened (a stat each: ~2 µs). The caller reopens, which checks them again."""
        assert self.path is not None or not self.identity
        for name, ident in self.identity.items():
            assert self.path is not None
            try:
                if integrity.identity(self.path / name) != ident:
                    return True
            except OSError:
                return True
        return False

    def verify_pending(self) -> None:
        """Hash the large files left unverified at open, then load the graph.

        Raises SegmentInvalid if one does not match its checksum. Runs on a
        background thread; ``ann`` only ever goes from None to the graph, which a
        search reads once, so the searches going on meanwhile need no lock.
        """
        assert self.path is not None
        if self.pending:
            _verify(self.path, self.meta, self.pending)
        if self.meta.ann and self.ann is None:
            self.ann = _open_graph(self.path, self.n, self.meta.dim)
        self.pending = ()

    def verify_all(self) -> None:
        """Hash every file again (before a merge copies the arrays into the next
        generation, where a damaged one would get a fresh, matching checksum)."""
        if self.path is None or self.legacy:
            return
        _verify(self.path, self.meta, [n for n in self.meta.sizes if n != "meta.json"])

    def blob_code(self, blob_id: str) -> int | None:
        key = blob_id.encode("ascii", "replace")
        i = int(np.searchsorted(self.blob_keys, key))
        if i < len(self.blob_keys) and self.blob_keys[i] == key:
            return int(self.blob_sorted[i])
        return None

    def blob_codes(self, blob_ids: list[str]) -> np.ndarray:
        """The codes of those of ``blob_ids`` the segment holds (one vectorised lookup: a
        filtered recall may name thousands)."""
        if not blob_ids or not len(self.blob_keys):
            return np.zeros(0, dtype=np.int64)
        keys = np.array(
            [b.encode("ascii", "replace") for b in blob_ids], dtype=self.blob_keys.dtype
        )
        i = np.searchsorted(self.blob_keys, keys)
        i = np.minimum(i, len(self.blob_keys) - 1)
        found = self.blob_keys[i] == keys
        return np.asarray(self.blob_sorted[i[found]], dtype=np.int64)

    def release(self) -> None:
        """Unmap the pages queries touched in the arrays they read at random.

        A query reads a few hundred rows of the int8 vectors and a few blob ids, but the
        kernel maps file pages in large folios, so those reads made a process resident
        in whole megabytes of each: after 200 queries at a million rows, most of both
        files. Dropping the mappings (the pages stay in the page cache) keeps a process's
        memory to what it holds, not what it once glanced at. The graph (usearch's own
        view of its file) is left mapped: every query walks it, and re-faulting its pages
        cost ~25 ms a query at a million rows; it is bounded by its file's size.
        """
        for arr in (self.vec_i8, self.blob_ids, self.blob_keys):
            mm = getattr(arr, "_mmap", None)
            if mm is not None:
                with contextlib.suppress(OSError, ValueError):
                    mm.madvise(mmap.MADV_DONTNEED)

    def postings(self, key: int) -> tuple[np.ndarray, np.ndarray]:
        i = int(np.searchsorted(self.term_keys, np.uint64(key)))
        if i < len(self.term_keys) and int(self.term_keys[i]) == key:
            lo, hi = int(self.term_off[i]), int(self.term_off[i + 1])
            return self.post_row[lo:hi], self.post_tf[lo:hi]
        return _NO_ROWS, _NO_TF


_NO_ROWS = np.zeros(0, dtype=np.int32)
_NO_TF = np.zeros(0, dtype=np.uint16)


def build(
    *,
    account_id: str,
    model: str,
    dim: int,
    analyzer: int,
    generation: int,
    row_ids: np.ndarray,
    blob_ids: list[str],
    namespaces: list[str],
    vec_i8: np.ndarray,
    row_terms: list[tuple[np.ndarray, np.ndarray]],
    dead_blobs: set[str],
    dead_as_of: float,
    ann_min_rows: int = ANN_MIN_ROWS,
) -> Segment:
    """A segment from rows in memory (any order). Builds the HNSW graph if big enough."""
    n = len(row_ids)
    order = np.argsort(row_ids, kind="stable")
    row_ids = np.asarray(row_ids, dtype=np.int64)[order]
    vec_i8 = np.asarray(vec_i8, dtype=np.int8).reshape(n, dim)[order]
    blob_list = [blob_ids[i] for i in order]
    ns_list = [namespaces[i] for i in order]
    terms_list = [row_terms[i] for i in order]

    codes: dict[str, int] = {}
    row_blob = np.fromiter((codes.setdefault(b, len(codes)) for b in blob_list), np.int32, n)
    ns_names: dict[str, int] = {}
    row_ns = np.fromiter((ns_names.setdefault(x, len(ns_names)) for x in ns_list), np.int32, n)
    dead = np.zeros(len(codes), dtype=bool)
    for b in dead_blobs:
        c = codes.get(b)
        if c is not None:
            dead[c] = True
    counts = np.fromiter((len(k) for k, _ in terms_list), np.int64, n)
    total = int(counts.sum())
    return assemble(
        Meta(
            format=FORMAT,
            account_id=account_id,
            model=model,
            dim=dim,
            analyzer=analyzer,
            generation=generation,
            rows=n,
            high_water=0,
            ids_crc=0,
            dead_as_of=dead_as_of,
            namespaces=list(ns_names),
            ann=False,
            sizes={},
        ),
        row_ids=row_ids,
        row_blob=row_blob,
        row_ns=row_ns,
        row_len=np.fromiter((int(t.sum()) for _, t in terms_list), np.uint32, n),
        vec_i8=vec_i8,
        blob_ids=list(codes),
        dead=dead,
        post_row=np.repeat(np.arange(n, dtype=np.int32), counts),
        post_key=(np.concatenate([k for k, _ in terms_list]) if total else np.zeros(0, np.uint64)),
        post_tf=np.concatenate([t for _, t in terms_list]) if total else np.zeros(0, np.uint16),
        ann=None,
        ann_min_rows=ann_min_rows,
    )


def extend(
    seg: Segment,
    *,
    generation: int,
    row_ids: np.ndarray,
    row_blob: np.ndarray,
    row_ns: np.ndarray,
    row_len: np.ndarray,
    vec_i8: np.ndarray,
    new_blobs: list[str],
    namespaces: list[str],
    dead: np.ndarray,
    dead_as_of: float,
    post_row: np.ndarray,
    post_key: np.ndarray,
    post_tf: np.ndarray,
    ann_min_rows: int = ANN_MIN_ROWS,
) -> Segment:
    """The next generation: ``seg`` plus rows after its mark, appended in place.

    The new rows' blob and namespace codes continue ``seg``'s (``new_blobs`` and the
    tail of ``namespaces`` are those it does not know), and their postings' rows are
    positions after ``seg.n``. The graph, if ``seg`` has one, is loaded writable and
    extended rather than rebuilt: merging 20,000 rows into a million costs the new
    rows' insertions, not a million.
    """
    assert len(row_ids) == 0 or int(row_ids.min()) > seg.meta.high_water
    n = seg.n + len(row_ids)
    old_keys = np.repeat(seg.term_keys, np.diff(seg.term_off))
    ann: object | None = None
    if seg.meta.ann and seg.path is not None and len(row_ids):
        graph = usearch_index().restore(str(seg.path / "ann.usearch"), view=False)
        if graph is None:
            raise SegmentInvalid("ann.usearch could not be loaded to extend it")
        graph.add(
            np.arange(seg.n, n, dtype=np.uint64),
            np.ascontiguousarray(vec_i8),
            threads=os.cpu_count() or 1,
        )
        ann = graph
    elif seg.meta.ann:
        ann = seg.ann
    meta = Meta(
        **{
            **asdict(seg.meta),
            "format": FORMAT,  # a legacy segment is rewritten with checksums
            "generation": generation,
            "rows": n,
            "sizes": {},
            "checksums": {},
        }
    )
    meta.namespaces = list(namespaces)
    meta.dead_as_of = dead_as_of
    return assemble(
        meta,
        row_ids=np.concatenate([seg.row_ids, row_ids]),
        row_blob=np.concatenate([seg.row_blob, row_blob]).astype(np.int32),
        row_ns=np.concatenate([seg.row_ns, row_ns]).astype(np.int32),
        row_len=np.concatenate([seg.row_len, row_len]).astype(np.uint32),
        vec_i8=np.concatenate([seg.vec_i8, vec_i8]),
        blob_ids=[*(bytes(b).decode("ascii") for b in seg.blob_ids), *new_blobs],
        dead=dead,
        post_row=np.concatenate([seg.post_row, post_row]).astype(np.int32),
        post_key=np.concatenate([old_keys, post_key]).astype(np.uint64),
        post_tf=np.concatenate([seg.post_tf, post_tf]).astype(np.uint16),
        ann=ann,
        ann_min_rows=ann_min_rows,
    )


def assemble(
    meta: Meta,
    *,
    row_ids: np.ndarray,
    row_blob: np.ndarray,
    row_ns: np.ndarray,
    row_len: np.ndarray,
    vec_i8: np.ndarray,
    blob_ids: list[str],
    dead: np.ndarray,
    post_row: np.ndarray,
    post_key: np.ndarray,
    post_tf: np.ndarray,
    ann: object | None,
    ann_min_rows: int,
) -> Segment:
    """Sort postings into CSR form, index blob ids, and build the graph if missing."""
    n = len(row_ids)
    blob_arr = np.array(blob_ids, dtype="S64") if blob_ids else np.zeros(0, dtype="S64")
    blob_order = np.argsort(blob_arr, kind="stable")
    # Stable: postings arrive in row order, so each term's rows stay ascending.
    by_term = np.argsort(post_key, kind="stable")
    term_keys, starts = np.unique(post_key[by_term], return_index=True)
    meta.rows = n
    meta.high_water = int(row_ids[-1]) if n else 0
    meta.ids_crc = zlib.crc32(np.ascontiguousarray(row_ids).tobytes())
    seg = Segment(
        meta=meta,
        row_ids=np.ascontiguousarray(row_ids, dtype=np.int64),
        row_blob=np.ascontiguousarray(row_blob, dtype=np.int32),
        row_ns=np.ascontiguousarray(row_ns, dtype=np.int32),
        row_len=np.ascontiguousarray(row_len, dtype=np.uint32),
        vec_i8=np.ascontiguousarray(vec_i8, dtype=np.int8),
        blob_ids=blob_arr,
        blob_keys=blob_arr[blob_order],
        blob_sorted=blob_order.astype(np.int32),
        dead=np.asarray(dead, dtype=bool),
        term_keys=term_keys.astype(np.uint64),
        term_off=np.append(starts, len(post_key)).astype(np.int64),
        post_row=np.ascontiguousarray(post_row[by_term], dtype=np.int32),
        post_tf=np.ascontiguousarray(post_tf[by_term], dtype=np.uint16),
    )
    if ann is None and n >= ann_min_rows:
        ann = build_ann(seg.vec_i8)
    seg.ann = ann
    meta.ann = ann is not None
    return seg


def usearch_index() -> Any:
    """usearch's ``Index`` class, with onnxruntime loaded first.

    Imported after usearch, onnxruntime crashes the process (a segmentation fault
    while it loads: their native libraries clash; usearch 2.26.6, onnxruntime 1.2x),
    and the embedder loads it lazily — after a merge or a segment open may have
    imported usearch. So usearch is only ever imported through here.
    """
    with contextlib.suppress(ImportError):
        import onnxruntime  # noqa: F401
    from usearch.index import Index

    return Index


def usearch_exact_search() -> Any:
    """usearch's exact search function (imported as :func:`usearch_index` says)."""
    usearch_index()
    from usearch.index import search

    return search


def build_ann(vec_i8: np.ndarray) -> object:
    Index = usearch_index()
    index = Index(
        ndim=vec_i8.shape[1],
        metric="cos",
        dtype="i8",
        connectivity=ANN_CONNECTIVITY,
        expansion_add=ANN_EXPANSION_ADD,
        expansion_search=ANN_EXPANSION_SEARCH,
    )
    index.add(np.arange(len(vec_i8), dtype=np.uint64), vec_i8, threads=os.cpu_count() or 1)
    return index


def private_dir(path: Path) -> None:
    """Create ``path`` (and its parents) readable by this user only.

    Segments hold what search needs: int8 vectors that confirm a guessed text through the
    public model, and keyed term postings (docs/security.md). They are as sensitive as the
    data itself, so every directory of the index is 0700 and every file 0600, whatever the
    process umask.
    """
    missing = [p for p in (path, *path.parents) if not p.exists()]
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    for p in (path, *missing):
        os.chmod(p, 0o700)


def save(seg: Segment, root: Path) -> Path:
    """Write ``seg`` as a new generation under ``root`` and publish it; returns its dir."""
    private_dir(root)
    name = f"gen-{seg.meta.generation}-{seg.meta.high_water}-{os.getpid()}-{os.urandom(3).hex()}"
    tmp = root / f".{name}"
    tmp.mkdir(mode=0o700)
    os.chmod(tmp, 0o700)
    sizes: dict[str, int] = {}
    for array in _ARRAYS:
        path = tmp / f"{array}.npy"
        np.save(path, getattr(seg, array), allow_pickle=False)
        sizes[path.name] = path.stat().st_size
    if seg.ann is not None:
        ann_path = tmp / "ann.usearch"
        seg.ann.save(str(ann_path))  # type: ignore[attr-defined]
        sizes["ann.usearch"] = ann_path.stat().st_size
    # The large files' mtime goes two seconds into the past: any later write sets it to
    # the present, so the stamp below cannot miss one made in the tick it was taken in.
    past = (time.time_ns() // 10**9 - 2) * 10**9
    large = [file for file in LARGE_FILES if file in sizes]
    for file in large:
        os.utime(tmp / file, ns=(past, past))
    seg.meta.sizes = sizes
    seg.meta.checksums = {file: integrity.file_checksum(tmp / file) for file in sizes}
    (tmp / "meta.json").write_text(json.dumps(asdict(seg.meta)))
    for path in tmp.iterdir():
        os.chmod(path, 0o600)
        _fsync(path)
    identities = {file: integrity.identity(tmp / file) for file in large}
    integrity.stamp(tmp, seg.meta.checksums, identities, time.time_ns())
    final = root / name
    tmp.rename(final)
    pointer = root / f".CURRENT.{os.getpid()}.{os.urandom(3).hex()}"
    pointer.write_text(name)
    os.chmod(pointer, 0o600)
    _fsync(pointer)
    pointer.replace(root / "CURRENT")
    _fsync(root)
    seg.path = final
    _drop_old(root, keep=name)
    return final


def current(root: Path) -> Path | None:
    """The published generation's directory, if any."""
    try:
        name = (root / "CURRENT").read_text().strip()
    except OSError:
        return None
    path = root / name
    return path if name and path.is_dir() else None


def open_segment(
    path: Path,
    *,
    account_id: str,
    model: str,
    dim: int,
    analyzer: int,
    verify_inline_bytes: int = VERIFY_INLINE_BYTES,
) -> Segment:
    """Map a generation's files; raises SegmentInvalid if anything does not match.

    The small files are hashed and range-checked here; the large ones are trusted by
    the host's stamp, hashed here if small enough, or left ``pending`` (see the module
    doc) — then the graph is not loaded until ``verify_pending`` passes.
    """
    try:
        raw = json.loads((path / "meta.json").read_text())
        meta = Meta(**raw)
    except (OSError, ValueError, TypeError) as exc:
        raise SegmentInvalid(f"unreadable meta.json: {exc}") from exc
    if meta.format != FORMAT and meta.format not in LEGACY_FORMATS:
        raise SegmentInvalid(f"format {meta.format}, expected {FORMAT}", stale=True)
    if (meta.account_id, meta.model, meta.dim, meta.analyzer) != (account_id, model, dim, analyzer):
        raise SegmentInvalid(
            f"built for {meta.account_id}/{meta.model}/{meta.dim}/analyzer {meta.analyzer}",
            stale=True,
        )
    legacy = meta.format != FORMAT
    if not legacy and set(meta.checksums) != set(meta.sizes):
        raise SegmentInvalid("meta.json's checksums do not name its files")
    identity: dict[str, list[int]] = {}
    for name, size in {**meta.sizes, "meta.json": -1}.items():
        try:
            identity[name] = integrity.identity(path / name)
        except OSError as exc:
            raise SegmentInvalid(f"{name} missing") from exc
        if size >= 0 and identity[name][0] != size:
            raise SegmentInvalid(f"{name} is {identity[name][0]} bytes, expected {size}")
    if not legacy:
        _verify(path, meta, [n for n in meta.sizes if n not in LARGE_FILES])
    arrays: dict[str, np.ndarray] = {}
    try:
        for name in _ARRAYS:
            file = path / f"{name}.npy"
            arrays[name] = (
                np.load(file, allow_pickle=False)
                if name == "dead"  # a private, writable copy
                else np.load(file, mmap_mode="r", allow_pickle=False)
            )
    except (OSError, ValueError) as exc:
        raise SegmentInvalid(f"unreadable arrays: {exc}") from exc
    problems = integrity.array_problems(
        arrays, rows=meta.rows, dim=meta.dim, namespaces=len(meta.namespaces)
    )
    if problems:
        raise SegmentInvalid(f"arrays out of shape, range or order: {', '.join(problems)}")
    if legacy and zlib.crc32(np.ascontiguousarray(arrays["row_ids"]).tobytes()) != meta.ids_crc:
        raise SegmentInvalid("row ids do not match their checksum")
    pending: list[str] = []
    if not legacy:
        large = [n for n in LARGE_FILES if n in meta.sizes]
        vouched = integrity.vouched(path, meta.checksums, large)
        pending = [n for n in large if n not in vouched]
        if pending and sum(meta.sizes[n] for n in pending) <= verify_inline_bytes:
            _verify(path, meta, pending)
            pending = []
    seg = Segment(meta=meta, path=path, identity=identity, pending=tuple(pending), **arrays)  # type: ignore[arg-type]
    if meta.ann and "ann.usearch" not in pending:
        seg.ann = _open_graph(path, meta.rows, dim)
    return seg


def _open_graph(path: Path, rows: int, dim: int) -> object:
    try:
        ann = usearch_index().restore(str(path / "ann.usearch"), view=True)
    except Exception as exc:  # usearch raises plain RuntimeError/ValueError
        raise SegmentInvalid(f"unreadable ann.usearch: {exc}") from exc
    if ann is None or len(ann) != rows or ann.ndim != dim:
        raise SegmentInvalid("ann.usearch does not match the rows")
    ann.expansion_search = ANN_EXPANSION_SEARCH
    return ann


def _verify(path: Path, meta: Meta, names: Iterable[str]) -> None:
    wrong = integrity.verify(path, meta.checksums, names)
    if wrong is not None:
        raise SegmentInvalid(wrong)


def _drop_old(root: Path, keep: str) -> None:
    """Remove other generations. Safe while readers map them: on POSIX an unlinked
    file's pages stay valid until the last mapping goes away."""
    for path in root.iterdir():
        if path.name in (keep, "CURRENT", "lock") or path.name.startswith(".CURRENT"):
            continue
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


__all__ = [
    "ANN_MIN_ROWS",
    "FORMAT",
    "Meta",
    "Segment",
    "SegmentInvalid",
    "build",
    "current",
    "open_segment",
    "quantise",
    "save",
]
