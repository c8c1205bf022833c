"""Finishing accepted stores: capture + register once the write lands, release if it can't.

``settle(rt, memory_id)`` is one idempotent, non-blocking step: it asks the
relayer where the write stands and, if it has landed, captures the hold and
registers the memory (and its blob) in ONE transaction; if it failed
terminally (or missed its deadline) it releases the hold. Any number of
callers may run it concurrently for the same memory — the conditional
updates and the ledger's exactly-once refs make only one of them count.

Two drivers call it:
- the in-process ``Completer`` (started with the web process), right after
  accept, polling with backoff until the memory settles;
- the worker's ``complete_writes`` job, the safety net after a crash or
  restart: every memory still ``storing`` (or stuck ``accepting``) is settled
  from the database, so nothing accepted is ever stranded.

Why one file: settling a landed write and the thread that schedules settling share their
outcomes and batch rules; the shared keys and the blob row live in
``service/pipeline.py``.
"""

from __future__ import annotations

import heapq
import logging
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from sqlalchemy import bindparam, select, update

from walkeep import ledger
from walkeep.backends.base import JobState, JobStatus
from walkeep.db import insert_all_absent
from walkeep.db.models import Blob, Memory, MemoryTag, Request, table
from walkeep.errors import WalkeepError
from walkeep.lifecycle import BlobStatus, MemoryStatus
from walkeep.service import sealed
from walkeep.service.jobs import compaction
from walkeep.service.leaving import supersede
from walkeep.service.pipeline import (
    COMPACT_KEY_PREFIX,
    fail_attempt,
    hold_ref,
    job_key,
    parse_job_key,
    upsert_blob,
)
from walkeep.service.runtime import Runtime

log = logging.getLogger(__name__)


class Outcome(StrEnum):
    PENDING = "pending"
    LANDED = "landed"
    FAILED = "failed"
    SETTLED = "settled"  # nothing to do: already settled by someone else


def settle(rt: Runtime, memory_id: str) -> Outcome:
    return settle_many(rt, [memory_id])[memory_id][0]


BATCH = 64


def settle_many(rt: Runtime, memory_ids: list[str]) -> dict[str, tuple[Outcome, float | None]]:
    """``settle`` for many memories at once: one poll of the relayer for all their
    jobs, one transaction to register everything that landed."""
    out: dict[str, tuple[Outcome, float | None]] = {m: (Outcome.SETTLED, None) for m in memory_ids}
    with rt.db.read() as s:
        memories = [
            m
            for m in s.scalars(select(Memory).where(Memory.id.in_(memory_ids)))
            if m.status == MemoryStatus.STORING and m.job_id is not None
        ]
    if not memories:
        return out
    jobs = [m.job_id for m in memories if m.job_id]
    try:
        poll_many = getattr(rt.relayer, "poll_many", None)
        statuses = poll_many(jobs) if poll_many else {j: rt.relayer.poll(j) for j in jobs}
    except WalkeepError as exc:
        log.info("polling %d writes failed (%s); will retry", len(jobs), exc.message)
        statuses = {}
    # Writing one memory's quilt lands its neighbours too: register them with it.
    extra = [j for j, st in statuses.items() if st.state == JobState.LANDED and j not in jobs]
    if extra:
        with rt.db.read() as s:
            more = [
                m
                for m in s.scalars(select(Memory).where(Memory.job_id.in_(extra)))
                if m.status == MemoryStatus.STORING
            ]
        memories.extend(more)
        out.update({m.id: (Outcome.SETTLED, None) for m in more})
    now = rt.clock.now()
    landed: list[tuple[Memory, JobStatus]] = []
    for m in memories:
        st = statuses.get(m.job_id or "", JobStatus(JobState.PENDING))
        if st.state == JobState.LANDED and st.blob is not None:
            landed.append((m, st))
        elif st.state == JobState.FAILED:
            out[m.id] = (_fail(rt, m, st.error or "the write failed"), None)
        elif now >= m.deadline_at:
            out[m.id] = (_fail_late(rt, m), None)
        else:
            hint = None
            if st.retry_at is not None:
                hint = (min(st.retry_at, m.deadline_at) - now).total_seconds()
            out[m.id] = (Outcome.PENDING, hint)
    if landed:
        try:
            out.update({m.id: (o, None) for m, o in _register_batch(rt, landed)})
        except Exception:
            log.exception("registering a batch failed; registering one by one")
            for m, st in landed:
                out[m.id] = (_register(rt, m, st), None)
    return out


@dataclass
class Drained:
    taken: int = 0
    landed: int = 0
    failed: int = 0


def drain_due(rt: Runtime, limit: int = BATCH) -> Drained:
    """Work the relayer's due writes as a queue and settle their memories.

    Only for relayers that run the writes themselves (``work_due``); ``taken``
    is 0 when nothing is due right now.
    """
    out = Drained()
    work_due = getattr(rt.relayer, "work_due", None)
    if work_due is None:
        return out
    taken = work_due(limit)
    out.taken = len(taken)
    if not taken:
        return out
    by_memory: dict[str, tuple[int, JobStatus]] = {}
    moves: list[tuple[str, str, JobStatus]] = []
    for job_id, key, status in taken:
        if key.startswith(COMPACT_KEY_PREFIX):
            moves.append((job_id, key, status))
            continue
        parsed = parse_job_key(key)
        if parsed is not None:
            by_memory[parsed[0]] = (parsed[1], status)
    with rt.db.read() as s:
        memories = list(s.scalars(select(Memory).where(Memory.id.in_(list(by_memory)))))
    landed: list[tuple[Memory, JobStatus]] = []
    for m in memories:
        attempt, status = by_memory[m.id]
        if m.attempt != attempt and status.state != JobState.LANDED:
            continue  # an old attempt's job: nothing to settle
        if status.state == JobState.LANDED and status.blob is not None:
            landed.append((m, status))  # also records orphans of abandoned attempts
        elif (
            status.state == JobState.FAILED
            and m.status == MemoryStatus.STORING
            and _fail(rt, m, status.error or "the write failed") == Outcome.FAILED
        ):
            out.failed += 1
    if landed:
        try:
            outcomes = [o for _, o in _register_batch(rt, landed)]
        except Exception:
            log.exception("registering a batch failed; registering one by one")
            outcomes = [_register(rt, m, st) for m, st in landed]
        out.landed += outcomes.count(Outcome.LANDED)
    if moves:
        compaction.finish(rt, moves)
    return out


def _register_batch(
    rt: Runtime, landed: list[tuple[Memory, JobStatus]]
) -> list[tuple[Memory, Outcome]]:
    """Register landed writes — a whole quilt's members together — in ONE transaction:
    every member lands (captured, registered) or, if anything fails, none does."""
    now = rt.clock.now()
    with rt.db.begin() as s:
        batch = _Batch.read(s, landed)
        results = [(m, _register_in(rt, s, m, st, now, batch=batch)) for m, st in landed]
        if batch.landed:
            s.execute(_LANDED, batch.landed)
            insert_all_absent(s, _T, batch.tags, _TAG_KEY)
        # Captures late, together, one account at a time (in a fixed order): they take the
        # account's row lock (PostgreSQL), which is held to commit and which every store
        # of the account waits for. LOCK ORDER: accounts before requests, as in a store's
        # claim, which locks the account and then inserts its request row. A replay's
        # insert waits for the request row a registration is updating; had that
        # registration updated it *before* taking the account lock the claim holds, the
        # two would deadlock (seen: PostgreSQL aborted the replay, a 503).
        captures: dict[str, list[tuple[str, str]]] = {}
        for memory, outcome in results:
            if outcome == Outcome.LANDED:
                captures.setdefault(memory.account_id, []).append(
                    (hold_ref(memory.id, memory.attempt), f"stored {memory.id}")
                )
        lost: dict[str, list[tuple[Memory, str]]] = {}
        for memory, reason in batch.lost:
            lost.setdefault(memory.account_id, []).append((memory, reason))
        for account_id in sorted(captures.keys() | lost.keys()):
            if account_id in captures:
                ledger.capture_holds(s, account_id, captures[account_id])
            for memory, reason in lost.get(account_id, []):
                fail_attempt(
                    s, memory, memory.attempt, reason, now, from_status=MemoryStatus.STORING
                )
        if batch.done:
            s.execute(_REQUEST_DONE, batch.done)
    return results


def _register(rt: Runtime, memory: Memory, st: JobStatus) -> Outcome:
    with rt.db.begin() as s:
        return _register_in(rt, s, memory, st, rt.clock.now())


def _register_in(  # type: ignore[no-untyped-def]
    rt: Runtime, s, memory: Memory, st: JobStatus, now, *, batch: _Batch | None = None
) -> Outcome:
    """Register a landed write (or record an orphan if we gave up) in the caller's
    transaction. Alone, a LANDED write is also captured here.

    A ``batch`` (registering many at once) knows every member's state, the kept copies
    and each live quilt's blob row once its first member found or made it, and gathers
    the updates; ``_register_batch`` writes them and captures, in its lock order."""
    assert st.blob is not None
    threshold = rt.settings.renew_threshold_epochs
    if batch is not None:
        state = batch.states.get(memory.id)  # None: the memory is gone
    else:
        state = s.execute(_STATE, {"p_memory": memory.id}).first()
    if state is None:
        return Outcome.SETTLED
    live = state.status == MemoryStatus.STORING and state.attempt == memory.attempt
    cached = batch.blobs.get(st.blob.blob_object_id) if batch is not None and live else None
    blob_pk = (
        cached
        if cached is not None
        else upsert_blob(
            s,
            memory.account_id,
            st.blob,
            now,
            threshold,
            live=live,
            patch_count=st.patch_count,
            share_micro=st.quilt_share_micro,
        )
    )
    if batch is not None and live and st.patch_count is not None:
        batch.blobs[st.blob.blob_object_id] = blob_pk
    if not live:
        # We already gave up on this attempt (deadline): the blob is an
        # orphan, never renewed; nothing is billed for it.
        return Outcome.SETTLED
    if state.supersedes is not None and not supersede(
        s, memory.account_id, state.supersedes, memory.id, now
    ):
        # Another correction of the same memory landed first (or it was forgotten or
        # expired meanwhile): this one is released unbilled, and a replay of its
        # request_id answers why (store re-checks the memory it corrects).
        reason = f"the memory it supersedes ({state.supersedes}) is no longer in service"
        if batch is None:
            fail_attempt(s, memory, memory.attempt, reason, now, from_status=MemoryStatus.STORING)
        else:
            batch.lost.append((memory, reason))
        return Outcome.FAILED
    public_id, share = st.public_id, st.share_micro
    key = (memory.account_id, memory.content_hash)
    if st.patch_id is not None:
        # Identical content already kept by this account is one patch: point at
        # it (its renewal is already paid for); the new copy is Walkeep's cost.
        if batch is not None:
            kept = batch.kept.get(key)
        else:
            row = s.execute(
                _KEPT_COPY, {"p_account": memory.account_id, "p_hash": memory.content_hash}
            ).first()
            kept = (row.blob_pk, row.blob_id, row.share_micro) if row is not None else None
        if kept is not None:
            blob_pk, public_id, share = kept
    status = MemoryStatus.NO_RENEW if state.forgotten_at else MemoryStatus.ACTIVE
    landed = {
        "p_memory": memory.id,
        "p_status": status,
        "p_blob": blob_pk,
        "p_blob_id": public_id,
        "p_share": share,
        "p_now": now,
    }
    done = {"p_account": memory.account_id, "p_memory": memory.id, "p_now": now}
    tags = _tags(rt, memory)
    if batch is None:  # one by one: captured here, in _register_batch's lock order
        s.execute(_LANDED, landed)
        insert_all_absent(s, _T, tags, _TAG_KEY)
        _capture(s, memory)
        s.execute(_REQUEST_DONE, done)
        return Outcome.LANDED
    batch.landed.append(landed)
    batch.tags.extend(tags)
    batch.done.append(done)
    if st.patch_id is not None and share is not None and status == MemoryStatus.ACTIVE:
        batch.kept.setdefault(key, (blob_pk, public_id, share))  # a later identical member
    return Outcome.LANDED


@dataclass
class _Batch:
    """What registering a batch reads once and gathers before writing it with one
    executemany each: every member's state (status, attempt, forgotten_at), the kept
    packed copies by (account, content hash) — extended as members land, so a second
    identical member points at the first —, each live quilt's blob row by object id
    (found or made by its first member), and the landed memories' and their requests'
    updates."""

    states: dict[str, Any]
    kept: dict[tuple[str, str], tuple[int, str, int]]
    blobs: dict[str, int] = field(default_factory=dict)
    landed: list[dict[str, object]] = field(default_factory=list)
    tags: list[dict[str, str]] = field(default_factory=list)
    done: list[dict[str, object]] = field(default_factory=list)
    # Corrections that lost their race, released with the captures, in account order.
    lost: list[tuple[Memory, str]] = field(default_factory=list)

    @classmethod
    def read(cls, s, landed: list[tuple[Memory, JobStatus]]) -> _Batch:  # type: ignore[no-untyped-def]
        ids = [m.id for m, _ in landed]
        states = {row.id: row for row in s.execute(_STATES, {"p_ids": ids})}
        hashes: dict[str, set[str]] = {}
        for m, st in landed:
            if st.patch_id is not None:
                hashes.setdefault(m.account_id, set()).add(m.content_hash)
        kept: dict[tuple[str, str], tuple[int, str, int]] = {}
        for account_id, wanted in hashes.items():
            rows = s.execute(_KEPT_COPIES, {"p_account": account_id, "p_hashes": sorted(wanted)})
            for row in rows:  # newest end_epoch first: keep the first per hash
                kept.setdefault(
                    (account_id, row.content_hash), (row.blob_pk, row.blob_id, row.share_micro)
                )
        return cls(states, kept)


def _tags(rt: Runtime, memory: Memory) -> list[dict[str, str]]:
    """The memory's ``memory_tags`` rows: written as it lands (the filters see only landed
    memories), off the store's accept path; a retried landing inserts none twice."""
    md = sealed.open_metadata(rt, memory.account_id, memory.metadata_)
    return [
        {"account_id": memory.account_id, "tag": tag, "memory_id": memory.id}
        for tag in sealed.metadata_tags(rt, memory.account_id, md)
    ]


def _capture(s, memory: Memory) -> None:  # type: ignore[no-untyped-def]
    """Bill a registered write. A hold released meanwhile (the deadline passed)
    raises LedgerConflict, rolling the registration back with it."""
    ledger.capture(
        s, memory.account_id, hold_ref(memory.id, memory.attempt), memo=f"stored {memory.id}"
    )


# Built once: registration runs per landed write (see ledger.py on why that matters).
_M, _B, _R, _T = table(Memory), table(Blob), table(Request), table(MemoryTag)
_TAG_KEY = ("account_id", "tag", "memory_id")
_STATE = select(_M.c.status, _M.c.attempt, _M.c.forgotten_at, _M.c.supersedes).where(
    _M.c.id == bindparam("p_memory")
)
_STATES = select(_M.c.id, _M.c.status, _M.c.attempt, _M.c.forgotten_at, _M.c.supersedes).where(
    _M.c.id.in_(bindparam("p_ids", expanding=True))
)
_LANDED = (
    update(_M)
    .where(_M.c.id == bindparam("p_memory"))
    .values(
        status=bindparam("p_status"),
        blob_pk=bindparam("p_blob"),
        blob_id=bindparam("p_blob_id"),
        share_micro=bindparam("p_share"),
        stored_at=bindparam("p_now"),
        status_changed_at=bindparam("p_now"),
    )
)
_REQUEST_DONE = (
    update(_R)
    .where(_R.c.account_id == bindparam("p_account"), _R.c.memory_id == bindparam("p_memory"))
    .values(status="done", updated_at=bindparam("p_now"))
)
_KEPT_COPIES = (
    select(_M.c.content_hash, _M.c.blob_pk, _M.c.blob_id, _M.c.share_micro)
    .join(_B, _B.c.id == _M.c.blob_pk)
    .where(
        _M.c.account_id == bindparam("p_account"),
        _M.c.content_hash.in_(bindparam("p_hashes", expanding=True)),
        _M.c.status.in_([MemoryStatus.ACTIVE, MemoryStatus.PAUSED]),
        _M.c.share_micro.is_not(None),
        _B.c.status == BlobStatus.LIVE,
    )
    .order_by(_B.c.end_epoch.desc())
)
# A kept (landed, not forgotten, not lapsed) packed copy of the same content.
_KEPT_COPY = (
    select(_M.c.blob_pk, _M.c.blob_id, _M.c.share_micro)
    .join(_B, _B.c.id == _M.c.blob_pk)
    .where(
        _M.c.account_id == bindparam("p_account"),
        _M.c.content_hash == bindparam("p_hash"),
        _M.c.status.in_([MemoryStatus.ACTIVE, MemoryStatus.PAUSED]),
        _M.c.share_micro.is_not(None),
        _B.c.status == BlobStatus.LIVE,
    )
    .order_by(_B.c.end_epoch.desc())
    .limit(1)
)


def _fail_late(rt: Runtime, memory: Memory) -> Outcome:
    """The deadline passed. Fail the store only if its write can be fenced off: a
    write nobody is uploading is cancelled in the same transaction, so it can
    never land afterwards as an orphan the operator pays for (or a second copy
    next to a retry's). A write being uploaded right now is left to land."""
    reason = "the write did not land before its deadline"
    cancel = getattr(rt.relayer, "cancel_in", None)
    with rt.db.begin() as s:
        now = rt.clock.now()
        if cancel is not None and memory.job_id and not cancel(s, memory.job_id, now):
            return Outcome.PENDING
        failed = fail_attempt(
            s, memory, memory.attempt, reason, now, from_status=MemoryStatus.STORING
        )
    if not failed:
        return Outcome.SETTLED
    log.warning("store %s failed: %s (hold released, write cancelled)", memory.id, reason)
    return Outcome.FAILED


def _fail(rt: Runtime, memory: Memory, reason: str) -> Outcome:
    with rt.db.begin() as s:
        failed = fail_attempt(
            s, memory, memory.attempt, reason, rt.clock.now(), from_status=MemoryStatus.STORING
        )
    if not failed:
        return Outcome.SETTLED
    log.warning("store %s failed: %s (hold released)", memory.id, reason)
    return Outcome.FAILED


def recover_accepting(rt: Runtime, memory_id: str) -> Outcome:
    """A memory stuck in ``accepting`` (crash between claim and relayer accept).

    Re-run the accept with the same idempotency key: the relayer returns the
    job it already has, or accepts now. If the relayer is unavailable, leave it
    for the next pass until the deadline, then release the hold.
    """
    with rt.db.read() as s:
        memory = s.get(Memory, memory_id)
    if memory is None or memory.status != MemoryStatus.ACCEPTING:
        return Outcome.SETTLED
    now = rt.clock.now()
    # The plaintext is not kept by Walkeep after accept: if the relayer never
    # got the write, there is nothing to resubmit. Ask with the same key; a
    # relayer that has no such job cannot be given one, so release.
    job_id = _find_job(rt, memory)
    if job_id is not None:
        with rt.db.begin() as s:
            s.execute(
                update(Memory)
                .where(Memory.id == memory.id, Memory.status == MemoryStatus.ACCEPTING)
                .values(status=MemoryStatus.STORING, job_id=job_id, status_changed_at=now)
            )
        return settle(rt, memory.id)
    with rt.db.begin() as s:
        failed = fail_attempt(
            s,
            memory,
            memory.attempt,
            "interrupted before the storage backend accepted the write",
            now,
            from_status=MemoryStatus.ACCEPTING,
        )
    if not failed:
        return Outcome.SETTLED
    return Outcome.FAILED


def _find_job(rt: Runtime, memory: Memory) -> str | None:
    finder = getattr(rt.relayer, "find_job", None)
    if finder is None:
        return None
    try:
        return finder(job_key(memory.id, memory.attempt))  # type: ignore[no-any-return]
    except WalkeepError:
        return None


@dataclass
class CompleteReport:
    landed: int = 0
    failed: int = 0
    pending: int = 0
    recovered: int = 0


def complete_writes(
    rt: Runtime, *, accepting_grace_seconds: int = 120, limit: int = 1000
) -> CompleteReport:
    """Worker job: settle every in-flight store from the database."""
    report = CompleteReport()
    now = rt.clock.now()
    with rt.db.read() as s:
        storing = list(
            s.scalars(
                select(Memory.id)
                .where(Memory.status == MemoryStatus.STORING)
                .order_by(Memory.accepted_at)
                .limit(limit)
            )
        )
        stuck = list(
            s.scalars(
                select(Memory.id)
                .where(
                    Memory.status == MemoryStatus.ACCEPTING,
                    Memory.status_changed_at < now - timedelta(seconds=accepting_grace_seconds),
                )
                .limit(limit)
            )
        )
    for mid in stuck:
        if recover_accepting(rt, mid) != Outcome.SETTLED:
            report.recovered += 1
    compaction.finish_landed(rt)
    # Self-run writes: work the queue until nothing is due.
    while True:
        stop = rt.extras.get("stop")
        if stop is not None and stop.is_set():
            return report
        drained = drain_due(rt)
        report.landed += drained.landed
        report.failed += drained.failed
        if not drained.taken:
            break
    stop = rt.extras.get("stop")
    for i in range(0, len(storing), BATCH):
        if stop is not None and stop.is_set():
            break
        batch = storing[i : i + BATCH]
        try:
            outcomes = [o for o, _ in settle_many(rt, batch).values()]
        except Exception:
            log.exception("settling %d writes failed; will retry", len(batch))
            outcomes = [Outcome.PENDING] * len(batch)
        report.landed += outcomes.count(Outcome.LANDED)
        report.failed += outcomes.count(Outcome.FAILED)
        report.pending += outcomes.count(Outcome.PENDING)
    return report


@dataclass(order=True)
class _Item:
    due: float
    memory_id: str = field(compare=False)
    delay: float = field(compare=False, default=0.05)


class Completer:
    """In-process driver: settles accepted stores as soon as they can land.

    Two modes. With a self-run relayer (``work_due``) the queue lives in the
    database: the thread takes whatever writes are due, oldest first, and
    sleeps until the next is due or a store wakes it. With a remote relayer
    (MemWal) it keeps a heap of memories to poll, in batches, backing off per
    memory (or sleeping until the relayer says the write can be due).

    Purely an accelerator: if the process dies, the worker's
    ``complete_writes`` finishes the job from the database.
    """

    MAX_DELAY = 5.0
    # After a productive round, how long to let new writes gather before the next.
    GATHER_SECONDS = 0.05
    # Completion is background work: its threads run at this nice value (Linux),
    # the lowest priority, so that on a busy machine requests get the CPU first and
    # completion catches up in the gaps (19 measured 0.42-0.43 of the ceiling on
    # PostgreSQL against 0.34-0.40 at 10); during a burst its embedding also steps
    # aside between batches (walkeep/pressure.py). Accepted writes are durable in
    # the database, so lagging costs latency to "active", never data.
    NICE = 19
    # How long to sleep when the relayer says when a write can first be due.
    MAX_HINTED_DELAY = 60.0
    # A round running longer than this counts as hung (readiness says so).
    STUCK_SECONDS = 300.0

    # One thread: on a small machine a second one mostly competes with request
    # threads for the GIL and SQLite's writer (measured: bench/store.py).
    def __init__(self, rt: Runtime, *, threads: int = 1) -> None:
        self.rt = rt
        self._heap: list[_Item] = []
        self._cv = threading.Condition()
        self._inflight = 0
        self._stop = False
        self._threads = [
            threading.Thread(target=self._run, name=f"walkeep-completer-{i}", daemon=True)
            for i in range(threads)
        ]
        self._started = False
        # Longest idle sleep: another process may accept writes without waking us.
        self.max_sleep = self.MAX_DELAY
        self._queue_mode = getattr(rt.relayer, "work_due", None) is not None
        self._kicks = 0
        # Queue mode: when the idle thread will next look at the queue by itself.
        self._sleeping_until: float | None = None
        # When the round in hand began (time.monotonic()), None between rounds.
        self._round_began: float | None = None

    def start(self) -> None:
        if not self._started:
            self._started = True
            for t in self._threads:
                t.start()

    def stop(self, timeout: float = 5.0) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        for t in self._threads:
            if t.is_alive():
                t.join(timeout)

    def alive(self) -> bool:
        """Whether this completer is finishing writes: started, not stopped, its threads
        running, and none of them in one round for ``STUCK_SECONDS`` (``/readyz``)."""
        if not self._started or self._stop:
            return False
        if not all(t.is_alive() for t in self._threads):
            return False
        began = self._round_began
        return began is None or time.monotonic() - began < self.STUCK_SECONDS

    def submit(self, memory_id: str, delay: float = 0.0) -> None:
        """A write was accepted; ``delay``: seconds until it is due."""
        with self._cv:
            if self._queue_mode:
                # The queue is in the database: only wake a thread that would otherwise
                # sleep past this write. A packed write is due when its quilt's window
                # closes, which a sleeping thread already plans to wake for; waking it per
                # accept instead cost a lease query and a next_due query per store, on the
                # same GIL and (SQLite) write lock as the requests.
                if self._sleeping_until is not None and (
                    time.monotonic() + delay >= self._sleeping_until
                ):
                    return
                self._kicks += 1
            else:
                heapq.heappush(self._heap, _Item(time.monotonic() + delay, memory_id))
            self._cv.notify()

    def _run_queue(self) -> None:
        """Self-run relayer: the work queue lives in ``write_jobs``; take what is due.

        Database queries happen outside ``_cv``: a store's ``submit`` takes it on the
        event loop, which must not wait for this thread's query (py-spy showed the loop
        waiting there during bursts)."""
        while True:
            with self._cv:
                if self._stop:
                    return
                self._inflight += 1
                self._kicks = 0
            worked = 0
            crashed = False
            try:
                # Not while requests saturate the process (walkeep/pressure.py): stepping
                # aside inside the embedder alone still let each round's lease, upload,
                # first embedding batch and vector inserts run mid-burst — 28 % of the
                # process's samples during a PostgreSQL burst (py-spy), on the cores the
                # requests needed. Before the lease, so no write is held while it waits.
                self.rt.pressure.step_aside()
                self._round_began = time.monotonic()
                worked = drain_due(self.rt).taken
            except Exception:
                crashed = True
                log.exception("working due writes failed; retrying shortly")
            finally:
                self._round_began = None
            with self._cv:
                self._inflight -= 1
                self._cv.notify_all()
                if self._stop or (worked >= BATCH and not crashed):
                    continue  # a backlog: keep going
                if worked and not crashed:
                    # Writes are arriving: let the next batch build up instead of
                    # waking per accept. Each round has fixed costs (lease, poll,
                    # register transactions) that would otherwise be paid per
                    # store, on the same GIL as the requests (bench/store.py).
                    self._sleep(self.GATHER_SECONDS)
                    continue
                if self._kicks and not crashed:
                    continue
            # Nothing due (or a failure): sleep until the next write is due, or a new
            # one arrives; after a failure, back off first.
            wait = self.MAX_DELAY if crashed else self.max_sleep
            if not crashed:
                nxt = self._next_due()
                if nxt is not None:
                    wait = min(wait, max(0.0, (nxt - self.rt.clock.now()).total_seconds()))
            with self._cv:
                if self._stop or (self._kicks and not crashed):
                    continue  # a store arrived while we looked: submit() counted it
                if wait > 0:
                    self._sleep(wait)

    def _next_due(self) -> datetime | None:
        try:
            return self.rt.relayer.next_due()  # type: ignore[attr-defined, no-any-return]
        except Exception:
            log.exception("next_due failed")
            return None

    def _sleep(self, seconds: float) -> None:
        """Wait on the condition (held) for ``seconds`` or a kick, saying until when."""
        self._sleeping_until = time.monotonic() + seconds
        try:
            self._cv.wait(seconds)
        finally:
            self._sleeping_until = None

    def pending(self) -> int:
        with self._cv:
            return len(self._heap) + self._inflight + self._kicks

    def wait_idle(self, timeout: float = 10.0) -> bool:
        """Block until nothing is queued or running (tests, graceful shutdown)."""
        end = time.monotonic() + timeout
        if self._queue_mode:
            return self._wait_queue_idle(end)
        with self._cv:
            while self._heap or self._inflight:
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self._cv.wait(min(left, 0.05))
        return True

    def _wait_queue_idle(self, end: float) -> bool:
        """Idle = no write is due now and no thread is working one."""
        while time.monotonic() < end:
            with self._cv:
                busy = self._inflight or self._kicks
            if not busy:
                nxt = self.rt.relayer.next_due()  # type: ignore[attr-defined]
                if nxt is None or nxt > self.rt.clock.now():
                    with self._cv:
                        if not (self._inflight or self._kicks):
                            return True
            time.sleep(0.01)
        return False

    def _run(self) -> None:
        _lower_priority(self.NICE)
        self._warm_up()
        if self._queue_mode:
            self._run_queue()
            return
        while True:
            with self._cv:
                while not self._stop and (not self._heap or self._heap[0].due > time.monotonic()):
                    wait = (
                        None if not self._heap else max(0.0, self._heap[0].due - time.monotonic())
                    )
                    self._cv.wait(wait if wait is not None else 1.0)
                if self._stop:
                    return
                # Take everything that is due (up to a batch): one poll round, one commit.
                now = time.monotonic()
                items: dict[str, _Item] = {}
                while self._heap and self._heap[0].due <= now and len(items) < BATCH:
                    item = heapq.heappop(self._heap)
                    items.setdefault(item.memory_id, item)
                self._inflight += len(items)
            self._round_began = time.monotonic()
            try:
                results = settle_many(self.rt, list(items))
            except Exception:
                log.exception("settling %d writes crashed; retrying", len(items))
                results = {m: (Outcome.PENDING, None) for m in items}
            finally:
                self._round_began = None
            with self._cv:
                self._inflight -= len(items)
                for mid, (outcome, hint) in results.items():
                    if outcome != Outcome.PENDING or self._stop:
                        continue
                    delay = min(items[mid].delay * 2, self.MAX_DELAY)
                    # The relayer may say when the write can first be due: sleep
                    # until then instead of polling it again and again.
                    wait = (
                        min(max(hint, delay), self.MAX_HINTED_DELAY) if hint is not None else delay
                    )
                    heapq.heappush(self._heap, _Item(time.monotonic() + wait, mid, delay))
                self._cv.notify_all()

    def _warm_up(self) -> None:
        """Load the embedding model now, in the background, rather than in the middle
        of the first batch of writes (≈1 s of CPU that would otherwise land on the
        first memories' time-to-active and on the requests running beside it)."""
        embedder = getattr(getattr(self.rt.relayer, "index", None), "embedder", None)
        load = getattr(embedder, "load", None)
        if load is None:
            return
        try:
            load()
        except Exception as exc:  # it loads (and fails loudly) on first use instead
            log.debug("could not preload the embedder: %s", exc)


def _lower_priority(by: int) -> None:
    """Lower the calling thread's scheduling priority by ``by`` nice steps (Linux,
    where nice is per thread; elsewhere a no-op). Lowering needs no privileges."""
    if sys.platform != "linux":
        return
    tid = threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + by))
    except OSError as exc:  # e.g. a sandbox that forbids it: run at normal priority
        log.debug("could not lower the completer's priority: %s", exc)
