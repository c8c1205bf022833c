"""Per-account, per-tool token buckets: one key cannot monopolise the server.

Every tool call takes tokens from its (account, tool) bucket before the
service function runs — one, except for a long ``recall`` (``call_cost``); a
bucket without enough is ``RATE_LIMITED`` with ``data.retry_after_seconds``. Buckets refill continuously at
``WALKEEP_RATE_LIMIT_PER_MINUTE`` (or the tool's entry in
``WALKEEP_RATE_LIMITS``) up to ``WALKEEP_RATE_LIMIT_BURST`` tokens;
``WALKEEP_RATE_LIMIT_PER_MINUTE=0`` turns all of them off.

The buckets live in the process (one per web process or ``walkeep mcp``): a
deployment with N web processes admits up to N× the configured rate. That is
the right trade for a guard against runaway agents; a hard shared quota would
belong in the database (usage counters), not here. Time comes from
``rt.clock``, so tests move a ManualClock instead of sleeping.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping

from walkeep.config import Settings
from walkeep.errors import RateLimited
from walkeep.service.runtime import Runtime

_EXTRAS_KEY = "rate_limiter"
_MAX_BUCKETS = 100_000
# A recall counts as one call per this many bytes of query (UTF-8), up to
# RECALL_MAX_COST. What a recall costs grows with its query until the embedding
# model's 256 word pieces are full (~1,000 characters of English), then barely: CPU
# per recall at 100,000 memories, against a 54-character question (LoCoMo's median):
# 1.5× at 128 characters, 2.1× at 256, 3.4× at 512, 6.5× at 1,024, 7.3× at 2,048 and
# 4,096 (bench/recall_scale.py's deployment). Bytes rather than characters: a CJK
# character is a word piece of its own, so 256 of them fill the model as ~1,000
# English characters do (768 bytes: counted 6).
RECALL_BYTES_PER_CALL = 128
RECALL_MAX_COST = 8


def call_cost(tool: str, args: Mapping[str, object] | None = None) -> int:
    """How many calls one call of ``tool`` with ``args`` counts as against its bucket."""
    query = args.get("query") if args else None
    if tool != "recall" or not isinstance(query, str):
        return 1
    size = len(query.encode("utf-8", "replace"))
    return max(1, min(size // RECALL_BYTES_PER_CALL, RECALL_MAX_COST))


class RateLimiter:
    def __init__(self, settings: Settings) -> None:
        self._default = settings.rate_limit_per_minute
        # 0 turns rate limiting off, per-tool entries included: a benchmark or an operator
        # who says "off" must not still meet recall's default of 120 a minute.
        self._per_tool = dict(settings.rate_limits) if self._default > 0 else {}
        self._burst = settings.rate_limit_burst
        self._lock = threading.Lock()
        # (account, tool) -> (tokens, at): tokens left as of time ``at`` (seconds).
        self._buckets: dict[tuple[str, str], tuple[float, float]] = {}

    def per_minute(self, tool: str) -> int:
        return self._per_tool.get(tool, self._default)

    def take(self, account_id: str, tool: str, now: float, cost: int = 1) -> float:
        """Take ``cost`` tokens; return 0.0, or the seconds until they are available.

        A cost above the bucket's size takes a full bucket: a call must stay possible.
        """
        per_minute = self.per_minute(tool)
        if per_minute <= 0:
            return 0.0
        rate = per_minute / 60.0
        capacity = float(min(self._burst, per_minute))
        need = min(float(cost), capacity)
        key = (account_id, tool)
        with self._lock:
            tokens, at = self._buckets.get(key, (capacity, now))
            tokens = min(capacity, tokens + max(0.0, now - at) * rate)
            if tokens >= need:
                self._buckets[key] = (tokens - need, now)
                if len(self._buckets) > _MAX_BUCKETS:
                    self._prune(now, rate, capacity)
                return 0.0
            self._buckets[key] = (tokens, now)
            return (need - tokens) / rate

    def _prune(self, now: float, rate: float, capacity: float) -> None:
        """Forget buckets that have refilled completely: they hold no information."""
        full = [k for k, (t, at) in self._buckets.items() if t + (now - at) * rate >= capacity]
        for k in full:
            del self._buckets[k]


def limiter(rt: Runtime) -> RateLimiter:
    found = rt.extras.get(_EXTRAS_KEY)
    if found is None:
        found = rt.extras.setdefault(_EXTRAS_KEY, RateLimiter(rt.settings))
    assert isinstance(found, RateLimiter)
    return found


def charge_call(
    rt: Runtime, account_id: str, tool: str, args: Mapping[str, object] | None = None
) -> None:
    """Admit one call of ``tool`` by ``account_id`` with ``args`` or raise RATE_LIMITED."""
    lim = limiter(rt)
    cost = call_cost(tool, args)
    wait = lim.take(account_id, tool, rt.clock.now().timestamp(), cost)
    if wait > 0:
        retry_after = max(1, math.ceil(wait))
        weight = f" (this one counts as {cost}: a long query)" if cost > 1 else ""
        raise RateLimited(
            f"too many {tool} calls: at most {lim.per_minute(tool)} per minute per account"
            f"{weight}; retry in {retry_after} s",
            {
                "tool": tool,
                "limit_per_minute": lim.per_minute(tool),
                "call_cost": cost,
                "retry_after_seconds": retry_after,
            },
        )
