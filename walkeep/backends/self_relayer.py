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
from collections.abc import Iterable
from dataclasses import asdict
from datetime import timedelta

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError

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
from walkeep.db.models import WriteJob
from walkeep.errors import NotFound, QuotaExceeded, RelayerUnavailable, ValidationError

log = logging.getLogger(__name__)

HEALTH_TTL_SECONDS = 5.0


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
        except Exception as exc:  # a probe must never crash its caller
            h = Health(ok=False, writes="paused", detail=f"health probe failed: {exc}")
        self._health = (now, h)
        return h

    def invalidate_health(self) -> None:
        self._health = None

    # --- writes ------------------------------------------------------------------------
    def accept(
        self, *, account_id: str, namespace: str, content: str, idempotency_key: str, epochs: int
    ) -> str:
        h = self.health()
        if not h.ok or h.writes == "paused":
            raise RelayerUnavailable(
                f"storage backend ({self.name}) is unavailable: {h.detail or 'unreachable'}; "
                "nothing was stored or billed — retry with the same request_id",
                {"backend": self.name, "retry": True},
            )
        existing = self.find_job(idempotency_key)
        if existing is not None:
            return existing
        ciphertext = self.keyring.encrypt(account_id, content.encode("utf-8"))
        now = self.clock.now()
        job_id = ids.new_job_id()
        job = WriteJob(
            id=job_id,
            account_id=account_id,
            namespace=namespace,
            idempotency_key=idempotency_key,
            ciphertext=ciphertext,
            size_bytes=len(ciphertext),
            epochs=epochs,
            status="pending",
            not_before=now + timedelta(milliseconds=self.latency_ms),
            created_at=now,
            updated_at=now,
        )
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
        with self.db.read() as s:
            job = s.get(WriteJob, job_id)
        if job is None:
            return JobStatus(JobState.FAILED, error="unknown write job")
        if job.status == "landed":
            return JobStatus(JobState.LANDED, blob=_blob(job.result))
        if job.status == "failed":
            return JobStatus(JobState.FAILED, error=job.error)
        now = self.clock.now()
        if job.status == "pending" and now < job.not_before:
            return JobStatus(JobState.PENDING)
        if not self._lease(job_id, now):
            return JobStatus(JobState.PENDING)  # someone else is working on it
        try:
            return self._work(job_id)
        except Exception:
            self._unlease(job_id)
            raise

    def _lease(self, job_id: str, now) -> bool:  # type: ignore[no-untyped-def]
        with self.db.begin() as s:
            res = s.execute(
                update(WriteJob)
                .where(
                    WriteJob.id == job_id,
                    WriteJob.status.in_(["pending", "uploaded"]),
                    (WriteJob.lease_until.is_(None)) | (WriteJob.lease_until < now),
                )
                .values(
                    lease_until=now + timedelta(seconds=self.lease_seconds),
                    attempts=WriteJob.attempts + 1,
                    updated_at=now,
                )
            )
            return res.rowcount == 1

    def _unlease(self, job_id: str) -> None:
        with self.db.begin() as s:
            s.execute(update(WriteJob).where(WriteJob.id == job_id).values(lease_until=None))

    def _work(self, job_id: str) -> JobStatus:
        with self.db.read() as s:
            job = s.get(WriteJob, job_id)
        assert job is not None
        if job.status == "pending":
            if self.fail_next_jobs > 0:
                with self._lock:
                    self.fail_next_jobs -= 1
                return self._finish_failed(job_id, "injected failure (test hook)")
            assert job.ciphertext is not None
            try:
                stored = self.store.put(job.ciphertext, epochs=job.epochs, owner=self.owner)
            except (QuotaExceeded, ValidationError) as exc:
                return self._finish_failed(job_id, exc.message)
            except RelayerUnavailable as exc:
                self.invalidate_health()
                backoff = min(300, 2 ** min(job.attempts, 8))
                with self.db.begin() as s:
                    s.execute(
                        update(WriteJob)
                        .where(WriteJob.id == job_id)
                        .values(
                            lease_until=None,
                            not_before=self.clock.now() + timedelta(seconds=backoff),
                            error=exc.message[:1000],
                        )
                    )
                return JobStatus(JobState.PENDING, error=exc.message)
            if not stored.newly_created:
                # No Blob object of ours was created: nothing we could renew.
                return self._finish_failed(
                    job_id, "the publisher returned alreadyCertified without a Blob object for us"
                )
            with self.db.begin() as s:
                s.execute(
                    update(WriteJob)
                    .where(WriteJob.id == job_id)
                    .values(
                        status="uploaded", result=asdict(stored.blob), updated_at=self.clock.now()
                    )
                )
            blob = stored.blob
        else:
            blob = _blob(job.result)
        # Index (embedding happens here: background, never on a request thread).
        assert job.ciphertext is not None
        plaintext = self.keyring.decrypt(job.account_id, job.ciphertext).decode("utf-8")
        self.index.add(job.account_id, job.namespace, blob.blob_id, plaintext)
        with self.db.begin() as s:
            s.execute(
                update(WriteJob)
                .where(WriteJob.id == job_id)
                .values(
                    status="landed", ciphertext=None, lease_until=None, updated_at=self.clock.now()
                )
            )
        self._remember(job.account_id, blob.blob_id, plaintext)
        return JobStatus(JobState.LANDED, blob=blob)

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


def _blob(result: dict | None) -> BlobObject:  # type: ignore[type-arg]
    if not result:
        raise ValueError("write job has no result")
    return BlobObject(**result)
