"""A private asyncio loop on a daemon thread, so sync callers can drive async pysui.

pysui 1.5.1 is async-only, while Walkeep's service layer is synchronous and
calls adapters from worker threads (DESIGN §7). ``asyncio.run`` per call would
create a fresh loop each time, and grpclib channels are bound to the loop they
were first used on; one long-lived loop keeps a single HTTP/2 connection and
lets any number of threads submit coroutines concurrently.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class LoopTimeout(Exception):
    """The coroutine did not finish within the caller's timeout (it was cancelled)."""


class LoopThread:
    """Runs coroutines on one event loop owned by a daemon thread."""

    def __init__(self, name: str = "walkeep-sui-loop") -> None:
        self._name = name
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def _ensure(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                ready = threading.Event()

                def _main() -> None:
                    asyncio.set_event_loop(loop)
                    loop.call_soon(ready.set)
                    loop.run_forever()

                thread = threading.Thread(target=_main, name=self._name, daemon=True)
                thread.start()
                ready.wait()
                self._loop, self._thread = loop, thread
            return self._loop

    @property
    def running(self) -> bool:
        return self._loop is not None

    def run(self, coro: Coroutine[Any, Any, T], timeout: float) -> T:
        """Run ``coro`` on the loop and wait at most ``timeout`` seconds for it.

        On timeout the coroutine is cancelled and LoopTimeout raised; exceptions
        from the coroutine propagate unchanged.
        """
        loop = self._ensure()
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("LoopThread.run called from its own loop (would deadlock)")
        future = asyncio.run_coroutine_threadsafe(coro, loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise LoopTimeout(f"no answer within {timeout:g}s") from None

    def close(self, timeout: float = 5.0) -> None:
        """Stop the loop and join the thread (idempotent)."""
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout)
        if not thread.is_alive():
            loop.close()
