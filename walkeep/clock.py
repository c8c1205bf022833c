"""Injectable time.

Everything that depends on "now" — epochs, deadlines, idempotency windows,
webhook reconciliation — asks a Clock, so tests move time instead of sleeping.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime:
        """Current time, timezone-aware UTC."""
        ...

    def time(self) -> float:
        """Current time as Unix seconds."""
        ...


class SystemClock:
    """Wall-clock time."""

    def now(self) -> datetime:
        return datetime.now(UTC)

    def time(self) -> float:
        return time.time()


class ManualClock:
    """A clock that only moves when told to (tests, benchmarks, simulations)."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime(2026, 1, 1, tzinfo=UTC)
        if self._now.tzinfo is None:
            raise ValueError("ManualClock needs an aware datetime")
        self._lock = threading.Lock()

    def now(self) -> datetime:
        with self._lock:
            return self._now

    def time(self) -> float:
        return self.now().timestamp()

    def advance(self, seconds: float = 0, **kwargs: float) -> datetime:
        """Move forward by ``seconds`` (plus any ``timedelta`` keyword arguments)."""
        with self._lock:
            self._now += timedelta(seconds=seconds, **kwargs)
            return self._now

    def set(self, when: datetime) -> None:
        with self._lock:
            self._now = when


def utcnow() -> datetime:
    return datetime.now(UTC)
