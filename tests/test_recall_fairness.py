"""A heavy recall is bounded and paid for: at most MAX_QUERY_TERMS distinct terms are
scored (the most common dropped first), and a long query counts as several calls
against the rate limit. Three parallel 4,096-character recalls tripled another tenant's
p50 on 2 cores: each scored every distinct word's postings and was charged one call.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import numpy as np
import pytest
from test_mcp_e2e import Server, call_ok, mcp_client, sc

from tests.helpers import vector_cipher
from walkeep.db import Database
from walkeep.errors import RateLimited
from walkeep.index import ranking as rk
from walkeep.index import terms as termlib
from walkeep.index.embedder import HashEmbedder
from walkeep.index.search import SearchIndex
from walkeep.service.operators import accounts
from walkeep.service.runtime import Runtime
from walkeep.service.tools import ratelimit

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
        vector_cipher,
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
        vector_cipher,
        root=tmp_path,
        ranking="lexical",
        background=False,
    )
    index.add_many([(acct, "default", f"b{j}", " ".join(WORDS[j:])) for j in range(len(WORDS))])
    # The 5 most common words: nothing is dropped below the cap.
    hits = index.search(acct, None, " ".join(WORDS[-5:]), len(WORDS))
    assert {b for b, _ in hits} == {f"b{j}" for j in range(len(WORDS))}


# --- what a recall costs against the rate limit ----------------------------------------


def test_a_recall_costs_one_call_per_128_bytes_of_query_up_to_eight() -> None:
    cost = ratelimit.call_cost
    assert cost("recall", {"query": "When did Caroline go to the support group?"}) == 1
    assert cost("recall", {"query": "x" * 255}) == 1
    assert cost("recall", {"query": "x" * 256}) == 2
    assert cost("recall", {"query": "x" * 1024}) == 8
    assert cost("recall", {"query": "x" * 4096}) == 8
    assert cost("recall", {"query": "記憶" * 128}) == 6  # 256 characters, 768 bytes
    assert cost("store", {"content": "x" * 4096}) == 1
    assert cost("check_balance", None) == 1


def test_long_recalls_empty_the_bucket_faster(rt: Runtime) -> None:
    """recall: 120 a minute, a bucket of 60. Seven 4,096-character recalls take 56 of it;
    the eighth waits for the 4 it lacks (2 s); a short one still fits."""
    acct = accounts.create_account(rt.db, "heavy").account_id
    long = {"query": "x" * 4096}
    for _ in range(7):
        ratelimit.charge_call(rt, acct, "recall", long)
    with pytest.raises(RateLimited) as refused:
        ratelimit.charge_call(rt, acct, "recall", long)
    assert refused.value.data["call_cost"] == 8
    assert refused.value.data["retry_after_seconds"] == 2
    for _ in range(4):
        ratelimit.charge_call(rt, acct, "recall", {"query": "herons"})
    with pytest.raises(RateLimited):
        ratelimit.charge_call(rt, acct, "recall", {"query": "herons"})


def test_a_cost_above_the_bucket_takes_a_full_bucket(rt: Runtime) -> None:
    """With recall at 5 a minute the bucket holds 5: a long recall must still be possible."""
    rt.settings.rate_limits = {"recall": 5}
    acct = accounts.create_account(rt.db, "slow").account_id
    ratelimit.charge_call(rt, acct, "recall", {"query": "x" * 4096})
    with pytest.raises(RateLimited) as refused:
        ratelimit.charge_call(rt, acct, "recall", {"query": "x"})
    assert refused.value.data["call_cost"] == 1


@pytest.fixture
def live(settings, clock, db) -> Iterator[Server]:  # type: ignore[no-untyped-def]
    with Server(settings, clock, db) as srv:
        yield srv


def test_a_long_recall_counts_as_several_calls_on_rest_and_mcp(live: Server) -> None:
    live.rt.settings.rate_limits = {"recall": 16}  # a bucket of 16: two long recalls
    long = "lantern " * 512
    a = accounts.create_account(live.rt.db, "rest", credits_mc=10_000).api_key
    with httpx.Client(base_url=live.url, timeout=30) as h:
        auth = {"Authorization": f"Bearer {a}"}
        codes = [
            h.post("/v1/recall", json={"query": long}, headers=auth).status_code for _ in range(2)
        ]
        assert codes == [200, 200]
        limited = h.post("/v1/recall", json={"query": long}, headers=auth)
        assert limited.status_code == 429
        assert limited.json()["data"]["call_cost"] == 8
        assert limited.json()["data"]["retry_after_seconds"] == 30
        live.rt.clock.advance(seconds=4)  # type: ignore[attr-defined]
        assert h.post("/v1/recall", json={"query": "lantern"}, headers=auth).status_code == 200

    b = accounts.create_account(live.rt.db, "mcp", credits_mc=10_000).api_key

    async def go() -> None:
        async with mcp_client(live, b) as c:
            await call_ok(c, "recall", {"query": long})
            await call_ok(c, "recall", {"query": long})
            r = await c.call_tool("recall", {"query": long})
            body = sc(r)
            assert r.is_error and body["code"] == "RATE_LIMITED"
            assert body["data"]["call_cost"] == 8

    anyio.run(go)
