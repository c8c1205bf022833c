"""Text → keyed term hashes: the lexical index's analyzer. Pure: no database.

What BM25 needs of a document is term identity, term frequency and length
(``../shared/DESIGN.md`` §8), so the index never has to hold a word: each
normalised term is replaced by a 64-bit BLAKE2b MAC under a per-account key
(derived from the account's data key, like the content key). Equal words in
one account hash equally, so ranking is unchanged; equal words in two accounts
hash differently, and a stolen database reads as numbers.

Normalisation, in order:

1. NFKC, then case folding (``Straße`` and ``STRASSE`` meet).
2. Unicode word tokens: runs of letters and digits (``[^\\W_]+``), so ``ERR-4096``
   gives ``err`` and ``4096`` and other scripts still match word by word. Runs of
   CJK ideographs, kana or hangul, which are written without spaces, become
   overlapping character bigrams (a single character stays a unigram), as
   Lucene's CJK analyzer does.
3. Latin letters lose their accents (``café`` meets ``cafe``); other scripts are
   left as they are.
4. English stop words are dropped, then ASCII words are stemmed with Snowball's
   English stemmer (PyStemmer): ``renewals`` meets ``renewed``. Numbers and other
   scripts are not stemmed.

Changing any of this changes every hash: bump ``ANALYZER_VERSION`` and the index
is rebuilt (``walkeep index rebuild``).
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable
from functools import lru_cache

import numpy as np
import Stemmer

ANALYZER_VERSION = 1
# A term longer than this is cut: identifiers stay distinct, a base64 blob can't
# make one posting a kilobyte.
MAX_TERM_CHARS = 64
TF_MAX = 65_535  # term frequencies are stored as uint16

# English stop words (the classic SMART/Snowball short list, lower case). Dropped
# from documents and queries alike; they carry no ranking signal.
STOP_WORDS = frozenset(
    [
        "a",
        "about",
        "above",
        "after",
        "again",
        "against",
        "all",
        "am",
        "an",
        "and",
        "any",
        "are",
        "as",
        "at",
        "be",
        "because",
        "been",
        "before",
        "being",
        "below",
        "between",
        "both",
        "but",
        "by",
        "can",
        "could",
        "did",
        "do",
        "does",
        "doing",
        "down",
        "during",
        "each",
        "few",
        "for",
        "from",
        "further",
        "had",
        "has",
        "have",
        "having",
        "he",
        "her",
        "here",
        "hers",
        "herself",
        "him",
        "himself",
        "his",
        "how",
        "i",
        "if",
        "in",
        "into",
        "is",
        "it",
        "its",
        "itself",
        "just",
        "me",
        "more",
        "most",
        "my",
        "myself",
        "no",
        "nor",
        "not",
        "now",
        "of",
        "off",
        "on",
        "once",
        "only",
        "or",
        "other",
        "our",
        "ours",
        "ourselves",
        "out",
        "over",
        "own",
        "same",
        "she",
        "should",
        "so",
        "some",
        "such",
        "than",
        "that",
        "the",
        "their",
        "theirs",
        "them",
        "themselves",
        "then",
        "there",
        "these",
        "they",
        "this",
        "those",
        "through",
        "to",
        "too",
        "under",
        "until",
        "up",
        "very",
        "was",
        "we",
        "were",
        "what",
        "when",
        "where",
        "which",
        "while",
        "who",
        "whom",
        "why",
        "will",
        "with",
        "would",
        "you",
        "your",
        "yours",
        "yourself",
        "yourselves",
        "s",
        "t",
        "d",
        "ll",
        "m",
        "o",
        "re",
        "ve",
        "y",
    ]
)

_WORD = re.compile(r"[^\W_]+")
# Scripts written without spaces between words.
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]+")
_stemmer = Stemmer.Stemmer("english")


@lru_cache(maxsize=65_536)
def _fold(token: str) -> str:
    """Strip accents from Latin letters only; other scripts keep their marks."""
    if token.isascii():
        return token
    out: list[str] = []
    for ch in unicodedata.normalize("NFD", token):
        if unicodedata.combining(ch) and out and out[-1].isascii():
            continue
        out.append(ch)
    return unicodedata.normalize("NFC", "".join(out))


@lru_cache(maxsize=131_072)
def _normalise_word(word: str) -> str | None:
    word = _fold(word)
    if word in STOP_WORDS:
        return None
    if word.isascii() and word.isalpha():
        word = _stemmer.stemWord(word)
    return word[:MAX_TERM_CHARS]


def terms(text: str) -> list[str]:
    """The normalised terms of ``text``, in order, with repeats (see the module doc)."""
    out: list[str] = []
    for token in _WORD.findall(unicodedata.normalize("NFKC", text).casefold()):
        pos = 0
        for m in _CJK.finditer(token):
            if m.start() > pos:
                _add_word(out, token[pos : m.start()])
            run = m.group()
            if len(run) == 1:
                out.append(run)
            else:
                out.extend(run[i : i + 2] for i in range(len(run) - 1))
            pos = m.end()
        if pos < len(token):
            _add_word(out, token[pos:])
    return out


def _add_word(out: list[str], word: str) -> None:
    term = _normalise_word(word)
    if term:
        out.append(term)


def term_hash(key: bytes, term: str) -> int:
    """The keyed 64-bit hash of one normalised term (BLAKE2b MAC, little-endian)."""
    digest = hashlib.blake2b(term.encode("utf-8"), digest_size=8, key=key).digest()
    return int.from_bytes(digest, "little")


def hash_terms(key: bytes, words: Iterable[str]) -> np.ndarray:
    """Distinct keyed hashes of ``words``, sorted (uint64): a query's terms."""
    return np.unique(np.fromiter((term_hash(key, w) for w in set(words)), dtype=np.uint64))


def term_vector(key: bytes, text: str) -> tuple[np.ndarray, np.ndarray]:
    """A document's (sorted distinct term hashes uint64, frequencies uint16)."""
    counts = Counter(terms(text))
    if not counts:
        return np.zeros(0, dtype=np.uint64), np.zeros(0, dtype=np.uint16)
    pairs: dict[int, int] = {}
    for word, n in counts.items():
        h = term_hash(key, word)
        pairs[h] = pairs.get(h, 0) + n  # a 64-bit collision merges two terms' counts
    keys = np.fromiter(pairs.keys(), dtype=np.uint64, count=len(pairs))
    tfs = np.minimum(np.fromiter(pairs.values(), dtype=np.int64, count=len(pairs)), TF_MAX)
    order = np.argsort(keys)
    return keys[order], tfs[order].astype(np.uint16)


def pack(keys: np.ndarray, tfs: np.ndarray) -> bytes:
    """The ``embeddings.terms`` column: ``n`` little-endian uint64 hashes, then ``n`` uint16."""
    return np.asarray(keys, dtype="<u8").tobytes() + np.asarray(tfs, dtype="<u2").tobytes()


def unpack(data: bytes | None) -> tuple[np.ndarray, np.ndarray]:
    """Inverse of :func:`pack`; ``None`` or empty gives two empty arrays."""
    if not data:
        return np.zeros(0, dtype=np.uint64), np.zeros(0, dtype=np.uint16)
    if len(data) % 10:
        raise ValueError(f"a packed term vector is 10 bytes per term, got {len(data)} bytes")
    n = len(data) // 10
    keys = np.frombuffer(data, dtype="<u8", count=n).astype(np.uint64)
    tfs = np.frombuffer(data, dtype="<u2", count=n, offset=8 * n).astype(np.uint16)
    return keys, tfs


__all__ = [
    "ANALYZER_VERSION",
    "STOP_WORDS",
    "hash_terms",
    "pack",
    "term_hash",
    "term_vector",
    "terms",
    "unpack",
]
