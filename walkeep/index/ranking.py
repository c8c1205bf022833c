"""How recall ranks: BM25 for words, cosine for meaning, one blended score. Pure.

``score`` in a recall hit is always in [0, 1], higher is better:

* ``dense`` — the embedding's cosine similarity, clipped at 0.
* ``lexical`` — BM25 divided by the BM25 of a document of average length that
  holds every query term once, capped at 1: the share of the query a memory
  matches, weighted by how rare each matched word is (repeats and short texts
  can only bring a partial match up to 1).
* ``hybrid`` (the default) — ``DENSE_WEIGHT · dense + (1 − DENSE_WEIGHT) · lexical``
  over the union of both rankings' candidates, each candidate scored by both.

A weighted sum rather than reciprocal-rank fusion because it keeps a score a
caller can threshold (``min_score``) and it ranked better on our benchmark
(bench/recall_quality.py, tuned on its dev half only; README "Recall quality").
"""

from __future__ import annotations

from typing import Literal

import numpy as np

Ranking = Literal["hybrid", "dense", "lexical"]
RANKINGS: tuple[Ranking, ...] = ("hybrid", "dense", "lexical")

# BM25 (Robertson/Lucene): term-frequency saturation and length normalisation.
K1 = 1.2
B = 0.75
# Tuned on the dev half of bench/recall_quality.py (README, "Recall quality").
DENSE_WEIGHT = 0.5
# At most this many distinct query terms are scored; past it the most common (most
# postings in the account's index, lowest idf) are dropped first. Scoring a term costs
# its postings: a 4,096-character query has ~170 distinct terms, and at 100,000
# memories its BM25 took 12.3 ms (5.6 capped; a question's 1.2). LoCoMo's 1,536
# questions (bench/recall_quality.py) have 5 distinct terms at the median, 10 at p99
# and 15 at most: 64 leaves every one of them whole, with four times the longest's room.
MAX_QUERY_TERMS = 64


def idf(df: np.ndarray | int, n: int) -> np.ndarray:
    """Lucene's BM25 idf, always positive: ``ln(1 + (N − df + ½) / (df + ½))``."""
    d = np.asarray(df, dtype=np.float64)
    return np.log1p((n - d + 0.5) / (d + 0.5))


def tf_weight(
    tf: np.ndarray, doc_len: np.ndarray, avg_len: float, scale: float = 1.0
) -> np.ndarray:
    """BM25's saturating term-frequency factor, in [0, K1 + 1), times ``scale``.

    In float32, in place: a question's words hold ~100,000 postings at a million
    memories, and float64 temporaries doubled the memory traffic of scoring them.
    Scores are shown to four places; float32 keeps seven.
    """
    t = tf.astype(np.float32)
    norm = doc_len.astype(np.float32)
    norm *= np.float32(K1 * B / max(avg_len, 1e-9))
    norm += np.float32(K1 * (1.0 - B))
    norm += t
    t *= np.float32(scale * (K1 + 1.0))
    t /= norm
    return t


def kept_terms(df: np.ndarray, cap: int = MAX_QUERY_TERMS) -> np.ndarray:
    """Which query terms to score (a mask), given each one's document frequency.

    All of them if at most ``cap`` occur anywhere; else the ``cap`` rarest that occur
    (ties: the earlier) and those that occur nowhere — they cost nothing to score and
    still count in the ideal (matching one word of three is a third of the query).
    """
    df = np.asarray(df, dtype=np.int64)
    keep = np.ones(len(df), dtype=bool)
    found = np.flatnonzero(df > 0)
    if len(found) > cap:
        by_commonness = found[np.argsort(df[found], kind="stable")]
        keep[by_commonness[cap:]] = False
    return keep


def ideal(idfs: np.ndarray) -> float:
    """BM25 of an average-length document holding each query term once (tf weight 1)."""
    return float(np.sum(idfs))


def fuse(cos: np.ndarray, lexical: np.ndarray, ranking: Ranking) -> np.ndarray:
    """The score in [0, 1] of candidates with cosine ``cos`` and normalised BM25 ``lexical``."""
    dense = np.clip(cos, 0.0, 1.0)
    lex = np.clip(lexical, 0.0, 1.0)
    if ranking == "dense":
        return dense
    if ranking == "lexical":
        return lex
    return DENSE_WEIGHT * dense + (1.0 - DENSE_WEIGHT) * lex


__all__ = [
    "DENSE_WEIGHT",
    "K1",
    "MAX_QUERY_TERMS",
    "RANKINGS",
    "B",
    "Ranking",
    "fuse",
    "ideal",
    "idf",
    "kept_terms",
    "tf_weight",
]
