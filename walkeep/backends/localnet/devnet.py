"""``walkeep devnet``: the local network served over Walrus's HTTP wire format.

The publisher/aggregator routes speak exactly what real Walrus daemons speak
(notes/walrus-sui.md §1.1–1.3; ``crates/walrus-service/src/client/daemon/
routes.rs``), so the ``walrus`` HTTP backend is tested end to end against
this server and then pointed at a real publisher unchanged:

- ``PUT /v1/blobs?epochs=&send_object_to=&force=&permanent=&deletable=&share=``
  — raw body; 200 ``{"newlyCreated": {...}}`` or ``{"alreadyCertified": {...}}``
  (camelCase, as serde renders ``BlobStoreResult``).
- ``PUT /v1/quilts`` (same query) — ``multipart/form-data``, one field per
  patch (field name = identifier), optional ``_metadata`` (JSON list of
  ``{identifier, tags}``); at most 666 patches, identifiers unique and not
  starting with ``_``; body capped like ``/v1/blobs``. 200
  ``{"blobStoreResult": <as above>, "storedQuiltBlobs": [{"identifier",
  "quiltPatchId"}]}``.
- ``GET /v1/blobs/{blob_id}`` and ``GET /v1/blobs/by-object-id/{object_id}``
  — raw bytes, ``application/octet-stream``.
- ``GET /v1/blobs/by-quilt-patch-id/{patch_id}`` and
  ``GET /v1/blobs/by-quilt-id/{quilt_id}/{identifier}`` — raw bytes with
  ``X-Quilt-Patch-Identifier`` (percent-encoded if not printable ASCII) and
  ``ETag`` (the patch id); ``GET /v1/quilts/{quilt_id}/patches`` →
  ``[{"identifier", "patch_id", "tags"}]`` (snake_case, as Walrus).
- Errors are AIP-193 bodies, ``{"error": {"code", "status", "message",
  "details": [{"@type": "ErrorInfo", "reason", "domain", "metadata"}]}}``,
  domain ``daemon.walrus.space`` as in Walrus.

Where this server differs from a real daemon (on purpose, documented):

- 413 comes back as an AIP-193 body (``SIZE_EXCEEDED`` / ``BLOB_TOO_LARGE``);
  a real publisher's body-size layer answers 413 in plain text, so clients
  must key on the HTTP status, not the body.
- ``share=true`` (SharedBlob) is not modelled: 400 ``MALFORMED_REQUEST``.
- ``reuse_resources`` is accepted and ignored; ``quilt_version`` must be
  ``v1``; no ``Range`` reads, no JWT auth. Quilt sizes, columns and patch ids
  follow QuiltV1, the quilt's bytes (and so its blob id) do not
  (``walkeep.protocol.quilt``).
- ``GET /status`` (``OK``) and ``GET /v1/api`` (an HTML page standing in for
  the Redoc docs) answer like a real daemon; clients use them as probes.
- Injected faults: ``unreachable`` → 503 ``UNAVAILABLE`` on every Walrus
  route (blobs, ``/status``, ``/v1/api``); a failed write
  (``fail_next_writes``) → 504 ``INSUFFICIENT_CONFIRMATIONS``, the transient
  store failure a real publisher reports.

**Local-only** JSON endpoints (not part of Walrus; for tools and tests that
need the simulated chain's state over HTTP):

- ``GET /local/v1/epoch`` → ``{"network": "local", "epoch", "epoch_seconds",
  "genesis", "epoch_started_at", "storage_price_frost", "server_address",
  "package_id"}`` (times ISO 8601 UTC).
- ``GET /local/v1/objects/{object_id}`` → the Blob object with the field
  names of ``walkeep.backends.base.BlobObject`` plus ``network``, ``live``,
  ``start_epoch``, ``storage_id``, ``version``.

The explorer (``/explorer/tx/{digest}``, ``/explorer/object/{id}``) is mounted
too, so digests printed by a devnet-backed Walkeep resolve here.

Why one file: one HTTP surface that mirrors one upstream routes file; the routes and
their wire shapes are compared line by line against it.
"""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncGenerator
from typing import Any
from urllib.parse import quote

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser

from walkeep.backends.base import ChainUnavailable
from walkeep.backends.localnet.codec import LOCAL_PACKAGE_ID, blob_id_bytes, normalize_address
from walkeep.backends.localnet.engine import LocalNetwork
from walkeep.backends.localnet.explorer import make_explorer_router
from walkeep.backends.localnet.quilts import LocalPatch
from walkeep.backends.localnet.records import NETWORK, ObjectRecord
from walkeep.errors import NotFound, RelayerUnavailable, ValidationError
from walkeep.protocol.quilt import MAX_PATCHES, is_patch_id
from walkeep.protocol.walrus import MAX_EPOCHS_AHEAD

ERROR_DOMAIN = "daemon.walrus.space"
DEFAULT_PORT = 31415

# PublisherQuery has ``deny_unknown_fields``: anything else is a 400.
_PUT_PARAMS = frozenset(
    {
        "encoding_type",
        "epochs",
        "deletable",
        "permanent",
        "force",
        "quilt_version",
        "reuse_resources",
        "send_object_to",
        "share",
    }
)


_API_PAGE = """<!doctype html><html lang="en"><head><meta charset="utf-8">
<title>walkeep devnet — Walrus publisher/aggregator API (local)</title></head><body>
<h1>walkeep devnet</h1><p><strong>network: local</strong> — a simulated Walrus, not Walrus.</p>
<ul>
<li><code>PUT /v1/blobs?epochs=&amp;send_object_to=&amp;force=&amp;permanent=</code></li>
<li><code>GET /v1/blobs/{blob_id}</code></li>
<li><code>GET /v1/blobs/by-object-id/{object_id}</code></li>
<li><code>PUT /v1/quilts?epochs=&amp;send_object_to=&amp;force=</code> (multipart)</li>
<li><code>GET /v1/blobs/by-quilt-patch-id/{patch_id}</code></li>
<li><code>GET /v1/blobs/by-quilt-id/{quilt_id}/{identifier}</code></li>
<li><code>GET /v1/quilts/{quilt_id}/patches</code></li>
<li><code>GET /status</code></li>
<li>local only: <code>GET /local/v1/epoch</code>, <code>GET /local/v1/objects/{id}</code>,
<code>GET /explorer/tx/{digest}</code>, <code>GET /explorer/object/{id}</code></li>
</ul></body></html>
"""


def aip193(
    code: int,
    status: str,
    reason: str,
    message: str,
    metadata: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    """An AIP-193 error response, shaped like Walrus's ``Status`` type."""
    body = {
        "error": {
            "code": code,
            "status": status,
            "message": message,
            "details": [
                {
                    "@type": "ErrorInfo",
                    "reason": reason,
                    "domain": ERROR_DOMAIN,
                    "metadata": metadata or {},
                }
            ],
        }
    }
    return JSONResponse(body, status_code=code, headers=headers)


def _malformed(message: str) -> JSONResponse:
    return aip193(
        400, "INVALID_ARGUMENT", "MALFORMED_REQUEST", f"the request is malformed: {message}"
    )


def _unavailable(reason: str = "BLOB_UNAVAILABLE") -> JSONResponse:
    return aip193(
        503,
        "UNAVAILABLE",
        reason,
        "the service is currently unavailable, retry with a backoff",
        headers={"Retry-After": "1"},
    )


def _parse_bool(name: str, value: str) -> bool:
    if value == "true":
        return True
    if value == "false":
        return False
    raise ValueError(f"{name} must be true or false, got {value!r}")


def blob_object_json(rec: ObjectRecord) -> dict[str, Any]:
    """A Blob object as the publisher renders it (``blobObject``, camelCase)."""
    return {
        "id": rec.object_id,
        "registeredEpoch": rec.registered_epoch,
        "blobId": rec.blob_id,
        "size": rec.size,
        "encodingType": "RS2",
        "certifiedEpoch": rec.certified_epoch,
        "storage": {
            "id": rec.storage_id,
            "startEpoch": rec.start_epoch,
            "endEpoch": rec.end_epoch,
            "storageSize": rec.storage_size,
        },
        "deletable": rec.deletable,
    }


async def _read_body(request: Request, limit: int) -> bytes | None:
    """The request body, or None as soon as it exceeds ``limit`` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        return None
    chunks: list[bytes] = []
    total = 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def _parse_put_query(request: Request) -> tuple[int, bool, bool, str | None] | Response:
    """``(epochs, force, permanent, owner)`` of a publisher PUT, or the 400 to answer.

    Shared by ``PUT /v1/blobs`` and ``PUT /v1/quilts`` (the same ``PublisherQuery``).
    """
    q = request.query_params
    unknown = sorted(set(q.keys()) - _PUT_PARAMS)
    if unknown:
        return _malformed(f"unknown query parameter(s): {', '.join(unknown)}")
    try:
        epochs_raw = q.get("epochs", "1")
        if not (epochs_raw.isascii() and epochs_raw.isdigit()):
            raise ValueError(f"epochs must be a positive integer, got {epochs_raw!r}")
        epochs = int(epochs_raw)
        force = _parse_bool("force", q.get("force", "false"))
        permanent = _parse_bool("permanent", q.get("permanent", "false"))
        deletable = _parse_bool("deletable", q.get("deletable", "false"))
        share = _parse_bool("share", q.get("share", "false"))
        _parse_bool("reuse_resources", q.get("reuse_resources", "false"))
        encoding = q.get("encoding_type", "RS2")
        if encoding != "RS2":
            raise ValueError(f"unsupported encoding_type {encoding!r} (only RS2)")
        quilt_version = q.get("quilt_version", "v1")
        if quilt_version.lower() not in ("v1", "1"):
            raise ValueError(f"unsupported quilt_version {quilt_version!r} (only v1)")
        send_to = q.get("send_object_to")
        owner = normalize_address(send_to) if send_to is not None else None
    except ValueError as exc:
        return _malformed(str(exc))
    if permanent and deletable:
        return aip193(
            400,
            "INVALID_ARGUMENT",
            "INVALID_BLOB_PERSISTENCE",
            "the blob cannot be both deletable and permanent",
        )
    if share and owner is not None:
        return _malformed("send_object_to and share=true are mutually exclusive")
    if share:
        return _malformed("share=true (SharedBlob) is not supported by the local network")
    if not 1 <= epochs <= MAX_EPOCHS_AHEAD:
        return _malformed(f"epochs must be between 1 and {MAX_EPOCHS_AHEAD}, got {epochs}")
    return epochs, force, permanent, owner


def _too_large(max_body_bytes: int) -> JSONResponse:
    return aip193(
        413,
        "SIZE_EXCEEDED",
        "BLOB_TOO_LARGE",
        f"the blob is too large: the limit is {max_body_bytes} bytes",
        {"max_body_bytes": max_body_bytes},
    )


def _store_failed(exc: RelayerUnavailable) -> JSONResponse:
    if exc.data.get("fault") == "write_failed":
        return aip193(
            504,
            "DEADLINE_EXCEEDED",
            "INSUFFICIENT_CONFIRMATIONS",
            "the service timed-out while waiting for confirmations, please try again",
        )
    return _unavailable("SERVICE_UNAVAILABLE")


def blob_store_result_json(
    network: LocalNetwork, rec: ObjectRecord, newly_created: bool, cost: int | None, epochs: int
) -> dict[str, Any]:
    """A ``BlobStoreResult`` (``newlyCreated`` / ``alreadyCertified``), camelCase."""
    if newly_created:
        return {
            "newlyCreated": {
                "blobObject": blob_object_json(rec),
                "resourceOperation": {
                    "registerFromScratch": {
                        "encodedLength": rec.storage_size,
                        "epochsAhead": epochs,
                    }
                },
                "cost": cost or 0,
            }
        }
    already: dict[str, Any] = {"blobId": rec.blob_id}
    if rec.deletable and rec.owner == network.server_address:
        already["object"] = rec.object_id
    else:
        already["event"] = {"txDigest": rec.last_tx, "eventSeq": "0"}
    already["endEpoch"] = rec.end_epoch
    return {"alreadyCertified": already}


async def _single_chunk(body: bytes) -> AsyncGenerator[bytes, None]:
    yield body


async def _parse_quilt_form(
    request: Request, body: bytes, max_part: int
) -> tuple[list[tuple[str, bytes]], dict[str, dict[str, str]]] | Response:
    """``(patches, tags)`` from a ``PUT /v1/quilts`` multipart body, or the 400 to answer.

    Every field but ``_metadata`` is a patch named by its field name (file or plain
    field alike); ``_metadata`` is a JSON list of ``{"identifier", "tags"}``.
    """
    if not request.headers.get("content-type", "").lower().startswith("multipart/form-data"):
        return _malformed("a quilt is sent as multipart/form-data")
    parser = MultiPartParser(
        request.headers,
        _single_chunk(body),
        max_files=MAX_PATCHES + 1,
        max_fields=MAX_PATCHES + 2,
        max_part_size=max_part,
    )
    try:
        form = await parser.parse()
    except MultiPartException as exc:
        if "Too many" in exc.message:
            return _malformed(f"a quilt holds at most {MAX_PATCHES} patches")
        return _malformed(f"invalid multipart body: {exc.message}")
    patches: list[tuple[str, bytes]] = []
    metadata: Any = None
    try:
        for name, value in form.multi_items():
            raw = await value.read() if isinstance(value, UploadFile) else value.encode()
            if name == "_metadata":
                if metadata is not None:
                    return _malformed("_metadata given twice")
                try:
                    metadata = json.loads(raw)
                except ValueError:
                    return _malformed("_metadata must be JSON")
                continue
            patches.append((name, raw))
    finally:
        await form.close()
    if len(patches) > MAX_PATCHES:
        return _malformed(f"a quilt holds at most {MAX_PATCHES} patches, got {len(patches)}")
    tags: dict[str, dict[str, str]] = {}
    if metadata is not None:
        if not isinstance(metadata, list):
            return _malformed("_metadata must be a JSON list of {identifier, tags}")
        for entry in metadata:
            ident = entry.get("identifier") if isinstance(entry, dict) else None
            entry_tags = entry.get("tags", {}) if isinstance(entry, dict) else None
            if not isinstance(ident, str) or not isinstance(entry_tags, dict):
                return _malformed("_metadata entries are {identifier: str, tags: {str: str}}")
            if not all(isinstance(k, str) and isinstance(v, str) for k, v in entry_tags.items()):
                return _malformed(f"tags of {ident!r} must map strings to strings")
            tags[ident] = entry_tags
    return patches, tags


def _patch_response(patch: LocalPatch, data: bytes) -> Response:
    ident = patch.identifier
    header = ident if ident.isascii() and ident.isprintable() else quote(ident, safe="")
    return Response(
        content=data,
        media_type="application/octet-stream",
        headers={
            "ETag": patch.patch_id,
            "X-Quilt-Patch-Identifier": header,
            "X-Content-Type-Options": "nosniff",
        },
    )


def create_devnet_app(network: LocalNetwork, *, max_body_bytes: int = 10 * 2**20) -> FastAPI:
    """The ASGI app: Walrus publisher + aggregator + local JSON + explorer."""
    app = FastAPI(
        title="walkeep devnet — local Walrus publisher/aggregator",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )

    @app.put("/v1/blobs")
    async def put_blob(request: Request) -> Response:
        parsed = _parse_put_query(request)
        if isinstance(parsed, Response):
            return parsed
        epochs, force, permanent, owner = parsed
        body = await _read_body(request, max_body_bytes)
        if body is None:
            return _too_large(max_body_bytes)
        try:
            stored = await run_in_threadpool(
                network.store_blob,
                body,
                epochs=epochs,
                owner=owner or network.server_address,
                force=force,
                permanent=permanent,
            )
        except RelayerUnavailable as exc:
            return _store_failed(exc)
        except ValidationError as exc:
            return _malformed(exc.message)
        rec = await run_in_threadpool(network.object_record, stored.blob.blob_object_id)
        assert rec is not None
        return JSONResponse(
            blob_store_result_json(network, rec, stored.newly_created, stored.cost_frost, epochs)
        )

    @app.put("/v1/quilts")
    async def put_quilt(request: Request) -> Response:
        parsed = _parse_put_query(request)
        if isinstance(parsed, Response):
            return parsed
        epochs, force, permanent, owner = parsed
        body = await _read_body(request, max_body_bytes)
        if body is None:
            return _too_large(max_body_bytes)
        form = await _parse_quilt_form(request, body, max_body_bytes)
        if isinstance(form, Response):
            return form
        patches, tags = form
        try:
            stored = await run_in_threadpool(
                network.store_quilt,
                patches,
                epochs=epochs,
                owner=owner or network.server_address,
                force=force,
                permanent=permanent,
                tags=tags,
            )
        except RelayerUnavailable as exc:
            return _store_failed(exc)
        except ValidationError as exc:
            return _malformed(exc.message)
        rec = await run_in_threadpool(network.object_record, stored.blob.blob_object_id)
        assert rec is not None
        return JSONResponse(
            {
                "blobStoreResult": blob_store_result_json(
                    network, rec, stored.newly_created, stored.cost_frost, epochs
                ),
                "storedQuiltBlobs": [
                    {"identifier": p.identifier, "quiltPatchId": p.patch_id} for p in stored.patches
                ],
            }
        )

    def _blob_response(data: bytes, etag: str) -> Response:
        return Response(
            content=data,
            media_type="application/octet-stream",
            headers={"ETag": etag, "X-Content-Type-Options": "nosniff"},
        )

    def _not_found(message: str) -> JSONResponse:
        return aip193(404, "NOT_FOUND", "BLOB_NOT_FOUND", message)

    def _invalid_id(value: str) -> JSONResponse:
        return aip193(400, "INVALID_ARGUMENT", "INVALID_ID_FORMAT", f"invalid ID format: {value}")

    @app.get("/v1/blobs/by-quilt-patch-id/{patch_id}")
    def get_patch(patch_id: str) -> Response:
        if not is_patch_id(patch_id):
            return _invalid_id(patch_id)
        try:
            patch, data = network.read_patch_entry(patch_id)
        except RelayerUnavailable:
            return _unavailable()
        except NotFound:
            return _not_found("the requested quilt patch does not exist on Walrus (or expired)")
        return _patch_response(patch, data)

    @app.get("/v1/blobs/by-quilt-id/{quilt_id}/{identifier:path}")
    def get_patch_by_identifier(quilt_id: str, identifier: str) -> Response:
        try:
            blob_id_bytes(quilt_id)
        except ValueError:
            return _invalid_id(quilt_id)
        try:
            patch, data = network.read_quilt_patch_by_identifier(quilt_id, identifier)
        except RelayerUnavailable:
            return _unavailable()
        except NotFound:
            return _not_found("the requested quilt patch does not exist on Walrus (or expired)")
        return _patch_response(patch, data)

    @app.get("/v1/quilts/{quilt_id}/patches")
    def list_patches(quilt_id: str) -> Response:
        """Walrus keeps these keys snake_case (no camelCase rename), and so do we."""
        try:
            blob_id_bytes(quilt_id)
        except ValueError:
            return _invalid_id(quilt_id)
        try:
            patches = network.list_quilt_patches(quilt_id)
        except RelayerUnavailable:
            return _unavailable()
        except NotFound:
            return _not_found("the requested quilt does not exist on Walrus (or expired)")
        return JSONResponse(
            [{"identifier": p.identifier, "patch_id": p.patch_id, "tags": p.tags} for p in patches]
        )

    @app.get("/v1/blobs/by-object-id/{object_id}")
    def get_blob_by_object(object_id: str) -> Response:
        try:
            oid = normalize_address(object_id)
        except ValueError:
            return aip193(
                400, "INVALID_ARGUMENT", "INVALID_ID_FORMAT", f"invalid ID format: {object_id}"
            )
        try:
            data = network.read_by_object(oid)
        except RelayerUnavailable:
            return _unavailable()
        except NotFound:
            return _not_found("the requested blob object does not exist on Walrus (or expired)")
        return _blob_response(data, oid)

    @app.get("/v1/blobs/{blob_id}")
    def get_blob(blob_id: str) -> Response:
        try:
            blob_id_bytes(blob_id)
        except ValueError:
            return aip193(
                400, "INVALID_ARGUMENT", "INVALID_ID_FORMAT", f"invalid ID format: {blob_id}"
            )
        try:
            data = network.read_blob(blob_id)
        except RelayerUnavailable:
            return _unavailable()
        except NotFound:
            return _not_found(
                "the requested blob ID does not exist on Walrus, ensure that it was entered "
                "correctly"
            )
        return _blob_response(data, blob_id)

    # --- liveness, as on a real daemon ---------------------------------------------------

    @app.get("/status")
    def status() -> Response:
        """Walrus daemons answer ``OK`` here (``STATUS_ENDPOINT``)."""
        if network.faults.unreachable:
            return _unavailable("SERVICE_UNAVAILABLE")
        return PlainTextResponse("OK")

    @app.get("/v1/api")
    def api_docs() -> Response:
        """Real daemons serve their OpenAPI docs (Redoc) here; clients use it as a probe."""
        if network.faults.unreachable:
            return _unavailable("SERVICE_UNAVAILABLE")
        return HTMLResponse(_API_PAGE)

    # --- local-only JSON (not part of Walrus) ------------------------------------------

    @app.get("/local/v1/epoch")
    def local_epoch() -> Response:
        try:
            info = network.epoch_info()
        except ChainUnavailable:
            return _unavailable("SERVICE_UNAVAILABLE")
        return JSONResponse(
            {
                "network": NETWORK,
                "epoch": info.epoch,
                "epoch_seconds": info.duration_seconds,
                "genesis": network.genesis().isoformat(),
                "epoch_started_at": info.started_at.isoformat() if info.started_at else None,
                "storage_price_frost": network.storage_price_frost(),
                "server_address": network.server_address,
                "package_id": LOCAL_PACKAGE_ID,
            }
        )

    @app.get("/local/v1/objects/{object_id}")
    def local_object(object_id: str) -> Response:
        try:
            obj = network.get_object(object_id)
            epoch = network.current_epoch()
        except ChainUnavailable:
            return _unavailable("SERVICE_UNAVAILABLE")
        rec = network.object_record(object_id) if obj is not None else None
        if rec is None:
            return aip193(404, "NOT_FOUND", "OBJECT_NOT_FOUND", f"no such object: {object_id}")
        return JSONResponse(
            {
                "network": NETWORK,
                "blob_id": rec.blob_id,
                "blob_object_id": rec.object_id,
                "size": rec.size,
                "storage_size": rec.storage_size,
                "registered_epoch": rec.registered_epoch,
                "certified_epoch": rec.certified_epoch,
                "start_epoch": rec.start_epoch,
                "end_epoch": rec.end_epoch,
                "owner": rec.owner,
                "deletable": rec.deletable,
                "storage_id": rec.storage_id,
                "version": rec.version,
                "live": epoch < rec.end_epoch,
            }
        )

    app.include_router(make_explorer_router(lambda: network))
    return app


def serve_devnet(
    network: LocalNetwork,
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    *,
    max_body_bytes: int = 10 * 2**20,
    sock: socket.socket | None = None,
) -> None:
    """Serve the devnet until interrupted (blocking; runs uvicorn). ``sock``: a
    listening socket bound by the caller (``walkeep devnet`` binds first, so a port in
    use fails before the network is opened)."""
    app = create_devnet_app(network, max_body_bytes=max_body_bytes)
    config = uvicorn.Config(app, host=host, port=port, log_level="info")
    uvicorn.Server(config).run(sockets=[sock] if sock is not None else None)
