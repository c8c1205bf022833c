"""A heavy recall is bounded and paid for: at most MAX_QUERY_TERMS distinct terms are
scored (the most common dropped first), and a long query counts as several calls
against the rate limit. Three parallel 4,096-character recalls tripled another tenant's
p50 on 2 cores: each scored every distinct word's postings and was charged one call.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from walkeep.db import Database
from walkeep.index import ranking as rk
from walkeep.index import terms as termlib
from walkeep.index.embedder import HashEmbedder
from walkeep.index.search import SearchIndex
from walkeep.service.operators import accounts

# --- the cap on scored terms -----------------------------------------------------------

WORDS = [f"w{i:03d}" for i in range(200)]
CAP = 64  # docs/recall.md: "a recall scores at most 64 distinct terms"


def _long_query() -> str:
    """4,096 characters naming all 200 words, over and over."""
    q = ""
    i = 0
    while len(q) + len(WORDS[0]) + 1 <= 4096:
        q += WORDS[i % len(WORDS)] + " "
        i += 1
    return q.ljust(4096)


def test_the_rarest_terms_are_kept_and_terms_found_nowhere_cost_nothing() -> None:
    df = np.array([0, 50, 3, 0, 7, 7, 1, 900])
    assert rk.kept_terms(df, cap=3).tolist() == [True, False, True, True, True, False, True, False]
    assert rk.kept_terms(df, cap=10).all()
    assert rk.MAX_QUERY_TERMS == CAP


@pytest.mark.parametrize("in_delta", [False, True], ids=["segment", "segment+delta"])
def test_a_4096_character_query_scores_at_most_the_cap_dropping_the_most_common(
    db: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, in_delta: bool
) -> None:
    """Word w_i is in memories b0 … b_i (document frequency i + 1). A query of all 200
    words scores only the 64 rarest (w000 … w063): memories holding none of them (b64 …
    b199, whose words are all common) get no lexical score at all."""
    acct = accounts.create_account(db, "wordy").account_id
    index = SearchIndex(
        db,
        HashEmbedder(),
        lambda a: hashlib.sha256(a.encode()).digest(),
        root=tmp_path,
        ranking="lexical",
        background=False,
    )
    docs = [(acct, "default", f"b{j}", " ".join(WORDS[j:])) for j in range(len(WORDS))]
    index.add_many(docs[:100] if in_delta else docs)
    assert index.merge(acct)
    if in_delta:
        index.add_many(docs[100:])  # rows after the segment: the shard's delta
    query = _long_query()
    assert len(query) == 4096 and len(set(termlib.terms(query))) == len(WORDS)

    scored: list[int] = []
    real = rk.tf_weight

    def counting(tf: np.ndarray, *a: Any, **k: Any) -> np.ndarray:
        scored.append(len(tf))  # the term's postings in scope: its document frequency
        return real(tf, *a, **k)

    monkeypatch.setattr(rk, "tf_weight", counting)
    hits = index.search(acct, None, query, len(WORDS))
    assert sorted(scored) == list(range(1, CAP + 1))
    assert {b for b, _ in hits} == {f"b{j}" for j in range(CAP)}
    if in_delta:
        assert index.shard(acct).n_delta == 100


def test_a_short_query_is_scored_whole(db: Database, tmp_path: Path) -> None:
    acct = accounts.create_account(db, "brief").account_id
    index = SearchIndex(
        db,
        HashEmbedder(),
        lambda a: hashlib.sha256(a.encode()).digest(),
        root=tmp_path,
        ranking="lexical",
        background=False,
    )
    index.add_many([(acct, "default", f"b{j}", " ".join(WORDS[j:])) for j in range(len(WORDS))])
    # The 5 most common words: nothing is dropped below the cap.
    hits = index.search(acct, None, " ".join(WORDS[-5:]), len(WORDS))
    assert {b for b, _ in hits} == {f"b{j}" for j in range(len(WORDS))}
