"""Calls that may run on the event loop because they promise not to wait.

A store with the self-run relayer is a few hundred microseconds of CPU: no network
but the database's, and on SQLite a write lock that is free almost always. Handing it
to a worker thread anyway cost more than the store itself: the thread and the event
loop pass the GIL back and forth at every SQLite call, and every request in flight
slows down with them (measured with ``bench/store.py``: 0.24 of the ceiling through a
thread, 0.38 on the loop). On PostgreSQL its statements are awaited on the loop
(``Database.on_loop``); the promise below is about every *other* wait.

So a caller may try such a call on its own thread inside :func:`no_wait`. Every place
on that path that could block — the SQLite write lock (this process's and another
process's), a stale health probe, a retry pause — calls :func:`refuse` first, which
raises :class:`WouldWait` there instead of waiting. The caller then runs the same call
again from the start on a worker thread, where waiting is harmless.

Except where the blocker says when it is gone (``WouldWait.on_free``): this process's
write lock, held by one of its own threads for one transaction. Sending the call to a
thread then was a trap: that thread held the lock next, slowly, sharing the GIL with
the loop, so the calls behind it were refused too and went to threads as well — 1,529
of 2,400 stores in one burst (bench/store.py). An event-loop caller instead awaits the
release and tries again on the loop.

That retry is only safe because :func:`refuse` is called *before* anything that
matters is written: a call may have done harmless work (encrypted the content,
created the account's data key in its own transaction) but never half of its own
transaction.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_ACTIVE: ContextVar[bool] = ContextVar("walkeep_no_wait", default=False)


class WouldWait(Exception):
    """Raised inside :func:`no_wait` where the call would otherwise block; run it on a
    thread instead, or, if ``on_free`` is set, pass it a callback (called once, from any
    thread, when the blocker is gone) and try again then. Never reaches a client."""

    def __init__(
        self, what: str, on_free: Callable[[Callable[[], None]], None] | None = None
    ) -> None:
        super().__init__(what)
        self.on_free = on_free


@contextmanager
def no_wait() -> Iterator[None]:
    """Within this block, anything that would wait raises WouldWait instead."""
    token = _ACTIVE.set(True)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def active() -> bool:
    return _ACTIVE.get()


def refuse(what: str, on_free: Callable[[Callable[[], None]], None] | None = None) -> None:
    """Say that the caller is about to wait for ``what``: raises WouldWait inside
    :func:`no_wait`, returns otherwise."""
    if _ACTIVE.get():
        raise WouldWait(what, on_free)
