"""Bearer API keys → the calling account, for MCP over HTTP and the REST mirror.

Lookups hit the database (only key hashes are stored); a short-lived cache
keeps a busy agent from paying that on every call. A revoked key is refused
within ``CACHE_TTL_SECONDS``. Before any of that, the guest gate asks whether a request
presents a valid key at all (:class:`KnownKeys`, a set kept fresh from the database).

Discovery: MCP hosts that meet a 401 look for OAuth 2.0 protected-resource metadata
(RFC 9728). We serve it at ``/.well-known/oauth-protected-resource[/mcp]`` and point
``WWW-Authenticate`` at it, so a host learns that this resource takes a bearer header.
It names no authorization server (the field is optional in RFC 9728): keys are issued
by the operator, not by an OAuth flow, and the 401's message says how to get one.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable

import anyio
from mcp.server.auth.handlers.metadata import ProtectedResourceMetadataHandler
from mcp.server.auth.routes import build_resource_metadata_url, cors_middleware
from mcp.shared.auth import ProtectedResourceMetadata
from pydantic import AnyHttpUrl
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from walkeep.db import Database
from walkeep.errors import (
    Internal,
    ServiceUnavailable,
    Unauthorized,
    WalkeepError,
    jsonrpc_body,
)
from walkeep.mcp.server import Caller, current_caller
from walkeep.service import digests
from walkeep.service.operators import accounts
from walkeep.service.runtime import Runtime

log = logging.getLogger(__name__)

CACHE_TTL_SECONDS = 5.0
KEY_SHAPE = "wk_live_ followed by 43 characters"
GET_A_KEY = (
    "`walkeep serve` prints one on first run (also saved in ~/.walkeep/credentials.json); "
    "`walkeep key create --account NAME` makes another"
)


class ApiKeyResourceMetadata(ProtectedResourceMetadata):
    """The SDK's RFC 9728 model, minus its required authorization server.

    RFC 9728 §2 makes ``authorization_servers`` optional; the SDK requires one because
    it assumes OAuth. Naming none tells a host not to start an OAuth flow here.
    """

    authorization_servers: list[AnyHttpUrl] | None = None  # type: ignore[assignment]


def _resource(public_url: str, path: str = "") -> AnyHttpUrl:
    return AnyHttpUrl(public_url.rstrip("/") + path)


def resource_metadata_url(public_url: str, path: str = "/mcp") -> str:
    """Where the metadata for ``public_url + path`` lives (RFC 9728 §3.1)."""
    if not path:
        return public_url.rstrip("/") + "/.well-known/oauth-protected-resource"
    return str(build_resource_metadata_url(_resource(public_url, path)))


def protected_resource_routes(public_url: str) -> list[Route]:
    """The metadata for the whole service (REST under /v1) and the path-suffixed /mcp one."""
    routes = []
    for path in ("", "/mcp"):
        metadata = ApiKeyResourceMetadata(
            resource=_resource(public_url, path),
            bearer_methods_supported=["header"],
            resource_name="Walkeep",
            resource_documentation=_resource(public_url, "/docs"),
        )
        handler = ProtectedResourceMetadataHandler(metadata)
        well_known = "/.well-known/oauth-protected-resource" + path
        routes.append(
            Route(
                well_known,
                endpoint=cors_middleware(handler.handle, ["GET", "OPTIONS"]),
                methods=["GET", "OPTIONS"],
            )
        )
    return routes


def challenge(public_url: str, *, token_sent: bool, path: str = "/mcp") -> str:
    """``WWW-Authenticate`` for a 401 (RFC 6750 §3; RFC 9728 §5.1 ``resource_metadata``).

    No ``error`` when no credentials came (RFC 6750 §3.1); ``invalid_token`` otherwise.
    """
    parts = ['Bearer realm="walkeep"']
    if token_sent:
        parts.append('error="invalid_token"')
    parts.append(f'resource_metadata="{resource_metadata_url(public_url, path)}"')
    return ", ".join(parts)


def unauthorized(public_url: str, *, token_sent: bool, path: str = "/mcp") -> Unauthorized:
    """A 401 an agent's host can act on, in words its human understands."""
    what = "this API key was not accepted (unknown or revoked)" if token_sent else "no API key"
    return Unauthorized(
        f"{what}. Walkeep needs an API key ({KEY_SHAPE}) in the header "
        f"`Authorization: Bearer wk_live_…`. Ask the operator of this Walkeep for one: {GET_A_KEY}.",
        {
            "header": "Authorization: Bearer wk_live_…",
            "key_format": KEY_SHAPE,
            "get_a_key": GET_A_KEY,
            "resource_metadata": resource_metadata_url(public_url, path),
        },
    )


KNOWN_KEYS_REFRESH_SECONDS = 5.0


def key_tag(api_key: str) -> int:
    """The first 64 bits of the key's SHA-256 (:func:`walkeep.ids.api_key_hash`)."""
    return int.from_bytes(hashlib.sha256(api_key.encode()).digest()[:8], "big")


class KnownKeys:
    """Whether a request presents a valid key, answered on the event loop without a query.

    The guest gate (walkeep.api.middleware) asks this for every request with a body, so it
    must be cheap, must hold for as long as a key is valid (a key "known" for 5 s after
    each lookup put agents holding keys behind a flood of anonymous uploads), and must
    be right in every web process. So each process keeps the 64-bit tags of every valid
    key, loaded from the database and reloaded whenever :func:`accounts.key_state_mark`
    moves (asked every ``refresh_seconds`` by a thread of its own): a key created or
    revoked by the CLI or another process counts within seconds. A key this process has
    just authenticated counts at once; one it has just refused stops counting at once.

    A tag is a filter, not a credential: a stranger's guess matching some valid key's 64
    bits (about N·2⁻⁶⁴ per guess) only gets its body read outside the guest slots, under
    the same per-key cap as that key's own; authentication still checks the whole key.
    """

    def __init__(self, db: Database, *, refresh_seconds: float = KNOWN_KEYS_REFRESH_SECONDS):
        self.db = db
        self.refresh_seconds = refresh_seconds
        self._tags: frozenset[int] = frozenset()
        self._learned: set[int] = set()
        self._refused: set[int] = set()
        self._mark: tuple[object, ...] | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def tag_of(self, scope: Scope) -> int | None:
        """The tag of the request's bearer key if it is valid, else None."""
        for name, value in scope.get("headers") or ():
            if name == b"authorization":
                token = bearer_token(value.decode("latin-1"))
                if token is None:
                    return None
                tag = key_tag(token)
                known = tag in self._tags or tag in self._learned
                return tag if known and tag not in self._refused else None
        return None

    def learn(self, api_key: str) -> None:
        """``api_key`` was just accepted by the database."""
        tag = key_tag(api_key)
        with self._lock:
            self._learned.add(tag)
            self._refused.discard(tag)

    def forget(self, api_key: str) -> None:
        """``api_key`` was just refused (revoked, its account disabled)."""
        tag = key_tag(api_key)
        with self._lock:
            self._learned.discard(tag)
            if tag in self._tags:
                self._refused.add(tag)

    def refresh(self) -> bool:
        """Reload the valid keys if anything changed since the last load; True if it did."""
        mark = accounts.key_state_mark(self.db)
        if mark == self._mark:
            return False
        tags = frozenset(int(h[:16], 16) for h in accounts.valid_key_hashes(self.db))
        with self._lock:
            self._tags = tags
            self._learned.clear()
            self._refused.clear()
            self._mark = mark
        return True

    def _refresh_logged(self) -> None:
        try:
            self.refresh()
        except Exception as exc:  # the database is down: keep what we had, say so
            log.warning("valid API keys not reloaded: %s", type(exc).__name__)

    def start(self) -> None:
        """Load now, then keep fresh in the background until :meth:`stop`."""
        self._refresh_logged()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="walkeep-known-keys", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.refresh_seconds):
            self._refresh_logged()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None


class KeyCache:
    def __init__(
        self,
        rt: Runtime,
        *,
        monotonic: Callable[[], float] = time.monotonic,
        known: KnownKeys | None = None,
    ) -> None:
        self.rt = rt
        self._monotonic = monotonic  # injectable, so tests move time instead of sleeping
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[float, Caller]] = {}
        self.known = known

    def cached(self, api_key: str) -> Caller | None:
        """A fresh cache hit, cheap enough to check on the event loop."""
        digest = hashlib.sha256(api_key.encode()).hexdigest()
        with self._lock:
            hit = self._cache.get(digest)
        return hit[1] if hit and hit[0] > self._monotonic() else None

    def resolve(self, api_key: str) -> Caller:
        hit = self.cached(api_key)
        if hit is not None:
            return hit
        digest = hashlib.sha256(api_key.encode()).hexdigest()
        now = self._monotonic()
        try:
            principal = accounts.authenticate(self.rt.db, api_key, digests.master_key(self.rt))
        except Unauthorized:
            if self.known is not None:
                self.known.forget(api_key)
            raise
        if self.known is not None:
            self.known.learn(api_key)
        caller = Caller(
            principal.account_id,
            principal.default_namespace,
            principal.default_namespace if principal.only_namespace else None,
        )
        with self._lock:
            if len(self._cache) > 10_000:
                self._cache.clear()
            self._cache[digest] = (now + CACHE_TTL_SECONDS, caller)
        return caller


def bearer_token(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


class BearerAccountMiddleware:
    """Pure ASGI: authenticate, bind the caller for the tools, or answer the failure.

    Failures here happen before the MCP app sees the request, so they are answered as
    JSON-RPC errors (what MCP clients read) carrying the typed envelope: 401 with
    ``WWW-Authenticate`` for a missing or refused key, 503 with ``Retry-After`` when the
    key cannot be looked up because the database is down (not a bare 500), 500 for
    anything else (logged, never described).
    """

    def __init__(self, app: ASGIApp, keys: KeyCache) -> None:
        self.app = app
        self.keys = keys

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        token = bearer_token(headers.get(b"authorization", b"").decode("latin-1"))
        caller: Caller | None = None
        if token:
            caller = self.keys.cached(token)  # no thread hop on the hot path
            if caller is None:
                try:
                    caller = await anyio.to_thread.run_sync(self.keys.resolve, token)
                except Unauthorized:
                    caller = None
                except Exception as exc:  # the key could not be looked up at all
                    await _lookup_failed(send, exc)
                    return
        if caller is None:
            public_url = self.keys.rt.settings.public_url
            sent = token is not None
            await send_jsonrpc_error(
                send,
                unauthorized(public_url, token_sent=sent),
                [(b"www-authenticate", challenge(public_url, token_sent=sent).encode())],
            )
            return
        scope.setdefault("state", {})["account_id"] = caller.account_id
        reset = current_caller.set(caller)
        try:
            await self.app(scope, receive, send)
        finally:
            current_caller.reset(reset)


async def _lookup_failed(send: Send, exc: Exception) -> None:
    from walkeep.db import is_outage

    if is_outage(exc):
        log.warning("API key lookup: database unavailable: %s", type(exc).__name__)
        await send_jsonrpc_error(
            send,
            ServiceUnavailable("Walkeep's database is unreachable; retry shortly"),
            [(b"retry-after", b"5")],
        )
        return
    log.error("API key lookup failed", exc_info=exc)
    await send_jsonrpc_error(send, Internal("internal error; it was logged"))


async def send_jsonrpc_error(
    send: Send, err: WalkeepError, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    """Answer ``err`` with its HTTP status and a JSON-RPC error body (id null: the
    request was refused before its body was read)."""
    body = json.dumps(jsonrpc_body(err)).encode()
    await send(
        {
            "type": "http.response.start",
            "status": err.http_status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *(headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
