"""Pure-ASGI middleware around the whole web app: body caps, request ids, access log.

Why pure ASGI rather than ``@app.middleware("http")``: the body cap must act
*before* anything reads the body (FastAPI parses JSON, the webhook reads raw
bytes, the MCP SDK buffers its own copy), and it must see chunked bodies
chunk by chunk. A wrapped ``receive`` is the only place that does both.

``BodyLimit`` refuses a declared ``Content-Length`` above the route's cap at
once (nothing read), and otherwise reads the body into memory *up to the cap*
before calling the app, answering 413 the moment a streamed body crosses it.
So one request costs at most its route's cap, whatever the client sends.

Time and count are bounded too. Who is asking decides how:

- A request without a body (every GET, the health, readiness and metrics probes) is never
  held up: there is nothing to read, so it takes no slot.
- A caller whose bearer key is valid (:class:`walkeep.api.auth.KnownKeys`: every process
  keeps the set of valid keys' hashes fresh from the database, so this is a set lookup,
  not a query) never waits behind guests. Its bodies must arrive within ``read_seconds``,
  and one key may have at most ``key_bytes`` of bodies in flight (beyond that 429
  RATE_LIMITED with ``Retry-After``): 300 unfinished 2.3 MB uploads on one key took a
  server from 433 to 1,072 MB.
- Everyone else (no key, a wrong or revoked key) is a guest: at most ``slots`` of their
  bodies are read at once per size class — the tool routes' large bodies, and the small
  ones (sign-in and checkout forms, Stripe's webhook) in a pool of their own, so a flood of
  one does not block the other — within the shorter ``guest_read_seconds``. Beyond the
  slots: 503 with ``Retry-After`` without reading anything.

Connections that never finish their headers are closed by the server itself
(``walkeep.api.serve.HeaderDeadline``): ASGI middleware only sees complete headers.
"""

from __future__ import annotations

import json
import logging
import re
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import anyio
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from walkeep.logs import ACCESS_LOGGER, redact

log = logging.getLogger(ACCESS_LOGGER)

KIB = 1024
WEBHOOK_MAX_BODY = 64 * KIB  # a Stripe checkout event is a few KiB
SMALL_MAX_BODY = 64 * KIB  # forms (checkout Pay), ops routes, anything unlisted
# JSON escapes a control character as \\uXXXX: six bytes for one byte of content.
JSON_ESCAPE_FACTOR = 6
ENVELOPE_ALLOWANCE = 64 * KIB  # request_id, namespace, JSON-RPC framing


def tool_body_limit(max_memory_bytes: int, metadata_bytes: int) -> int:
    """The largest body a legal tool call can need, escaped worst case, plus framing.

    ``metadata_bytes`` is the most metadata a store may carry (keys × (key +
    value) characters, 4 UTF-8 bytes each at most); both it and the content
    may be escaped six-fold.
    """
    return JSON_ESCAPE_FACTOR * (max_memory_bytes + metadata_bytes) + ENVELOPE_ALLOWANCE


@dataclass(frozen=True, slots=True)
class BodyLimits:
    """Per path prefix; the first matching prefix wins, ``default`` otherwise."""

    rules: Sequence[tuple[str, int]]
    default: int = SMALL_MAX_BODY

    def for_path(self, path: str) -> int:
        for prefix, limit in self.rules:
            if path == prefix or path.startswith(prefix.rstrip("/") + "/"):
                return limit
        return self.default


def _envelope(code: str, message: str, data: dict[str, object]) -> bytes:
    return json.dumps({"code": code, "message": message, "data": data}).encode()


async def _send_413(send: Send, limit: int) -> None:
    body = _envelope(
        "VALIDATION_ERROR",
        f"request body too large: this endpoint accepts at most {limit} bytes",
        {"max_body_bytes": limit},
    )
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                # The rest of the body is never read: the connection cannot be reused.
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def _send_error(
    send: Send,
    status: int,
    code: str,
    message: str,
    headers: Sequence[tuple[bytes, bytes]],
    data: dict[str, object] | None = None,
) -> None:
    body = _envelope(code, message, data or {})
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


# Asked by load balancers and monitors every few seconds: never behind the guest gate.
PROBES = frozenset({"/healthz", "/readyz", "/metrics"})
KEY_BODY_BYTES = 32 * 2**20  # body bytes one key may have in flight (default)


@dataclass
class GuestPool:
    """Bodies of guests being read right now in one size class, and how many may be."""

    slots: int
    in_flight: int = field(default=0)

    def enter(self) -> bool:
        if self.in_flight >= self.slots:
            return False
        self.in_flight += 1
        return True

    def leave(self) -> None:
        self.in_flight -= 1


@dataclass
class GuestGate:
    """Who waits for a body to be read, shared by every BodyLimit of one app (the ordinary
    routes and the ``/mcp`` fast path); see the module docstring.

    ``known(scope)`` is the caller's key tag if it presents a valid key, else None. The
    event loop is single-threaded, so plain counters suffice.
    """

    slots: int
    known: Callable[[Scope], int | None] = lambda _scope: None
    key_bytes: int = KEY_BODY_BYTES
    large: GuestPool = field(init=False)
    small: GuestPool = field(init=False)
    per_key: dict[int, int] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        self.large = GuestPool(self.slots)
        self.small = GuestPool(self.slots)

    def pool(self, limit: int) -> GuestPool:
        """Small bodies (forms, webhooks) and large ones (tool calls) wait apart."""
        return self.small if limit <= SMALL_MAX_BODY else self.large

    def hold(self, key: int, size: int) -> bool:
        """Count ``size`` body bytes for ``key``; False if that would pass its cap (a key
        with nothing in flight may always send one body, whatever its size)."""
        held = self.per_key.get(key, 0)
        if held and held + size > self.key_bytes:
            return False
        self.per_key[key] = held + size
        return True

    def release(self, key: int, size: int) -> None:
        left = self.per_key.get(key, 0) - size
        if left > 0:
            self.per_key[key] = left
        else:
            self.per_key.pop(key, None)


def _framing(scope: Scope) -> tuple[int | None, bool]:
    """The declared Content-Length (None if absent or unreadable) and whether the body is
    sent in chunks (Transfer-Encoding). With neither, HTTP/1.1 has no request body."""
    declared: int | None = None
    chunked = False
    for name, value in scope.get("headers") or ():
        if name == b"content-length":
            try:
                declared = int(value)
            except ValueError:
                declared = None
        elif name == b"transfer-encoding":
            chunked = True
    return declared, chunked


class BodyLimit:
    """Cap every request body before anything reads it (413 with the error envelope),
    in size, in time (408) and in number: guests' bodies in slots (503), each key's in
    bytes (429); see the module docstring."""

    def __init__(
        self,
        app: ASGIApp,
        limits: BodyLimits,
        *,
        read_seconds: float = 30.0,
        guest_read_seconds: float | None = None,
        guests: GuestGate | None = None,
    ) -> None:
        self.app = app
        self.limits = limits
        self.read_seconds = read_seconds
        self.guest_read_seconds = guest_read_seconds or read_seconds
        self.guests = guests

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        limit = self.limits.for_path(path)
        declared, chunked = _framing(scope)
        if declared is not None and declared > limit:
            await _send_413(send, limit)
            return
        gate = self.guests
        if gate is None or path in PROBES or (not chunked and not declared):
            # Nothing to wait for (or a probe): no slot, and never behind a flood.
            seconds = self.read_seconds if gate is None else self.guest_read_seconds
            await self._read_then_call(scope, receive, send, limit, seconds)
            return
        key = gate.known(scope)
        if key is not None:
            size = declared if declared is not None else limit
            if not gate.hold(key, size):
                await _send_error(
                    send,
                    429,
                    "RATE_LIMITED",
                    f"this API key already has {gate.per_key.get(key, 0)} bytes of request "
                    "bodies in flight; wait for them to finish, then retry",
                    [(b"retry-after", b"1")],
                    {"retry_after_seconds": 1, "max_bytes_in_flight": gate.key_bytes},
                )
                return
            try:
                await self._read_then_call(scope, receive, send, limit, self.read_seconds)
            finally:
                gate.release(key, size)
            return
        pool = gate.pool(limit)
        if not pool.enter():
            await _send_error(
                send,
                503,
                "SERVICE_UNAVAILABLE",
                "too many requests without a valid API key are in progress; retry shortly",
                [(b"retry-after", b"1")],
            )
            return
        try:
            body = await self._read(receive, send, limit, self.guest_read_seconds)
        finally:
            pool.leave()
        if body is not None:
            await self._call(scope, receive, send, body)

    async def _read_then_call(
        self, scope: Scope, receive: Receive, send: Send, limit: int, seconds: float
    ) -> None:
        body = await self._read(receive, send, limit, seconds)
        if body is not None:
            await self._call(scope, receive, send, body)

    async def _read(self, receive: Receive, send: Send, limit: int, seconds: float) -> bytes | None:
        """The whole body, or None when it was answered here (413, 408) or the client left."""
        chunks: list[bytes] = []
        size = 0
        with anyio.move_on_after(seconds) as deadline:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return None  # the client left before sending its body: nothing to answer
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > limit:
                    chunks.clear()
                    await _send_413(send, limit)
                    return None
                if chunk:
                    chunks.append(chunk)
                if not message.get("more_body", False):
                    break
        if deadline.cancelled_caught:
            chunks.clear()
            await _send_error(
                send,
                408,
                "VALIDATION_ERROR",
                f"the request body did not arrive within {seconds:g} s",
                [],
            )
            return None
        body = b"".join(chunks)
        chunks.clear()
        return body

    async def _call(self, scope: Scope, receive: Receive, send: Send, body: bytes) -> None:
        replayed = False

        async def replay() -> Message:
            nonlocal replayed, body
            if not replayed:
                replayed = True
                out: Message = {"type": "http.request", "body": body, "more_body": False}
                body = b""
                return out
            return await receive()  # after the body: only http.disconnect comes

        await self.app(scope, replay, send)


_REQUEST_ID_OK = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")


class RequestLog:
    """One access-log line per request, tied together by ``X-Request-Id``.

    A well-formed incoming ``X-Request-Id`` (≤128 of ``[A-Za-z0-9._:-]``) is
    kept so a caller can correlate its own logs; anything else gets a fresh
    id. The id is echoed on the response and stored in ``scope["state"]``.
    The line never carries headers, bodies or query strings (keys, content), and its
    path is redacted (:func:`walkeep.logs.redact`).
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        incoming = ""
        for name, value in scope.get("headers") or ():
            if name == b"x-request-id":
                incoming = value.decode("latin-1")
                break
        request_id = incoming if _REQUEST_ID_OK.match(incoming) else secrets.token_hex(12)
        scope.setdefault("state", {})["request_id"] = request_id
        started = time.perf_counter()
        status = 0
        sent = 0

        async def send_wrapper(message: Message) -> None:
            nonlocal status, sent
            if message["type"] == "http.response.start":
                status = int(message["status"])
                headers = [
                    (k, v) for k, v in message.get("headers", []) if k.lower() != b"x-request-id"
                ]
                headers.append((b"x-request-id", request_id.encode()))
                message = {**message, "headers": headers}
            elif message["type"] == "http.response.body":
                sent += len(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        except BaseException:
            status = status or 500  # the server-error handler outside us answers it
            raise
        finally:
            state = scope.get("state") or {}
            # Paths carry capabilities (/console/link/<one-time token>, checkout ids):
            # the record itself holds the redacted form, whatever handler reads it.
            path = redact(scope.get("path", ""))
            # Probes (load balancers poll these every few seconds) are logged only at
            # debug level, so they never drown the requests people read logs for.
            probe = path in PROBES and (status or 500) < 400
            log.log(
                logging.DEBUG if probe else logging.INFO,
                "%s %s %s",
                scope.get("method", ""),
                path,
                status or "-",
                extra={
                    "request_id": request_id,
                    "method": scope.get("method", ""),
                    "path": path,
                    "status": status or None,
                    "duration_ms": round((time.perf_counter() - started) * 1000, 1),
                    "response_bytes": sent,
                    "account_id": state.get("account_id"),
                    "client": (scope.get("client") or ("", 0))[0],
                },
            )


# Headers every HTML page gets unless it set its own: no framing (clickjacking of the
# checkout's Pay button, the console's forms), no MIME sniffing, and no caching — pages
# carry one-time tokens (checkout pay tokens, console CSRF tokens, sign-in links).
PAGE_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"x-frame-options", b"DENY"),
    (b"content-security-policy", b"frame-ancestors 'none'"),
    (b"x-content-type-options", b"nosniff"),
    (b"cache-control", b"no-store"),
    (b"referrer-policy", b"no-referrer"),
)


class PageHeaders:
    """Pure ASGI: add :data:`PAGE_HEADERS` to every ``text/html`` response.

    One place for every page (checkout, ``/topup/done``, the local explorer, ``/docs``,
    the console) instead of a header list per router that a new page can forget.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_wrapper(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                names = {k.lower() for k, _ in headers}
                content_type = next((v for k, v in headers if k.lower() == b"content-type"), b"")
                if content_type.startswith(b"text/html"):
                    headers += [(k, v) for k, v in PAGE_HEADERS if k not in names]
                    message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_wrapper)


# A JSON \\uD800-\\uDFFF escape: the only way a lone surrogate reaches us in UTF-8 JSON.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def _lone_surrogate_field(value: object, path: str = "") -> str | None:
    """The first field (top-level argument name) whose keys or text hold a lone surrogate."""
    if isinstance(value, str):
        return path if any(0xD800 <= ord(c) <= 0xDFFF for c in value) else None
    if isinstance(value, dict):
        for k, v in value.items():
            here = path or str(k)
            if _lone_surrogate_field(str(k), here) or _lone_surrogate_field(v, here):
                return here
    if isinstance(value, list):
        for v in value:
            found = _lone_surrogate_field(v, path)
            if found:
                return found
    return None


class SurrogateGuard:
    """Pure ASGI, in front of the MCP app: a lone surrogate is VALIDATION_ERROR, as on REST.

    UTF-8 cannot carry an unpaired surrogate, but a JSON ``\\uD800`` escape can; the MCP
    SDK's parser refuses it with a bare JSON-RPC parse error, so an agent got -32700
    where REST answers VALIDATION_ERROR naming the field. Python's own parser accepts such
    escapes, so the request is read here only when the raw body has a surrogate escape
    at all (paired ones, emoji, pass through untouched), and a ``tools/call`` is answered
    with the same ``isError`` tool result the tools give.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        while True:  # BodyLimit has buffered the body: this is one message
            message = await receive()
            if message["type"] != "http.request":
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        reply = _surrogate_reply(body) if _SURROGATE_ESCAPE.search(body) else None
        if reply is not None:
            status, payload = reply
            data = json.dumps(payload).encode()
            await send(
                {
                    "type": "http.response.start",
                    "status": status,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(data)).encode()),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": data})
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


def _surrogate_reply(body: bytes) -> tuple[int, dict[str, object]] | None:
    from walkeep.errors import ValidationError, jsonrpc_body
    from walkeep.mcp.envelope import error_result

    try:
        request = json.loads(body)
    except ValueError:
        return None  # not JSON at all: the SDK answers that itself
    if not isinstance(request, dict):
        return None
    params = request.get("params")
    arguments = params.get("arguments") if isinstance(params, dict) else None
    field = _lone_surrogate_field(arguments if isinstance(arguments, dict) else params)
    if field is None:
        return None
    # The same words and data as walkeep.ids.check_text gives REST and the tools.
    err = ValidationError(
        f"{field} must not contain an unpaired surrogate (U+D800–U+DFFF)",
        {"field": field, "reason": "unstorable_character"},
    )
    if request.get("method") == "tools/call":
        result = error_result(err).model_dump(mode="json", by_alias=True, exclude_none=True)
        return 200, {"jsonrpc": "2.0", "id": request.get("id"), "result": result}
    return 400, jsonrpc_body(err, request.get("id"))
