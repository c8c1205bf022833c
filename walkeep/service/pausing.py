"""Resuming paused memories when credits arrive: the one rule every caller shares.

A top-up (tools/topup.py), an automatic top-up (autocharge.py), an operator's grant
(operators/accounts.py) and the renewal pass (jobs/renew.py) all resume an account's
paused memories the same way; pausing itself is the renewal pass's (it knows what it
could not fund). A payment reaches the ledger through ``credit_payment``, one path for
Checkout and automatic charges alike.
"""

from __future__ import annotations

import logging

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from walkeep import ledger
from walkeep.db import rowcount
from walkeep.db.models import Blob, Memory
from walkeep.ledger import Kind
from walkeep.lifecycle import BlobStatus, MemoryStatus
from walkeep.service import alerts
from walkeep.service.runtime import Runtime

log = logging.getLogger(__name__)


def current_epoch_or_none(rt: Runtime) -> int | None:
    """The chain's current epoch, or None when it does not answer (a credit must never
    fail because the chain is unreachable: the renewal pass resumes memories later)."""
    try:
        return rt.chain.current_epoch()
    except Exception as exc:  # best effort by design: the credit itself must go through
        log.warning("current epoch unknown (%r): paused memories resume on the next pass", exc)
        return None


def resume_paused(session: Session, account_id: str, current_epoch: int | None) -> int:
    """After credits arrive, paused memories become active again (no one has to act).

    Only memories whose paid runway has not run out: a blob past its end epoch is gone
    on chain and nothing resumes it (the sweep marks its memories expired and sends
    ``memories.expired``). Counting those as resumed told an operator that lapsed
    memories were safe. With ``current_epoch`` None (chain unreachable) nothing is
    resumed here; the renewal pass does it once the chain answers.

    The next renewal pass renews those that are due; if the money still does
    not stretch that far they are paused again. Returns how many resumed.
    """
    if current_epoch is None or ledger.balance(session, account_id).available_mc <= 0:
        return 0
    now = session.info["clock"].now()
    alive = select(Blob.id).where(
        Blob.account_id == account_id,
        Blob.status == BlobStatus.LIVE,
        Blob.end_epoch > current_epoch,
    )
    res = session.execute(
        update(Memory)
        .where(
            Memory.account_id == account_id,
            Memory.status == MemoryStatus.PAUSED,
            Memory.blob_pk.in_(alive),
        )
        .values(status=MemoryStatus.ACTIVE, status_changed_at=now)
    )
    resumed = rowcount(res)
    # --- alert (same transaction as the resume) ---
    if resumed:
        alerts.emit(session, account_id, "memories.resumed", {"resumed_memories": resumed})
    return resumed


def credit_payment(
    session: Session,
    rt: Runtime,
    account_id: str,
    amount_mc: int,
    *,
    ref: str,
    kind: Kind,
    memo: str,
) -> ledger.Entry:
    """Credit a payment once (``ref`` is UNIQUE per account: a replay returns the first
    entry) and resume the account's paused memories, in the caller's transaction."""
    entry = ledger.credit(session, account_id, amount_mc, ref=ref, kind=kind, memo=memo)
    resume_paused(session, account_id, current_epoch_or_none(rt))
    return entry
