"""Small helpers shared by service-level tests."""

from __future__ import annotations

import itertools

from walkeep.service import accounts, completion
from walkeep.service.runtime import Runtime

_n = itertools.count()


def account(rt: Runtime, credits: int = 100, name: str | None = None) -> str:
    return accounts.create_account(
        rt.db, name or f"acct-{next(_n)}", credits_mc=credits * 1000
    ).account_id


def land_all(rt: Runtime) -> completion.CompleteReport:
    """What the worker's complete_writes does after accept: settle every in-flight store."""
    return completion.complete_writes(rt)


def epoch_seconds(rt: Runtime) -> int:
    return rt.chain.epoch_info().duration_seconds
