"""Bearer API keys → the calling account, for MCP over HTTP and the REST mirror.

Lookups hit the database (only key hashes are stored); a short-lived cache
keeps a busy agent from paying that on every call. A revoked key is refused
within ``CACHE_TTL_SECONDS``.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable

import anyio
from starlette.types import ASGIApp, Receive, Scope, Send

from walkeep.errors import Unauthorized
from walkeep.mcp.server import Caller, current_caller
from walkeep.service import accounts
from walkeep.service.runtime import Runtime

CACHE_TTL_SECONDS = 5.0
WWW_AUTHENTICATE = 'Bearer realm="walkeep", error="invalid_token"'


class KeyCache:
    def __init__(self, rt: Runtime, *, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.rt = rt
        self._monotonic = monotonic  # injectable, so tests move time instead of sleeping
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[float, Caller]] = {}

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
        principal = accounts.authenticate(self.rt.db, api_key)  # raises Unauthorized
        caller = Caller(principal.account_id, principal.default_namespace)
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
    """Pure ASGI: authenticate, bind the caller for the tools, or answer 401."""

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
        if caller is None:
            body = json.dumps(
                Unauthorized(
                    "missing or invalid API key: send Authorization: Bearer wk_live_…"
                ).body()
            ).encode()
            await send(
                {
                    "type": "http.response.start",
                    "status": 401,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"www-authenticate", WWW_AUTHENTICATE.encode()),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return
        scope.setdefault("state", {})["account_id"] = caller.account_id
        reset = current_caller.set(caller)
        try:
            await self.app(scope, receive, send)
        finally:
            current_caller.reset(reset)
