"""A fake of Stripe's Checkout Sessions API, spoken over real HTTP (notes/stripe.md §5.1).

Neither localstripe nor stripe-mock has Checkout Sessions, so this is a small
stdlib server the real ``stripe`` SDK talks to through
``StripeClient(base_addresses={"api": fake.url})``. It implements what
Walkeep relies on and what can go wrong with it:

* Bearer-key auth, form-encoded nested params (``line_items[0][price_data][unit_amount]``);
* ``Idempotency-Key``: a replay with the same path and params returns the
  stored response; a different request under the same key is a 400
  ``idempotency_error``; failed validation stores nothing;
* create / list / retrieve / expire, the $0.50 minimum, the ``expires_at``
  window (30 min – 24 h from "now", where "now" is an injectable clock so a
  test's ManualClock drives both sides);
* test-only controls (not Stripe API): ``complete(session_id, delayed=False)``,
  ``fail_async``, ``expire``; each emits events shaped like Stripe's
  (``evt_…``, ``data.object`` = a copy of the session), signed with the v1
  scheme and POSTed as exact bytes to the configured webhook URL. Events are
  kept in ``events`` so tests can re-deliver them, out of order, tampered…;
* ``outage``: ``"drop"`` (connection closed without a response → the SDK's
  ``APIConnectionError``), ``"lose_response"`` (the request is *executed*,
  then the connection drops: the crash window the idempotency key exists
  for), ``"hang"`` (no answer until the client times out), ``"500"`` or ``"429"``.

Error texts approximate Stripe's; assert on exception class, status and ``param``.
"""

from __future__ import annotations

import contextlib
import copy
import json
import re
import secrets
import string
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal

import stripe

Outage = Literal["drop", "lose_response", "hang", "500", "429"] | None

MIN_AMOUNT = 50
MIN_EXPIRY_SECONDS = 30 * 60
MAX_EXPIRY_SECONDS = 24 * 3600
_ALNUM = string.ascii_letters + string.digits
_KEY_RE = re.compile(r"[^\[\]]+")


def _rand(n: int) -> str:
    return "".join(secrets.choice(_ALNUM) for _ in range(n))


def parse_form(pairs: list[tuple[str, str]]) -> dict[str, Any]:
    """Nested params from Stripe's form encoding; all-digit-key dicts become lists."""
    root: dict[str, Any] = {}
    for key, value in pairs:
        parts = _KEY_RE.findall(key)
        if not parts:
            continue
        node = root
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return _listify(root)


def _listify(node: Any) -> Any:
    if not isinstance(node, dict):
        return node
    out = {k: _listify(v) for k, v in node.items()}
    if out and all(k.isdigit() for k in out):
        return [out[k] for k in sorted(out, key=int)]
    return out


class StripeFakeError(Exception):
    def __init__(self, status: int, type_: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.body: dict[str, Any] = {"error": {"type": type_, "message": message}}
        if param is not None:
            self.body["error"]["param"] = param


@dataclass(frozen=True)
class Delivery:
    status: int
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body.decode("utf-8"))


class FakeStripe:
    """The fake server plus its test controls. ``with FakeStripe(...) as fake:``."""

    def __init__(
        self,
        api_key: str = "sk_test_fake",
        *,
        clock: Callable[[], float] | None = None,
        webhook_url: str | None = None,
        webhook_secret: str | None = None,
    ) -> None:
        self.api_key = api_key
        self.clock: Callable[[], float] = clock or time.time
        self.webhook_url = webhook_url
        self.webhook_secret = webhook_secret
        self.outage: Outage = None
        self.sessions: dict[str, dict[str, Any]] = {}
        self.events: list[dict[str, Any]] = []
        self.deliveries: list[tuple[str, Delivery]] = []  # (event id, result)
        self.sessions_created = 0
        # (method, path, Idempotency-Key) of every API call received, outages included.
        self.requests: list[tuple[str, str, str | None]] = []
        self._order: list[str] = []
        self._idem: dict[str, tuple[str, dict[str, Any], int, dict[str, Any]]] = {}
        self._lock = threading.RLock()
        self._release = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # --- lifecycle -------------------------------------------------------------------

    def start(self) -> FakeStripe:
        handler = _make_handler(self)
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        server.daemon_threads = True
        self._server = server
        self._release.clear()
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._release.set()  # free any "hang" handlers
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = None
        self._thread = None

    def __enter__(self) -> FakeStripe:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("FakeStripe is not started")
        port = self._server.server_address[1]
        return f"http://127.0.0.1:{port}"

    def now(self) -> int:
        return int(self.clock())

    # --- API implementation ----------------------------------------------------------

    def handle(
        self, method: str, path: str, params: dict[str, Any], headers: dict[str, str]
    ) -> tuple[int, dict[str, Any], dict[str, str]]:
        auth = headers.get("authorization", "")
        if auth != f"Bearer {self.api_key}":
            return (
                401,
                {
                    "error": {
                        "type": "invalid_request_error",
                        "message": "Invalid API Key provided: "
                        + auth.removeprefix("Bearer ")[:8]
                        + "…",
                    }
                },
                {},
            )
        idem_key = headers.get("idempotency-key") if method == "POST" else None
        with self._lock:
            if idem_key is not None and idem_key in self._idem:
                stored_path, stored_params, status, body = self._idem[idem_key]
                if (stored_path, stored_params) != (f"{method} {path}", params):
                    return (
                        400,
                        {
                            "error": {
                                "type": "idempotency_error",
                                "message": "Keys for idempotent requests can only be used with "
                                "the same parameters they were first used with. Try using a key "
                                f"other than '{idem_key}' if you meant to execute a different "
                                "request.",
                            }
                        },
                        {},
                    )
                return status, copy.deepcopy(body), {"Idempotent-Replayed": "true"}
            try:
                status, body, emitted = self._route(method, path, params)
            except StripeFakeError as err:
                # Failed validation is not saved under the key (as at Stripe).
                return err.status, err.body, {}
            if idem_key is not None:
                self._idem[idem_key] = (
                    f"{method} {path}",
                    copy.deepcopy(params),
                    status,
                    copy.deepcopy(body),
                )
        for ev in emitted:
            self._auto_deliver(ev)
        return status, body, {}

    def _route(
        self, method: str, path: str, params: dict[str, Any]
    ) -> tuple[int, dict[str, Any], list[dict[str, Any]]]:
        parts = [p for p in path.split("/") if p]
        if parts[:3] == ["v1", "checkout", "sessions"]:
            rest = parts[3:]
            if method == "POST" and not rest:
                return 200, self._create(params), []
            if method == "GET" and not rest:
                return 200, self._list(params), []
            if method == "GET" and len(rest) == 1:
                return 200, copy.deepcopy(self._get(rest[0])), []
            if method == "POST" and len(rest) == 2 and rest[1] == "expire":
                ev = self._expire(rest[0])
                return 200, copy.deepcopy(self.sessions[rest[0]]), [ev]
        raise StripeFakeError(
            404, "invalid_request_error", f"Unrecognized request URL ({method}: {path})."
        )

    def _create(self, p: dict[str, Any]) -> dict[str, Any]:
        if p.get("mode") != "payment":
            raise StripeFakeError(
                400, "invalid_request_error", "Invalid mode: must be payment", "mode"
            )
        items = p.get("line_items")
        if not isinstance(items, list) or len(items) != 1:
            raise StripeFakeError(
                400,
                "invalid_request_error",
                "Exactly one line item is supported here.",
                "line_items",
            )
        item = items[0]
        pd = item.get("price_data") if isinstance(item, dict) else None
        if not isinstance(pd, dict):
            raise StripeFakeError(
                400,
                "invalid_request_error",
                "Missing required param: line_items[0][price_data].",
                "line_items[0][price_data]",
            )
        if pd.get("currency") != "usd":
            raise StripeFakeError(
                400,
                "invalid_request_error",
                "Invalid currency.",
                "line_items[0][price_data][currency]",
            )
        if not isinstance(pd.get("product_data"), dict) or not pd["product_data"].get("name"):
            raise StripeFakeError(
                400,
                "invalid_request_error",
                "Missing required param: product_data[name].",
                "line_items[0][price_data][product_data][name]",
            )
        try:
            unit = int(pd.get("unit_amount", ""))
            qty = int(item.get("quantity", "1"))
        except ValueError:
            raise StripeFakeError(
                400,
                "invalid_request_error",
                "Invalid integer.",
                "line_items[0][price_data][unit_amount]",
            ) from None
        amount = unit * qty
        if amount < MIN_AMOUNT:
            raise StripeFakeError(
                400,
                "invalid_request_error",
                "The Checkout Session's total amount due must add up to at least $0.50 usd",
                "line_items",
            )
        if not p.get("success_url"):
            raise StripeFakeError(
                400, "invalid_request_error", "Missing required param: success_url.", "success_url"
            )
        now = self.now()
        if "expires_at" in p:
            try:
                expires_at = int(p["expires_at"])
            except ValueError:
                raise StripeFakeError(
                    400, "invalid_request_error", "Invalid integer.", "expires_at"
                ) from None
            if not MIN_EXPIRY_SECONDS <= expires_at - now <= MAX_EXPIRY_SECONDS:
                raise StripeFakeError(
                    400,
                    "invalid_request_error",
                    "The `expires_at` timestamp must be between 30 minutes and 24 hours from "
                    "Checkout Session creation.",
                    "expires_at",
                )
        else:
            expires_at = now + MAX_EXPIRY_SECONDS
        sid = "cs_test_a1" + _rand(56)
        metadata = p.get("metadata") or {}
        session = {
            "id": sid,
            "object": "checkout.session",
            "mode": "payment",
            "livemode": False,
            "status": "open",
            "payment_status": "unpaid",
            "amount_subtotal": amount,
            "amount_total": amount,
            "currency": "usd",
            "client_reference_id": p.get("client_reference_id"),
            "metadata": dict(metadata) if isinstance(metadata, dict) else {},
            "created": now,
            "expires_at": expires_at,
            "success_url": p.get("success_url"),
            "cancel_url": p.get("cancel_url"),
            "payment_intent": None,
            "url": f"{self.url}/c/pay/{sid}",
        }
        self.sessions[sid] = session
        self._order.append(sid)
        self.sessions_created += 1
        return copy.deepcopy(session)

    def _list(self, p: dict[str, Any]) -> dict[str, Any]:
        try:
            limit = max(1, min(100, int(p.get("limit", "10"))))
        except ValueError:
            raise StripeFakeError(
                400, "invalid_request_error", "Invalid integer.", "limit"
            ) from None
        ids = list(reversed(self._order))
        return {
            "object": "list",
            "url": "/v1/checkout/sessions",
            "has_more": len(ids) > limit,
            "data": [copy.deepcopy(self.sessions[i]) for i in ids[:limit]],
        }

    def _get(self, sid: str) -> dict[str, Any]:
        session = self.sessions.get(sid)
        if session is None:
            raise StripeFakeError(
                404, "invalid_request_error", f"No such checkout.session: '{sid}'", "session"
            )
        return session

    def _expire(self, sid: str) -> dict[str, Any]:
        session = self._get(sid)
        if session["status"] != "open":
            raise StripeFakeError(
                400,
                "invalid_request_error",
                f'Only Checkout Sessions with a status in ["open"] can be expired. This '
                f'Checkout Session has a status of "{session["status"]}".',
            )
        session["status"] = "expired"
        session["url"] = None
        return self._event("checkout.session.expired", session)

    def _event(self, type_: str, session: dict[str, Any]) -> dict[str, Any]:
        ev = {
            "id": "evt_1" + _rand(23),
            "object": "event",
            "api_version": stripe.api_version,
            "created": self.now(),
            "livemode": False,
            "pending_webhooks": 1,
            "request": {"id": None, "idempotency_key": None},
            "type": type_,
            "data": {"object": copy.deepcopy(session)},
        }
        self.events.append(ev)
        return ev

    # --- test-only controls ------------------------------------------------------------

    def complete(
        self,
        session_id: str,
        *,
        delayed: bool = False,
        settle: bool = True,
        deliver: bool = True,
    ) -> list[dict[str, Any]]:
        """The customer pays; returns the events emitted (delivered if ``deliver``).

        ``delayed`` = a bank method: ``checkout.session.completed`` with
        ``payment_status=unpaid``, then (unless ``settle=False``, which leaves
        that for ``settle_async``) paid with ``async_payment_succeeded``.
        """
        with self._lock:
            s = self._get(session_id)
            if s["status"] != "open":
                raise ValueError(f"session {session_id} is {s['status']}, not open")
            s.update(status="complete", url=None, payment_intent="pi_" + _rand(24))
            s["payment_status"] = "unpaid" if delayed else "paid"
            evs = [self._event("checkout.session.completed", s)]
        if delayed and settle:
            evs += self.settle_async(session_id, succeeded=True, deliver=False)
        if deliver:
            for ev in evs:
                self._auto_deliver(ev)
        return evs

    def settle_async(
        self, session_id: str, *, succeeded: bool = True, deliver: bool = True
    ) -> list[dict[str, Any]]:
        """The delayed payment of a completed, unpaid session succeeds or fails."""
        with self._lock:
            s = self._get(session_id)
            if s["status"] != "complete" or s["payment_status"] != "unpaid":
                raise ValueError(f"session {session_id} has no pending delayed payment")
            if succeeded:
                s["payment_status"] = "paid"
                evs = [self._event("checkout.session.async_payment_succeeded", s)]
            else:
                evs = [self._event("checkout.session.async_payment_failed", s)]
        if deliver:
            for ev in evs:
                self._auto_deliver(ev)
        return evs

    def fail_async(self, session_id: str, *, deliver: bool = True) -> list[dict[str, Any]]:
        """A delayed payment that fails: completed (unpaid), then async_payment_failed."""
        evs = self.complete(session_id, delayed=True, settle=False, deliver=deliver)
        return evs + self.settle_async(session_id, succeeded=False, deliver=deliver)

    def make_event(self, type_: str, session_id: str) -> dict[str, Any]:
        """A new event of ``type_`` carrying the session's current state (not delivered)."""
        with self._lock:
            return self._event(type_, self._get(session_id))

    def expire(self, session_id: str, *, deliver: bool = True) -> dict[str, Any]:
        """Like ``POST /v1/checkout/sessions/{id}/expire`` (or the expiry time passing)."""
        with self._lock:
            ev = self._expire(session_id)
        if deliver:
            self._auto_deliver(ev)
        return ev

    def session(self, session_id: str) -> dict[str, Any]:
        with self._lock:
            return copy.deepcopy(self._get(session_id))

    # --- webhook delivery ------------------------------------------------------------------

    @staticmethod
    def sign(payload: bytes, secret: str, timestamp: int | None = None) -> str:
        """A ``Stripe-Signature`` header (v1 scheme) over ``payload``.

        The timestamp is wall-clock time, because the receiving SDK checks
        its age against ``time.time()``.
        """
        return stripe.WebhookSignature.generate_signature_header(
            payload.decode("utf-8"), secret, timestamp=timestamp
        )

    def signed(
        self, event: dict[str, Any], secret: str | None = None, timestamp: int | None = None
    ) -> tuple[bytes, str]:
        secret = secret or self.webhook_secret
        if not secret:
            raise ValueError("no webhook secret")
        body = json.dumps(event, indent=2).encode("utf-8")
        return body, self.sign(body, secret, timestamp)

    def deliver(
        self,
        event: dict[str, Any],
        url: str | None = None,
        secret: str | None = None,
        *,
        tamper: bool = False,
        timestamp: int | None = None,
    ) -> Delivery:
        """POST ``event`` signed with ``secret`` to ``url`` (defaults: the configured ones).

        ``tamper`` changes the body after signing (e.g. an attacker raising the amount).
        """
        body, sig = self.signed(event, secret, timestamp)
        if tamper:
            body = body.replace(b'"amount_total": ', b'"amount_total": 9', 1)
        result = self.post(url or self.webhook_url, body, sig)
        with self._lock:
            self.deliveries.append((event["id"], result))
        return result

    @staticmethod
    def post(url: str | None, body: bytes, signature: str | None) -> Delivery:
        if not url:
            raise ValueError("no webhook URL")
        headers = {
            "Content-Type": "application/json; charset=utf-8",
            "User-Agent": "Stripe/1.0 (+https://stripe.com/docs/webhooks)",
        }
        if signature is not None:
            headers["Stripe-Signature"] = signature
        req = urllib.request.Request(url, data=body, headers=headers, method="POST")
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(req, timeout=30) as resp:
                return Delivery(resp.status, resp.read())
        except urllib.error.HTTPError as err:
            return Delivery(err.code, err.read())

    def _auto_deliver(self, event: dict[str, Any]) -> None:
        if self.webhook_url and self.webhook_secret:
            self.deliver(event)


def _make_handler(fake: FakeStripe) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "FakeStripe/1.0"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _drop(self) -> None:
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(2)

        def _outage(self) -> bool:
            mode = fake.outage
            if mode is None or mode == "lose_response":
                return False
            if mode == "hang":
                fake._release.wait(timeout=30)
            if mode in ("drop", "hang"):
                self._drop()
                return True
            status = 429 if mode == "429" else 500
            kind = "rate_limit_error" if mode == "429" else "api_error"
            self._send(status, {"error": {"type": kind, "message": f"fake outage ({mode})"}}, {})
            return True

        def _send(self, status: int, body: dict[str, Any], extra: dict[str, str]) -> None:
            data = json.dumps(body).encode("utf-8")
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Request-Id", "req_" + _rand(14))
            for k, v in extra.items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        def _serve(self, method: str) -> None:
            parsed = urllib.parse.urlsplit(self.path)
            if parsed.path.startswith("/v1/"):
                with fake._lock:
                    fake.requests.append((method, parsed.path, self.headers.get("Idempotency-Key")))
            if self._outage():
                return
            if method == "GET" and parsed.path.startswith("/c/pay/"):
                page = b"<html><body>Fake Stripe checkout page</body></html>"
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(page)))
                self.end_headers()
                self.wfile.write(page)
                return
            if method == "POST":
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length).decode("utf-8")
            else:
                raw = parsed.query
            params = parse_form(urllib.parse.parse_qsl(raw, keep_blank_values=True))
            headers = {k.lower(): v for k, v in self.headers.items()}
            status, body, extra = fake.handle(method, parsed.path, params, headers)
            if fake.outage == "lose_response":
                self._drop()  # executed, but the client never hears back
                return
            self._send(status, body, extra)

        def do_GET(self) -> None:
            self._serve("GET")

        def do_POST(self) -> None:
            self._serve("POST")

        def do_DELETE(self) -> None:
            self._serve("DELETE")

    return Handler
