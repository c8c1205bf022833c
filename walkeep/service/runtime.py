"""The runtime: everything a service function needs, built once per process.

Service functions take ``rt: Runtime`` and nothing global, so MCP, REST,
stdio, the CLI and the worker all call the same code with the same wiring,
and tests build a Runtime around a ManualClock and local backends.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from walkeep.backends.base import Chain, Relayer
from walkeep.clock import Clock
from walkeep.config import Settings
from walkeep.db import Database
from walkeep.payments.base import Payments
from walkeep.pressure import Pressure

if TYPE_CHECKING:
    from walkeep.service.completion import Completer


@dataclass
class Runtime:
    settings: Settings
    db: Database
    clock: Clock
    chain: Chain
    relayer: Relayer
    payments: Payments
    completer: Completer | None = None
    # Requests in flight in this process; background work steps aside for a burst.
    pressure: Pressure = field(default_factory=Pressure)
    # Anything a component wants to keep per process (caches, test hooks).
    extras: dict[str, Any] = field(default_factory=dict)
