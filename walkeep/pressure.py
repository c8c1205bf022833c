"""Request pressure: background work steps aside while requests saturate the process.

Completion embeds every landed memory (the model is most of its CPU). On a small
machine, during a burst of stores, that embedding took the CPU the requests needed:
the completer used 2–3 ms of CPU per accepted store, beside about 5 ms for the store
itself on the event loop (bench/store.py, per-thread CPU). Running it at the lowest
priority (nice 19) only gives it the gaps, and on two cores the gaps are where the
requests' other half runs. So background work calls :meth:`Pressure.step_aside`,
which waits while the process is saturated: the completer before each round (before
it leases anything), and the embedder between batches, on whichever background thread
runs it (bootstrap wires that hook).

Saturated means a request arrived to find ``SATURATED_AT`` or more in flight within the
last ``HOLD_SECONDS``: a handful of concurrent calls from one agent is not a burst.

Stepping aside is bounded: once one saturated stretch has lasted ``MAX_STEP_ASIDE_SECONDS``,
background work runs beside the requests again until the stretch ends, so an overload
that never ends delays completion by at most that much, never indefinitely (and the
write backlog limit refuses new stores before a backlog grows without bound). Accepted
writes are durable in the database; stepping aside costs them time to "active", never data.

With ``walkeep serve --workers N`` the requests are in the web processes and completion
in the supervisor, which serves none: each web process posts the moment it last found
itself saturated on a shared *board* (eight bytes of a memory-mapped file in the data
directory, :meth:`Pressure.share`), and the supervisor's completer reads it. Before, it
saw no pressure at all and landed 1,800 writes in the middle of a 15 s burst
(bench/store.py ``--workers 2``), on the cores the requests needed.
"""

from __future__ import annotations

import asyncio
import mmap
import os
import struct
import time
from collections.abc import Callable
from pathlib import Path

_BOARD = struct.Struct("d")  # the last saturated moment, time.monotonic() (system-wide)


class Pressure:
    """Counts this process's requests in flight; tells background work when to wait."""

    SATURATED_AT = 4
    HOLD_SECONDS = 1.0
    MAX_STEP_ASIDE_SECONDS = 30.0
    POLL_SECONDS = 0.05

    def __init__(
        self,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._monotonic = monotonic
        self._sleep = sleep
        self.in_flight = 0
        self._busy_at: float | None = None
        self._stretch_started: float | None = None
        self._board: mmap.mmap | None = None

    def share(self, board: Path) -> None:
        """Post and read saturation on ``board`` too, shared by every process of one
        server (created if missing). The clock must be ``time.monotonic``, which is one
        clock for the whole machine on Linux."""
        self._board = _open_board(board)

    # --- requests (event loop) --------------------------------------------------------
    def enter(self) -> None:
        self.in_flight += 1
        if self.in_flight >= self.SATURATED_AT:
            self._busy_at = self._monotonic()
            if self._board is not None:
                _BOARD.pack_into(self._board, 0, self._busy_at)

    def leave(self) -> None:
        self.in_flight -= 1

    # --- background work (its own threads) ---------------------------------------------
    def saturated(self) -> bool:
        busy = self._busy_at
        if self._board is not None:
            posted = _BOARD.unpack_from(self._board, 0)[0]
            busy = posted if busy is None else max(busy, posted)
        # Never ahead of now: a board left by a server before a reboot (the clock restarts)
        # must not read as a burst that is still going on.
        return busy is not None and 0 <= self._monotonic() - busy < self.HOLD_SECONDS

    def step_aside(self) -> None:
        """Wait while requests saturate the process, within the bound above (and never
        on a thread running an event loop, which must not wait at all)."""
        if _on_event_loop():
            return
        while self.saturated():
            now = self._monotonic()
            if self._stretch_started is None:
                self._stretch_started = now
            if now - self._stretch_started >= self.MAX_STEP_ASIDE_SECONDS:
                return  # this stretch has had its wait: keep working beside it
            self._sleep(self.POLL_SECONDS)
        self._stretch_started = None


def _open_board(path: Path) -> mmap.mmap:
    """Eight bytes of a file shared by the processes of one server (created if missing)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        if os.fstat(fd).st_size < _BOARD.size:
            os.ftruncate(fd, _BOARD.size)
        return mmap.mmap(fd, _BOARD.size)
    finally:
        os.close(fd)


class Heartbeat:
    """A moment one process posts and others read, on a board like the pressure one.

    ``walkeep serve --workers N``: the completer runs in the supervisor, the requests in
    the web processes. The supervisor posts here while its completer is alive; a web
    process's ``/readyz`` reads it, so it says unready when nothing finishes the writes it
    accepts (its supervisor's completer died or hung) instead of taking stores whose
    holds never settle. Monotonic time, one clock for the whole machine on Linux.
    """

    def __init__(self, board: Path, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._board = _open_board(board)
        self._monotonic = monotonic

    def post(self) -> None:
        _BOARD.pack_into(self._board, 0, self._monotonic())

    def age(self) -> float | None:
        """Seconds since the last post; None if never posted, or posted before a reboot
        (a moment ahead of now)."""
        posted = float(_BOARD.unpack_from(self._board, 0)[0])
        age = self._monotonic() - posted
        return age if posted > 0 and age >= 0 else None


def _on_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True
