"""Calls that may run on the event loop because they promise not to wait.

A store on SQLite with the self-run relayer is a few hundred microseconds of CPU: no
network, and a write lock that is free almost always. Handing it to a worker thread
anyway cost more than the store itself: the thread and the event loop pass the GIL
back and forth at every SQLite call, and every request in flight slows down with
them (measured with ``bench/store.py``: 0.24 of the ceiling through a thread, 0.38 on
the loop).

So a caller may try such a call on its own thread inside :func:`no_wait`. Every place
on that path that could block — the SQLite write lock (this process's and another
process's), a stale health probe, a retry pause — calls :func:`refuse` first, which
raises :class:`WouldWait` there instead of waiting. The caller then runs the same call
again from the start on a worker thread, where waiting is harmless.

That retry is only safe because :func:`refuse` is called *before* anything that
matters is written: a call may have done harmless work (encrypted the content,
created the account's data key in its own transaction) but never half of its own
transaction.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_ACTIVE: ContextVar[bool] = ContextVar("walkeep_no_wait", default=False)


class WouldWait(Exception):
    """Raised inside :func:`no_wait` where the call would otherwise block; run it on a
    thread instead. Never reaches a client."""


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


def refuse(what: str) -> None:
    """Say that the caller is about to wait for ``what``: raises WouldWait inside
    :func:`no_wait`, returns otherwise."""
    if _ACTIVE.get():
        raise WouldWait(what)
