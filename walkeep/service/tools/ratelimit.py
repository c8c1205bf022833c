"""Per-account, per-tool token buckets: one key cannot monopolise the server.

Every tool call takes one token from its (account, tool) bucket before the
service function runs; an empty bucket is ``RATE_LIMITED`` with
``data.retry_after_seconds``. Buckets refill continuously at
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

from walkeep.config import Settings
from walkeep.errors import RateLimited
from walkeep.service.runtime import Runtime

_EXTRAS_KEY = "rate_limiter"
_MAX_BUCKETS = 100_000


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

    def take(self, account_id: str, tool: str, now: float) -> float:
        """Take one token; return 0.0, or the seconds until one is available."""
        per_minute = self.per_minute(tool)
        if per_minute <= 0:
            return 0.0
        rate = per_minute / 60.0
        capacity = float(min(self._burst, per_minute))
        key = (account_id, tool)
        with self._lock:
            tokens, at = self._buckets.get(key, (capacity, now))
            tokens = min(capacity, tokens + max(0.0, now - at) * rate)
            if tokens >= 1.0:
                self._buckets[key] = (tokens - 1.0, now)
                if len(self._buckets) > _MAX_BUCKETS:
                    self._prune(now, rate, capacity)
                return 0.0
            self._buckets[key] = (tokens, now)
            return (1.0 - tokens) / rate

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


def charge_call(rt: Runtime, account_id: str, tool: str) -> None:
    """Admit one call of ``tool`` by ``account_id`` or raise RATE_LIMITED."""
    lim = limiter(rt)
    wait = lim.take(account_id, tool, rt.clock.now().timestamp())
    if wait > 0:
        retry_after = max(1, math.ceil(wait))
        raise RateLimited(
            f"too many {tool} calls: at most {lim.per_minute(tool)} per minute per account; "
            f"retry in {retry_after} s",
            {
                "tool": tool,
                "limit_per_minute": lim.per_minute(tool),
                "retry_after_seconds": retry_after,
            },
        )
