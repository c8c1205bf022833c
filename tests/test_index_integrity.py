"""Damaged index files are detected, not served (walkeep/index/segment.py, search.py).

Same-size damage to a segment's files — postings or blob codes out of range, flipped
dead flags, shuffled arrays, a flipped byte in the vectors or the graph — made every
recall of the account fail with INTERNAL, or answer nothing or a wrong ranking, until
``walkeep index rebuild``. Each kind of damage here, at rest (found when a process opens
the segment) and under a running process (its files written to in place, seen through
the mapping), must leave recall answering exactly as the undamaged index did, with the
segment rebuilt from the database, a warning logged and the rebuild counted.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.helpers import account, land_all
from walkeep import metrics
from walkeep.clock import ManualClock
from walkeep.index import integrity
from walkeep.index import segment as seglib
from walkeep.index.search import SearchIndex
from walkeep.service import sealed
from walkeep.service.runtime import Runtime
from walkeep.service.tools import forget, recall, store

PEOPLE = ["Marta", "Jonas", "Priya", "Kenji", "Aisha", "Tomasz", "Lucia"]
THINGS = ["lantern", "kettle", "ladder", "bicycle", "piano", "telescope", "canoe", "drum"]
PLACES = ["Oslo", "Lisbon", "Nairobi", "Quito", "Hanoi", "Tbilisi", "Perth", "Dakar", "Riga"]
N = 80
QUERIES: list[tuple[str, str | None]] = [
    ("ticket T-1012", None),
    ("Who moved the lantern to Oslo?", None),
    ("Marta telescope Lisbon", "home"),
    ("kettle Tbilisi", "work"),
    ("which bicycle went to Hanoi", None),
    ("T-1045", "home"),
]


def _text(i: int) -> str:
    return (
        f"Note {i}: {PEOPLE[i % 7]} moved the {THINGS[i % 8]} to {PLACES[i % 9]} "
        f"(ticket T-{1000 + i})."
    )


def _answers(rt: Runtime, acct: str) -> list[list[tuple[str, float]]]:
    return [
        [
            (h.blob_id, h.score)
            for h in recall.recall(rt, acct, query=q, namespace=ns, limit=8).results
        ]
        for q, ns in QUERIES
    ]


class Deployment:
    """One account of N memories in two namespaces, some forgotten, its segment (with
    a graph) on disk, and the answers the undamaged index gives."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.acct = account(rt, credits=1000)
        ids = [
            store.store(
                rt,
                self.acct,
                content=_text(i),
                request_id=f"r{i}",
                namespace="work" if i % 2 else "home",
            ).memory_id
            for i in range(N)
        ]
        land_all(rt)
        for i in range(3, N, 7):  # dead blobs for the dead flags
            forget.forget(rt, self.acct, memory_id=ids[i], request_id=f"f{i}")
        self.index: SearchIndex = rt.relayer.index  # type: ignore[attr-defined]
        self.index.ann_min_rows = 50
        self.index.background = False
        assert self.index.merge(self.acct)
        self.index.clear_cache()
        self.path = self.current()
        assert self.path is not None and json.loads((self.path / "meta.json").read_text())["ann"]
        self.expected = _answers(rt, self.acct)
        assert all(self.expected) and self.current() == self.path

    def current(self) -> Path | None:
        return seglib.current(self.index.directory(self.acct))

    def answers(self) -> list[list[tuple[str, float]]]:
        return _answers(self.rt, self.acct)


@pytest.fixture
def dep(rt: Runtime) -> Deployment:
    return Deployment(rt)


def _rebuilds(reason: str) -> float:
    return metrics.INDEX_REBUILDS.labels(reason=reason)._value.get()


# --- kinds of damage, each the size the file had ---------------------------------------


def _array(path: Path, name: str) -> np.ndarray:
    return np.load(path / f"{name}.npy", mmap_mode="r+")


def postings_out_of_range(path: Path) -> None:
    a = _array(path, "post_row")
    a[len(a) // 2] = len(np.load(path / "row_ids.npy")) + 7
    a.flush()


def blob_codes_out_of_range(path: Path) -> None:
    a = _array(path, "row_blob")
    a[len(a) // 3] = len(np.load(path / "blob_ids.npy")) + 3
    a.flush()


def dead_flags_flipped(path: Path) -> None:
    a = _array(path, "dead")
    a[:] = ~a
    a.flush()


def postings_shuffled(path: Path) -> None:
    a = _array(path, "post_row")
    a[:] = np.random.default_rng(1).permutation(np.asarray(a))
    a.flush()


def vectors_shuffled(path: Path) -> None:
    a = _array(path, "vec_i8")
    a[:] = np.asarray(a)[np.random.default_rng(2).permutation(len(a))]
    a.flush()


def blob_ids_shuffled(path: Path) -> None:
    """Every code still in range; each row now names another row's blob."""
    a = _array(path, "blob_ids")
    order = np.roll(np.arange(len(a)), 1)
    a[:] = np.asarray(a)[order]
    a.flush()


def graph_byte_flipped(path: Path) -> None:
    file = path / "ann.usearch"
    data = bytearray(file.read_bytes())
    data[len(data) // 2] ^= 0x5A
    _overwrite(file, bytes(data))


def vector_byte_flipped(path: Path) -> None:
    file = path / "vec_i8.npy"
    data = bytearray(file.read_bytes())
    data[-100] ^= 0x7F
    _overwrite(file, bytes(data))


def file_truncated(path: Path) -> None:
    with open(path / "post_tf.npy", "r+b") as f:
        f.truncate(64)


def _overwrite(file: Path, data: bytes) -> None:
    """In place (same inode), as a stray write or a bad disk would."""
    with open(file, "r+b") as f:
        f.write(data)


SAME_SIZE: list[Callable[[Path], None]] = [
    postings_out_of_range,
    blob_codes_out_of_range,
    dead_flags_flipped,
    postings_shuffled,
    vectors_shuffled,
    blob_ids_shuffled,
    graph_byte_flipped,
    vector_byte_flipped,
]


@pytest.mark.parametrize("damage", [*SAME_SIZE, file_truncated], ids=lambda f: f.__name__)
def test_damage_at_rest_is_found_at_open_and_the_segment_rebuilt(
    dep: Deployment, damage: Callable[[Path], None], caplog: pytest.LogCaptureFixture
) -> None:
    assert dep.path is not None
    damage(dep.path)
    dep.index.clear_cache()  # a process that opens the segment after the damage
    before = _rebuilds("damaged")
    with caplog.at_level("WARNING", logger="walkeep.index.search"):
        assert dep.answers() == dep.expected
    rebuilt = dep.current()
    assert rebuilt is not None and rebuilt != dep.path
    assert "unusable" in caplog.text and "rebuilding" in caplog.text
    assert _rebuilds("damaged") == before + 1
    # The rebuilt generation is sound: a fresh open finds nothing wrong with it.
    dep.index.clear_cache()
    assert dep.answers() == dep.expected
    assert dep.current() == rebuilt and _rebuilds("damaged") == before + 1


@pytest.mark.parametrize("damage", SAME_SIZE, ids=lambda f: f.__name__)
def test_damage_under_a_running_process_is_found_and_the_segment_rebuilt(
    dep: Deployment, clock: ManualClock, damage: Callable[[Path], None]
) -> None:
    """The files are mapped: a write in place is what the next search would read."""
    assert dep.answers() == dep.expected  # the segment is open in this process
    assert dep.path is not None and dep.current() == dep.path
    damage(dep.path)
    before = _rebuilds("damaged")
    clock.advance(seconds=dep.index.refresh_seconds)
    assert dep.answers() == dep.expected
    rebuilt = dep.current()
    assert rebuilt is not None and rebuilt != dep.path
    assert _rebuilds("damaged") == before + 1


# --- what the checks at open cost, and what the host trusts -----------------------------


@pytest.fixture
def hashed(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    names: list[str] = []
    real = integrity.file_checksum

    def counting(path: Path) -> str:
        names.append(path.name)
        return real(path)

    monkeypatch.setattr(integrity, "file_checksum", counting)
    yield names


def test_the_large_files_are_trusted_by_their_stamp_and_checked_again_when_written_to(
    dep: Deployment, hashed: list[str]
) -> None:
    """At a million memories the vectors and the graph are ~1 GB: hashing them at every
    open would cost more than the first recall. Written by this host and untouched, they
    are trusted by their identity; written to in place, they are hashed again."""
    assert dep.path is not None
    dep.index.clear_cache()
    assert dep.answers() == dep.expected
    assert hashed and not set(hashed) & set(integrity.LARGE_FILES)  # the small files only
    hashed.clear()
    vec = dep.path / "vec_i8.npy"
    _overwrite(vec, vec.read_bytes())  # the same bytes: a write all the same
    dep.index.clear_cache()
    assert dep.answers() == dep.expected
    assert "vec_i8.npy" in hashed and dep.current() == dep.path  # hashed, found sound
    # Written this very second, it is not stamped (a write in the same tick could go
    # unseen): hashed again at the next open. Once its last write is older, it is.
    hashed.clear()
    dep.index.clear_cache()
    assert dep.answers() == dep.expected and "vec_i8.npy" in hashed
    past = vec.stat().st_mtime_ns - 5 * 10**9
    os.utime(vec, ns=(past, past))  # as if written five seconds ago
    dep.index.clear_cache()
    assert dep.answers() == dep.expected
    hashed.clear()
    dep.index.clear_cache()
    assert dep.answers() == dep.expected
    assert hashed and "vec_i8.npy" not in hashed


def test_a_stamp_never_vouches_for_a_file_written_in_its_own_clock_tick(tmp_path: Path) -> None:
    """A write in the tick a stamp was taken in may leave mtime and ctime as they were:
    the stamp only vouches for files last written a second or more before it."""
    file = tmp_path / "vec_i8.npy"
    file.write_bytes(b"x" * 100)
    sums = {file.name: integrity.file_checksum(file)}
    ident = integrity.identity(file)
    integrity.stamp(tmp_path, sums, {file.name: ident}, ident[2] + 10**6)
    assert integrity.vouched(tmp_path, sums, [file.name]) == set()
    integrity.stamp(tmp_path, sums, {file.name: ident}, ident[2] + 2 * 10**9)
    assert integrity.vouched(tmp_path, sums, [file.name]) == {file.name}
    file.write_bytes(b"y" * 100)
    assert integrity.vouched(tmp_path, sums, [file.name]) == set()


def test_large_files_unvouched_are_checked_in_the_background_without_the_graph(
    dep: Deployment, hashed: list[str]
) -> None:
    """Too large to hash at open (a million rows: ~1 GB), unvouched large files are hashed
    on a thread; until they pass, queries use exact search and no graph — a damaged graph
    file is never handed to usearch — and when they fail the segment is rebuilt."""
    assert dep.path is not None
    dep.index.verify_inline_bytes = 0
    dep.index.background = True
    (dep.path / integrity.STAMP).unlink()
    started = threading.Event()
    go_on = threading.Event()
    real_verify = seglib.Segment.verify_pending

    def held(seg: seglib.Segment) -> None:
        started.set()
        assert go_on.wait(30)
        real_verify(seg)

    try:
        seglib.Segment.verify_pending = held  # type: ignore[method-assign]
        dep.index.clear_cache()
        assert dep.answers() == dep.expected  # answered while the check is under way
        assert started.wait(30)
        shard = dep.index.shard(dep.acct)
        assert shard.segment is not None and shard.segment.ann is None
        assert shard.segment.pending == tuple(integrity.LARGE_FILES)
        go_on.set()
        _join("index-verify-")
        assert shard.segment.ann is not None and shard.segment.pending == ()
        assert json.loads((dep.path / integrity.STAMP).read_text()).keys() == set(
            integrity.LARGE_FILES
        )
        # Damage found the same way: the next query rebuilds the segment.
        go_on.clear()
        started.clear()
        graph_byte_flipped(dep.path)
        dep.index.clear_cache()
        before = _rebuilds("damaged")
        assert dep.answers() == dep.expected
        assert started.wait(30)
        go_on.set()
        _join("index-verify-")
        assert dep.index.shard(dep.acct).segment.failed is None  # type: ignore[union-attr]
        assert dep.answers() == dep.expected
        assert dep.current() != dep.path and _rebuilds("damaged") == before + 1
    finally:
        go_on.set()
        seglib.Segment.verify_pending = real_verify  # type: ignore[method-assign]
        _join("index-")


def _join(prefix: str) -> None:
    for t in threading.enumerate():
        if t.name.startswith(prefix):
            t.join(60)
            assert not t.is_alive()


def test_a_merge_does_not_copy_damage_into_the_next_generation(dep: Deployment) -> None:
    """A merge extends the open segment's arrays and writes fresh checksums over them: it
    hashes every file first, and writes the generation anew from the rows if one fails."""
    assert dep.answers() == dep.expected  # open in this process
    assert dep.path is not None
    good = json.loads((dep.path / "meta.json").read_text())["checksums"]["vec_i8.npy"]
    vectors_shuffled(dep.path)
    before = _rebuilds("damaged")
    assert dep.index.merge(dep.acct)
    merged = dep.current()
    assert merged is not None and merged != dep.path
    assert json.loads((merged / "meta.json").read_text())["checksums"]["vec_i8.npy"] == good
    assert _rebuilds("damaged") == before + 1


def test_a_segment_from_before_checksums_is_served_and_rewritten_with_them(
    dep: Deployment, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An upgrade must not rebuild every account from the database at its first recall (at
    a million memories ~45 s, then the graph): a format-1 segment passes the range checks,
    answers, and a merge rewrites it with checksums."""
    assert dep.path is not None
    meta = json.loads((dep.path / "meta.json").read_text())
    meta["format"] = 1
    del meta["checksums"]
    (dep.path / "meta.json").write_text(json.dumps(meta))
    (dep.path / integrity.STAMP).unlink()
    loads: list[dict[str, Any]] = []
    real = dep.index.rows.load
    monkeypatch.setattr(dep.index.rows, "load", lambda *a, **k: loads.append(k) or real(*a, **k))
    before = {r: _rebuilds(r) for r in ("damaged", "stale")}
    dep.index.clear_cache()
    assert dep.answers() == dep.expected
    assert [k for k in loads if not k.get("above")] == []  # never re-read whole
    rewritten = dep.current()
    assert rewritten is not None and rewritten != dep.path
    assert json.loads((rewritten / "meta.json").read_text())["format"] == seglib.FORMAT
    assert {r: _rebuilds(r) for r in before} == before
    dep.index.clear_cache()
    assert dep.answers() == dep.expected


# --- a search that raises, an answer the database contradicts ---------------------------


def test_a_search_that_raises_rebuilds_the_segment(
    dep: Deployment, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Damage no check at open caught (bit rot under a valid stamp, a bug) must not make
    every recall of the account INTERNAL until someone runs `walkeep index rebuild`."""
    from walkeep.index.shard import Shard

    real = Shard.search
    failures = [IndexError("index 91 is out of bounds for axis 0 with size 80")]

    def search_once(self: Shard, *a: Any, **k: Any) -> Any:
        if failures:
            raise failures.pop()
        return real(self, *a, **k)

    monkeypatch.setattr(Shard, "search", search_once)
    before = _rebuilds("search_failed")
    with caplog.at_level("WARNING", logger="walkeep.index.search"):
        assert dep.answers() == dep.expected
    assert "a search raised IndexError" in caplog.text
    assert dep.current() != dep.path and _rebuilds("search_failed") == before + 1


def test_a_failing_embedding_is_not_taken_for_a_damaged_index(
    dep: Deployment, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(texts: list[str]) -> np.ndarray:
        raise RuntimeError("onnxruntime: out of memory")

    monkeypatch.setattr(dep.index.embedder, "embed", broken)
    before = _rebuilds("search_failed")
    with pytest.raises(RuntimeError, match="out of memory"):
        dep.index.search(dep.acct, None, "lantern Oslo", 5)
    assert dep.current() == dep.path and _rebuilds("search_failed") == before


def test_an_empty_answer_the_database_contradicts_is_rechecked(dep: Deployment) -> None:
    """A shard that believes every blob dead answers nothing; the database has visible
    memories with index rows it holds: it re-reads which blobs are dead and answers."""
    assert dep.answers() == dep.expected
    shard = dep.index.shard(dep.acct)
    with shard.lock:
        shard.reset_dead(np.ones_like(shard.dead))
    before = _rebuilds("contradicted")
    assert dep.answers() == dep.expected
    assert dep.current() == dep.path and _rebuilds("contradicted") == before  # no rebuild


def test_an_empty_answer_that_survives_the_recheck_rebuilds_the_segment(
    dep: Deployment,
) -> None:
    """A segment whose rows all say another namespace (damage no check caught) answers
    nothing in "home"; the re-check cannot mend it, so it is rebuilt from the rows."""
    assert dep.answers() == dep.expected
    shard = dep.index.shard(dep.acct)
    seg = shard.segment
    assert seg is not None
    with shard.lock:
        work = sealed.namespace_token(dep.rt, dep.acct, "work")
        seg.row_ns = np.full(seg.n, shard.ns_codes[work], dtype=np.int32)
        shard._cache.clear()
        shard._seg_cache.clear()
    before = _rebuilds("contradicted")
    assert dep.answers() == dep.expected
    assert dep.current() != dep.path and _rebuilds("contradicted") == before + 1


def test_an_empty_answer_the_database_agrees_with_costs_no_rebuild(
    rt: Runtime, dep: Deployment
) -> None:
    """Nothing visible in scope (all forgotten, an unknown namespace, a new account):
    empty is the right answer, and nothing is re-checked or rebuilt."""
    store.store(rt, dep.acct, content="a lone note about herons", request_id="h1", namespace="b")
    land_all(rt)
    (only,) = recall.recall(rt, dep.acct, query="herons", namespace="b").results
    forget.forget(rt, dep.acct, memory_id=only.blob_id, request_id="fh")
    before = {r: _rebuilds(r) for r in ("contradicted", "damaged", "search_failed")}
    path = dep.current()
    assert recall.recall(rt, dep.acct, query="herons", namespace="b").results == []
    assert recall.recall(rt, dep.acct, query="herons", namespace="nowhere").results == []
    assert recall.recall(rt, account(rt), query="herons").results == []
    assert dep.current() == path
    assert {r: _rebuilds(r) for r in before} == before


def test_index_files_are_owner_only_whatever_the_umask(rt: Runtime) -> None:
    """Segments hold vectors that confirm guesses through the public model: every
    directory under the index root is 0700 and every file 0600, even under umask 022."""
    old = os.umask(0o022)
    try:
        dep = Deployment(rt)
    finally:
        os.umask(old)
    root = dep.index.root
    seen = 0
    for path in [root, *root.rglob("*")]:
        mode = path.stat().st_mode & 0o777
        assert mode == (0o700 if path.is_dir() else 0o600), (path, oct(mode))
        seen += 1
    assert seen > 10  # the walk saw the generation's arrays, not an empty tree
