"""The runtime: everything a service function needs, built once per process.

Service functions take ``rt: Runtime`` and nothing global, so MCP, REST,
stdio, the CLI and the worker all call the same code with the same wiring,
and tests build a Runtime around a ManualClock and local backends.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from walkeep.backends.base import Chain, Relayer
from walkeep.clock import Clock
from walkeep.config import Settings
from walkeep.db import Database
from walkeep.payments.base import Payments
from walkeep.pressure import Pressure


class WriteQueue(Protocol):
    """Finishes accepted writes in the background (jobs/completion.py's ``Completer``).

    A protocol, not the class: the tools hand it work and the entrypoints start and
    stop it, and none of them should import the job that does it (bootstrap injects it).
    """

    max_sleep: float

    def start(self) -> None: ...
    def stop(self, timeout: float = 5.0) -> None: ...
    def submit(self, memory_id: str, delay: float = 0.0) -> None: ...
    def pending(self) -> int: ...
    def wait_idle(self, timeout: float = 10.0) -> bool: ...
    def alive(self) -> bool: ...


@dataclass
class Runtime:
    settings: Settings
    db: Database
    clock: Clock
    chain: Chain
    relayer: Relayer
    payments: Payments
    completer: WriteQueue | None = None
    # Requests in flight in this process; background work steps aside for a burst.
    pressure: Pressure = field(default_factory=Pressure)
    # Anything a component wants to keep per process (caches, test hooks).
    extras: dict[str, Any] = field(default_factory=dict)
