"""``WalrusBlobStore``: the ``BlobStore`` port over a Walrus publisher and aggregator (HTTP).

Wire contract (notes/walrus-sui.md §1):

- ``PUT {publisher}/v1/blobs?epochs=N&send_object_to=<owner>&force=true`` with the raw
  bytes → 200 ``BlobStoreResult`` JSON, camelCase at every level
  (``newlyCreated.blobObject.storage.endEpoch``; the generated OpenAPI file's snake_case
  is wrong). ``send_object_to`` makes the new ``Blob`` object Walkeep's, so Walkeep can
  renew it; ``force=true`` always creates a new object, because an ``alreadyCertified``
  answer leaves us with nothing we own and therefore nothing we can renew.
- ``PUT {publisher}/v1/quilts?epochs=N&send_object_to=<owner>&force=true`` as
  ``multipart/form-data`` (one field per patch, field name = identifier) → 200
  ``{"blobStoreResult": <BlobStoreResult>, "storedQuiltBlobs": [{"identifier",
  "quiltPatchId"}]}``: many small blobs as one Blob object (walkeep.protocol.quilt).
- ``GET {aggregator}/v1/blobs/{blob_id}``, ``/v1/blobs/by-object-id/{id}`` and
  ``/v1/blobs/by-quilt-patch-id/{patch_id}`` → raw bytes.
- Errors are AIP-193: ``{"error": {"code", "status", "message", "details":
  [{"@type": "ErrorInfo", "reason": "BLOB_NOT_FOUND", ...}]}}``; the ``reason`` is
  passed on in ``data.reason``.

Retries, and why PUT (blob or quilt) has none: a PUT is not idempotent — every successful
attempt buys storage and mints a Blob object, so a blind retry after a timeout can pay
twice (MemWal #477 is exactly that bug). ``put`` and ``put_quilt`` make one attempt; on
failure ``data.outcome`` says what may have happened: ``"not_sent"`` (connection refused or
connect timeout: nothing reached the publisher), ``"not_stored"`` (the publisher refused
the request), ``"unknown"`` (read timeout, 5xx, 504 ``INSUFFICIENT_CONFIRMATIONS``: a
Blob may exist). Because the object is sent to Walkeep's own wallet, an "unknown"
outcome that did store something is found by the orphan sweep (``Chain.owned_blobs``),
never billed, never renewed. GETs are safe to repeat and are retried with bounded
exponential backoff and jitter.
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal
from urllib.parse import quote

import httpx

from walkeep.backends.base import (
    BlobObject,
    Health,
    QuiltPatch,
    StoredBlob,
    StoredQuilt,
    get_each,
)
from walkeep.errors import (
    ConfigurationError,
    NotFound,
    QuotaExceeded,
    RelayerUnavailable,
    ValidationError,
)
from walkeep.protocol.quilt import decode_patch_id, is_patch_id, plan_layout
from walkeep.protocol.walrus import MAX_EPOCHS_AHEAD, encoded_blob_length

log = logging.getLogger(__name__)

Outcome = Literal["not_sent", "not_stored", "unknown"]

_RETRYABLE_GET = frozenset({429, 500, 502, 503, 504})
# Reads one process keeps in flight for ``get_many`` (a recall's hits, an export's page):
# a recall's default five uncached hits cost one round trip (ten cost two), without one
# process opening dozens of connections to a shared aggregator.
READ_CONCURRENCY = 8


def aip193(response: httpx.Response) -> tuple[str | None, str]:
    """``(reason, message)`` from an AIP-193 error body, tolerating anything else."""
    reason: str | None = None
    message = f"HTTP {response.status_code}"
    try:
        body = response.json()
    except ValueError:
        text = response.text.strip()
        return None, text[:200] if text else message
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        if isinstance(error.get("message"), str):
            message = error["message"]
        for detail in error.get("details") or []:
            if isinstance(detail, dict) and isinstance(detail.get("reason"), str):
                reason = detail["reason"]
                break
        if reason is None and isinstance(error.get("status"), str):
            reason = error["status"]
    elif isinstance(error, str):
        message = error
    return reason, message


def _require(obj: Mapping[str, Any], key: str, kind: type) -> Any:
    value = obj.get(key)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        raise KeyError(key)
    return value


def parse_blob_object(raw: Mapping[str, Any], owner: str) -> BlobObject:
    """A ``newlyCreated.blobObject`` (camelCase) as a ``BlobObject``.

    The response does not carry the owner: it is the ``send_object_to`` we asked for.
    ``certifiedEpoch`` may be null in some responses (notes §1.3): kept as ``None``.
    """
    storage = _require(raw, "storage", dict)
    certified = raw.get("certifiedEpoch")
    return BlobObject(
        blob_id=_require(raw, "blobId", str),
        blob_object_id=_require(raw, "id", str),
        size=_require(raw, "size", int),
        storage_size=_require(storage, "storageSize", int),
        registered_epoch=_require(raw, "registeredEpoch", int),
        end_epoch=_require(storage, "endEpoch", int),
        owner=owner,
        certified_epoch=certified if isinstance(certified, int) else None,
        deletable=bool(raw.get("deletable", True)),
    )


class WalrusBlobStore:
    """A Walrus publisher (writes) and aggregator (reads) over HTTP."""

    name = "walrus"

    def __init__(
        self,
        publisher_url: str,
        aggregator_url: str,
        *,
        jwt: str | None = None,
        timeout: float = 60,
        retries: int = 2,
        http: httpx.Client | None = None,
        sleep: Callable[[float], None] = time.sleep,
        rng: Callable[[], float] = random.random,
        backoff_base: float = 0.5,
        backoff_max: float = 8.0,
    ) -> None:
        for label, url in (("publisher", publisher_url), ("aggregator", aggregator_url)):
            if not url.startswith(("http://", "https://")):
                raise ConfigurationError(f"walrus {label} url must be http(s): {url!r}")
        self.publisher_url = publisher_url.rstrip("/")
        self.aggregator_url = aggregator_url.rstrip("/")
        self._jwt = jwt
        self._timeout = httpx.Timeout(timeout)
        self._retries = max(0, retries)
        self._owns_http = http is None
        self._http = http or httpx.Client(timeout=self._timeout)
        self._sleep = sleep
        self._rng = rng
        self._backoff_base = backoff_base
        self._backoff_max = backoff_max
        self._readers: ThreadPoolExecutor | None = None
        self._readers_lock = threading.Lock()

    def close(self) -> None:
        if self._readers is not None:
            self._readers.shutdown(wait=False, cancel_futures=True)
        if self._owns_http:
            self._http.close()

    def __enter__(self) -> WalrusBlobStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _unavailable(self, message: str, **data: Any) -> RelayerUnavailable:
        return RelayerUnavailable(message, {"backend": self.name, **data})

    # -- writes --------------------------------------------------------------------------------

    def put(self, data: bytes, *, epochs: int, owner: str) -> StoredBlob:
        """Store ``data`` for ``epochs`` epochs with the new Blob object sent to ``owner``.

        One attempt only (module docstring). Raises ``RelayerUnavailable``
        (unreachable, timeout, 5xx, 504 ``INSUFFICIENT_CONFIRMATIONS``; see
        ``data.outcome``), ``QuotaExceeded`` (413), ``ValidationError`` (400, 451,
        ``markedInvalid``).

        ``alreadyCertified`` (not expected with ``force=true``) comes back as
        ``newly_created=False`` with only what is known: ``blob_id``, ``end_epoch``,
        ``size``, the computed ``storage_size``, an empty ``owner`` and the
        publisher's object id if it sent one (otherwise ``""``). No object of ours
        exists, so the caller must not register it for renewal: store again or treat
        the write as failed.
        """
        epochs = self._check_epochs(epochs)
        owner = owner.lower()
        response = self._publisher_put(
            "/v1/blobs",
            {"epochs": str(epochs), "send_object_to": owner, "force": "true"},
            len(data),
            content=bytes(data),
        )
        size = len(data)
        return self._parse_store_result(
            self._json(response), size, encoded_blob_length(size), owner
        )

    def put_quilt(
        self, patches: Sequence[tuple[str, bytes]], *, epochs: int, owner: str
    ) -> StoredQuilt:
        """Store ``(identifier, bytes)`` patches as one quilt (``PUT /v1/quilts``, multipart).

        One attempt only, like :meth:`put` (same errors and ``data.outcome``). The
        patches are checked here first (at most 666, identifiers unique, non-empty,
        not starting with ``_``): ``ValidationError`` and nothing is sent. The answer
        must name every requested identifier once, with a well-formed patch id of
        this quilt; otherwise ``RelayerUnavailable`` (``outcome="unknown"``: a quilt
        may exist, and the orphan sweep finds it).
        """
        epochs = self._check_epochs(epochs)
        items: list[tuple[str, bytes]] = []
        for item in patches:
            if (
                not isinstance(item, tuple | list)
                or len(item) != 2
                or not isinstance(item[1], bytes | bytearray | memoryview)
            ):
                raise ValidationError(
                    "quilt patches must be (identifier, bytes) pairs", {"backend": self.name}
                )
            items.append((item[0], bytes(item[1])))
        try:
            layout = plan_layout([(i, len(d)) for i, d in items])
        except ValueError as exc:
            raise ValidationError(f"invalid quilt: {exc}", {"backend": self.name}) from None
        owner = owner.lower()
        response = self._publisher_put(
            "/v1/quilts",
            {"epochs": str(epochs), "send_object_to": owner, "force": "true"},
            sum(len(d) for _, d in items),
            files=[(i, (i, d, "application/octet-stream")) for i, d in items],
        )
        body = self._json(response)
        result = body.get("blobStoreResult")
        if not isinstance(result, dict):
            raise self._unavailable(
                "Walrus quilt result lacks 'blobStoreResult'", outcome="unknown"
            )
        stored = self._parse_store_result(result, layout.laid_out_size, layout.storage_size, owner)
        blob_id = stored.blob.blob_id
        by_identifier: dict[str, str] = {}
        for entry in body.get("storedQuiltBlobs") or []:
            identifier = entry.get("identifier") if isinstance(entry, dict) else None
            patch_id = entry.get("quiltPatchId") if isinstance(entry, dict) else None
            if not isinstance(identifier, str) or not isinstance(patch_id, str):
                raise self._unavailable(
                    "Walrus quilt result has a malformed storedQuiltBlobs entry",
                    blob_id=blob_id,
                    outcome="unknown",
                )
            if identifier in by_identifier:
                raise self._unavailable(
                    f"Walrus quilt result names {identifier!r} twice",
                    blob_id=blob_id,
                    outcome="unknown",
                )
            try:
                ref = decode_patch_id(patch_id)
            except ValueError as exc:
                raise self._unavailable(
                    f"Walrus returned a malformed patch id for {identifier!r}: {exc}",
                    blob_id=blob_id,
                    outcome="unknown",
                ) from None
            if ref.quilt_blob_id != blob_id:
                raise self._unavailable(
                    f"Walrus patch id for {identifier!r} belongs to quilt "
                    f"{ref.quilt_blob_id}, not {blob_id}",
                    blob_id=blob_id,
                    outcome="unknown",
                )
            by_identifier[identifier] = patch_id
        requested = [i for i, _ in items]
        if set(by_identifier) != set(requested):
            missing = sorted(set(requested) - set(by_identifier))
            extra = sorted(set(by_identifier) - set(requested))
            raise self._unavailable(
                "Walrus quilt result does not match the request "
                f"(missing {missing[:5]}, unexpected {extra[:5]})",
                blob_id=blob_id,
                outcome="unknown",
            )
        return StoredQuilt(
            blob=stored.blob,
            patches=tuple(QuiltPatch(i, by_identifier[i]) for i in requested),
            newly_created=stored.newly_created,
            cost_frost=stored.cost_frost,
        )

    @staticmethod
    def _check_epochs(epochs: int) -> int:
        if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
            raise ValidationError("epochs must be a positive integer", {"epochs": epochs})
        if epochs > MAX_EPOCHS_AHEAD:
            raise ValidationError(f"epochs must be at most {MAX_EPOCHS_AHEAD}", {"epochs": epochs})
        return epochs

    def _publisher_put(
        self,
        path: str,
        params: dict[str, str],
        size: int,
        *,
        content: bytes | None = None,
        files: list[tuple[str, tuple[str, bytes, str]]] | None = None,
    ) -> httpx.Response:
        """One PUT to the publisher; a non-200 answer becomes the typed error."""
        headers = {} if files is not None else {"content-type": "application/octet-stream"}
        if self._jwt:
            headers["authorization"] = f"Bearer {self._jwt}"
        url = f"{self.publisher_url}{path}"
        try:
            response = self._http.put(
                url,
                params=params,
                content=content,
                files=files,
                headers=headers,
                timeout=self._timeout,
            )
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise self._unavailable(
                f"Walrus publisher unreachable: {type(exc).__name__}",
                reason="unreachable",
                outcome="not_sent",
            ) from exc
        except httpx.HTTPError as exc:
            # The bytes may have reached the publisher: a Blob may exist.
            raise self._unavailable(
                f"Walrus publisher did not answer: {type(exc).__name__}",
                reason="timeout" if isinstance(exc, httpx.TimeoutException) else "transport",
                outcome="unknown",
            ) from exc
        if response.status_code != 200:
            self._raise_put_error(response, size)
        return response

    def _raise_put_error(self, response: httpx.Response, size: int) -> None:
        status = response.status_code
        reason, message = aip193(response)
        if status == 413:
            raise QuotaExceeded(
                "The Walrus publisher refused the blob as too large",
                {"backend": self.name, "size": size, "reason": reason, "detail": message},
            )
        if status in (400, 422, 451):
            raise ValidationError(
                f"The Walrus publisher refused the blob: {message}",
                {"backend": self.name, "status": status, "reason": reason},
            )
        outcome: Outcome = "unknown" if status >= 500 else "not_stored"
        if status in (401, 403):
            log.error("walrus publisher refused credentials: %s %s", status, reason or message)
        raise self._unavailable(
            f"Walrus publisher error {status}: {message}",
            status=status,
            reason=reason,
            outcome=outcome,
        )

    def _json(self, response: httpx.Response) -> dict[str, Any]:
        try:
            body = response.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            raise self._unavailable(
                "Walrus publisher sent an unreadable store result", outcome="unknown"
            )
        return body

    def _parse_store_result(
        self, body: dict[str, Any], size: int, storage_size: int, owner: str
    ) -> StoredBlob:
        """A ``BlobStoreResult``; ``size``/``storage_size`` fill an ``alreadyCertified``."""
        if isinstance(body.get("newlyCreated"), dict):
            created = body["newlyCreated"]
            try:
                blob = parse_blob_object(_require(created, "blobObject", dict), owner)
            except KeyError as exc:
                raise self._unavailable(
                    f"Walrus store result lacks {exc.args[0]!r}", outcome="unknown"
                ) from exc
            cost = created.get("cost")
            return StoredBlob(
                blob=blob,
                newly_created=True,
                cost_frost=cost if isinstance(cost, int) and not isinstance(cost, bool) else None,
            )
        if isinstance(body.get("alreadyCertified"), dict):
            certified = body["alreadyCertified"]
            blob_id = certified.get("blobId")
            end_epoch = certified.get("endEpoch")
            if not isinstance(blob_id, str) or not isinstance(end_epoch, int):
                raise self._unavailable(
                    "Walrus alreadyCertified result is incomplete", outcome="unknown"
                )
            log.warning("walrus answered alreadyCertified despite force=true: %s", blob_id)
            object_id = certified.get("object")
            return StoredBlob(
                blob=BlobObject(
                    blob_id=blob_id,
                    blob_object_id=object_id if isinstance(object_id, str) else "",
                    size=size,
                    storage_size=storage_size,
                    registered_epoch=0,
                    end_epoch=end_epoch,
                    owner="",
                ),
                newly_created=False,
            )
        if isinstance(body.get("markedInvalid"), dict):
            raise ValidationError(
                "Walrus marked this blob invalid",
                {"backend": self.name, "blob_id": body["markedInvalid"].get("blobId")},
            )
        if isinstance(body.get("error"), dict):
            failure = body["error"]
            raise self._unavailable(
                f"Walrus store failed: {failure.get('errorMsg', 'unknown error')}",
                reason=failure.get("failurePhase"),
                blob_id=failure.get("blobId"),
                outcome="unknown",
            )
        raise self._unavailable("Walrus publisher sent an unknown store result", outcome="unknown")

    # -- reads -----------------------------------------------------------------------------------

    def get(self, blob_id: str) -> bytes:
        """The blob's bytes. ``NotFound`` if never stored or lapsed; retried when transient."""
        return self._get(f"/v1/blobs/{quote(blob_id, safe='')}", {"blob_id": blob_id})

    def get_patch(self, patch_id: str) -> bytes:
        """A quilt patch's bytes (``by-quilt-patch-id``); ``NotFound`` also if malformed."""
        if not is_patch_id(patch_id):
            raise NotFound("not a quilt patch id", {"patch_id": str(patch_id)})
        return self._get(
            f"/v1/blobs/by-quilt-patch-id/{quote(patch_id, safe='')}", {"patch_id": patch_id}
        )

    def get_many(self, ids: Sequence[str]) -> dict[str, bytes]:
        """Those of ``ids`` that exist, fetched ``READ_CONCURRENCY`` at a time.

        Each read is a round trip in which the aggregator rebuilds the blob from storage
        nodes; one after another, a recall of ten uncached hits waited for ten of them.
        NotFound ones are left out; any other failure (after its retries) raises.
        """
        unique = list(dict.fromkeys(ids))
        if len(unique) <= 1:
            return get_each(self, unique)
        with self._readers_lock:
            if self._readers is None:
                self._readers = ThreadPoolExecutor(READ_CONCURRENCY, "walkeep-walrus-read")
            pool = self._readers
        futures = {i: pool.submit(get_each, self, (i,)) for i in unique}
        out: dict[str, bytes] = {}
        try:
            for future in futures.values():
                out.update(future.result())
        finally:
            for future in futures.values():  # after a failure: drop what has not started
                future.cancel()
        return out

    def get_by_object_id(self, object_id: str) -> bytes:
        """The bytes behind a Blob (or SharedBlob) object id."""
        return self._get(
            f"/v1/blobs/by-object-id/{quote(object_id, safe='')}", {"blob_object_id": object_id}
        )

    def backoff(self, attempt: int) -> float:
        """Delay before retry ``attempt`` (0-based): exponential, capped, equal jitter.

        Half the step is fixed so retries never bunch at zero; the other half is
        random so many readers backing off from one aggregator spread out.
        """
        step = min(self._backoff_max, self._backoff_base * (2**attempt))
        return step / 2 + self._rng() * step / 2

    def _get(self, path: str, ident: dict[str, str]) -> bytes:
        url = f"{self.aggregator_url}{path}"
        last: dict[str, Any] = {}
        for attempt in range(self._retries + 1):
            if attempt:
                wait = self.backoff(attempt - 1)
                retry_after = last.get("retry_after")
                if isinstance(retry_after, float):
                    wait = max(wait, min(retry_after, self._backoff_max))
                self._sleep(wait)
            try:
                response = self._http.get(url, timeout=self._timeout)
            except httpx.HTTPError as exc:
                last = {
                    "reason": "timeout"
                    if isinstance(exc, httpx.TimeoutException)
                    else "unreachable"
                }
                continue
            status = response.status_code
            if status == 200:
                return response.content
            reason, message = aip193(response)
            if status in (404, 410):
                raise NotFound(
                    "Blob not found on Walrus (never stored, or expired)",
                    {**ident, "reason": reason or "BLOB_NOT_FOUND"},
                )
            if status == 451:
                raise NotFound("Blob is blocked by this aggregator", {**ident, "reason": reason})
            if status not in _RETRYABLE_GET:
                raise self._unavailable(
                    f"Walrus aggregator error {status}: {message}",
                    **ident,
                    status=status,
                    reason=reason,
                )
            last = {"status": status, "reason": reason}
            header = response.headers.get("retry-after")
            if header is not None:
                with contextlib.suppress(ValueError):
                    last["retry_after"] = float(header)
        last.pop("retry_after", None)
        raise self._unavailable(
            "Walrus aggregator unavailable", **ident, attempts=self._retries + 1, **last
        )

    # -- health ----------------------------------------------------------------------------------

    def _reachable(self, base: str) -> tuple[bool, str]:
        try:
            response = self._http.get(f"{base}/v1/api", timeout=self._timeout)
        except httpx.HTTPError as exc:
            return False, f"unreachable ({type(exc).__name__})"
        if response.status_code >= 500:
            reason, _ = aip193(response)
            return False, f"HTTP {response.status_code}" + (f" {reason}" if reason else "")
        return True, "ok"

    def health(self) -> Health:
        """Cheap probe: ``GET /v1/api`` on both ends; any answer below 500 means "up"."""
        agg_ok, agg = self._reachable(self.aggregator_url)
        if self.publisher_url == self.aggregator_url:
            pub_ok, pub = agg_ok, agg
        else:
            pub_ok, pub = self._reachable(self.publisher_url)
        return Health(
            ok=agg_ok and pub_ok,
            writes="ok" if pub_ok else "degraded",
            detail=f"publisher {pub}, aggregator {agg}",
        )
