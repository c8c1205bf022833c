"""Resuming paused memories when credits arrive: the one rule every caller shares.

A top-up (tools/topup.py), an automatic top-up (autocharge.py), an operator's grant
(operators/accounts.py) and the renewal pass (jobs/renew.py) all resume an account's
paused memories the same way; pausing itself is the renewal pass's (it knows what it
could not fund). A payment reaches the ledger through ``credit_payment``, one path for
Checkout and automatic charges alike.

**What "resumed" promises.** Credits arriving make a paused memory active again, but
only a renewal keeps it: a memory whose blob ends before the next renewal pass can reach
it lapses however many credits arrived. ``memories.resumed`` therefore counts, in
``resumed_memories``, only memories on blobs a renewal reaches before they end; any
others resumed with them (their blob ends within one renewal interval) are reported
beside, as ``ending_before_renewal`` with the epoch they end at, and they lapse unless a
pass gets there first (``memories.expired`` says so if it does not). In the renewal pass
the memories it resumes are claimed by the same pass straight after, so all of them
count.

Why count rather than renew from the crediting transaction: a renewal is a chain
transaction, leased to one worker at a time (``FOR UPDATE SKIP LOCKED`` on PostgreSQL,
an intent per batch, the wallet's submitter lock). A top-up arrives on a web request or
a Stripe webhook; renewing there would put chain round trips inside a payment's
transaction, race the workers' claims for the same blobs and, on a chain with one
submitter per wallet, wait on (or be skipped by) a worker mid-pass whose cursor is
already past these blobs. Counting needs none of that: the end epochs are read in the
same transaction as the resume, and only a renewal moves them — later, and forward — so a
concurrent worker can only make the count too cautious, never too hopeful. The memories
are resumed either way, so whichever worker's pass comes first renews them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from walkeep import ledger
from walkeep.db import rowcount
from walkeep.db.models import Blob, Memory
from walkeep.ledger import Kind
from walkeep.lifecycle import BlobStatus, MemoryStatus
from walkeep.service import alerts
from walkeep.service.runtime import Runtime

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Reach:
    """Where renewals stand when credits arrive: the chain's current epoch, and the
    first end epoch the next renewal pass is sure to reach before the blob ends."""

    current_epoch: int
    reached_from: int

    @classmethod
    def at(cls, current_epoch: int) -> Reach:
        """Only the epoch is known: a blob ending with the current epoch may end at any
        moment, so only later ones count as reached."""
        return cls(current_epoch, current_epoch + 2)


def renewal_reach(rt: Runtime) -> Reach | None:
    """When the next renewal pass can act, from the chain's epoch clock: a pass runs at
    least every ``renew_interval_seconds`` and never less often than once an epoch (the
    worker shortens a longer default, refuses a longer explicit one), so a blob is reached
    in time if it ends more than that after now. None when the chain does not answer (a
    credit must never fail because the chain is unreachable: the renewal pass resumes
    memories later)."""
    try:
        info = rt.chain.epoch_info()
    except Exception as exc:  # best effort by design: the credit itself must go through
        log.warning("current epoch unknown (%r): paused memories resume on the next pass", exc)
        return None
    if info.started_at is None or info.duration_seconds <= 0:
        return Reach.at(info.epoch)
    wait = timedelta(seconds=min(rt.settings.renew_interval_seconds, info.duration_seconds))
    # The first epoch that begins after the next pass is due: blobs ending there or later.
    elapsed = rt.clock.now() + wait - info.started_at
    first = info.epoch + int(elapsed.total_seconds() // info.duration_seconds) + 1
    return Reach(info.epoch, max(info.epoch + 1, first))


def resume_paused(session: Session, account_id: str, reach: Reach | int | None) -> int:
    """After credits arrive, paused memories become active again (no one has to act).

    Only memories whose paid runway has not run out: a blob past its end epoch is gone
    on chain and nothing resumes it (the sweep marks its memories expired and sends
    ``memories.expired``). Counting those as resumed told an operator that lapsed
    memories were safe. With ``reach`` None (chain unreachable) nothing is resumed here;
    the renewal pass does it once the chain answers. An int is the current epoch alone
    (``Reach.at``).

    The next renewal pass renews those that are due; if the money still does not
    stretch that far they are paused again. Returns how many resumed on blobs a renewal
    reaches in time (the module docstring: what "resumed" promises).
    """
    if reach is None or ledger.balance(session, account_id).available_mc <= 0:
        return 0
    if isinstance(reach, int):
        reach = Reach.at(reach)
    now = session.info["clock"].now()
    alive = select(Blob.id).where(
        Blob.account_id == account_id,
        Blob.status == BlobStatus.LIVE,
        Blob.end_epoch > reach.current_epoch,
    )
    paused = (
        Memory.account_id == account_id,
        Memory.status == MemoryStatus.PAUSED,
        Memory.blob_pk.in_(alive),
    )
    # Those that end before a renewal can reach them, counted before they resume.
    ending = session.execute(
        select(func.count(), func.min(Blob.end_epoch))
        .select_from(Memory)
        .join(Blob, Blob.id == Memory.blob_pk)
        .where(*paused, Blob.end_epoch < reach.reached_from)
    ).one()
    res = session.execute(
        update(Memory).where(*paused).values(status=MemoryStatus.ACTIVE, status_changed_at=now)
    )
    at_risk = min(int(ending[0] or 0), rowcount(res))
    resumed = rowcount(res) - at_risk
    # --- alert (same transaction as the resume) ---
    if resumed or at_risk:
        body: dict[str, object] = {"resumed_memories": resumed}
        if at_risk:
            body.update(
                ending_before_renewal=at_risk,
                ends_at_epoch=ending[1],
                note=f"{at_risk} more resumed, but their paid storage ends at epoch "
                f"{ending[1]}, before the next renewal pass is due: they are kept only if "
                "a renewal reaches them first, otherwise they lapse (memories.expired)",
            )
        alerts.emit(session, account_id, "memories.resumed", body)
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
    resume_paused(session, account_id, renewal_reach(rt))
    return entry
