"""Hybrid recall: the keyed lexical index beside the vectors, segments on disk, exactness.

Service-level tests store through ``store`` and land through the completer, as the
worker does; index-level tests drive ``SearchIndex`` directly with small thresholds so
the graph, merges and the byte bound are exercised on a few hundred rows.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy import func, select, update

from tests.helpers import account, database_bytes, land_all, vector_cipher
from walkeep.clock import ManualClock
from walkeep.db import Database
from walkeep.db.models import Embedding, IndexState
from walkeep.index import segment as seglib
from walkeep.index import terms as termlib
from walkeep.index.embedder import HashEmbedder
from walkeep.index.search import SearchIndex
from walkeep.service.jobs import reindex
from walkeep.service.operators import accounts
from walkeep.service.runtime import Runtime
from walkeep.service.tools import forget, recall, store

# --- the analyzer (pure) ----------------------------------------------------------------


def test_terms_stem_drop_stop_words_fold_accents_and_split_cjk() -> None:
    assert termlib.terms("The renewals were RENEWED by the worker") == [
        "renew",
        "renew",
        "worker",
    ]
    assert termlib.terms("ERR-4096 on wk_live_abc") == ["err", "4096", "wk", "live", "abc"]
    assert termlib.terms("Café crème") == termlib.terms("cafe creme")
    assert termlib.terms("Straße") == termlib.terms("STRASSE")
    # Other scripts are kept word by word (no English stemming); CJK runs become bigrams.
    assert termlib.terms("Москва слезам не верит") == ["москва", "слезам", "не", "верит"]
    assert termlib.terms("東京の会議") == ["東京", "京の", "の会", "会議"]
    assert termlib.terms("猫") == ["猫"]


def test_term_hashes_are_keyed_per_account() -> None:
    k1, k2 = b"1" * 32, b"2" * 32
    assert termlib.term_hash(k1, "walrus") == termlib.term_hash(k1, "walrus")
    assert termlib.term_hash(k1, "walrus") != termlib.term_hash(k2, "walrus")
    keys, tfs = termlib.term_vector(k1, "walrus walrus renewal")
    assert sorted(tfs.tolist()) == [1, 2] and list(keys) == sorted(keys)
    assert [a.tolist() for a in termlib.unpack(termlib.pack(keys, tfs))] == [
        keys.tolist(),
        tfs.tolist(),
    ]


# --- through the service ----------------------------------------------------------------


def _store(rt: Runtime, acct: str, texts: list[str], namespace: str = "default") -> list[str]:
    ids = [
        store.store(
            rt, acct, content=t, request_id=f"r-{namespace}-{i}-{hash(t)}", namespace=namespace
        ).memory_id
        for i, t in enumerate(texts)
    ]
    land_all(rt)
    return ids


def _recall(rt: Runtime, acct: str, query: str, limit: int = 5, **kw: Any) -> list[str]:
    return [h.content for h in recall.recall(rt, acct, query=query, limit=limit, **kw).results]


KEYS = [
    f"The deploy key for the staging cluster is {code}."
    for code in ("K-7731", "K-2210", "K-9034", "K-1187", "K-5526", "K-3049", "K-8812", "K-6603")
]


def test_lexical_finds_exact_identifiers_that_the_dense_model_blurs(rt: Runtime) -> None:
    acct = account(rt)
    _store(rt, acct, KEYS)
    index = rt.relayer.index  # type: ignore[attr-defined]
    dense_first, hybrid_first = 0, 0
    for text in KEYS:
        code = text.split()[-1].rstrip(".")
        index.ranking = "dense"
        dense_first += _recall(rt, acct, f"key {code}", 1) == [text]
        index.ranking = "hybrid"
        hybrid_first += _recall(rt, acct, f"key {code}", 1) == [text]
    assert hybrid_first == len(KEYS)
    assert dense_first < len(KEYS)  # what the lexical index adds


def test_scores_are_in_unit_range_and_min_score_filters(rt: Runtime) -> None:
    acct = account(rt)
    _store(rt, acct, [*KEYS, "Julia is on parental leave until March 2027."])
    for ranking in ("hybrid", "dense", "lexical"):
        rt.relayer.index.ranking = ranking  # type: ignore[attr-defined]
        hits = recall.recall(rt, acct, query="staging key K-7731", limit=10).results
        scores = [h.score for h in hits]
        assert hits and all(0.0 <= s <= 1.0 for s in scores) and scores == sorted(scores)[::-1]
        cut = scores[len(scores) // 2]
        kept = recall.recall(rt, acct, query="staging key K-7731", limit=10, min_score=cut)
        assert [h.score for h in kept.results] == [s for s in scores if s >= cut]


def test_other_languages_match_word_by_word(rt: Runtime) -> None:
    acct = account(rt)
    texts = [
        "Der Schlüssel liegt unter der Fußmatte vor der Haustür.",
        "東京の会議は火曜日の午後三時に始まります。",
        "La réunion budgétaire est reportée à jeudi.",
        "Ключ от гаража висит на гвозде в прихожей.",
        "The quarterly budget meeting moved to Thursday.",
    ]
    _store(rt, acct, texts)
    assert _recall(rt, acct, "Fußmatte", 1) == [texts[0]]
    assert _recall(rt, acct, "会議", 1) == [texts[1]]
    assert _recall(rt, acct, "reunion budgetaire", 1) == [texts[2]]
    assert _recall(rt, acct, "гаража", 1) == [texts[3]]


def test_forgotten_and_lapsed_memories_never_surface_and_leave_the_statistics(
    rt: Runtime, clock: ManualClock
) -> None:
    acct = account(rt)
    texts = [f"Zanzibar trip note {i}: ferry at {7 + i} am" for i in range(8)]
    ids = _store(rt, acct, texts)
    index = rt.relayer.index  # type: ignore[attr-defined]
    assert len(_recall(rt, acct, "Zanzibar ferry", 10)) == 8
    shard = index.shard(acct)
    live_before = shard._scope(None).live_rows
    for mid in ids[:3]:
        forget.forget(rt, acct, memory_id=mid, request_id=f"f-{mid}")
    # Hidden at once (recall checks every hit) ...
    got = _recall(rt, acct, "Zanzibar ferry", 5)
    assert len(got) == 5 and not set(got) & set(texts[:3])
    # ... and, after the index's refresh, out of its statistics too.
    clock.advance(seconds=2)
    shard = index.shard(acct)
    assert shard._scope(None).live_rows == live_before - 3
    # Lapse: past every blob's end_epoch nothing is shown.
    epoch = rt.chain.epoch_info().duration_seconds
    clock.advance(seconds=epoch * 60)
    assert _recall(rt, acct, "Zanzibar ferry", 10) == []


def test_namespaces_scope_ranking_and_statistics(rt: Runtime) -> None:
    acct = account(rt)
    _store(rt, acct, ["alpha project uses Postgres", "alpha launch is in May"], "work")
    _store(rt, acct, ["alpha the cat sleeps a lot"], "home")
    assert _recall(rt, acct, "alpha", 10, namespace="home") == ["alpha the cat sleeps a lot"]
    assert len(_recall(rt, acct, "alpha", 10, namespace="work")) == 2
    assert len(_recall(rt, acct, "alpha", 10)) == 3
    assert _recall(rt, acct, "alpha", 10, namespace="nowhere") == []


DISTINCTIVE = ["Quetzalcoatlus", "Brontosaurix", "zyxwvutsrq", "Pterodactylomancy"]


def test_no_readable_word_of_a_memory_is_in_the_database(rt: Runtime) -> None:
    acct = account(rt)
    texts = [f"{w} was seen near the {w.lower()}-lake on 3 May 2026" for w in DISTINCTIVE]
    _store(rt, acct, texts)
    for w, text in zip(DISTINCTIVE, texts, strict=True):
        assert _recall(rt, acct, w, 1) == [text]  # found by its word ...
    raw = database_bytes(rt).lower()
    assert len(raw) > 10_000
    for w in DISTINCTIVE:
        forms = {w.lower(), termlib.terms(w)[0], w.lower()[:8]}
        for form in forms:
            assert form.encode() not in raw, f"{form!r} is readable in the database"
            assert form.encode("utf-16-le") not in raw


# --- the index on disk ------------------------------------------------------------------


def _index(db: Database, root: Path, **kw: Any) -> SearchIndex:
    kw.setdefault("ranking", "lexical")  # HashEmbedder's "meaning" is only more keywords
    return SearchIndex(
        db,
        HashEmbedder(),
        lambda a: hashlib.sha256(a.encode()).digest(),
        vector_cipher,
        root=root,
        background=False,
        **kw,
    )


WORDS = [
    "walrus",
    "renewal",
    "epoch",
    "quilt",
    "ledger",
    "credit",
    "blob",
    "patch",
    "chain",
    "digest",
]


def _fill(index: SearchIndex, acct: str, n: int, start: int = 0, ns: str = "default") -> None:
    rng = np.random.default_rng(start)
    items = [
        (acct, ns, f"b{i}", " ".join(rng.choice(WORDS, 5)) + f" item{i}")
        for i in range(start, start + n)
    ]
    index.add_many(items)


def test_a_restart_opens_the_segment_instead_of_rebuilding(
    db: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    acct = accounts.create_account(db, "a").account_id
    first = _index(db, tmp_path, ann_min_rows=100)
    _fill(first, acct, 300)
    assert first.merge(acct)
    want = first.search(acct, None, "walrus item17", 5)
    assert want[0][0] == "b17"

    restarted = _index(db, tmp_path, ann_min_rows=100)
    loads: list[dict[str, Any]] = []
    real = restarted.rows.load
    monkeypatch.setattr(restarted.rows, "load", lambda *a, **k: loads.append(k) or real(*a, **k))
    assert restarted.search(acct, None, "walrus item17", 5) == want
    assert loads == []  # nothing re-read: the segment (with its graph) answered
    shard = restarted.shard(acct)
    assert shard.segment is not None and shard.segment.ann is not None
    # New rows after a restart are loaded on their own, not the whole account.
    _fill(first, acct, 5, start=300)
    assert restarted.search(acct, None, "item302", 1)[0][0] == "b302"
    assert [k.get("above") for k in loads] == [shard.segment.meta.high_water]


@pytest.mark.parametrize("damage", ["truncate", "other-model", "stale-generation"])
def test_a_damaged_or_stale_segment_is_detected_and_rebuilt(
    db: Database, tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    acct = accounts.create_account(db, "a").account_id
    index = _index(db, tmp_path)
    _fill(index, acct, 50)
    assert index.merge(acct)
    path = seglib.current(index.directory(acct))
    assert path is not None
    if damage == "truncate":
        with open(path / "vec_i8.npy", "r+b") as f:
            f.truncate(100)
    elif damage == "other-model":
        meta = (path / "meta.json").read_text().replace(index.model_id, "another-model")
        (path / "meta.json").write_text(meta)
    else:
        with db.begin() as s:
            s.add(
                IndexState(
                    account_id=acct, model=index.model_id, generation=7, updated_at=db.clock.now()
                )
            )
    fresh = _index(db, tmp_path)
    with caplog.at_level("INFO", logger="walkeep.index.search"):
        assert fresh.search(acct, None, "item7", 1)[0][0] == "b7"
    assert "rebuilding" in caplog.text
    rebuilt = seglib.current(fresh.directory(acct))
    assert rebuilt is not None and rebuilt != path


def test_a_segment_rebuilt_without_its_graph_gets_one_in_the_background(
    db: Database, tmp_path: Path
) -> None:
    """Regression: a segment rebuilt on first use (a damaged one here) answered at once
    with exact search and then kept no graph until merge_rows more rows arrived: at a
    million memories that was 127 ms per recall instead of ~25."""
    acct = accounts.create_account(db, "a").account_id
    index = _index(db, tmp_path, ann_min_rows=100, merge_rows=10_000)
    _fill(index, acct, 300)
    assert index.merge(acct)
    path = seglib.current(index.directory(acct))
    assert path is not None and json.loads((path / "meta.json").read_text())["ann"]
    with open(path / "ann.usearch", "r+b") as f:
        f.truncate(100)
    fresh = _index(db, tmp_path, ann_min_rows=100, merge_rows=10_000)
    assert fresh.search(acct, None, "walrus item17", 1)[0][0] == "b17"  # answered first
    rebuilt = seglib.current(fresh.directory(acct))
    assert rebuilt is not None and rebuilt != path
    assert json.loads((rebuilt / "meta.json").read_text())["ann"]  # and the graph followed
    assert fresh.search(acct, None, "walrus item17", 1)[0][0] == "b17"
    shard = fresh.shard(acct)
    assert shard.segment is not None and shard.segment.ann is not None


def test_merges_publish_generations_other_processes_pick_up(db: Database, tmp_path: Path) -> None:
    acct = accounts.create_account(db, "a").account_id
    writer = _index(db, tmp_path, merge_rows=40, ann_min_rows=60)
    reader = _index(db, tmp_path, merge_rows=10_000)
    _fill(writer, acct, 30)
    assert reader.search(acct, None, "item3", 1)[0][0] == "b3"
    _fill(writer, acct, 50, start=30)
    writer.search(acct, None, "item3", 1)  # 50 new rows ≥ merge_rows: merges (inline here)
    assert writer.shard(acct).n_delta == 0 and writer.shard(acct).segment.ann is not None
    assert reader.search(acct, None, "item77", 1)[0][0] == "b77"
    shard = reader.shard(acct)
    assert shard.n_delta == 0 and shard.n_seg == 80  # switched to the writer's generation
    # The next merge extends the graph in place: 80 rows kept, 45 added.
    _fill(writer, acct, 45, start=80)
    writer.search(acct, None, "item3", 1)
    seg = writer.shard(acct).segment
    assert seg is not None and seg.n == 125 and len(seg.ann) == 125  # type: ignore[arg-type]
    for i in (3, 79, 124):
        assert reader.search(acct, None, f"item{i}", 1)[0][0] == f"b{i}"


def _bm25_by_brute_force(
    rows: list[tuple[str, str, dict[int, int]]], dead: set[str], ns: str | None, q: list[int]
) -> dict[int, float]:
    """Each in-scope row's normalised BM25 for terms ``q``, by the book, row by row."""
    from walkeep.index import ranking as rk

    scope = [i for i, (b, n, _) in enumerate(rows) if b not in dead and (ns is None or n == ns)]
    lens = {i: sum(rows[i][2].values()) for i in scope}
    avg = sum(lens.values()) / len(scope)
    idfs = {t: float(rk.idf(sum(1 for i in scope if t in rows[i][2]), len(scope))) for t in q}
    ideal = sum(idfs.values())
    out: dict[int, float] = {}
    for i in scope:
        score = sum(
            idfs[t] * float(rk.tf_weight(np.array([rows[i][2][t]]), np.array([lens[i]]), avg)[0])
            for t in q
            if t in rows[i][2]
        )
        if score:
            out[i] = score / ideal
    return out


def _exact_segment(
    blob_ids: list[str], namespaces: list[str], row_terms: list[tuple[np.ndarray, np.ndarray]]
):  # type: ignore[no-untyped-def]
    """A segment of account "acct", rows 1…n with equal 4-d vectors, searched exactly."""
    n = len(blob_ids)
    return seglib.build(
        account_id="acct",
        model="m",
        dim=4,
        analyzer=termlib.ANALYZER_VERSION,
        generation=0,
        row_ids=np.arange(1, n + 1),
        blob_ids=blob_ids,
        namespaces=namespaces,
        vec_i8=np.ones((n, 4), dtype=np.int8),
        row_terms=row_terms,
        dead_blobs=set(),
        dead_as_of=0.0,
        ann_min_rows=10**9,
    )


def test_lexical_top_rows_and_scores_are_exact_bm25() -> None:
    """The accumulator path (walkeep/index/shard.py ``_lexical``) against BM25 computed row
    by row: segment + delta, dead blobs, namespaces, common and rare words; the same top
    rows (up to ties) and the same score for every candidate, query after query (the
    accumulator is reused, so a row left unzeroed would show up in the next query)."""
    from walkeep.index.rows import RowBatch
    from walkeep.index.shard import Shard

    rng = np.random.default_rng(7)
    vocab = 40
    weights = 1.0 / np.arange(1, vocab + 1)  # Zipf-like: term 0 common, term 39 rare
    weights /= weights.sum()

    def doc() -> dict[int, int]:
        words = rng.choice(vocab, size=int(rng.integers(1, 12)), p=weights)
        counts: dict[int, int] = {}
        for w in words.tolist():
            counts[w + 1] = counts.get(w + 1, 0) + 1
        return counts

    def term_arrays(d: dict[int, int]) -> tuple[np.ndarray, np.ndarray]:
        keys = sorted(d)
        return np.array(keys, dtype=np.uint64), np.array([d[k] for k in keys], dtype=np.uint16)

    n_seg, n_delta = 600, 150
    rows = [(f"blob{i // 3}", "ns-a" if i % 4 else "ns-b", doc()) for i in range(n_seg + n_delta)]
    seg = _exact_segment(
        [b for b, _, _ in rows[:n_seg]],
        [n for _, n, _ in rows[:n_seg]],
        [term_arrays(d) for _, _, d in rows[:n_seg]],
    )
    shard = Shard("acct", 4, 0, seg, None)
    shard.append(
        RowBatch(
            ids=np.arange(n_seg + 1, n_seg + n_delta + 1),
            blob_ids=[b for b, _, _ in rows[n_seg:]],
            namespaces=[n for _, n, _ in rows[n_seg:]],
            vectors=np.ones((n_delta, 4), dtype=np.float32) / 2,
            terms=[term_arrays(d) for _, _, d in rows[n_seg:]],
        )
    )
    dead: set[str] = set()
    for _round in range(3):
        for ns in (None, "ns-a", "ns-b"):
            scope = shard._scope(ns)
            assert scope is not None
            for _ in range(15):
                q = sorted({int(t) + 1 for t in rng.choice(vocab, size=int(rng.integers(1, 5)))})
                want = int(rng.integers(1, 30))
                truth = _bm25_by_brute_force(rows, dead, ns, q)
                also = np.array(sorted(rng.choice(len(rows), 10, replace=False)), dtype=np.int64)
                also = also[scope.ok[also]]
                with shard._lexical(np.array(q, dtype=np.uint64), scope, want) as lex:
                    top = lex.top_rows
                    if not truth:
                        assert len(top) == 0
                        continue
                    best = sorted(truth.values(), reverse=True)[: len(top)]
                    assert len(top) == min(want, len(truth))
                    assert list(top) == sorted(top)
                    got = lex.scores(top)
                    assert sorted(got, reverse=True) == pytest.approx(best, rel=1e-6)
                    assert lex.scores(also) == pytest.approx([truth.get(int(i), 0.0) for i in also])
        # Memories die between rounds: they leave the candidates and the statistics.
        for b in (f"blob{rng.integers(0, len(rows) // 3)}" for _ in range(40)):
            dead.add(b)
            shard.set_dead(b, True)
    assert not shard._acc.any()  # zeroed after every query


def test_a_long_memorys_chunks_do_not_hide_the_other_memories() -> None:
    """The best rows can all be chunks of one long memory: the cut widens until it names
    ``limit`` blobs. It stopped at the best 20 rows, so a search for 2 answered 1, and
    recall took "fewer hits than asked" for "no more" (a compacted quilt's memory, 246
    chunks beside its old copy's 246, went missing)."""
    from walkeep.index.shard import Shard

    word = np.array([1], dtype=np.uint64)
    rows = [("long", np.array([2], dtype=np.uint16))] * 100 + [
        ("short", np.array([1], dtype=np.uint16))
    ]
    seg = _exact_segment(
        [b for b, _ in rows], ["default"] * len(rows), [(word, tf) for _, tf in rows]
    )
    shard = Shard("acct", 4, 0, seg, None)
    got = shard.search(None, word, None, 2, "lexical")
    assert sorted(b for b, _ in got) == ["long", "short"]
    assert got[0][1] >= got[1][1] > 0
    assert sorted(b for b, _ in shard.search(None, word, None, 5, "lexical")) == ["long", "short"]


def test_the_graph_agrees_with_exact_search(
    db: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One build thread: usearch inserts in parallel otherwise, so the graph (and this
    # agreement, 0.96–1.0) changed with how the threads interleaved under CI's load.
    monkeypatch.setattr(seglib.os, "cpu_count", lambda: 1)
    acct = accounts.create_account(db, "a").account_id
    graph = _index(db, tmp_path / "g", ann_min_rows=100, ranking="dense")
    exact = _index(db, tmp_path / "e", ann_min_rows=10**9, ranking="dense")
    _fill(graph, acct, 600)
    graph.merge(acct)
    exact.merge(acct)
    assert graph.shard(acct).segment.ann is not None and exact.shard(acct).segment.ann is None
    agree = [
        len(
            {b for b, _ in graph.search(acct, None, q, 10)}
            & {b for b, _ in exact.search(acct, None, q, 10)}
        )
        / 10
        for q in (
            f"{a} {b} item{i}" for i, (a, b) in enumerate(zip(WORDS, WORDS[3:] * 2, strict=False))
        )
    ]
    assert np.mean(agree) >= 0.97, agree


def test_the_cache_is_bounded_in_bytes_across_accounts(db: Database, tmp_path: Path) -> None:
    accts = [accounts.create_account(db, f"u{i}").account_id for i in range(6)]
    probe = _index(db, tmp_path / "probe")
    _fill(probe, accts[0], 40)
    one = probe.shard(accts[0]).nbytes
    index = _index(db, tmp_path, cache_bytes=int(one * 2.5))
    for a in accts[1:]:
        _fill(index, a, 40)
    for _ in range(2):
        for a in accts:
            index.search(a, None, "walrus", 3)
            info = index.cache_info()
            assert info["bytes"] <= int(one * 2.5) and info["shards"] <= 2


def test_rebuild_backfills_terms_of_old_rows_and_resumes(rt: Runtime) -> None:
    acct = account(rt)
    texts = [f"Invoice {n} was paid by Okonkwo Ltd" for n in (4411, 5522, 6633)]
    _store(rt, acct, texts)
    index = rt.relayer.index  # type: ignore[attr-defined]
    with rt.db.begin() as s:  # rows as an older version wrote them
        s.execute(update(Embedding).values(terms=None))
    rt.relayer.index.clear_cache()  # type: ignore[attr-defined]
    index.ranking = "lexical"
    assert _recall(rt, acct, "Okonkwo 5522", 3) == []
    assert reindex.missing_terms(rt) == 3
    seen: list[tuple[str, int, int]] = []
    report = reindex.rebuild(rt, None, progress=lambda *a: seen.append(a))
    assert report.rows_backfilled == 3 and report.segments_written == 1
    assert seen[-1][1:] == (3, 3)
    assert reindex.missing_terms(rt) == 0
    assert _recall(rt, acct, "Okonkwo 5522", 1) == [texts[1]]
    with rt.db.read() as s:
        assert s.scalar(select(IndexState.generation).where(IndexState.account_id == acct)) == 1
    # Resumable / idempotent: a second run has nothing left to do.
    assert reindex.rebuild(rt, None).rows_backfilled == 0


def test_rebuild_reads_a_batchs_blobs_together_and_counts_the_unreadable(rt: Runtime) -> None:
    """The backfill reads a batch's blobs in one ``read_many`` (a Walrus aggregator
    overlaps them) instead of one round trip after another; a row whose blob cannot be
    read is counted, and its memory is indexed again from its own blob."""
    acct = account(rt)
    texts = [f"Ledger line {n} settled by Ababio & Sons" for n in (101, 202, 303, 404)]
    _store(rt, acct, texts)
    with rt.db.begin() as s:  # rows as an older version wrote them; one names a lost blob
        s.execute(update(Embedding).values(terms=None))
        first = s.scalar(select(Embedding.id).order_by(Embedding.id).limit(1))
        s.execute(update(Embedding).where(Embedding.id == first).values(blob_id="lost-blob"))
    asked: list[list[str]] = []
    real = rt.relayer.read_many

    def spy(account_id: str, blob_ids: list[str]) -> dict[str, str]:
        asked.append(list(blob_ids))
        return real(account_id, blob_ids)

    rt.relayer.read_many = spy  # type: ignore[method-assign]
    report = reindex.rebuild(rt, None)
    assert report.rows_backfilled == 4 and report.unreadable == 1
    assert len(asked[0]) == 4 and "lost-blob" in asked[0]  # the whole batch, in one call
    assert report.memories_indexed == 1 and len(asked) == 2  # the lost row's memory
    index = rt.relayer.index  # type: ignore[attr-defined]
    index.ranking = "lexical"
    assert _recall(rt, acct, "Ababio 101", 1) == [texts[0]]


def test_the_worker_backfill_job_says_what_it_did(
    rt: Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    acct = account(rt)
    _store(rt, acct, ["Okonkwo paid invoice 4411"])
    with rt.db.begin() as s:
        s.execute(update(Embedding).values(terms=None))
    with caplog.at_level("INFO", logger="walkeep.service.jobs.reindex"):
        report = reindex.backfill(rt)
    assert report.rows_backfilled == 1 and report.remaining == 0
    assert "search index backfill: 1 rows of 1 accounts got their terms, 0 remain" in caplog.text
    assert reindex.backfill(rt).rows_backfilled == 0


@pytest.mark.postgres
def test_sqlite_and_postgresql_rank_the_same(
    db: Database, sqlite_db: Database, tmp_path: Path
) -> None:
    results = []
    for i, database in enumerate((db, sqlite_db)):
        acct = accounts.create_account(database, "same").account_id
        index = SearchIndex(
            database,
            HashEmbedder(),
            lambda _a: b"k" * 32,
            vector_cipher,
            root=tmp_path / str(i),
            background=False,
        )
        _fill(index, acct, 200)
        results.append(
            [
                index.search(acct, None, q, 10)
                for q in ("walrus ledger", "item42 quilt", "epoch digest chain")
            ]
        )
    assert results[0] == results[1]


def test_a_crash_between_index_rows_and_the_memory_leaves_nothing_half_visible(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rows of a landing write are committed before its memory is registered: a
    crash in between shows nothing (the memory is not stored yet), and the retried
    landing registers it once, reusing the rows instead of writing a second set."""
    acct = account(rt)
    index = rt.relayer.index  # type: ignore[attr-defined]
    real = index.add_many

    def crash_after(items: Any) -> int:
        real(items)
        raise RuntimeError("power cut after the index rows")

    monkeypatch.setattr(index, "add_many", crash_after)
    store.store(rt, acct, content="Okonkwo's locker code is 4471", request_id="c1")
    with pytest.raises(RuntimeError):
        land_all(rt)
    with rt.db.read() as s:
        rows = s.scalar(select(func.count()).select_from(Embedding))
    assert rows == 1  # the rows are there ...
    assert _recall(rt, acct, "locker 4471", 5) == []  # ... and show nothing
    monkeypatch.setattr(index, "add_many", real)
    land_all(rt)
    hits = recall.recall(rt, acct, query="locker 4471", limit=5).results
    assert [h.content for h in hits] == ["Okonkwo's locker code is 4471"]
    with rt.db.read() as s:
        assert s.scalar(select(func.count()).select_from(Embedding)) == 1


def test_usearch_is_imported_so_that_onnxruntime_can_load_after_it() -> None:
    """Imported after usearch, onnxruntime crashed the process (a segmentation fault):
    a segment opened or merged before the embedder's first use would have killed it."""
    import sys

    code = (
        "from walkeep.index import segment; segment.usearch_index(); "
        "import onnxruntime; print('alive')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "alive", (out.returncode, out.stderr)


def test_the_question_is_embedded_while_the_shard_is_brought_up_to_date(
    db: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Embedding the question and the freshness round trip (then the words' BM25) are
    independent: they overlap, so a warm recall costs the longer, not the sum. The
    embedder here waits until the shard has asked the database for its newest row; run
    one after the other, it would wait in vain and the search would fail."""
    import threading

    from walkeep.index import search as searchlib

    acct = accounts.create_account(db, "a").account_id
    index = _index(db, tmp_path, ranking="hybrid")
    _fill(index, acct, 40)
    asked = threading.Event()
    real_head = index.rows.head

    def head(account_id: str) -> tuple[int, int]:
        asked.set()
        return real_head(account_id)

    class WaitsForTheShard(HashEmbedder):
        def embed(self, texts: Any) -> np.ndarray:
            if texts == ["walrus item7"]:
                assert asked.wait(timeout=30), "embedded before the shard was refreshed"
            return super().embed(texts)

    monkeypatch.setattr(index.rows, "head", head)
    index.embedder = WaitsForTheShard()
    assert index.search(acct, None, "walrus item7", 3)[0][0] == "b7"

    # Every helper busy: the asking thread embeds the question itself, same answer.
    gate = threading.Event()
    blockers = [searchlib._EMBED_POOL.submit(gate.wait) for _ in range(16)]
    try:
        asked.clear()
        index.embedder = HashEmbedder()
        assert index.search(acct, None, "walrus item7", 3)[0][0] == "b7"
    finally:
        gate.set()
        for b in blockers:
            b.result()

    class Broken(HashEmbedder):
        def embed(self, texts: Any) -> np.ndarray:
            raise RuntimeError("model gone")

    index.embedder = Broken()
    with pytest.raises(RuntimeError, match="model gone"):
        index.search(acct, None, "walrus item7", 3)
