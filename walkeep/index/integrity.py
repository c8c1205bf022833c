"""Is a segment file what was written? Checksums, the host's stamp, range checks.

Same-size damage to a segment's files (postings or blob codes out of range, flipped
dead flags, shuffled arrays, a flipped byte) used to be served: every recall of the
account raised, or answered nothing or a wrong ranking, until ``walkeep index
rebuild``. What ``walkeep/index/segment.py`` checks when, and what it costs:

* every file but the two large ones is hashed at every open and its arrays' codes
  are range-checked (postings' rows and blob, namespace and order codes within
  their arrays, term offsets and row ids in order): ~25 MB at 100,000 rows in
  1.3–2.5 ms from the page cache, so ~250 MB and ~15–25 ms at a million, on a first
  recall of ~250 ms. xxh3 reads 6–19 GB/s here; BLAKE2b or SHA-256 (~1 GB/s at
  best) would cost a first recall's worth again;
* the vectors and the graph (~1 GB of a million-row segment's 1.3) are hashed when
  written, and the host then trusts them by their identity (size, inode, mtime,
  ctime — any write changes mtime, which ``save`` set in the past, and ctime) as
  recorded in ``verified.json`` beside them. Files it does not vouch for (copied
  from elsewhere, restored, written to in place) are hashed again: at open if they
  are small (``VERIFY_INLINE_BYTES``), else on a background thread while queries
  use exact search and no graph — an unverified graph file is never handed to
  usearch, whose native code trusts its links. The vectors are in use meanwhile; a
  bad one can misrank until the check ends (104 MB in 17 ms from the page cache at
  100,000 rows; ~1 s from a cold disk at a million) and the segment is rebuilt.
  Hashing them at every open instead would add ~0.2 s to a first recall at a
  million memories from the page cache, ~1 s cold.

What this does not catch: bit rot under a valid stamp in the vectors or the graph
(the file's identity unchanged). The index's caller guards the rest
(``walkeep/index/search.py``): a search that raises rebuilds the segment, and an
empty answer the database contradicts is re-checked.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

# The vectors and the graph: hashed when written, then trusted by identity (above).
LARGE_FILES = ("vec_i8.npy", "ann.usearch")
# Unvouched large files up to this size are hashed at open (~25 ms from the page
# cache); larger ones on a background thread, the graph held back until they pass.
VERIFY_INLINE_BYTES = 128 * 2**20
STAMP = "verified.json"
# A stamp vouches for a file only if the file's mtime is older than the stamp by at
# least this: a write in the clock tick the stamp was taken in could leave it unchanged.
_RACY_NS = 1_000_000_000
_HASH_CHUNK = 2**20


def file_checksum(path: Path) -> str:
    """xxh3-128 of a file, through a mapping of its own that is closed after: no copy
    (read() into a buffer halved the speed: ~25 MB in 2.2 ms against 1.2), and the
    process is no more resident after than before (the page cache keeps the pages).
    Fed a mebibyte at a time, so a thread hashing a gigabyte lets others run between."""
    h = xxhash.xxh3_128()
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return h.hexdigest()
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            with contextlib.suppress(OSError, ValueError):
                mm.madvise(mmap.MADV_SEQUENTIAL)
            view = memoryview(mm)
            try:
                for at in range(0, size, _HASH_CHUNK):
                    h.update(view[at : at + _HASH_CHUNK])
            finally:
                view.release()
    return h.hexdigest()


def identity(path: Path) -> list[int]:
    """What a write, a replacement or a copy changes: size, inode, mtime, ctime (ns)."""
    st = path.stat()
    return [st.st_size, st.st_ino, st.st_mtime_ns, st.st_ctime_ns]


def verify(path: Path, checksums: Mapping[str, str], names: Iterable[str]) -> str | None:
    """Hash the files ``names`` under ``path`` against ``checksums``: what is wrong, or
    None. Large files that pass are stamped if no write can have slipped by (unchanged
    while hashed, last written more than a second before)."""
    names = list(names)
    started = time.time_ns()
    try:
        before = {n: identity(path / n) for n in names}
        for name in names:
            if file_checksum(path / name) != checksums.get(name):
                return f"{name} does not match its checksum"
        after = {n: identity(path / n) for n in names}
    except OSError as exc:
        return f"unreadable: {exc}"
    if after == before:
        stamp(path, checksums, {n: i for n, i in before.items() if n in LARGE_FILES}, started)
    return None


def vouched(path: Path, checksums: Mapping[str, str], names: Iterable[str]) -> set[str]:
    """Of ``names``, the files this host's stamp vouches for (see the module doc)."""
    try:
        files = dict(json.loads((path / STAMP).read_text()))
    except (OSError, ValueError, TypeError):
        return set()
    out: set[str] = set()
    for name in names:
        entry: Any = files.get(name)
        try:
            ident, at = list(entry["identity"]), int(entry["at"])
            same = entry["checksum"] == checksums.get(name) and ident == identity(path / name)
        except (OSError, KeyError, TypeError, ValueError):
            continue
        if same and ident[2] <= at - _RACY_NS:
            out.add(name)
    return out


def stamp(
    path: Path, checksums: Mapping[str, str], identities: Mapping[str, list[int]], at: int
) -> None:
    """Record that files of these identities were verified as of ``at`` (ns), beside the
    entries of other files the stamp still vouches for. Best effort: a read-only
    directory only means the files are hashed again at the next open."""
    files: dict[str, object] = {
        name: {"checksum": checksums[name], "identity": ident, "at": at}
        for name, ident in identities.items()
        if ident[2] <= at - _RACY_NS  # else a write in the same tick could go unseen
    }
    if not files:
        return
    with contextlib.suppress(OSError, ValueError, TypeError):
        old = dict(json.loads((path / STAMP).read_text()))
        for name in vouched(path, checksums, [n for n in old if n not in files]):
            files[name] = old[name]
    tmp = path / f".{STAMP}.{os.getpid()}.{os.urandom(3).hex()}"
    with contextlib.suppress(OSError):
        tmp.write_text(json.dumps(files))
        os.chmod(tmp, 0o600)  # owner-only, as every file of the index (segment.private_dir)
        tmp.replace(path / STAMP)


def array_problems(
    arrays: Mapping[str, np.ndarray], *, rows: int, dim: int, namespaces: int
) -> list[str]:
    """Shapes, and every code that indexes another array within it (one pass each:
    ~0.6 ms at 100,000 rows). A checksum proves a file is what was written; these
    prove what was written can be searched without raising or reading another row."""
    blobs = len(arrays["blob_ids"])
    terms = len(arrays["term_keys"])
    postings = len(arrays["post_row"])
    shapes_ok = (
        arrays["row_ids"].shape == (rows,)
        and arrays["row_blob"].shape == (rows,)
        and arrays["row_ns"].shape == (rows,)
        and arrays["row_len"].shape == (rows,)
        and arrays["vec_i8"].shape == (rows, dim)
        and arrays["term_off"].shape == (terms + 1,)
        and arrays["post_row"].shape == arrays["post_tf"].shape
        and arrays["dead"].shape == (blobs,)
        and arrays["blob_keys"].shape == (blobs,)
        and arrays["blob_sorted"].shape == (blobs,)
    )
    if not shapes_ok:
        return ["shapes"]
    off = arrays["term_off"]
    return [
        what
        for what, ok in (
            ("row blob codes", _within(arrays["row_blob"], blobs)),
            ("row namespace codes", _within(arrays["row_ns"], namespaces)),
            ("postings' rows", _within(arrays["post_row"], rows)),
            ("blob order", _within(arrays["blob_sorted"], blobs)),
            ("term offsets", int(off[0]) == 0 and int(off[-1]) == postings and _ascending(off)),
            ("term keys", _ascending(arrays["term_keys"], strict=True)),
            ("row ids", _ascending(arrays["row_ids"], strict=True)),
        )
        if not ok
    ]


def _within(codes: np.ndarray, bound: int) -> bool:
    return len(codes) == 0 or (int(codes.min()) >= 0 and int(codes.max()) < bound)


def _ascending(a: np.ndarray, *, strict: bool = False) -> bool:
    a = np.asarray(a)
    if len(a) < 2:
        return True
    return bool(np.all(a[1:] > a[:-1]) if strict else np.all(a[1:] >= a[:-1]))


__all__ = [
    "LARGE_FILES",
    "STAMP",
    "VERIFY_INLINE_BYTES",
    "array_problems",
    "file_checksum",
    "identity",
    "stamp",
    "verify",
    "vouched",
]
