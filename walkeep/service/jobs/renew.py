"""Renewal: keep every active, funded memory's blob paid ahead of time.

One pass (``renew``) repeats until nothing is due:

1. **Claim + hold + intent** (one transaction). Pick up to ``renew_batch``
   live blobs that hold at least one ``active`` memory and whose runway is at
   or below the threshold (early, never at the last moment), in (end_epoch,
   id) order from where the previous batch stopped, skipping blobs another
   worker has claimed (``FOR UPDATE SKIP LOCKED`` on PostgreSQL; on SQLite a
   single worker runs). For each owning account, under its row lock,
   hold the cost of as many of its blobs as its available credits cover;
   the rest are left out and their memories become ``paused`` (their paid
   runway keeps counting down). Build the chain transaction — its digest is
   known before it is submitted — and record it as a renewal *intent* with
   its items; each claimed blob points at the intent, which is the lease
   other workers respect.
2. **Submit** the transaction (outside any database transaction).
3. **Record + capture** (one transaction): new end_epoch, renewals_performed,
   last_renewal_tx, next_renewal_epoch, the renewal's cost, and the holds
   captured. A refused transaction releases the holds and backs off.

Batch N's record runs on a thread of its own while batch N+1 is claimed (their
round trips overlap: 100,000 blobs in 22-24 s instead of 26, bench/renew.py), one
record in flight at a time, and N+1 goes to the chain only once N is recorded — a
failed record stops the pass with N+1 an unsubmitted intent. Both lock their
accounts in id order (the claim's lock, the ledger's ``_in_id_order``), so the
overlap cannot deadlock on them; and a capture never changes what an account has
available, so the claim's funding is the same either side of it.

A crash between 1 and 3 leaves an intent. ``reconcile.reconcile_renewals`` asks the
chain about its digest (and the blobs' end_epoch): applied → record and
capture once; not applied → release. Never paid twice, never billed for an
extension that didn't happen.

Why one file: one renewal is one protocol — hold, submit, capture or release — and its
crash recovery re-enters the same steps; split, the recovery would be read apart from
what it recovers.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import socket
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import (
    BindParameter,
    Update,
    bindparam,
    case,
    func,
    insert,
    select,
    text,
    tuple_,
    update,
)
from sqlalchemy.orm import Session

from walkeep import ledger, lifecycle, metrics, pricing
from walkeep.backends.base import (
    ChainError,
    ChainRejected,
    ChainUnavailable,
    PreparedTx,
    TxEffects,
)
from walkeep.db import insert_rows
from walkeep.db.models import Account, Blob, Memory, Renewal, RenewalItem, table
from walkeep.errors import InsufficientBalance
from walkeep.lifecycle import BlobStatus, MemoryStatus
from walkeep.service import alerts
from walkeep.service.jobs import autotopup
from walkeep.service.pausing import Reach, resume_paused
from walkeep.service.renewal_price import (
    ACTIVE_ONLY,
    KEPT,
    Plan,
    blob_needs,
    quilt_shares,
    renewal_plan,
)
from walkeep.service.runtime import Runtime

log = logging.getLogger(__name__)

# Statements of the per-batch path, built once (Core: no ORM bulk bookkeeping;
# constant SQL, so psycopg prepares them and nothing is rebuilt per batch).
_ACCOUNTS = table(Account)
_BLOBS = table(Blob)
_ITEMS = table(RenewalItem)
_RENEWALS = table(Renewal)
_RID: BindParameter[int] = bindparam("renewal_id")
_OF_RENEWAL = (_BLOBS.c.id == _ITEMS.c.blob_pk, _ITEMS.c.renewal_id == _RID)
_ASYNC_COMMIT = text("SET LOCAL synchronous_commit = off")
# The claimed blobs point at their intent: one UPDATE joined to its items.
_LEASE = (
    update(_BLOBS).where(*_OF_RENEWAL).values(pending_renewal_id=_RID, updated_at=bindparam("now"))
)
_RECORD_ITEMS = (
    select(
        _ITEMS.c.id,
        _ITEMS.c.new_end_epoch,
        _BLOBS.c.blob_object_id,
        _BLOBS.c.kind,
        _BLOBS.c.storage_size,
        _ITEMS.c.epochs,
        _ITEMS.c.cost_mc,
        _ITEMS.c.account_id,
    )
    .join_from(_ITEMS, _BLOBS, _BLOBS.c.id == _ITEMS.c.blob_pk)
    .where(_ITEMS.c.renewal_id == _RID)
)


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass
class RenewReport:
    transactions: int = 0
    blobs_renewed: int = 0
    failed_transactions: int = 0
    unknown_outcome: int = 0
    paused_memories: int = 0
    resumed_memories: int = 0
    captured_mc: int = 0
    wal_cost_frost: int = 0
    compactions: int = 0
    digests: list[str] = field(default_factory=list)
    explorer_urls: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class _Due:
    """A due blob as the claim reads it (plain values: the pass is set-based)."""

    id: int
    account_id: str | None
    blob_object_id: str
    end_epoch: int
    storage_size: int
    renew_failures: int
    kind: str
    share_micro: int | None  # a quilt's apportioned shares (blobs.share_micro)


# Where the due scan of a pass has got to: the (end_epoch, id) of the last
# due blob it read (see ``_due_query``).
_Cursor = tuple[int, int]


@dataclass
class _Claim:
    renewal_id: int
    prepared: PreparedTx | None  # None: due blobs were read but none submitted
    blob_count: int
    cursor: _Cursor
    # Accounts whose automatic top-up is asked to cover what this batch could not fund
    # (account → mc short), once the claim has committed (jobs/autotopup.py).
    top_up: dict[str, int] = field(default_factory=dict)


def _skipped(cursor: _Cursor, top_up: dict[str, int] | None = None) -> _Claim:
    """Due blobs were found but none could be submitted (unfunded → paused, or
    refused → backed off): they drop out of the due query, so look again."""
    return _Claim(-1, None, 0, cursor, top_up or {})


class CrashForTest(Exception):
    """Raised by test hooks to simulate a process dying at a chosen point."""


def renew(rt: Runtime, *, max_batches: int | None = None, worker: str | None = None) -> RenewReport:
    """One renewal pass (see the module docstring)."""
    if getattr(rt.chain, "single_submitter", False) and rt.db.is_postgres:
        with _submitter_lock(rt) as acquired:
            if not acquired:
                log.info("another worker is renewing for this wallet; skipping this pass")
                return RenewReport()
            return _renew(rt, max_batches=max_batches, worker=worker)
    return _renew(rt, max_batches=max_batches, worker=worker)


def _wallet_lock_key(rt: Runtime) -> int:
    digest = hashlib.blake2b(rt.chain.owner_address().encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


@contextmanager
def _submitter_lock(rt: Runtime) -> Iterator[bool]:
    """A PostgreSQL advisory lock per server wallet, held for the whole pass.

    On chains where two submitters would spend the same coin versions (Sui),
    only one worker renews at a time; the others skip the pass. Session-level
    so it spans the pass's transactions; released when the connection closes,
    so a dead worker never leaves it behind.
    """
    key = _wallet_lock_key(rt)
    with rt.db.engine.connect() as conn:
        got = bool(conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": key}).scalar())
        conn.commit()
        try:
            yield got
        finally:
            if got:
                conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": key})
                conn.commit()


def _renew(rt: Runtime, *, max_batches: int | None, worker: str | None) -> RenewReport:
    report = RenewReport()
    worker = worker or worker_name()
    report.resumed_memories = resume_eligible(rt)
    # Mostly-forgotten quilts are re-packed instead of extended, when cheaper.
    from walkeep.service.jobs import compaction

    report.compactions = compaction.start(rt).started
    batches = 0
    cursor: _Cursor | None = None
    stop = rt.extras.get("stop")
    submission_lock: Callable[[], AbstractContextManager[object]] = getattr(
        rt.chain, "submission_lock", nullcontext
    )
    # Batch N is recorded on this thread pool while batch N+1 is claimed: the record's
    # round trips overlap the claim's work (one record in flight at a time).
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="walkeep-record") as recorder:
        recording: Future[bool] | None = None
        try:
            while max_batches is None or batches < max_batches:
                if stop is not None and stop.is_set():
                    break  # graceful shutdown: the batch in hand is recorded below
                current = rt.chain.current_epoch()
                # Prepare → execute under the wallet's submitter lock where the chain has
                # one (the local network's gas coin): another process renewing with the
                # same wallet (`walkeep smoke` beside the server) waits for this batch
                # instead of spending the same gas version and being refused.
                with submission_lock():
                    claim = _claim_batch(rt, current, worker, report, cursor)
                    if claim is None:
                        break
                    batches += 1
                    cursor = claim.cursor
                    if recording is not None:
                        # Its errors surface here, before this batch goes to the chain: the
                        # batch is then left an unsubmitted intent, as a crash would leave it.
                        done, recording = recording, None
                        done.result()
                    effects = _submit(rt, claim, report)
                if claim.top_up:
                    # Before anything of theirs pauses, charge the accounts whose
                    # automatic top-up covers them (outside the claim's transaction).
                    autotopup.charge_for_renewal(rt, claim.top_up)
                if effects is not None:
                    recording = recorder.submit(record, rt, claim.renewal_id, effects, report)
            if recording is not None:
                done, recording = recording, None
                done.result()
        finally:
            # The pass failed with a record in flight: let it land, and say so if it
            # did not (its intent waits for reconcile either way).
            if recording is not None and (exc := recording.exception()) is not None:
                log.error("a renewal batch was not recorded (reconcile settles it): %r", exc)
    return report


def resume_eligible(rt: Runtime) -> int:
    """Paused accounts whose credits cover a whole round become active again.

    The rule (README "Alerts"): without a top-up, an account's paused memories resume
    only when its available credits cover renewing **every** paused blob to the target
    runway **and** every active blob of the account that is due now. Resuming as soon as
    the cheapest paused blob was affordable made the next claim fund some, pause the rest
    again, and resume them on the following pass: ``memories.paused``/``.resumed``
    flipped every pass with no top-up in sight. A top-up (or a grant) resumes at once
    (``resume_paused``); if it was not enough, the next pass pauses what it cannot fund,
    once, and nothing resumes until more credits arrive.
    """
    with rt.db.read() as s:
        accounts = list(
            s.scalars(
                select(Memory.account_id).where(Memory.status == MemoryStatus.PAUSED).distinct()
            )
        )
    total = 0
    threshold = rt.settings.renew_threshold_epochs
    target = rt.settings.target_runway_epochs
    price = rt.settings.renewal_price_mc_per_unit_epoch
    for account_id in accounts:
        with rt.db.begin() as s:
            current = rt.chain.current_epoch()
            cols = (Blob.id, Blob.kind, Blob.storage_size, Blob.share_micro, Blob.end_epoch)
            live = (Blob.status == BlobStatus.LIVE, Blob.end_epoch > current)
            paused = list(
                s.execute(
                    select(*cols)
                    .join(Memory, Memory.blob_pk == Blob.id)
                    .where(
                        Memory.account_id == account_id,
                        Memory.status == MemoryStatus.PAUSED,
                        *live,
                    )
                    .distinct()
                )
            )
            if not paused:
                continue
            due_active = list(
                s.execute(
                    select(*cols)
                    .join(Memory, Memory.blob_pk == Blob.id)
                    .where(
                        Memory.account_id == account_id,
                        Memory.status == MemoryStatus.ACTIVE,
                        Blob.end_epoch <= current + threshold,
                        Blob.pending_renewal_id.is_(None),
                        *live,
                    )
                    .distinct()
                )
            )
            blobs = {b.id: b for b in [*paused, *due_active]}
            shares = quilt_shares(s, [i for i, b in blobs.items() if b.kind == "quilt"], KEPT)
            needs = blob_needs(s, list(blobs), KEPT)
            need = sum(
                renewal_plan(
                    b,
                    shares,
                    needs.get(b.id),
                    max(1, lifecycle.extension_epochs(b.end_epoch, current, target)),
                    price,
                ).cost_mc
                for b in blobs.values()
            )
            if ledger.balance(s, account_id).available_mc >= max(need, 1):
                # This pass claims them next: every one still alive is reached in time.
                total += resume_paused(s, account_id, Reach(current, current + 1))
    return total


def batch_size(rt: Runtime) -> int:
    """WALKEEP_RENEW_BATCH, within what one transaction of this chain can carry."""
    return max(
        1,
        min(rt.settings.renew_batch, int(getattr(rt.chain, "max_batch", rt.settings.renew_batch))),
    )


def _due_query(rt: Runtime, current: int, now: datetime, after: _Cursor | None):  # type: ignore[no-untyped-def]
    """Up to a batch of due blobs, in (end_epoch, id) order, after ``after``.

    A pass reads the due blobs once, in index order, each batch starting
    where the last one stopped. Starting from the beginning every time
    walked, batch after batch, over the index entries of every blob already
    renewed in this pass (their old versions stay in the index until vacuum,
    and any long transaction on the server keeps PostgreSQL from skipping
    them): quadratic, 85 ms per scan by the end of a 100,000-blob pass. A
    blob behind the cursor that becomes due again mid-pass (another worker
    let its lease go, a top-up resumed it) is renewed by the next pass
    (``renew_interval_seconds`` later), well inside the threshold's epochs.
    """
    threshold = rt.settings.renew_threshold_epochs
    b = _BLOBS.c
    q = (
        select(
            b.id,
            b.account_id,
            b.blob_object_id,
            b.end_epoch,
            b.storage_size,
            b.renew_failures,
            b.kind,
            b.share_micro,
        )
        .where(
            b.status == BlobStatus.LIVE,
            b.pending_renewal_id.is_(None),
            b.end_epoch > current,
            b.end_epoch <= current + threshold,
            (b.renew_not_before.is_(None)) | (b.renew_not_before <= now),
            # Holds an active memory: the blob's own count (migration 0013). As a probe
            # of memories per blob, PostgreSQL with statistics from before a burst of
            # inserts turned it into a semi-join over every active memory, once per
            # blob: 16-50 ms per batch (auto_explain, bench/renew.py).
            b.active_memories > 0,
        )
        .order_by(b.end_epoch, b.id)
        .limit(batch_size(rt))
    )
    if after is not None:
        q = q.where(tuple_(b.end_epoch, b.id) > tuple_(*after))
    if rt.db.is_postgres:
        # NO KEY UPDATE: compatible with the KEY SHARE locks of concurrent
        # foreign-key inserts (memories being registered on these blobs).
        q = q.with_for_update(skip_locked=True, of=_BLOBS, key_share=True)
    return q


def _claim_batch(
    rt: Runtime, current: int, worker: str, report: RenewReport, after: _Cursor | None
) -> _Claim | None:
    now = rt.clock.now()
    price = rt.settings.renewal_price_mc_per_unit_epoch
    target = rt.settings.target_runway_epochs
    with rt.db.begin() as s:
        blobs = [_Due(*row) for row in s.execute(_due_query(rt, current, now, after))]
        if not blobs:
            return None
        cursor = (blobs[-1].end_epoch, blobs[-1].id)
        by_account: dict[str | None, list[tuple[_Due, int, int]]] = defaultdict(list)
        capped: list[int] = []
        shares = quilt_shares(s, [b.id for b in blobs if b.kind == "quilt"], ACTIVE_ONLY)
        # Blobs holding active memories that expire: extended only as far as they are
        # needed, and a quilt's shares billed only while their members need it.
        needs = blob_needs(s, [b.id for b in blobs], ACTIVE_ONLY)
        plans: dict[int, Plan] = {}
        for b in blobs:
            k = lifecycle.extension_epochs(b.end_epoch, current, target)
            plan = renewal_plan(b, shares, needs.get(b.id), k, price)
            if plan.epochs <= 0:
                # Nothing can be added (Walrus's cap), or nothing is needed (every active
                # member expires within the paid runway): look again next epoch.
                capped.append(b.id)
                continue
            plans[b.id] = plan
            by_account[b.account_id].append((b, plan.epochs, plan.cost_mc))
        if capped:
            next_epoch = now + timedelta(seconds=rt.chain.epoch_info().duration_seconds)
            s.execute(update(Blob).where(Blob.id.in_(capped)).values(renew_not_before=next_epoch))

        funded: list[tuple[_Due, int, int]] = []
        unfunded: list[int] = []
        short: dict[str, int] = defaultdict(int)
        owners = sorted(a for a in by_account if a is not None)
        # One statement locks every owner, in id order (as one lock at a time
        # did): two passes can never wait on each other's accounts in a cycle.
        acc = _ACCOUNTS.c
        lock = (
            select(acc.id, acc.balance_mc, acc.held_mc).where(acc.id.in_(owners)).order_by(acc.id)
        )
        if rt.db.is_postgres:
            lock = lock.with_for_update(key_share=True)
        available_of = {row[0]: row[1] - row[2] for row in s.execute(lock)}
        for account_id in owners:
            entries = by_account[account_id]
            available = available_of[account_id]
            spent = 0
            for blob, k, cost in entries:
                if spent + cost <= available:
                    spent += cost
                    funded.append((blob, k, cost))
                else:
                    unfunded.append(blob.id)
                    short[account_id] += cost

        top_up: dict[str, int] = {}
        if short:
            # Check before pausing: automatic top-up may be about to fund these accounts.
            defer, ask = autotopup.before_pausing(rt, s, short)
            top_up = {a: short[a] for a in ask}
            if defer:
                deferred = {b.id for b in blobs if b.account_id in defer}
                unfunded = [b for b in unfunded if b not in deferred]
        if unfunded:
            paused_accounts = s.scalars(
                update(Memory)
                .where(Memory.blob_pk.in_(unfunded), Memory.status == MemoryStatus.ACTIVE)
                .values(status=MemoryStatus.PAUSED, status_changed_at=now)
                .returning(Memory.account_id)
            ).all()
            paused = len(paused_accounts)
            # --- alerts (same transaction as the pause) ---
            for acct, n in sorted(Counter(paused_accounts).items()):
                alerts.emit(s, acct, "memories.paused", _paused_alert(n))
            report.paused_memories += paused
            metrics.PAUSED_MEMORIES.inc(paused)
            log.warning("paused %d memories on %d unfunded blobs", paused, len(unfunded))
        if not funded:
            return _skipped(cursor, top_up)
        funded, prepared = _prepare_checked(rt, s, funded, now)
        if prepared is None:
            return _skipped(cursor, top_up)
        holds: dict[str, int] = defaultdict(int)
        for blob, _k, cost in funded:
            if blob.account_id:
                holds[blob.account_id] += cost
        renewal_id = s.execute(
            insert(_RENEWALS)
            .values(
                digest=prepared.digest,
                network=rt.chain.network,
                explorer_url=rt.chain.explorer_tx_url(prepared.digest),
                status="intent",
                walrus_epoch=prepared.epoch,
                blob_count=len(funded),
                cost_mc=sum(c for _, _, c in funded),
                tx_bytes=prepared.tx_bytes,
                worker=worker,
                created_at=now,
            )
            .returning(_RENEWALS.c.id)
        ).scalar_one()
        insert_rows(
            s,
            _ITEMS,
            [
                {
                    "renewal_id": renewal_id,
                    "blob_pk": blob.id,
                    "account_id": blob.account_id,
                    "epochs": k,
                    "old_end_epoch": blob.end_epoch,
                    "new_end_epoch": blob.end_epoch + k,
                    "cost_mc": cost,
                    "hold_ref": _hold_ref(renewal_id, blob.account_id) if blob.account_id else None,
                    **_item_shares(blob, plans[blob.id]),
                }
                for blob, k, cost in funded
            ],
        )
        # The intent is the lease: other workers skip blobs that point at one.
        s.execute(_LEASE, {"renewal_id": renewal_id, "now": now})
        ledger.hold_new_many(
            s,
            [
                (account_id, amount, _hold_ref(renewal_id, account_id))
                for account_id, amount in sorted(holds.items())
            ],
            memo=f"renewal {prepared.digest}",
        )
        return _Claim(renewal_id, prepared, len(funded), cursor, top_up)


def _item_shares(blob: _Due, plan: Plan) -> dict[str, int | None]:
    """A quilt item's kept and unbilled shares — they sum to the quilt's apportioned
    shares, so ``walkeep verify`` checks its bill to the unit; None for a plain blob."""
    if blob.kind != "quilt":
        return {"share_micro": None, "unbilled_micro": None}
    return {"share_micro": plan.kept_micro, "unbilled_micro": plan.unbilled_micro}


def _prepare_checked(
    rt: Runtime,
    s: Session,
    funded: list[tuple[_Due, int, int]],
    now,  # type: ignore[no-untyped-def]
) -> tuple[list[tuple[_Due, int, int]], PreparedTx | None]:
    """Prepare the batch; if the chain refuses it, drop the blobs it refuses (e.g.
    lapsed since we read them) so one bad blob never blocks the others."""
    try:
        return funded, rt.chain.prepare_extend([(b.blob_object_id, k) for b, k, _ in funded])
    except ChainRejected as exc:
        problems = dict(getattr(exc, "problems", {}) or {})
    refused: list[_Due] = []
    kept: list[tuple[_Due, int, int]] = []
    if problems:  # the chain named the culprits: drop exactly those
        for entry in funded:
            if entry[0].blob_object_id in problems:
                refused.append(entry[0])
                log.warning(
                    "chain refuses to extend %s: %s",
                    entry[0].blob_object_id,
                    problems[entry[0].blob_object_id],
                )
            else:
                kept.append(entry)
    else:  # probe one by one
        for entry in funded:
            try:
                rt.chain.prepare_extend([(entry[0].blob_object_id, entry[1])])
                kept.append(entry)
            except ChainRejected as exc:
                refused.append(entry[0])
                log.warning("chain refuses to extend %s: %s", entry[0].blob_object_id, exc)
    # --- alerts (same transaction as the back-off) ---
    for acct in sorted({b.account_id for b in refused if b.account_id}):
        ids = [b.blob_object_id for b in refused if b.account_id == acct]
        alerts.emit(s, acct, "renewal.failed", {"reason": "refused by the chain", "blobs": ids})
    for blob in refused:
        failures = blob.renew_failures + 1
        s.execute(
            update(Blob)
            .where(Blob.id == blob.id)
            .values(
                renew_failures=failures,
                renew_not_before=now + timedelta(seconds=_backoff(failures)),
            )
        )
    if not kept:
        return kept, None
    if problems:
        return _prepare_checked(rt, s, kept, now)
    return kept, rt.chain.prepare_extend([(b.blob_object_id, k) for b, k, _ in kept])


def _paused_alert(n: int) -> dict[str, object]:
    return {
        "paused_memories": n,
        "reason": "credits cannot cover their renewal",
        "note": "their paid runway keeps counting down; a top-up resumes them automatically",
    }


def _hold_ref(renewal_id: int, account_id: str) -> str:
    return f"renewal:{renewal_id}:{account_id}"


def _backoff(failures: int) -> int:
    return min(3600, 30 * 2 ** min(failures, 7))


def _submit(rt: Runtime, claim: _Claim, report: RenewReport) -> TxEffects | None:
    """Execute the claimed batch's transaction: its effects, or None if it was refused
    (released and backed off here) or its outcome is unknown (reconcile settles it)."""
    if claim.prepared is None:
        return None
    hooks = rt.extras.get("renew_hooks", {})
    if "before_submit" in hooks:
        hooks["before_submit"](claim)
    try:
        effects = rt.chain.execute(claim.prepared)
    except ChainRejected as exc:
        abandon(rt, claim.renewal_id, f"refused: {exc}", backoff=True)
        report.failed_transactions += 1
        metrics.RENEWAL_TXS.labels("refused").inc()
        return None
    except (ChainUnavailable, ChainError, OSError) as exc:
        log.warning(
            "renewal %s outcome unknown (%s); reconcile will settle it", claim.prepared.digest, exc
        )
        report.unknown_outcome += 1
        metrics.RENEWAL_TXS.labels("unknown").inc()
        return None
    if "after_submit" in hooks:
        hooks["after_submit"](claim)
    return effects


def record(
    rt: Runtime, renewal_id: int, effects: TxEffects, report: RenewReport | None = None
) -> bool:
    """Apply a confirmed transaction: end epochs, counters, capture. Exactly once."""
    now = rt.clock.now()
    threshold = rt.settings.renew_threshold_epochs
    by_object = {e.blob_object_id: e for e in effects.extensions}
    with rt.db.begin() as s:
        if rt.db.is_postgres:
            # The one commit that need not wait for its WAL flush: lost in a
            # crash, it leaves the intent, which reconcile_renewals settles from
            # the chain (the path every crash between submit and record takes).
            # The next batch's claim commits synchronously and flushes it anyway.
            s.execute(_ASYNC_COMMIT)
        renewal = s.execute(
            _maybe_lock(rt, select(_RENEWALS.c.status).where(_RENEWALS.c.id == renewal_id))
        ).scalar_one_or_none()
        if renewal != "intent":
            return False
        items = s.execute(_RECORD_ITEMS, {"renewal_id": renewal_id}).all()
        item_fixes = []
        unbilled = 0
        price = rt.settings.renewal_price_mc_per_unit_epoch
        for item_id, planned_end, object_id, kind, storage_size, epochs, item_cost, _a in items:
            if kind == "quilt":
                unbilled += max(0, pricing.renewal_cost_mc(storage_size, epochs, price) - item_cost)
            ext = by_object.get(object_id)
            if ext is not None and ext.new_end_epoch != planned_end:
                item_fixes.append({"id": item_id, "new_end_epoch": ext.new_end_epoch})
        if item_fixes:
            # The chain's end epoch wins over the plan; the items then hold the truth.
            s.execute(update(RenewalItem), item_fixes)
        if items:
            s.execute(
                _record_blobs_stmt(threshold),
                {"renewal_id": renewal_id, "digest": effects.digest, "now": now},
            )
        captured = sum(
            entry.amount_mc
            for entry in ledger.capture_many(
                s,
                [
                    (a, _hold_ref(renewal_id, a))
                    for a in sorted({row.account_id for row in items} - {None})
                ],
                memo=f"renewal {effects.digest}",
            )
        )
        r = _RENEWALS.c
        s.execute(
            update(_RENEWALS)
            .where(r.id == renewal_id)
            .values(
                status="confirmed",
                wal_cost_frost=effects.wal_cost_frost,
                gas_used=effects.gas_used,
                submitted_at=func.coalesce(r.submitted_at, now),
                settled_at=now,
            )
        )
    n = len(items)
    metrics.QUILT_UNBILLED_MC.inc(unbilled)
    metrics.RENEWAL_TXS.labels("confirmed").inc()
    metrics.RENEWED_BLOBS.inc(n)
    metrics.BLOBS_PER_TX.observe(n)
    metrics.RENEWAL_WAL_FROST.inc(effects.wal_cost_frost or 0)
    metrics.CREDITS_CAPTURED_MC.labels("renewal").inc(captured)
    if report is not None:
        report.transactions += 1
        report.blobs_renewed += n
        report.captured_mc += captured
        report.wal_cost_frost += effects.wal_cost_frost or 0
        report.digests.append(effects.digest)
        report.explorer_urls.append(rt.chain.explorer_tx_url(effects.digest))
    log.info(
        "renewal confirmed",
        extra={
            "digest": effects.digest,
            "blobs": n,
            "captured_mc": captured,
            "explorer": rt.chain.explorer_tx_url(effects.digest),
        },
    )
    return True


def _maybe_lock(rt: Runtime, q):  # type: ignore[no-untyped-def]
    return q.with_for_update() if rt.db.is_postgres else q


@functools.cache
def _record_blobs_stmt(threshold: int) -> Update:
    """One UPDATE for every blob of a confirmed renewal, joined to its items.

    Set-based on purpose: one statement whatever the batch size, where an
    UPDATE per blob cost a round trip (or a pipelined statement) each. Each
    item's ``new_end_epoch`` is what the chain reported (fixed up before this
    runs); a blob never moves backwards (``max`` with its current end). Built
    once per threshold (a setting): the rest are parameters.
    """
    planned = _ITEMS.c.new_end_epoch
    final_end = case((planned > _BLOBS.c.end_epoch, planned), else_=_BLOBS.c.end_epoch)
    return (
        update(_BLOBS)
        .where(*_OF_RENEWAL)
        .values(
            end_epoch=final_end,
            renewals_performed=_BLOBS.c.renewals_performed + 1,
            last_renewal_tx=bindparam("digest"),
            next_renewal_epoch=lifecycle.next_renewal_epoch(final_end, threshold),
            pending_renewal_id=None,
            renew_failures=0,
            renew_not_before=None,
            updated_at=bindparam("now"),
        )
    )


def abandon(rt: Runtime, renewal_id: int, reason: str, *, backoff: bool) -> bool:
    """The transaction did not happen: release holds, free the blobs."""
    now = rt.clock.now()
    with rt.db.begin() as s:
        status = s.execute(
            _maybe_lock(rt, select(Renewal.status).where(Renewal.id == renewal_id))
        ).scalar_one_or_none()
        if status != "intent":
            return False
        items = s.execute(
            select(RenewalItem.account_id, Blob.id, Blob.renew_failures, Blob.blob_object_id)
            .join(Blob, Blob.id == RenewalItem.blob_pk)
            .where(RenewalItem.renewal_id == renewal_id)
        ).all()
        # --- alerts (same transaction as the release): only real refusals ---
        if backoff:
            digest = s.scalar(select(Renewal.digest).where(Renewal.id == renewal_id))
            for acct in sorted({a for a, *_ in items if a}):
                ids = [oid for a, _pk, _f, oid in items if a == acct]
                alerts.emit(
                    s,
                    acct,
                    "renewal.failed",
                    {"reason": reason[:300], "digest": digest, "blobs": ids},
                )
        for account_id in sorted({a for a, *_ in items if a}):
            ledger.release(s, account_id, _hold_ref(renewal_id, account_id), memo=reason[:200])
        if items:
            s.execute(
                update(Blob),
                [
                    {
                        "id": blob_pk,
                        "pending_renewal_id": None,
                        "updated_at": now,
                        **(
                            {
                                "renew_failures": failures + 1,
                                "renew_not_before": now + timedelta(seconds=_backoff(failures + 1)),
                            }
                            if backoff
                            else {}
                        ),
                    }
                    for _a, blob_pk, failures, _oid in items
                ],
            )
        s.execute(
            update(Renewal)
            .where(Renewal.id == renewal_id)
            .values(
                status="failed" if backoff else "abandoned", error=reason[:1000], settled_at=now
            )
        )
    log.warning("renewal %d released: %s", renewal_id, reason)
    return True


__all__ = [
    "CrashForTest",
    "InsufficientBalance",
    "RenewReport",
    "renew",
]
