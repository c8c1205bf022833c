"""A fake MemWal relayer that speaks the real wire format and checks auth like the real one.

A stdlib ``ThreadingHTTPServer`` on ``127.0.0.1:0`` (parallel-safe) implementing
``GET /health``, ``POST /api/remember``, ``GET /api/remember/{job_id}`` and
``POST /api/recall`` (notes/memwal.md §2, seeds/memwal-relayer-api.md).

Authentication mirrors ``services/server/src/auth.rs`` (notes/memwal.md §4):
the canonical message is rebuilt from the *raw* request — method, the path and
query exactly as received, SHA-256 of the raw body bytes, the headers — and
verified with the ``x-public-key`` it names. Then: missing/non-UUID nonce → 426;
timestamp more than ``max_drift`` seconds from the fake's own (injectable) clock →
401 with ``x-auth-error: ERR_TIMESTAMP_OUT_OF_BOUNDS``; bad signature, replayed
nonce or unknown public key → bare 401. Nothing is trusted from the client that
the real relayer would not trust.

Tests drive state directly: ``writes`` (what /health reports), ``remember_paused``
(503 on remember), ``rate_limit(n, retry_after)``, ``complete_job``/``fail_job``/
``set_job_status``; every request is recorded in ``requests`` for assertions such as
"no remember was ever sent".
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from walkeep.clock import Clock

NONCE_TTL_SECONDS = 600  # Redis ``SET nonce:<uuid> 1 NX EX 600``


@dataclass
class RecordedRequest:
    method: str
    path: str  # path and query, as received
    status: int
    body: bytes
    headers: dict[str, str]


@dataclass
class FakeJob:
    job_id: str
    owner: str
    namespace: str
    text: str
    status: str = "pending"
    blob_id: str | None = None
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


_JOB_PATH = re.compile(r"^/api/remember/([^/?]+)$")


class FakeMemWalRelayer:
    """In-process MemWal relayer for tests. Use as a context manager."""

    def __init__(
        self,
        *,
        clock: Clock,
        keys: dict[str, str],
        owner: str = "0x" + "ab" * 32,
        max_drift: int = 300,
    ) -> None:
        """``keys`` maps a delegate public key (hex) to the MemWal account id it belongs to."""
        self.clock = clock
        self.keys = {k.lower(): v for k, v in keys.items()}
        self.owner = owner
        self.max_drift = max_drift
        self.writes = "ok"
        self.remember_paused = False
        self.jobs: dict[str, FakeJob] = {}
        self.requests: list[RecordedRequest] = []
        self._idempotency: dict[tuple[str, str], str] = {}
        self._nonces: dict[str, float] = {}
        self._rate_limited = 0
        self._retry_after = 0
        self._lock = threading.RLock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle --------------------------------------------------------------------------

    @property
    def url(self) -> str:
        assert self._server is not None, "not started"
        port = self._server.server_address[1]
        return f"http://127.0.0.1:{port}"

    def start(self) -> FakeMemWalRelayer:
        fake = self

        class Handler(_Handler):
            relayer = fake

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.02,), daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FakeMemWalRelayer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- test controls ----------------------------------------------------------------------

    def pause(self) -> None:
        """``WRITES_PAUSED=1``: /health says paused and remember answers 503."""
        self.writes = "paused"
        self.remember_paused = True

    def rate_limit(self, times: int, retry_after: int) -> None:
        """The next ``times`` authenticated requests get 429 + Retry-After."""
        with self._lock:
            self._rate_limited = times
            self._retry_after = retry_after

    def set_job_status(self, job_id: str, status: str) -> None:
        with self._lock:
            self.jobs[job_id].status = status

    def complete_job(self, job_id: str, blob_id: str | None = None, **extra: Any) -> str:
        """pending → done with a blob_id; ``extra`` fields are added to the job JSON."""
        with self._lock:
            job = self.jobs[job_id]
            job.status = "done"
            job.blob_id = blob_id or _blob_id_for(job.job_id, job.text)
            job.extra.update(extra)
            return job.blob_id

    def fail_job(self, job_id: str, error: str = "walrus upload failed") -> None:
        with self._lock:
            job = self.jobs[job_id]
            job.status = "failed"
            job.error = error

    def requests_to(self, method: str, path_prefix: str) -> list[RecordedRequest]:
        with self._lock:
            return [
                r for r in self.requests if r.method == method and r.path.startswith(path_prefix)
            ]

    # -- auth, as the real relayer does it -------------------------------------------------------

    def authenticate(
        self, method: str, path: str, body: bytes, headers: dict[str, str]
    ) -> tuple[int, dict[str, str], str | None]:
        """Return (status, extra headers, account owner) — status 0 means authenticated."""
        nonce = headers.get("x-nonce", "")
        try:
            uuid.UUID(nonce)
        except ValueError:
            return 426, {}, None
        public_hex = headers.get("x-public-key", "")
        signature_hex = headers.get("x-signature", "")
        timestamp_text = headers.get("x-timestamp", "")
        account_id = headers.get("x-account-id", "")
        try:
            timestamp = int(timestamp_text)
            public = Ed25519PublicKey.from_public_bytes(bytes.fromhex(public_hex))
            signature = bytes.fromhex(signature_hex)
        except ValueError:
            return 401, {}, None
        now = self.clock.time()
        if abs(now - timestamp) > self.max_drift:
            return 401, {"x-auth-error": "ERR_TIMESTAMP_OUT_OF_BOUNDS"}, None
        message = (
            f"{timestamp}.{method}.{path}.{hashlib.sha256(body).hexdigest()}.{nonce}.{account_id}"
        )
        try:
            public.verify(signature, message.encode("utf-8"))
        except InvalidSignature:
            return 401, {}, None
        with self._lock:
            self._nonces = {n: t for n, t in self._nonces.items() if now - t < NONCE_TTL_SECONDS}
            if nonce in self._nonces:
                return 401, {}, None
            self._nonces[nonce] = now
        registered = self.keys.get(public_hex.lower())
        if registered is None or (account_id and account_id != registered):
            return 401, {}, None
        return 0, {}, self.owner

    # -- routes --------------------------------------------------------------------------------

    def handle(
        self, method: str, path: str, body: bytes, headers: dict[str, str]
    ) -> tuple[int, dict[str, str], Any]:
        if method == "GET" and path == "/health":
            return 200, {}, self._health()
        status, extra, owner = self.authenticate(method, path, body, headers)
        if status:
            return status, extra, None
        assert owner is not None
        with self._lock:
            if self._rate_limited > 0:
                self._rate_limited -= 1
                retry = self._retry_after
                return (
                    429,
                    {"retry-after": str(retry)},
                    {
                        "error": "Rate limit exceeded",
                        "layer": "delegate_key",
                        "limit": "30 weighted-requests/minute",
                        "retry_after_seconds": retry,
                    },
                )
        if method == "POST" and path == "/api/remember":
            return self._remember(owner, body)
        match = _JOB_PATH.match(path)
        if method == "GET" and match:
            return self._job(owner, match.group(1))
        if method == "POST" and path == "/api/recall":
            return self._recall(owner, body)
        return 404, {}, {"error": "not found"}

    def _health(self) -> dict[str, Any]:
        return {
            "status": "ok",
            "version": "0.1.0",
            "apiVersion": "1.0.0",
            "mode": "production",
            "write_ready": True,
            "writes": self.writes,
        }

    def _remember(self, owner: str, body: bytes) -> tuple[int, dict[str, str], Any]:
        if self.remember_paused:
            return 503, {}, {"error": "writes are paused"}
        try:
            payload = json.loads(body)
            text = payload["text"]
        except (ValueError, KeyError, TypeError):
            return 400, {}, {"error": "invalid JSON body"}
        if not isinstance(text, str) or not text:
            return 400, {}, {"error": "text must be a non-empty string"}
        namespace = payload.get("namespace") or "default"
        if len(namespace.encode("utf-8")) > 255:
            return 400, {}, {"error": "namespace too long"}
        key = payload.get("idempotency_key")
        with self._lock:
            if key and (owner, key) in self._idempotency:
                job_id = self._idempotency[(owner, key)]
            else:
                job_id = str(uuid.uuid4())
                self.jobs[job_id] = FakeJob(job_id, owner, namespace, text)
                if key:
                    self._idempotency[(owner, key)] = job_id
        return 202, {}, {"job_id": job_id, "status": "running"}

    def _job(self, owner: str, job_id: str) -> tuple[int, dict[str, str], Any]:
        with self._lock:
            job = self.jobs.get(job_id)
            if job is None or job.owner != owner:
                return 404, {}, {"error": "job not found"}
            out: dict[str, Any] = {
                "job_id": job.job_id,
                "status": job.status,
                "owner": job.owner,
                "namespace": job.namespace,
            }
            if job.blob_id and job.status in ("uploaded", "done"):
                out["blob_id"] = job.blob_id
            if job.status == "failed":
                out["error"] = job.error
            out.update(job.extra)
            return 200, {}, out

    def _recall(self, owner: str, body: bytes) -> tuple[int, dict[str, str], Any]:
        try:
            payload = json.loads(body)
            query = str(payload["query"])
        except (ValueError, KeyError, TypeError):
            return 400, {}, {"error": "invalid JSON body"}
        namespace = payload.get("namespace") or "default"
        limit = min(int(payload.get("limit") or 10), 100)
        q = set(query.lower().split())
        scored: list[tuple[float, FakeJob]] = []
        with self._lock:
            for job in self.jobs.values():
                if job.owner != owner or job.namespace != namespace or job.status != "done":
                    continue
                words = set(job.text.lower().split())
                overlap = len(q & words) / max(1, len(q | words))
                scored.append((round(1.0 - overlap, 6), job))
        scored.sort(key=lambda item: item[0])
        results = [
            {"blob_id": job.blob_id, "text": job.text, "distance": distance}
            for distance, job in scored[:limit]
        ]
        return 200, {}, {"results": results, "total": len(results)}


def _blob_id_for(job_id: str, text: str) -> str:
    digest = hashlib.sha256(f"{job_id}\0{text}".encode()).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


class _Handler(BaseHTTPRequestHandler):
    relayer: FakeMemWalRelayer
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out as two writes

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _serve(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length) if length else b""
        headers = {k.lower(): v for k, v in self.headers.items()}
        status, extra, payload = self.relayer.handle(self.command, self.path, body, headers)
        with self.relayer._lock:
            self.relayer.requests.append(
                RecordedRequest(self.command, self.path, status, body, headers)
            )
        data = b"" if payload is None else json.dumps(payload).encode()
        self.send_response(status)
        for name, value in extra.items():
            self.send_header(name, value)
        if payload is not None:
            self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = _serve
    do_POST = _serve
