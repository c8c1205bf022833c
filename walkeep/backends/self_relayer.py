"""``SelfRelayer``: Walkeep as its own relayer (the ``local`` and ``walrus`` backends).

Accept = encrypt the content with the account's key and persist a write job
(the ciphertext lives in the database until the blob lands, so an accepted
write survives a crash). The job is worked by whoever polls it once it is
due — the in-process completer or the worker — under a lease, so two pollers
never upload the same job twice:

    pending ──put to the BlobStore──▶ uploaded ──index──▶ landed
        └──terminal error (too large, refused)──▶ failed

``uploaded`` is recorded before indexing so a crash while embedding never
re-uploads (a second upload would create a second, orphaned Blob object).
Transient store errors (publisher down, 5xx) back off and retry until the
store's completion deadline; the service layer then releases the hold.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta

from sqlalchemy import func, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from walkeep import ids
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
from walkeep.db import Database
from walkeep.db.models import WriteJob, table
from walkeep.errors import NotFound, QuotaExceeded, RelayerUnavailable, ValidationError

log = logging.getLogger(__name__)

HEALTH_TTL_SECONDS = 5.0
# Built once: a job is inserted on every store.
_INSERT_JOB = insert(table(WriteJob))
_JOB_COLUMNS = tuple(c.key for c in table(WriteJob).columns)


class SelfRelayer:
    content_listable = True

    def __init__(
        self,
        db: Database,
        clock: Clock,
        store: BlobStore,
        keyring,  # walkeep.crypto.Keyring
        index,  # walkeep.index.vectors.VectorIndex
        owner: str,
        *,
        latency_ms: int = 0,
        lease_seconds: int = 300,
        cache_size: int = 2048,
        max_backlog: int = 0,
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
        self._cache: OrderedDict[tuple[str, str], str] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()

    # --- health ------------------------------------------------------------------------
    def health(self) -> Health:
        now = time.monotonic()
        cached = self._health
        if cached and now - cached[0] < HEALTH_TTL_SECONDS:
            return cached[1]
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
        return _Staged(account_id, namespace, ciphertext)

    def accept_staged(
        self, session: Session, staged: _Staged, *, idempotency_key: str, epochs: int
    ) -> str:
        """Accept inside the caller's transaction: the job commits with the claim and hold.

        The key is new per attempt; a duplicate violates the UNIQUE constraint and
        aborts the caller's transaction (the caller then replays)."""
        job = self._job(ids.new_job_id(), staged, idempotency_key, epochs, self.clock.now())
        # Unset (None) columns are left out so their defaults apply.
        row = {c: v for c in _JOB_COLUMNS if (v := getattr(job, c)) is not None}
        session.execute(_INSERT_JOB, row)
        return job.id

    def _job(self, job_id: str, staged: _Staged, key: str, epochs: int, now) -> WriteJob:  # type: ignore[no-untyped-def]
        return WriteJob(
            id=job_id,
            account_id=staged.account_id,
            namespace=staged.namespace,
            idempotency_key=key,
            ciphertext=staged.ciphertext,
            size_bytes=len(staged.ciphertext),
            epochs=epochs,
            status="pending",
            not_before=now + timedelta(milliseconds=self.latency_ms),
            created_at=now,
            updated_at=now,
        )

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
        job_id = ids.new_job_id()
        job = self._job(job_id, staged, idempotency_key, epochs, self.clock.now())
        try:
            with self.db.begin() as s:
                s.add(job)
        except IntegrityError:
            found = self.find_job(idempotency_key)
            if found is None:
                raise
            return found
        return job_id

    def find_job(self, idempotency_key: str) -> str | None:
        with self.db.read() as s:
            return s.scalar(select(WriteJob.id).where(WriteJob.idempotency_key == idempotency_key))

    def poll(self, job_id: str) -> JobStatus:
        return self.poll_many([job_id])[job_id]

    def poll_many(self, job_ids: Sequence[str]) -> dict[str, JobStatus]:
        """Where each write stands; due writes are worked here, as one batch.

        Batching is what lets completion keep up with accepts: one lease
        transaction, one embedding call for all the texts, one transaction to
        record the uploads and one to mark them landed.
        """
        ids_ = list(dict.fromkeys(job_ids))
        # Read only the small columns: the ciphertext is loaded when there is work.
        with self.db.read() as s:
            rows = s.execute(
                select(
                    WriteJob.id,
                    WriteJob.status,
                    WriteJob.not_before,
                    WriteJob.result,
                    WriteJob.error,
                ).where(WriteJob.id.in_(ids_))
            ).all()
        out: dict[str, JobStatus] = {
            j: JobStatus(JobState.FAILED, error="unknown write job") for j in ids_
        }
        now = self.clock.now()
        due: list[str] = []
        for r in rows:
            if r.status == "landed":
                out[r.id] = JobStatus(JobState.LANDED, blob=_blob(r.result))
            elif r.status == "failed":
                out[r.id] = JobStatus(JobState.FAILED, error=r.error)
            elif r.status == "pending" and now < r.not_before:
                out[r.id] = JobStatus(JobState.PENDING, retry_at=r.not_before)
            else:
                out[r.id] = JobStatus(JobState.PENDING)
                due.append(r.id)
        if due:
            leased = self._lease(due, now)  # the others are being worked elsewhere
            if leased:
                try:
                    out.update(self._work(leased))
                except Exception:
                    self._unlease(leased)
                    raise
        return out

    def work_due(self, limit: int = 64) -> list[tuple[str, str, JobStatus]]:
        """Work the oldest due writes (a job queue, for the in-process completer and the
        worker): returns ``(job_id, idempotency_key, status)`` for each job taken."""
        now = self.clock.now()
        with self.db.read() as s:
            candidates = list(
                s.scalars(
                    select(WriteJob.id)
                    .where(
                        WriteJob.status.in_(["pending", "uploaded"]),
                        WriteJob.not_before <= now,
                        (WriteJob.lease_until.is_(None)) | (WriteJob.lease_until < now),
                    )
                    .order_by(WriteJob.not_before)
                    .limit(limit)
                )
            )
        if not candidates:
            return []
        leased = self._lease(candidates, now)
        if not leased:
            return []
        try:
            statuses = self._work(leased)
        except Exception:
            self._unlease(leased)
            raise
        with self.db.read() as s:
            keys = dict(
                s.execute(
                    select(WriteJob.id, WriteJob.idempotency_key).where(WriteJob.id.in_(leased))
                ).all()
            )
        return [(j, keys[j], statuses.get(j, JobStatus(JobState.PENDING))) for j in leased]

    def next_due(self) -> datetime | None:
        """When the earliest waiting write becomes due (None: nothing waiting)."""
        with self.db.read() as s:
            return s.scalar(
                select(func.min(WriteJob.not_before)).where(
                    WriteJob.status.in_(["pending", "uploaded"])
                )
            )

    def _lease(self, job_ids: list[str], now) -> list[str]:  # type: ignore[no-untyped-def]
        with self.db.begin() as s:
            return list(
                s.scalars(
                    update(WriteJob)
                    .where(
                        WriteJob.id.in_(job_ids),
                        WriteJob.status.in_(["pending", "uploaded"]),
                        (WriteJob.lease_until.is_(None)) | (WriteJob.lease_until < now),
                    )
                    .values(
                        lease_until=now + timedelta(seconds=self.lease_seconds),
                        attempts=WriteJob.attempts + 1,
                        updated_at=now,
                    )
                    .returning(WriteJob.id)
                )
            )

    def _unlease(self, job_ids: list[str]) -> None:
        with self.db.begin() as s:
            s.execute(update(WriteJob).where(WriteJob.id.in_(job_ids)).values(lease_until=None))

    def _work(self, job_ids: list[str]) -> dict[str, JobStatus]:
        with self.db.read() as s:
            jobs = list(s.scalars(select(WriteJob).where(WriteJob.id.in_(job_ids))))
        out: dict[str, JobStatus] = {}
        ready: list[tuple[WriteJob, BlobObject]] = []
        uploaded: list[dict[str, object]] = []
        for job in jobs:
            if job.status == "uploaded":
                ready.append((job, _blob(job.result)))
                continue
            if self.fail_next_jobs > 0:
                with self._lock:
                    self.fail_next_jobs -= 1
                out[job.id] = self._finish_failed(job.id, "injected failure (test hook)")
                continue
            assert job.ciphertext is not None
            try:
                stored = self.store.put(job.ciphertext, epochs=job.epochs, owner=self.owner)
            except (QuotaExceeded, ValidationError) as exc:
                out[job.id] = self._finish_failed(job.id, exc.message)
                continue
            except RelayerUnavailable as exc:
                out[job.id] = self._back_off(job, exc.message)
                continue
            if not stored.newly_created:
                # No Blob object of ours was created: nothing we could renew.
                out[job.id] = self._finish_failed(
                    job.id, "the publisher returned alreadyCertified without a Blob object for us"
                )
                continue
            uploaded.append({"id": job.id, "status": "uploaded", "result": asdict(stored.blob)})
            ready.append((job, stored.blob))
        now = self.clock.now()
        if uploaded:
            # Recorded before indexing: a crash while embedding never re-uploads.
            with self.db.begin() as s:
                s.execute(update(WriteJob), [{**u, "updated_at": now} for u in uploaded])
        if not ready:
            return out
        # Index (embedding happens here: background, never on a request thread).
        texts = [
            (job, blob, self.keyring.decrypt(job.account_id, job.ciphertext or b"").decode("utf-8"))
            for job, blob in ready
        ]
        self.index.add_many([(j.account_id, j.namespace, b.blob_id, t) for j, b, t in texts])
        with self.db.begin() as s:
            s.execute(
                update(WriteJob),
                [
                    {
                        "id": j.id,
                        "status": "landed",
                        "ciphertext": None,
                        "lease_until": None,
                        "updated_at": now,
                    }
                    for j, _, _ in texts
                ],
            )
        for job, blob, text in texts:
            self._remember(job.account_id, blob.blob_id, text)
            out[job.id] = JobStatus(JobState.LANDED, blob=blob)
        return out

    def _back_off(self, job: WriteJob, reason: str) -> JobStatus:
        self.invalidate_health()
        backoff = min(300, 2 ** min(job.attempts, 8))
        retry_at = self.clock.now() + timedelta(seconds=backoff)
        with self.db.begin() as s:
            s.execute(
                update(WriteJob)
                .where(WriteJob.id == job.id)
                .values(lease_until=None, not_before=retry_at, error=reason[:1000])
            )
        return JobStatus(JobState.PENDING, error=reason, retry_at=retry_at)

    def _finish_failed(self, job_id: str, reason: str) -> JobStatus:
        with self.db.begin() as s:
            s.execute(
                update(WriteJob)
                .where(WriteJob.id == job_id)
                .values(status="failed", error=reason[:1000], ciphertext=None, lease_until=None)
            )
        return JobStatus(JobState.FAILED, error=reason)

    # --- reads -------------------------------------------------------------------------
    def read(self, account_id: str, blob_id: str) -> str:
        key = (account_id, blob_id)
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        data = self.store.get(blob_id)
        try:
            text = self.keyring.decrypt(account_id, data).decode("utf-8")
        except Exception as exc:
            # Not this account's blob (or corrupted): never reveal anything about it.
            raise NotFound("no such blob for this account", {"blob_id": blob_id}) from exc
        self._remember(account_id, blob_id, text)
        return text

    def _remember(self, account_id: str, blob_id: str, text: str) -> None:
        with self._lock:
            self._cache[(account_id, blob_id)] = text
            self._cache.move_to_end((account_id, blob_id))
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)

    def search(
        self, account_id: str, namespace: str | None, query: str, limit: int
    ) -> list[SearchHit]:
        return [
            SearchHit(blob_id=b, score=score)
            for b, score in self.index.search(account_id, namespace, query, limit)
        ]

    def list_contents(
        self, account_id: str, namespace: str | None, blob_ids: Iterable[str]
    ) -> list[ListedContent] | None:
        out: list[ListedContent] = []
        for blob_id in blob_ids:
            try:
                out.append(ListedContent(blob_id, namespace or "", self.read(account_id, blob_id)))
            except NotFound:
                continue
        return out


@dataclass(frozen=True, slots=True)
class _Staged:
    account_id: str
    namespace: str
    ciphertext: bytes


def _blob(result: dict | None) -> BlobObject:  # type: ignore[type-arg]
    if not result:
        raise ValueError("write job has no result")
    return BlobObject(**result)
