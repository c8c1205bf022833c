"""``MemWalRelayer``: the hosted Walrus Memory (MemWal) relayer behind the ``Relayer`` port.

Wire contract (notes/memwal.md §2, §4, §5; seeds/memwal-relayer-api.md):

- Every ``/api/*`` call is signed with the operator's Ed25519 *delegate key*:
  ``{timestamp}.{method}.{path_and_query}.{sha256_hex(body)}.{nonce}.{account_id}``
  in ``x-public-key`` / ``x-signature`` / ``x-timestamp`` / ``x-nonce`` /
  ``x-account-id``. The body is serialised exactly once and those bytes are both
  hashed and sent: re-serialising (or letting httpx encode ``json=``) would sign
  different bytes than the relayer hashes.
- The relayer rejects timestamps more than 300 s off its clock, non-UUID nonces
  (426) and replayed nonces (401), so every attempt, including a retry after a
  429, is re-signed with a fresh nonce and timestamp.
- ``/health`` is public and reports ``writes: ok | degraded | paused``; while
  paused, ``/api/remember`` answers ``503 {"error":"writes are paused"}``.

Design decisions that callers must know about
---------------------------------------------

**One MemWal account serves every Walkeep account.** The relayer scopes memories by
(owner, namespace) and the owner is the configured ``MemWalAccount``, shared by all
Walkeep accounts. To keep accounts isolated (DESIGN §4.7) each Walkeep namespace is
mapped to a MemWal namespace ``wk1:{account_id}:{namespace}`` (see
:func:`memwal_namespace`), and each idempotency key is scoped the same way (see
:func:`memwal_idempotency_key`), so two accounts using the same ``request_id`` can
never be handed each other's job.

**What a finished job tells us, and what it doesn't.** ``GET /api/remember/{id}``
returns ``{status, owner, namespace, blob_id}``. MemWal does *not* return the Walrus
``Blob`` object id, its ``end_epoch``, its size or its encoded ``storage_size``
(users ask for exactly this: MemWal #316, #755). The relayer buys its own epochs (3 by
default on mainnet, capped at 5, whatever ``epochs`` Walkeep asks for) and transfers
the ``Blob`` object to the MemWal account *owner* — not to Walkeep's server wallet.
So a landed job yields a :class:`BlobObject` that is only partly known:

- ``blob_id``: real.
- ``owner``: the MemWal account owner reported by the job (``""`` if absent).
- ``blob_object_id``: the job's ``blob_object_id``/``object_id`` when a future relayer
  sends one; otherwise the placeholder ``memwal:{blob_id}`` (:data:`PLACEHOLDER_PREFIX`).
  A placeholder is deliberately *not* a ``0x`` Sui id, so it can never be mistaken
  for, or collide with, a real object; it is unique per blob_id, which the
  ``blobs.blob_object_id`` UNIQUE column needs.
- ``end_epoch``, ``registered_epoch``, ``size``, ``storage_size``: the job's value when
  present, else :data:`UNKNOWN` (0). ``end_epoch == 0`` means *unknown*, not *lapsed*.

Renewal on this backend is therefore only possible when the Blob can be found on
chain *and* Walkeep's server wallet owns it, i.e. when the operator's Sui key is the
MemWal account owner. :func:`resolve_on_chain` does that lookup through the ``Chain``
port (``owned_blobs`` filtered by blob_id); given ``chain=``, ``poll`` does it itself
and returns the real object (see :meth:`MemWalRelayer._landed`). :func:`is_resolved`
tells the caller whether a blob it holds is renewable at all. An unresolved blob must
not be renewed, nor shown or filtered as lapsed: its lifetime is whatever the relayer
bought, and Walkeep cannot see it.

**No read by id.** The relayer has no ``GET memory by blob_id`` at this API version;
text only comes back with recall hits. :meth:`MemWalRelayer.read` raises ``NotFound``
with ``data.reason = "READ_BY_ID_UNSUPPORTED"`` (deterministic: retrying never helps),
and ``list_contents`` returns ``None`` (export then falls back to the registry and
reports ``content_included: false``).

**Recall is per namespace.** MemWal's recall has no "all namespaces" mode, so
``search(namespace=None)`` searches the account's ``"default"`` namespace.

Why one file: one peer's wire contract (signing, endpoints, error mapping, retries) that
is checked against its notes as a whole.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
import uuid
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any, Literal
from urllib.parse import quote

import httpx
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from walkeep.backends.base import (
    BlobObject,
    Chain,
    ChainError,
    Health,
    JobState,
    JobStatus,
    ListedContent,
    SearchHit,
    WriteHealth,
)
from walkeep.clock import Clock, SystemClock
from walkeep.errors import (
    ConfigurationError,
    NotFound,
    QuotaExceeded,
    RelayerUnavailable,
    ValidationError,
)

log = logging.getLogger(__name__)

PLACEHOLDER_PREFIX = "memwal:"
"""Prefix of a ``blob_object_id`` that stands for "the relayer did not tell us"."""

UNKNOWN = 0
"""Value of ``end_epoch``/``registered_epoch``/``size``/``storage_size`` when unknown."""

DEFAULT_NAMESPACE = "default"
NAMESPACE_MAX_BYTES = 255  # the relayer's limit on ``namespace`` (UTF-8 bytes)
RECALL_MAX_LIMIT = 100  # the relayer caps ``limit`` at 100
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()

_PENDING_STATUSES = frozenset({"pending", "running", "uploaded"})


# --- signing (pure) ------------------------------------------------------------------------


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def signature_message(
    *,
    method: str,
    path_and_query: str,
    body: bytes,
    timestamp: int,
    nonce: str,
    account_id: str,
) -> str:
    """The relayer's canonical message (``auth.rs:197-201``)."""
    return f"{timestamp}.{method.upper()}.{path_and_query}.{sha256_hex(body)}.{nonce}.{account_id}"


def sign_request(
    seed: bytes,
    method: str,
    path_and_query: str,
    body: bytes,
    timestamp: int,
    nonce: str,
    account_id: str,
) -> dict[str, str]:
    """The five auth headers for one request.

    Pure and deterministic (Ed25519 is), so the published test vectors
    (notes/memwal.md §6) can be checked byte for byte. ``body`` must be the exact
    bytes that go on the wire (``b""`` for a GET).
    """
    key = Ed25519PrivateKey.from_private_bytes(seed)
    public = key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    message = signature_message(
        method=method,
        path_and_query=path_and_query,
        body=body,
        timestamp=timestamp,
        nonce=nonce,
        account_id=account_id,
    )
    signature = key.sign(message.encode("utf-8"))
    return {
        "x-public-key": public.hex(),
        "x-signature": signature.hex(),
        "x-timestamp": str(timestamp),
        "x-nonce": nonce,
        "x-account-id": account_id,
    }


def parse_delegate_key(delegate_key_hex: str) -> bytes:
    """A 32-byte Ed25519 seed from hex (``0x`` optional).

    Also accepts the 64-byte ``seed ‖ public key`` form some tools export, after
    checking that its public half matches the seed (a mismatched pair would sign
    with one key and advertise another).
    """
    text = delegate_key_hex.strip().removeprefix("0x").removeprefix("0X")
    try:
        raw = bytes.fromhex(text)
    except ValueError as exc:
        raise ConfigurationError("memwal delegate key is not valid hex") from exc
    if len(raw) == 32:
        return raw
    if len(raw) == 64:
        seed, public = raw[:32], raw[32:]
        derived = (
            Ed25519PrivateKey.from_private_bytes(seed)
            .public_key()
            .public_bytes(Encoding.Raw, PublicFormat.Raw)
        )
        if derived != public:
            raise ConfigurationError("memwal delegate key: public half does not match the seed")
        return seed
    raise ConfigurationError(
        f"memwal delegate key must be a 32-byte Ed25519 seed in hex, got {len(raw)} bytes"
    )


def canonical_json(body: Mapping[str, Any]) -> bytes:
    """Serialise a request body the way the MemWal Python SDK does.

    ``ensure_ascii`` stays on (non-ASCII becomes ``\\uXXXX``); the relayer hashes
    raw bytes, so any encoding verifies as long as the signed bytes are the sent ones.
    """
    return json.dumps(body, separators=(",", ":"), allow_nan=False).encode("ascii")


# --- account scoping (pure) -----------------------------------------------------------------


def memwal_namespace(account_id: str, namespace: str | None) -> str:
    """The MemWal namespace holding one Walkeep account's namespace.

    ``wk1:{account_id}:{namespace}``; when that would exceed the relayer's 255-byte
    limit, the namespace part is replaced by ``h:`` + its SHA-256 (still unique
    and deterministic, so recall finds what store wrote).
    """
    ns = namespace if namespace is not None else DEFAULT_NAMESPACE
    scoped = f"wk1:{account_id}:{ns}"
    if len(scoped.encode("utf-8")) <= NAMESPACE_MAX_BYTES:
        return scoped
    return f"wk1:{account_id}:h:{sha256_hex(ns.encode('utf-8'))}"


def memwal_idempotency_key(account_id: str, idempotency_key: str) -> str:
    """The relayer-side idempotency key: scoped to the account, fixed length."""
    digest = sha256_hex(f"{account_id}\0{idempotency_key}".encode())
    return f"wk1-{digest}"


# --- what a landed job means (pure + Chain lookup) -------------------------------------------


def placeholder_object_id(blob_id: str) -> str:
    return f"{PLACEHOLDER_PREFIX}{blob_id}"


def is_placeholder_object_id(blob_object_id: str) -> bool:
    return blob_object_id.startswith(PLACEHOLDER_PREFIX)


def is_resolved(blob: BlobObject) -> bool:
    """True when ``blob`` names a real on-chain object with a known lifetime.

    Only a resolved blob can be renewed or judged lapsed; see the module docstring.
    """
    return (
        not is_placeholder_object_id(blob.blob_object_id)
        and blob.end_epoch != UNKNOWN
        and blob.storage_size != UNKNOWN
    )


def resolve_on_chain(blob: BlobObject, chain: Chain) -> BlobObject | None:
    """Find the real Blob object for a MemWal landing, if Walkeep can renew it.

    The relayer transfers the Blob to the MemWal account owner. Walkeep can only
    extend objects its own wallet owns, so this returns ``None`` unless the job's
    owner *is* the server wallet and that wallet owns a Blob with this blob_id.
    Scans ``chain.owned_blobs()``; call it once per landing, not per request.
    """
    if is_resolved(blob):
        return blob
    owner = chain.owner_address().lower()
    if not blob.owner or blob.owner.lower() != owner:
        return None
    for candidate in chain.owned_blobs():
        if candidate.blob_id == blob.blob_id:
            return candidate
    return None


def _int_field(body: Mapping[str, Any], *names: str) -> int:
    for name in names:
        value = body.get(name)
        if value is None:
            continue
        try:
            return int(value)
        except (TypeError, ValueError):
            continue
    return UNKNOWN


def blob_from_job(body: Mapping[str, Any]) -> BlobObject:
    """What a ``done`` job tells us, unknowns marked (module docstring)."""
    blob_id = str(body["blob_id"])
    object_id = body.get("blob_object_id") or body.get("object_id")
    if isinstance(object_id, str) and object_id.startswith("0x"):
        blob_object_id = object_id
    else:
        blob_object_id = placeholder_object_id(blob_id)
    certified = body.get("certified_epoch")
    return BlobObject(
        blob_id=blob_id,
        blob_object_id=blob_object_id,
        size=_int_field(body, "size"),
        storage_size=_int_field(body, "storage_size"),
        registered_epoch=_int_field(body, "registered_epoch"),
        end_epoch=_int_field(body, "end_epoch", "expiry_epoch"),
        owner=str(body.get("owner") or ""),
        certified_epoch=int(certified) if isinstance(certified, int) else None,
        deletable=True,  # MemWal always uploads with deletable: true
    )


def _error_text(response: httpx.Response) -> str:
    """The relayer's ``{"error": "..."}`` text, or a short status line."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("error"), str):
        return body["error"]
    return f"HTTP {response.status_code}"


def _retry_after_seconds(response: httpx.Response) -> float | None:
    header = response.headers.get("retry-after")
    if header is not None:
        try:
            return max(0.0, float(header))
        except ValueError:
            pass  # an HTTP-date: fall back to the body
    try:
        body = response.json()
    except ValueError:
        return None
    if isinstance(body, dict):
        value = body.get("retry_after_seconds")
        if isinstance(value, int | float):
            return max(0.0, float(value))
    return None


# --- the adapter -----------------------------------------------------------------------------


class MemWalRelayer:
    """The ``Relayer`` port over the hosted MemWal relayer's REST API.

    Stateless on purpose: the job id the relayer returns is all a later ``poll``
    needs, and the service stores it, so a crash loses nothing here.
    """

    name = "memwal"
    content_listable = False

    def __init__(
        self,
        base_url: str,
        delegate_key_hex: str,
        account_id: str,
        *,
        clock: Clock | None = None,
        timeout: float = 15,
        http: httpx.Client | None = None,
        sleep: Callable[[float], None] = time.sleep,
        max_rate_limit_retries: int = 2,
        max_retry_wait: float = 10.0,
        nonce_factory: Callable[[], str] = lambda: str(uuid.uuid4()),
        chain: Chain | None = None,
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ConfigurationError(f"memwal url must be http(s): {base_url!r}")
        if not account_id:
            raise ConfigurationError("memwal account id is required (the MemWalAccount object id)")
        self.base_url = base_url.rstrip("/")
        self.account_id = account_id
        self._seed = parse_delegate_key(delegate_key_hex)
        self._clock: Clock = clock or SystemClock()
        self._timeout = httpx.Timeout(timeout)
        self._owns_http = http is None
        self._http = http or httpx.Client(timeout=self._timeout)
        self._sleep = sleep
        self._max_rate_limit_retries = max(0, max_rate_limit_retries)
        self._max_retry_wait = max_retry_wait
        self._nonce = nonce_factory
        self._chain = chain

    @property
    def public_key_hex(self) -> str:
        key = Ed25519PrivateKey.from_private_bytes(self._seed).public_key()
        return key.public_bytes(Encoding.Raw, PublicFormat.Raw).hex()

    def close(self) -> None:
        if self._owns_http:
            self._http.close()

    def __enter__(self) -> MemWalRelayer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- transport -------------------------------------------------------------------------

    def _unavailable(self, message: str, **data: Any) -> RelayerUnavailable:
        return RelayerUnavailable(message, {"backend": self.name, **data})

    def _send_signed(
        self, method: Literal["GET", "POST"], path: str, body: Mapping[str, Any] | None
    ) -> httpx.Response:
        """One signed attempt. Transport failures become ``RelayerUnavailable``."""
        content = b"" if body is None else canonical_json(body)
        url = httpx.URL(self.base_url + path)
        # Sign the path exactly as the server's URI will show it (incl. any base path).
        path_and_query = url.raw_path.decode("ascii")
        headers = sign_request(
            self._seed,
            method,
            path_and_query,
            content,
            int(self._clock.time()),
            self._nonce(),
            self.account_id,
        )
        if body is not None:
            headers["content-type"] = "application/json"
        try:
            return self._http.request(
                method, url, content=content or None, headers=headers, timeout=self._timeout
            )
        except httpx.TimeoutException as exc:
            raise self._unavailable(
                f"MemWal relayer timed out on {method} {path}", reason="timeout"
            ) from exc
        except httpx.HTTPError as exc:
            raise self._unavailable(
                f"MemWal relayer unreachable on {method} {path}: {type(exc).__name__}",
                reason="unreachable",
            ) from exc

    def _request(
        self, method: Literal["GET", "POST"], path: str, body: Mapping[str, Any] | None = None
    ) -> httpx.Response:
        """A signed request with bounded 429 handling.

        Each retry is re-signed (fresh nonce and timestamp: the relayer refuses a
        replayed nonce). A wait longer than ``max_retry_wait`` is not slept through:
        the caller gets ``RelayerUnavailable`` with ``retry_after_seconds`` at once,
        because accept runs while an agent waits.
        """
        attempt = 0
        while True:
            response = self._send_signed(method, path, body)
            if response.status_code != 429:
                return response
            wait = _retry_after_seconds(response)
            if (
                attempt >= self._max_rate_limit_retries
                or wait is None
                or wait > self._max_retry_wait
            ):
                retry_after = int(-(-(wait or 0) // 1)) if wait is not None else None
                raise self._unavailable(
                    "MemWal relayer rate limit reached; retry later",
                    status=429,
                    retry_after_seconds=retry_after,
                    detail=_error_text(response),
                )
            attempt += 1
            log.info("memwal 429 on %s %s: waiting %.1fs (retry %d)", method, path, wait, attempt)
            self._sleep(wait)

    def _raise_for_status(self, response: httpx.Response, what: str) -> None:
        """Map a non-2xx relayer answer onto the error hierarchy."""
        status = response.status_code
        if status < 400:
            return
        text = _error_text(response)
        if status == 402:
            raise QuotaExceeded(
                f"MemWal storage quota exceeded ({text})",
                {"backend": self.name, "limit": "relayer storage quota", "detail": text},
            )
        if status == 413:
            raise QuotaExceeded(
                f"MemWal refused {what}: payload too large",
                {"backend": self.name, "detail": text},
            )
        if status in (400, 422):
            raise ValidationError(f"MemWal refused {what}: {text}", {"backend": self.name})
        if status in (401, 403, 426):
            # Misconfiguration (wrong key/account, clock drift, outdated protocol):
            # nothing was accepted and the agent can do nothing about it but retry later.
            auth_error = response.headers.get("x-auth-error")
            log.error("memwal auth refused %s: %s %s", what, status, auth_error or text)
            raise self._unavailable(
                "MemWal relayer refused Walkeep's credentials",
                status=status,
                **({"auth_error": auth_error} if auth_error else {}),
            )
        if status == 503:
            raise self._unavailable(f"MemWal relayer unavailable: {text}", status=503, detail=text)
        if status >= 500:
            raise self._unavailable(f"MemWal relayer error on {what}", status=status, detail=text)
        raise self._unavailable(f"MemWal relayer answered {status} on {what}", status=status)

    @staticmethod
    def _json(response: httpx.Response) -> dict[str, Any]:
        try:
            body = response.json()
        except ValueError as exc:
            raise RelayerUnavailable("MemWal relayer sent a non-JSON answer") from exc
        if not isinstance(body, dict):
            raise RelayerUnavailable("MemWal relayer sent an unexpected JSON shape")
        return body

    # -- Relayer port ------------------------------------------------------------------------

    def health(self) -> Health:
        """``GET /health`` (public, unsigned). Never raises."""
        try:
            response = self._http.get(f"{self.base_url}/health", timeout=self._timeout)
        except httpx.HTTPError as exc:
            return Health(ok=False, writes="degraded", detail=f"unreachable: {type(exc).__name__}")
        if response.status_code != 200:
            return Health(
                ok=False, writes="degraded", detail=f"/health HTTP {response.status_code}"
            )
        try:
            body = response.json()
        except ValueError:
            return Health(ok=False, writes="degraded", detail="/health is not JSON")
        if not isinstance(body, dict):
            return Health(ok=False, writes="degraded", detail="/health is not a JSON object")
        ok = body.get("status") == "ok"
        raw = body.get("writes")
        writes: WriteHealth
        if raw in ("ok", "degraded", "paused"):
            writes = raw
        elif raw is None:
            # Older relayers have no ``writes``; ``write_ready: false`` is the closest signal.
            writes = "degraded" if body.get("write_ready") is False else "ok"
        else:
            writes = "degraded"
        detail = f"version {body.get('version', '?')}"
        if body.get("write_ready") is False:
            detail += ", write_ready=false"
        return Health(ok=ok, writes=writes, detail=detail)

    def accept(
        self, *, account_id: str, namespace: str, content: str, idempotency_key: str, epochs: int
    ) -> str:
        """Check ``/health``, then signed ``POST /api/remember``; return the job id.

        ``epochs`` cannot be passed on: the relayer buys its own (module docstring).

        A paused relayer is refused *before* anything is sent, so a pause never
        leaves an accepted job behind. A timeout on the POST itself is ambiguous
        (the job may exist): it is reported as ``RelayerUnavailable`` and the
        service's retry with the same ``idempotency_key`` gets the same job back.
        """
        health = self.health()
        if not health.ok:
            raise self._unavailable(
                f"MemWal relayer is not healthy ({health.detail})", writes=health.writes
            )
        if health.writes == "paused":
            raise self._unavailable("MemWal relayer writes are paused", writes="paused")
        if health.writes == "degraded":
            log.warning("memwal writes degraded: accepting anyway, the job may fail")
        body = {
            "text": content,
            "namespace": memwal_namespace(account_id, namespace),
            "idempotency_key": memwal_idempotency_key(account_id, idempotency_key),
        }
        response = self._request("POST", "/api/remember", body)
        self._raise_for_status(response, "remember")
        job_id = self._json(response).get("job_id")
        if not isinstance(job_id, str) or not job_id:
            raise self._unavailable("MemWal relayer accepted the write but sent no job_id")
        return job_id

    def poll(self, job_id: str) -> JobStatus:
        """One signed ``GET /api/remember/{job_id}``; the caller owns the backoff loop."""
        response = self._request("GET", f"/api/remember/{quote(job_id, safe='')}")
        if response.status_code == 404:
            return JobStatus(JobState.FAILED, error="unknown job")
        self._raise_for_status(response, "job status")
        body = self._json(response)
        status = body.get("status")
        if status in _PENDING_STATUSES:
            return JobStatus(JobState.PENDING)
        if status == "done":
            if not body.get("blob_id"):
                return JobStatus(JobState.FAILED, error="relayer reported done without a blob_id")
            return self._landed(blob_from_job(body))
        if status == "failed":
            return JobStatus(JobState.FAILED, error=str(body.get("error") or "job failed"))
        raise self._unavailable(f"MemWal job has an unknown status {status!r}")

    def _landed(self, blob: BlobObject) -> JobStatus:
        """A done job, resolved on chain when Walkeep's wallet is the Blob's owner.

        With a ``chain`` and a job owned by the server wallet, the Blob object must
        be found before the write counts as landed: until the chain shows it (its
        index can trail the relayer by a few checkpoints) the job stays PENDING, so
        the service's deadline, not a silent unrenewable registration, decides.
        Owned by someone else: FAILED — Walkeep cannot renew it, so it must not be
        registered or billed. Without a chain (tests, tooling): LANDED with the
        placeholders (module docstring).
        """
        if self._chain is None or is_resolved(blob):
            return JobStatus(JobState.LANDED, blob=blob)
        try:
            ours = bool(blob.owner) and blob.owner.lower() == self._chain.owner_address().lower()
            resolved = resolve_on_chain(blob, self._chain) if ours else None
        except ChainError as exc:
            raise self._unavailable(
                f"cannot look the landed blob up on chain: {exc}", reason="chain"
            ) from exc
        if resolved is not None:
            return JobStatus(JobState.LANDED, blob=resolved)
        if ours:
            log.info("memwal blob %s landed but is not on chain yet", blob.blob_id)
            return JobStatus(JobState.PENDING)
        # Walkeep can only renew Blob objects its own wallet owns. Registering (and
        # billing) a memory nobody will renew would break the product's promise, so
        # this write counts as failed: the hold is released and the operator told.
        log.error(
            "memwal stored blob %s for owner %s, not for Walkeep's wallet: unrenewable",
            blob.blob_id,
            blob.owner or "(unknown)",
        )
        return JobStatus(
            JobState.FAILED,
            error=(
                f"MemWal stored blob {blob.blob_id} for owner {blob.owner or '(unknown)'}, "
                f"not for Walkeep's server wallet {self._chain.owner_address()}: Walkeep could "
                "not renew it, so it was neither registered nor billed. The server wallet "
                "(WALKEEP_SUI_PRIVATE_KEY) must own the MemWal account (WALKEEP_MEMWAL_ACCOUNT_ID)."
            ),
        )

    def read(self, account_id: str, blob_id: str) -> str:
        """Unsupported: MemWal has no read-by-id endpoint (text comes with recall)."""
        raise NotFound(
            "The MemWal relayer cannot read a memory by blob_id; its text is returned by recall",
            {"backend": self.name, "reason": "READ_BY_ID_UNSUPPORTED", "blob_id": blob_id},
        )

    def read_many(self, account_id: str, blob_ids: Sequence[str]) -> dict[str, str]:
        """Nothing: MemWal cannot read by blob_id (recall's hits carry their text)."""
        return {}

    def search(
        self,
        account_id: str,
        namespace: str | None,
        query: str,
        limit: int,
        only: Collection[str] | None = None,
    ) -> list[SearchHit]:
        """Signed ``POST /api/recall`` in the account's (scoped) namespace.

        ``only`` is not sent: the relayer's recall cannot be narrowed to given blobs, so a
        filtered recall keeps those of its hits that match (the relayer returns at most
        ``RECALL_MAX_LIMIT``).

        ``score`` is the relayer's ``score`` when it sends one (only with composite
        weights), else ``1 - distance`` (cosine distance), so higher is better
        either way. Hits the relayer could not download/decrypt are already
        dropped by it (``dropped_count``).
        """
        body = {
            "query": query,
            "limit": max(1, min(int(limit), RECALL_MAX_LIMIT)),
            "namespace": memwal_namespace(account_id, namespace),
        }
        response = self._request("POST", "/api/recall", body)
        self._raise_for_status(response, "recall")
        payload = self._json(response)
        if payload.get("dropped_count"):
            log.warning("memwal recall dropped %s undecryptable hits", payload["dropped_count"])
        hits: list[SearchHit] = []
        for item in payload.get("results") or []:
            if not isinstance(item, dict) or not item.get("blob_id"):
                continue
            score = item.get("score")
            if not isinstance(score, int | float):
                distance = item.get("distance")
                score = 1.0 - float(distance) if isinstance(distance, int | float) else 0.0
            text = item.get("text")
            hits.append(
                SearchHit(
                    blob_id=str(item["blob_id"]),
                    score=float(score),
                    content=text if isinstance(text, str) else None,
                )
            )
        return hits

    def list_contents(
        self, account_id: str, namespace: str | None, blob_ids: Iterable[str]
    ) -> list[ListedContent] | None:
        """MemWal has no bulk-content list: export falls back to the registry."""
        return None
