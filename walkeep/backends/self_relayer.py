"""``SelfRelayer``: Walkeep as its own relayer (the ``local`` and ``walrus`` backends).

Accept = encrypt the content with the account's key and persist a write job
(the ciphertext lives in the database until the blob lands, so an accepted
write survives a crash). The job is worked by whoever takes it once it is
due — the in-process completer or the worker — under a lease, so two workers
never upload the same job twice:

    pending ──put (alone, or packed in a quilt)──▶ uploaded ──index──▶ landed
        ├──terminal error (too large, refused)──▶ failed
        └──its store failed (deadline)──▶ cancelled: never uploads afterwards

**Quilts.** Small writes of one account wait up to ``quilt_window_seconds``
and are then written together as one Walrus quilt (one Blob object, one
renewal), or sooner once ``quilt_max_patches`` or ``quilt_max_bytes`` are
waiting. Each job lands with its own patch id and a fixed share of the
quilt's units (``pricing.apportion_quilt_shares``). Whether a write is packed at
all is ``pricing.packing_saves``: a cost comparison, not a guess.

``uploaded`` is recorded before indexing so a crash while embedding never
re-uploads (a second upload would create a second, orphaned Blob object).
Transient store errors (publisher down, 5xx) back off and retry until the
store's completion deadline; the service layer then cancels the job (fenced:
only a job nobody is uploading can be cancelled) and releases the hold.

**Leases belong to live processes.** A lease is short (``lease_seconds``) and
kept alive by a heartbeat thread while its holder works, so a crashed
process's writes are taken over within seconds instead of waiting out a long
fixed lease.

Why one file: one job queue's states (the diagram above) and every transition between
them, each conditional on the state before.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import secrets
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Collection, Iterable, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, case, func, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from walkeep import ids, metrics, nowait, pricing
from walkeep.backends.base import (
    BlobObject,
    BlobStore,
    Health,
    JobState,
    JobStatus,
    ListedContent,
    SearchHit,
)
from walkeep.clock import Clock
from walkeep.db import Database, Prepared, Tx, rowcount
from walkeep.db.models import WriteJob, table
from walkeep.errors import NotFound, QuotaExceeded, RelayerUnavailable, ValidationError

log = logging.getLogger(__name__)

HEALTH_TTL_SECONDS = 5.0
# Built once: a job is inserted on every store.
_INSERT_JOB = insert(table(WriteJob))


@functools.cache
def _job_insert(columns: tuple[str, ...]) -> Prepared:
    """The job INSERT for rows setting these columns (``job_row`` leaves out unset ones,
    so their defaults apply): on SQLite a store runs it on the raw cursor."""
    return Prepared(_INSERT_JOB, keys=columns)


_ACTIVE = ("pending", "uploaded")


class SelfRelayer:
    content_listable = True

    def __init__(
        self,
        db: Database,
        clock: Clock,
        store: BlobStore,
        keyring,  # walkeep.crypto.Keyring
        index,  # walkeep.index.search.SearchIndex
        owner: str,
        *,
        latency_ms: int = 0,
        lease_seconds: int = 20,
        cache_bytes: int = 32 * 2**20,
        max_backlog: int = 0,
        quilts: bool = False,
        quilt_window_seconds: float = 5.0,
        quilt_max_bytes: int = 16 * 2**20,
        quilt_max_patches: int = 600,
    ) -> None:
        self.db = db
        self.clock = clock
        self.store = store
        self.keyring = keyring
        self.index = index
        self.owner = owner
        self.name = store.name
        self.latency_ms = latency_ms
        self.lease_seconds = lease_seconds
        self.max_backlog = max_backlog
        # Test hook: the next N jobs fail terminally (as a refused write would).
        self.fail_next_jobs = 0
        self._health: tuple[float, Health] | None = None
        # Plaintext cache, bounded in bytes (a count bound let 256 KiB memories
        # hold half a gigabyte).
        self._cache: OrderedDict[tuple[str, str], str] = OrderedDict()
        self._cache_bytes = cache_bytes
        self._cached_bytes = 0
        self._lock = threading.Lock()
        self.quilts = quilts
        self.quilt_window = timedelta(seconds=quilt_window_seconds)
        self.quilt_max_bytes = quilt_max_bytes
        self.quilt_max_patches = quilt_max_patches
        self.pack_limit = _pack_limit(quilt_max_bytes) if quilts else 0
        # Who holds a lease: this process (and this relayer instance within it).
        self.lease_owner = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self._held: set[str] = set()
        self._heartbeat: threading.Thread | None = None

    # --- health ------------------------------------------------------------------------
    def health(self) -> Health:
        now = time.monotonic()
        cached = self._health
        if cached and now - cached[0] < HEALTH_TTL_SECONDS:
            return cached[1]
        nowait.refuse("a storage health probe")  # it may go over the network
        try:
            h = self.store.health()
            if h.ok and self.max_backlog:
                h = self._backlog_health(h)
        except Exception as exc:  # a probe must never crash its caller
            h = Health(ok=False, writes="paused", detail=f"health probe failed: {exc}")
        self._health = (now, h)
        return h

    def _backlog_health(self, h: Health) -> Health:
        """Load shedding. Accepts are cheaper than completions (upload, embedding), so
        a sustained flood would grow the queue until writes miss their completion
        deadline and fail *after* being accepted. Past ``max_backlog`` unfinished
        writes, new ones are refused up front instead (RELAYER_UNAVAILABLE: nothing
        held, retry later) until the queue drains; checked once per health TTL."""
        with self.db.read() as s:
            backlog = int(
                s.scalar(
                    select(func.count())
                    .select_from(WriteJob)
                    .where(WriteJob.status.in_(["pending", "uploaded"]))
                )
                or 0
            )
        if backlog < self.max_backlog:
            return h
        return Health(
            ok=True,
            writes="paused",
            detail=f"{backlog} accepted writes are still completing (limit {self.max_backlog}); "
            "new writes resume as they land",
        )

    def invalidate_health(self) -> None:
        self._health = None

    # --- writes ------------------------------------------------------------------------
    def stage(self, *, account_id: str, namespace: str, content: str) -> _Staged:
        """Everything that can happen before the caller's transaction: health, encryption
        (which may create the account's data key in its own transaction)."""
        self._require_healthy()
        ciphertext = self.keyring.encrypt(account_id, content.encode("utf-8"))
        return _Staged(
            account_id, namespace, ciphertext, self._delay(len(ciphertext)).total_seconds()
        )

    def accept_staged(
        self, session: Tx, staged: _Staged, *, idempotency_key: str, epochs: int
    ) -> str:
        """Accept inside the caller's transaction: the job commits with the claim and hold.

        The key is new per attempt; a duplicate violates the UNIQUE constraint and
        aborts the caller's transaction (the caller then replays)."""
        row = self.job_row(staged, idempotency_key=idempotency_key, epochs=epochs)
        _job_insert(tuple(row)).run(session, row)
        return str(row["id"])

    def job_row(self, staged: _Staged, *, idempotency_key: str, epochs: int) -> dict[str, Any]:
        """The new write job's ``write_jobs`` row, for callers that insert it themselves
        as part of a larger statement (the store's one-statement claim on PostgreSQL).
        Columns left out (lease, result, error…) take their defaults. A plain dict, not a
        ``WriteJob`` built and taken apart: the ORM's instrumentation cost a store
        ~0.1 ms on the event loop for nothing."""
        now = self.clock.now()
        size = len(staged.ciphertext)
        return {
            "id": ids.new_job_id(),
            "account_id": staged.account_id,
            "namespace": staged.namespace,
            "idempotency_key": idempotency_key,
            "ciphertext": staged.ciphertext,
            "size_bytes": size,
            "epochs": epochs,
            "status": "pending",
            # A packed write waits for its quilt's window; a lone one only for the
            # (simulated) write latency.
            "not_before": now + self._delay(size),
            "created_at": now,
            "updated_at": now,
        }

    def _delay(self, size: int) -> timedelta:
        """How long a new write of ``size`` ciphertext bytes waits before it is due: a
        packed one for its quilt's window, a lone one only for the (simulated) latency."""
        return self.quilt_window if self.packs(size) else timedelta(milliseconds=self.latency_ms)

    def packs(self, size: int) -> bool:
        """Whether a write of ``size`` (ciphertext) bytes goes into a quilt."""
        return self.quilts and size <= self.pack_limit

    def _require_healthy(self) -> None:
        h = self.health()
        if not h.ok or h.writes == "paused":
            raise RelayerUnavailable(
                f"storage backend ({self.name}) is unavailable: {h.detail or 'unreachable'}; "
                "nothing was stored or billed — retry with the same request_id",
                {"backend": self.name, "retry": True},
            )

    def accept(
        self, *, account_id: str, namespace: str, content: str, idempotency_key: str, epochs: int
    ) -> str:
        existing = self.find_job(idempotency_key)
        if existing is not None:
            return existing
        staged = self.stage(account_id=account_id, namespace=namespace, content=content)
        return self._insert_job(staged, idempotency_key, epochs)

    def _insert_job(self, staged: _Staged, idempotency_key: str, epochs: int) -> str:
        """Persist a write job in its own transaction; a racer with the same key wins."""
        job = WriteJob(**self.job_row(staged, idempotency_key=idempotency_key, epochs=epochs))
        try:
            with self.db.begin() as s:
                s.add(job)
        except IntegrityError:
            found = self.find_job(idempotency_key)
            if found is None:
                raise
            return found
        return job.id

    def find_job(self, idempotency_key: str) -> str | None:
        with self.db.read() as s:
            return s.scalar(select(WriteJob.id).where(WriteJob.idempotency_key == idempotency_key))

    def poll(self, job_id: str) -> JobStatus:
        return self.poll_many([job_id])[job_id]

    def poll_many(self, job_ids: Sequence[str]) -> dict[str, JobStatus]:
        """Where each write stands; due lone writes are worked here, as one batch.

        Batching is what lets completion keep up with accepts: one lease
        transaction, one embedding call for all the texts, one transaction to
        record the uploads and one to mark them landed. Writes waiting to be
        packed are left to ``work_due``, which writes them as a quilt.
        """
        ids_ = list(dict.fromkeys(job_ids))
        # Read only the small columns: the ciphertext is loaded when there is work.
        with self.db.read() as s:
            rows = s.execute(
                select(
                    WriteJob.id,
                    WriteJob.account_id,
                    WriteJob.status,
                    WriteJob.not_before,
                    WriteJob.size_bytes,
                    WriteJob.result,
                    WriteJob.error,
                ).where(WriteJob.id.in_(ids_))
            ).all()
        out: dict[str, JobStatus] = {
            j: JobStatus(JobState.FAILED, error="unknown write job") for j in ids_
        }
        now = self.clock.now()
        due: list[str] = []
        quilt_accounts: list[str] = []
        for r in rows:
            if r.status == "landed":
                out[r.id] = _landed(r.result)
            elif r.status in ("failed", "cancelled"):
                out[r.id] = JobStatus(JobState.FAILED, error=r.error or r.status)
            elif r.status == "pending" and now < r.not_before:
                out[r.id] = JobStatus(JobState.PENDING, retry_at=r.not_before)
            elif r.status == "pending" and self.packs(r.size_bytes):
                # Its quilt's window has closed: write the account's quilt now.
                out[r.id] = JobStatus(JobState.PENDING)
                quilt_accounts.append(r.account_id)
            else:
                out[r.id] = JobStatus(JobState.PENDING)
                due.append(r.id)
        for account_id in dict.fromkeys(quilt_accounts):
            group = self._take_quilt(account_id, now)
            if group:
                # Every member's status, not just the polled ones': the caller
                # registers a quilt's members together, in one transaction.
                out.update(self._work_leased(group, quilt=True))
        if due:
            leased = self._lease(due, now)  # the others are being worked elsewhere
            if leased:
                out.update(self._work_leased(leased))
        return out

    def work_due(self, limit: int = 64) -> list[tuple[str, str, JobStatus]]:
        """Work the due writes (a job queue, for the in-process completer and the
        worker): quilts whose window closed (or that are full) first, then lone
        writes. Returns ``(job_id, idempotency_key, status)`` for each job taken."""
        now = self.clock.now()
        statuses: dict[str, JobStatus] = {}
        if self.quilts:
            for account_id in self._ready_quilts(now):
                group = self._take_quilt(account_id, now)
                if group:
                    statuses.update(self._work_leased(group, quilt=True))
                if len(statuses) >= limit:
                    break
        room = max(0, limit - len(statuses))
        lone = self._due_lone(now, room) if room else []
        leased = self._lease(lone, now) if lone else []
        if leased:
            statuses.update(self._work_leased(leased))
        if not statuses:
            return []
        with self.db.read() as s:
            keys = dict(
                s.execute(
                    select(WriteJob.id, WriteJob.idempotency_key).where(
                        WriteJob.id.in_(list(statuses))
                    )
                ).all()
            )
        return [(j, keys[j], st) for j, st in statuses.items()]

    def _due_lone(self, now: datetime, limit: int) -> list[str]:
        """Due writes that go alone (too big to save by packing), and uploaded ones
        whose indexing was interrupted (packed or not)."""
        lone = WriteJob.status == "uploaded"
        if self.quilts:
            lone = lone | (WriteJob.size_bytes > self.pack_limit)
        else:
            lone = WriteJob.status.in_(_ACTIVE)
        with self.db.read() as s:
            return list(
                s.scalars(
                    select(WriteJob.id)
                    .where(
                        WriteJob.status.in_(_ACTIVE),
                        lone,
                        WriteJob.not_before <= now,
                        (WriteJob.lease_until.is_(None)) | (WriteJob.lease_until < now),
                    )
                    .order_by(WriteJob.not_before)
                    .limit(limit)
                )
            )

    def _ready_quilts(self, now: datetime) -> list[str]:
        """Accounts whose waiting writes should be written now: the oldest one's
        window has closed, or a full quilt's worth of patches or bytes is waiting."""
        with self.db.read() as s:
            rows = s.execute(
                select(
                    WriteJob.account_id,
                    func.count(),
                    func.sum(WriteJob.size_bytes),
                    func.min(WriteJob.not_before),
                )
                .where(
                    WriteJob.status == "pending",
                    WriteJob.size_bytes <= self.pack_limit,
                    (WriteJob.lease_until.is_(None)) | (WriteJob.lease_until < now),
                )
                .group_by(WriteJob.account_id)
            ).all()
        ready = [
            (oldest, account_id)
            for account_id, count, size, oldest in rows
            if oldest <= now or count >= self.quilt_max_patches or size >= self.quilt_max_bytes
        ]
        return [account_id for _, account_id in sorted(ready)]

    def _take_quilt(self, account_id: str, now: datetime) -> list[str]:
        """Lease one quilt's worth of an account's waiting writes, oldest first."""
        with self.db.read() as s:
            rows = s.execute(
                select(WriteJob.id, WriteJob.size_bytes)
                .where(
                    WriteJob.account_id == account_id,
                    WriteJob.status == "pending",
                    WriteJob.size_bytes <= self.pack_limit,
                    (WriteJob.lease_until.is_(None)) | (WriteJob.lease_until < now),
                )
                .order_by(WriteJob.created_at, WriteJob.id)
                .limit(self.quilt_max_patches)
            ).all()
        picked: list[str] = []
        total = 0
        for job_id, size in rows:
            if picked and total + size > self.quilt_max_bytes:
                break
            picked.append(job_id)
            total += size
        return self._lease(picked, now) if picked else []

    def next_due(self) -> datetime | None:
        """When the earliest waiting write can next be worked (None: nothing waiting):
        its due time, or the end of a lease someone else holds on it."""
        when = case(
            (
                and_(WriteJob.lease_until.is_not(None), WriteJob.lease_until > WriteJob.not_before),
                WriteJob.lease_until,
            ),
            else_=WriteJob.not_before,
        )
        with self.db.read() as s:
            return s.scalar(select(func.min(when)).where(WriteJob.status.in_(_ACTIVE)))

    # --- leases ------------------------------------------------------------------------
    def _lease(self, job_ids: list[str], now: datetime) -> list[str]:
        with self.db.begin() as s:
            leased = list(
                s.scalars(
                    update(WriteJob)
                    .where(
                        WriteJob.id.in_(job_ids),
                        WriteJob.status.in_(_ACTIVE),
                        (WriteJob.lease_until.is_(None)) | (WriteJob.lease_until < now),
                    )
                    .values(
                        lease_until=now + timedelta(seconds=self.lease_seconds),
                        lease_owner=self.lease_owner,
                        attempts=WriteJob.attempts + 1,
                        updated_at=now,
                    )
                    .returning(WriteJob.id)
                )
            )
        if leased:
            with self._lock:
                self._held.update(leased)
            self._ensure_heartbeat()
        return leased

    def _release(self, job_ids: Iterable[str]) -> None:
        with self._lock:
            self._held.difference_update(job_ids)

    def _unlease(self, job_ids: list[str]) -> None:
        self._release(job_ids)
        with self.db.begin() as s:
            s.execute(
                update(WriteJob)
                .where(WriteJob.id.in_(job_ids), WriteJob.lease_owner == self.lease_owner)
                .values(lease_until=None, lease_owner=None)
            )

    def heartbeat(self) -> int:
        """Keep this process's leases alive while it works them; returns how many.

        Called every ``lease_seconds / 4`` by a daemon thread. A process that dies
        stops calling it, so its leases run out within ``lease_seconds`` and the
        restarted server, another process or the worker takes the writes over.
        """
        with self._lock:
            held = list(self._held)
        if not held:
            return 0
        until = self.clock.now() + timedelta(seconds=self.lease_seconds)
        with self.db.begin() as s:
            res = s.execute(
                update(WriteJob)
                .where(
                    WriteJob.id.in_(held),
                    WriteJob.lease_owner == self.lease_owner,
                    WriteJob.status.in_(_ACTIVE),
                )
                .values(lease_until=until)
            )
        return rowcount(res)

    def _ensure_heartbeat(self) -> None:
        if self._heartbeat is not None and self._heartbeat.is_alive():
            return
        with self._lock:
            if self._heartbeat is not None and self._heartbeat.is_alive():
                return
            self._heartbeat = threading.Thread(
                target=self._beat, name="walkeep-lease-heartbeat", daemon=True
            )
            self._heartbeat.start()

    def _beat(self) -> None:
        interval = max(0.5, self.lease_seconds / 4)
        while True:
            time.sleep(interval)
            try:
                if not self.heartbeat():
                    with self._lock:
                        if not self._held:
                            self._heartbeat = None
                            return
            except Exception:  # the database may be briefly away; try again
                log.exception("lease heartbeat failed")

    def cancel_in(self, session: Session, job_id: str, now: datetime) -> bool:
        """Fence a failed attempt's write, in the caller's transaction (13.2).

        True when the job will never upload: it was waiting and is now
        ``cancelled``, or it had already failed. False when it is being worked
        right now (leased) or has already been uploaded: then the store must not
        be failed — its write is landing, and will be registered and billed.
        """
        res = session.execute(
            update(WriteJob)
            .where(
                WriteJob.id == job_id,
                WriteJob.status == "pending",
                (WriteJob.lease_until.is_(None)) | (WriteJob.lease_until < now),
            )
            .values(
                status="cancelled",
                ciphertext=None,
                lease_until=None,
                lease_owner=None,
                error="cancelled: the store failed before this write was uploaded",
                updated_at=now,
            )
        )
        if rowcount(res) == 1:
            return True
        status = session.scalar(select(WriteJob.status).where(WriteJob.id == job_id))
        return status in (None, "failed", "cancelled")

    # --- re-packing (compaction) ----------------------------------------------------------
    def requeue_patch(
        self, *, account_id: str, namespace: str, patch_id: str, idempotency_key: str, epochs: int
    ) -> str:
        """Queue a landed patch's ciphertext (read back from Walrus) as a new write, to be
        packed again with the account's other waiting writes. Idempotent on the key."""
        existing = self.find_job(idempotency_key)
        if existing is not None:
            return existing
        ciphertext = self.store.get_patch(patch_id)
        return self._insert_job(_Staged(account_id, namespace, ciphertext), idempotency_key, epochs)

    def unfinished_jobs(self, key_prefix: str) -> int:
        """Writes under this key prefix that have not landed yet (or not been applied)."""
        with self.db.read() as s:
            return int(
                s.scalar(
                    select(func.count())
                    .select_from(WriteJob)
                    .where(
                        WriteJob.idempotency_key.startswith(key_prefix, autoescape=True),
                        WriteJob.status.in_([*_ACTIVE, "landed"]),
                    )
                )
                or 0
            )

    def landed_jobs(self, key_prefix: str, limit: int) -> list[tuple[str, str, JobStatus]]:
        """Landed writes under this key prefix, not yet applied by their owner."""
        with self.db.read() as s:
            rows = list(
                s.execute(
                    select(WriteJob.id, WriteJob.idempotency_key, WriteJob.result)
                    .where(
                        WriteJob.status == "landed",
                        WriteJob.idempotency_key.startswith(key_prefix, autoescape=True),
                    )
                    .limit(limit)
                )
            )
        return [(j, k, _landed(r)) for j, k, r in rows]

    def mark_applied_in(self, session: Session, job_id: str, now: datetime) -> bool:
        """``landed`` → ``applied``, in the caller's transaction; False if done already."""
        res = session.execute(
            update(WriteJob)
            .where(WriteJob.id == job_id, WriteJob.status == "landed")
            .values(status="applied", updated_at=now)
        )
        return rowcount(res) == 1

    # --- work --------------------------------------------------------------------------
    def _work_leased(self, job_ids: list[str], *, quilt: bool = False) -> dict[str, JobStatus]:
        try:
            return self._work_quilt(job_ids) if quilt else self._work(job_ids)
        except Exception:
            self._unlease(job_ids)
            raise
        finally:
            self._release(job_ids)

    def _work(self, job_ids: list[str]) -> dict[str, JobStatus]:
        with self.db.read() as s:
            jobs = list(s.scalars(select(WriteJob).where(WriteJob.id.in_(job_ids))))
        out: dict[str, JobStatus] = {}
        ready: list[tuple[WriteJob, JobStatus]] = []
        uploaded: list[dict[str, object]] = []
        for job in jobs:
            if job.status == "uploaded":
                ready.append((job, _landed(job.result)))
                continue
            if self._take_injected_failure():
                out[job.id] = self._finish_failed([job.id], "injected failure (test hook)")[job.id]
                continue
            assert job.ciphertext is not None
            try:
                stored = self.store.put(job.ciphertext, epochs=job.epochs, owner=self.owner)
            except (QuotaExceeded, ValidationError) as exc:
                out.update(self._finish_failed([job.id], exc.message))
                continue
            except RelayerUnavailable as exc:
                out.update(self._back_off([job], exc.message))
                continue
            if not stored.newly_created:
                # No Blob object of ours was created: nothing we could renew.
                out.update(
                    self._finish_failed(
                        [job.id],
                        "the publisher returned alreadyCertified without a Blob object for us",
                    )
                )
                continue
            result = {"blob": asdict(stored.blob)}
            uploaded.append({"id": job.id, "status": "uploaded", "result": result})
            ready.append((job, _landed(result)))
        self._record_uploaded(uploaded)
        out.update(self._index_and_land(ready))
        return out

    def _work_quilt(self, job_ids: list[str]) -> dict[str, JobStatus]:
        """Write an account's waiting writes as one quilt; each lands with its patch."""
        with self.db.read() as s:
            jobs = [
                j
                for j in s.scalars(
                    select(WriteJob).where(WriteJob.id.in_(job_ids)).order_by(WriteJob.created_at)
                )
                if j.status == "pending" and j.ciphertext is not None
            ]
        if not jobs:
            return {}
        out: dict[str, JobStatus] = {}
        if self._take_injected_failure():
            return self._finish_failed([j.id for j in jobs], "injected failure (test hook)")
        # Identical content (deterministic per-account encryption) is one patch.
        # Identifiers are short and only unique within the quilt: they are public on
        # Walrus and every byte of them is in the quilt's index column.
        patches: dict[bytes, tuple[str, bytes]] = {}
        for job in jobs:
            assert job.ciphertext is not None
            digest = hashlib.sha256(job.ciphertext).digest()
            if digest not in patches:
                patches[digest] = (f"m{len(patches)}", job.ciphertext)
        epochs = max(j.epochs for j in jobs)
        try:
            stored = self.store.put_quilt(list(patches.values()), epochs=epochs, owner=self.owner)
        except (QuotaExceeded, ValidationError) as exc:
            return self._finish_failed([j.id for j in jobs], exc.message)
        except RelayerUnavailable as exc:
            return self._back_off(jobs, exc.message)
        if not stored.newly_created:
            return self._finish_failed(
                [j.id for j in jobs],
                "the publisher returned alreadyCertified without a quilt Blob object for us",
            )
        metrics.QUILTS_WRITTEN.labels("quilts").inc()
        metrics.QUILTS_WRITTEN.labels("patches").inc(len(patches))
        patch_of = {p.identifier: p.patch_id for p in stored.patches}
        # Every patch's fixed share, apportioned at once so that they sum exactly to the
        # quilt's units (less what a cap cuts): pricing.apportion_quilt_shares.
        shares = dict(
            zip(
                patches,
                pricing.apportion_quilt_shares(
                    stored.blob.storage_size, [len(data) for _, data in patches.values()]
                ),
                strict=True,
            )
        )
        blob = asdict(stored.blob)
        uploaded: list[dict[str, object]] = []
        ready: list[tuple[WriteJob, JobStatus]] = []
        for job in jobs:
            assert job.ciphertext is not None
            digest = hashlib.sha256(job.ciphertext).digest()
            ident, _data = patches[digest]
            patch_id = patch_of.get(ident)
            if patch_id is None:
                out.update(
                    self._finish_failed([job.id], "the publisher's quilt result has no patch")
                )
                continue
            result = {
                "blob": blob,
                "patch_id": patch_id,
                "share_micro": shares[digest],
                "quilt_share_micro": sum(shares.values()),
                "patch_count": len(patches),
            }
            uploaded.append({"id": job.id, "status": "uploaded", "result": result})
            ready.append((job, _landed(result)))
        self._record_uploaded(uploaded)
        out.update(self._index_and_land(ready))
        return out

    def _take_injected_failure(self) -> bool:
        with self._lock:
            if self.fail_next_jobs > 0:
                self.fail_next_jobs -= 1
                return True
            return False

    def _record_uploaded(self, uploaded: list[dict[str, Any]]) -> None:
        """Recorded before indexing: a crash while embedding never re-uploads."""
        if uploaded:
            now = self.clock.now()
            with self.db.begin() as s:
                s.execute(update(WriteJob), [{**u, "updated_at": now} for u in uploaded])

    def _index_and_land(self, ready: list[tuple[WriteJob, JobStatus]]) -> dict[str, JobStatus]:
        """Index (embedding happens here: background, never on a request thread), then
        mark landed and drop the ciphertext."""
        if not ready:
            return {}
        texts = [
            (job, st, self.keyring.decrypt(job.account_id, job.ciphertext or b"").decode("utf-8"))
            for job, st in ready
        ]
        self.index.add_many([(j.account_id, j.namespace, st.public_id, t) for j, st, t in texts])
        now = self.clock.now()
        with self.db.begin() as s:
            s.execute(
                update(WriteJob),
                [
                    {
                        "id": j.id,
                        "status": "landed",
                        "ciphertext": None,
                        "lease_until": None,
                        "lease_owner": None,
                        "updated_at": now,
                    }
                    for j, _, _ in texts
                ],
            )
        out: dict[str, JobStatus] = {}
        for job, st, text in texts:
            self._remember(job.account_id, st.public_id, text)
            out[job.id] = st
        return out

    def _back_off(self, jobs: Sequence[WriteJob], reason: str) -> dict[str, JobStatus]:
        self.invalidate_health()
        out: dict[str, JobStatus] = {}
        with self.db.begin() as s:
            for job in jobs:
                backoff = min(300, 2 ** min(job.attempts, 8))
                retry_at = self.clock.now() + timedelta(seconds=backoff)
                s.execute(
                    update(WriteJob)
                    .where(WriteJob.id == job.id)
                    .values(
                        lease_until=None,
                        lease_owner=None,
                        not_before=retry_at,
                        error=reason[:1000],
                    )
                )
                out[job.id] = JobStatus(JobState.PENDING, error=reason, retry_at=retry_at)
        return out

    def _finish_failed(self, job_ids: list[str], reason: str) -> dict[str, JobStatus]:
        with self.db.begin() as s:
            s.execute(
                update(WriteJob)
                .where(WriteJob.id.in_(job_ids))
                .values(
                    status="failed",
                    error=reason[:1000],
                    ciphertext=None,
                    lease_until=None,
                    lease_owner=None,
                )
            )
        return {j: JobStatus(JobState.FAILED, error=reason) for j in job_ids}

    # --- reads -------------------------------------------------------------------------
    def read(self, account_id: str, blob_id: str) -> str:
        got = self.read_many(account_id, [blob_id])
        if blob_id not in got:
            raise NotFound("no such blob for this account", {"blob_id": blob_id})
        return got[blob_id]

    def read_many(self, account_id: str, blob_ids: Sequence[str]) -> dict[str, str]:
        """Decrypted contents of those of ``blob_ids`` that exist; NotFound ones left out.

        What the plaintext cache lacks is asked of the store in one ``get_many`` (a
        Walrus aggregator's round trips overlap there). Any other error (the aggregator
        unavailable) raises.
        """
        out: dict[str, str] = {}
        missing: list[str] = []
        with self._lock:
            for blob_id in dict.fromkeys(blob_ids):
                key = (account_id, blob_id)
                if key in self._cache:
                    self._cache.move_to_end(key)
                    out[blob_id] = self._cache[key]
                else:
                    missing.append(blob_id)
        if not missing:
            return out
        for blob_id, data in self.store.get_many(missing).items():
            try:
                text = self.keyring.decrypt(account_id, data).decode("utf-8")
            except Exception:
                # Not this account's blob (or corrupted): never reveal anything about it.
                continue
            self._remember(account_id, blob_id, text)
            out[blob_id] = text
        return out

    def _remember(self, account_id: str, blob_id: str, text: str) -> None:
        size = _text_bytes(text)
        if size > self._cache_bytes // 4:
            return  # one huge memory must not evict everything else
        key = (account_id, blob_id)
        with self._lock:
            old = self._cache.pop(key, None)
            if old is not None:
                self._cached_bytes -= _text_bytes(old)
            self._cache[key] = text
            self._cached_bytes += size
            while self._cached_bytes > self._cache_bytes and self._cache:
                _, dropped = self._cache.popitem(last=False)
                self._cached_bytes -= _text_bytes(dropped)

    def cached_bytes(self) -> int:
        """What the plaintext cache holds now (bounded by ``cache_bytes``)."""
        with self._lock:
            return self._cached_bytes

    def search(
        self,
        account_id: str,
        namespace: str | None,
        query: str,
        limit: int,
        only: Collection[str] | None = None,
    ) -> list[SearchHit]:
        return [
            SearchHit(blob_id=b, score=score)
            for b, score in self.index.search(account_id, namespace, query, limit, only)
        ]

    def list_contents(
        self, account_id: str, namespace: str | None, blob_ids: Iterable[str]
    ) -> list[ListedContent] | None:
        wanted = list(blob_ids)
        contents = self.read_many(account_id, wanted)
        return [
            ListedContent(blob_id, namespace or "", contents[blob_id])
            for blob_id in wanted
            if blob_id in contents
        ]


@dataclass(frozen=True, slots=True)
class _Staged:
    account_id: str
    namespace: str
    ciphertext: bytes
    # When its job becomes due, from accept: a packed write waits for its quilt's window.
    due_in_seconds: float = 0.0


def _landed(result: dict[str, Any] | None) -> JobStatus:
    """A landed write's status from its job's recorded result.

    Results are ``{"blob": …, "patch_id": …, "share_micro": …, "quilt_share_micro": …,
    "patch_count": …}`` (``quilt_share_micro``: the quilt's apportioned shares, absent from
    results recorded before it was kept);
    rows written before quilts hold the blob's fields at the top level.
    """
    if not result:
        raise ValueError("write job has no result")
    if "blob" not in result:
        return JobStatus(JobState.LANDED, blob=BlobObject(**result))
    return JobStatus(
        JobState.LANDED,
        blob=BlobObject(**result["blob"]),
        patch_id=result.get("patch_id"),
        share_micro=result.get("share_micro"),
        quilt_share_micro=result.get("quilt_share_micro"),
        patch_count=result.get("patch_count"),
    )


def _text_bytes(text: str) -> int:
    return len(text.encode("utf-8"))


def _pack_limit(quilt_max_bytes: int) -> int:
    """The largest write (ciphertext bytes) that ``pricing.packing_saves`` packs.

    The saving shrinks as a write grows, so the set of packed sizes is an
    interval from 1: found once by bisection instead of per write in SQL.
    """
    lo, hi = 0, quilt_max_bytes
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if pricing.packing_saves(mid, quilt_max_bytes):
            lo = mid
        else:
            hi = mid - 1
    return lo
