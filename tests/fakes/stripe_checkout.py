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

Saved cards and off-session charges (automatic top-up; notes/stripe.md "Saved cards"):

* Customers (create, retrieve with ``expand[]=invoice_settings.default_payment_method``);
  Checkout in setup mode and in payment mode with ``customer`` and
  ``payment_intent_data[setup_future_usage]=off_session``; ``complete(…, card=NUMBER)``
  attaches a PaymentMethod of that test card to the customer (via the session's
  PaymentIntent or SetupIntent, retrievable expanded);
* ``POST /v1/payment_intents`` with ``off_session=true&confirm=true``: the test card's
  behaviour decides — success (``payment_intent.succeeded``, ``charge.succeeded``), or a
  402 ``card_error`` body as Stripe sends it (``code``, ``decline_code``,
  ``advice_code``, the ``payment_intent`` with ``last_payment_error``, ``charge``) and
  ``payment_intent.payment_failed``. The 402 is stored under the ``Idempotency-Key`` and
  replayed like any answer (Stripe saves every executed result, errors included). A
  detached or unknown card is a 400 ``resource_missing`` on ``payment_method``;
* ``GET /v1/payment_intents/{id}`` (``expand[]=latest_charge``),
  ``GET /v1/payment_intents/search?query=metadata['k']:'v'``, ``GET /v1/disputes``,
  ``POST /v1/billing_portal/sessions``, ``POST /v1/payment_methods/{id}/detach``;
* test controls ``refund``, ``dispute``, ``detach``, ``set_default_card`` emitting
  ``charge.refunded``, ``charge.dispute.created``, ``payment_method.detached`` and
  ``customer.updated``; ``card_behaviour`` overrides what a saved card does next.

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

# Stripe's test cards: number → (brand, last4, behaviour off-session). A behaviour is
# None (succeeds), "authentication_required", or (code, decline_code, advice_code).
Behaviour = str | tuple[str, str, str | None] | None
TEST_CARDS: dict[str, tuple[str, str, Behaviour]] = {
    "4242424242424242": ("visa", "4242", None),
    "4000002500003155": ("visa", "3155", None),  # authenticates at setup, then succeeds
    "4000002760003184": ("visa", "3184", "authentication_required"),
    "4000000000000002": ("visa", "0002", ("card_declined", "generic_decline", None)),
    "4000000000009995": (
        "visa",
        "9995",
        ("card_declined", "insufficient_funds", "try_again_later"),
    ),
    "4000000000009987": ("visa", "9987", ("card_declined", "lost_card", "do_not_try_again")),
    "4000000000009979": ("visa", "9979", ("card_declined", "stolen_card", "do_not_try_again")),
    "4000000000000069": ("visa", "0069", ("expired_card", "expired_card", None)),
}
DECLINE_MESSAGES = {
    "generic_decline": "Your card was declined.",
    "insufficient_funds": "Your card has insufficient funds.",
    "lost_card": "Your card was declined.",
    "stolen_card": "Your card was declined.",
    "expired_card": "Your card has expired.",
}
_SEARCH_RE = re.compile(r"^metadata\['([^']+)'\]:'([^']*)'$")
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
    def __init__(
        self,
        status: int,
        type_: str,
        message: str,
        param: str | None = None,
        *,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.body: dict[str, Any] = {"error": {"type": type_, "message": message}}
        if param is not None:
            self.body["error"]["param"] = param
        if code is not None:
            self.body["error"]["code"] = code


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
        self.customers: dict[str, dict[str, Any]] = {}
        self.payment_methods: dict[str, dict[str, Any]] = {}
        self.payment_intents: dict[str, dict[str, Any]] = {}
        self.setup_intents: dict[str, dict[str, Any]] = {}
        self.charges: dict[str, dict[str, Any]] = {}
        self.disputes: dict[str, dict[str, Any]] = {}
        self.portal_sessions: list[dict[str, Any]] = []
        # payment method id → behaviour override (what the card does from now on)
        self.card_behaviour: dict[str, Behaviour] = {}
        # What a PaymentIntent shows after an off-session authentication_required decline
        # (notes/stripe.md: requires_payment_method; some integrations see requires_action).
        self.sca_intent_status = "requires_payment_method"
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
                return 200, self._expand(self._public_session(self._get(rest[0])), params), []
            if method == "POST" and len(rest) == 2 and rest[1] == "expire":
                ev = self._expire(rest[0])
                return 200, self._public_session(self.sessions[rest[0]]), [ev]
        if parts[:2] == ["v1", "customers"]:
            if method == "POST" and len(parts) == 2:
                return 200, self._create_customer(params), []
            if method == "GET" and len(parts) == 3:
                return 200, self._expand(self._customer(parts[2]), params), []
        if parts[:2] == ["v1", "payment_intents"]:
            if method == "POST" and len(parts) == 2:
                return self._create_payment_intent(params)
            if method == "GET" and parts[2:] == ["search"]:
                return 200, self._search_payment_intents(params), []
            if method == "GET" and len(parts) == 3:
                return 200, self._expand(self._payment_intent(parts[2]), params), []
        if parts[:2] == ["v1", "disputes"] and method == "GET" and len(parts) == 2:
            found = [
                copy.deepcopy(d)
                for d in self.disputes.values()
                if d["payment_intent"] == params.get("payment_intent")
            ]
            return (
                200,
                {"object": "list", "url": "/v1/disputes", "has_more": False, "data": found},
                [],
            )
        if parts[:3] == ["v1", "billing_portal", "sessions"] and method == "POST":
            return 200, self._create_portal_session(params), []
        if parts[:2] == ["v1", "payment_methods"] and method == "POST" and parts[3:] == ["detach"]:
            ev = self._detach(parts[2])
            return 200, copy.deepcopy(self.payment_methods[parts[2]]), [ev]
        raise StripeFakeError(
            404, "invalid_request_error", f"Unrecognized request URL ({method}: {path})."
        )

    # --- expansion (``expand[]=a.b``): ids replaced by the objects they name ------------

    def _lookup(self, value: Any) -> Any:
        if not isinstance(value, str):
            return value
        for prefix, table in (
            ("pi_", self.payment_intents),
            ("seti_", self.setup_intents),
            ("pm_", self.payment_methods),
            ("ch_", self.charges),
            ("cus_", self.customers),
        ):
            if value.startswith(prefix) and value in table:
                return copy.deepcopy(table[value])
        return value

    def _expand(self, obj: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
        out = copy.deepcopy(obj)
        expand = params.get("expand") or []
        for path in expand if isinstance(expand, list) else [expand]:
            node: Any = out
            keys = str(path).split(".")
            for i, key in enumerate(keys):
                if not isinstance(node, dict) or key not in node:
                    break
                node[key] = self._lookup(node[key])
                if i < len(keys) - 1:
                    node = node[key]
        return out

    def _create(self, p: dict[str, Any]) -> dict[str, Any]:
        customer = p.get("customer")
        if customer is not None and customer not in self.customers:
            raise StripeFakeError(
                400, "invalid_request_error", f"No such customer: '{customer}'", "customer"
            )
        if p.get("mode") == "setup":
            return self._create_setup_session(p)
        if p.get("mode") != "payment":
            raise StripeFakeError(
                400, "invalid_request_error", "Invalid mode: must be payment or setup", "mode"
            )
        pid = p.get("payment_intent_data") or {}
        if pid.get("setup_future_usage") not in (None, "off_session", "on_session"):
            raise StripeFakeError(
                400,
                "invalid_request_error",
                "Invalid setup_future_usage",
                "payment_intent_data[setup_future_usage]",
            )
        if pid.get("setup_future_usage") and customer is None:
            raise StripeFakeError(
                400,
                "invalid_request_error",
                "A customer is required to save a payment method for future use.",
                "customer",
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
            "setup_intent": None,
            "customer": customer,
            "payment_intent_data": copy.deepcopy(pid),
            "custom_text": copy.deepcopy(p.get("custom_text")),
            "url": f"{self.url}/c/pay/{sid}",
        }
        self.sessions[sid] = session
        self._order.append(sid)
        self.sessions_created += 1
        return self._public_session(session)

    @staticmethod
    def _public_session(session: dict[str, Any]) -> dict[str, Any]:
        """The session as the API returns it (payment_intent_data is a request param)."""
        out = copy.deepcopy(session)
        out.pop("payment_intent_data", None)
        return out

    def _create_setup_session(self, p: dict[str, Any]) -> dict[str, Any]:
        if p.get("line_items"):
            raise StripeFakeError(
                400,
                "invalid_request_error",
                "line_items is not allowed in setup mode.",
                "line_items",
            )
        if p.get("currency") != "usd":
            raise StripeFakeError(
                400, "invalid_request_error", "currency is required in setup mode.", "currency"
            )
        if not p.get("success_url"):
            raise StripeFakeError(
                400, "invalid_request_error", "Missing required param: success_url.", "success_url"
            )
        now = self.now()
        expires_at = int(p.get("expires_at") or now + MAX_EXPIRY_SECONDS)
        if not MIN_EXPIRY_SECONDS <= expires_at - now <= MAX_EXPIRY_SECONDS:
            raise StripeFakeError(
                400,
                "invalid_request_error",
                "The `expires_at` timestamp is out of range.",
                "expires_at",
            )
        sid = "cs_test_c1" + _rand(56)
        metadata = p.get("metadata") or {}
        session = {
            "id": sid,
            "object": "checkout.session",
            "mode": "setup",
            "livemode": False,
            "status": "open",
            "payment_status": "no_payment_required",
            "amount_subtotal": None,
            "amount_total": None,
            "currency": "usd",
            "client_reference_id": p.get("client_reference_id"),
            "metadata": dict(metadata) if isinstance(metadata, dict) else {},
            "created": now,
            "expires_at": expires_at,
            "success_url": p.get("success_url"),
            "cancel_url": p.get("cancel_url"),
            "payment_intent": None,
            "setup_intent": None,
            "customer": p.get("customer"),
            "custom_text": copy.deepcopy(p.get("custom_text")),
            "url": f"{self.url}/c/pay/{sid}",
        }
        self.sessions[sid] = session
        self._order.append(sid)
        self.sessions_created += 1
        return copy.deepcopy(session)

    # --- customers, payment methods, payment intents ---------------------------------------

    def _create_customer(self, p: dict[str, Any]) -> dict[str, Any]:
        cid = "cus_" + _rand(14)
        self.customers[cid] = {
            "id": cid,
            "object": "customer",
            "created": self.now(),
            "description": p.get("description"),
            "metadata": dict(p.get("metadata") or {}),
            "invoice_settings": {"default_payment_method": None},
            "livemode": False,
        }
        return copy.deepcopy(self.customers[cid])

    def _customer(self, cid: str) -> dict[str, Any]:
        if cid not in self.customers:
            raise StripeFakeError(
                404, "invalid_request_error", f"No such customer: '{cid}'", "customer"
            )
        return self.customers[cid]

    def _payment_intent(self, pid: str) -> dict[str, Any]:
        if pid not in self.payment_intents:
            raise StripeFakeError(
                404, "invalid_request_error", f"No such payment_intent: '{pid}'", "intent"
            )
        return self.payment_intents[pid]

    def _new_payment_method(self, number: str, customer: str | None) -> dict[str, Any]:
        if number not in TEST_CARDS:
            raise ValueError(f"not a test card this fake knows: {number}")
        brand, last4, _ = TEST_CARDS[number]
        pm = {
            "id": "pm_" + _rand(24),
            "object": "payment_method",
            "type": "card",
            "card": {"brand": brand, "last4": last4, "exp_month": 12, "exp_year": 2034},
            "customer": customer,
            "created": self.now(),
            "livemode": False,
            "_number": number,
        }
        self.payment_methods[pm["id"]] = pm
        return pm

    def _behaviour(self, pm_id: str) -> Behaviour:
        if pm_id in self.card_behaviour:
            return self.card_behaviour[pm_id]
        return TEST_CARDS[self.payment_methods[pm_id]["_number"]][2]

    def _new_charge(self, pi: dict[str, Any], *, paid: bool) -> dict[str, Any]:
        ch = {
            "id": "ch_" + _rand(24),
            "object": "charge",
            "amount": pi["amount"],
            "amount_refunded": 0,
            "currency": pi["currency"],
            "payment_intent": pi["id"],
            "payment_method": pi["payment_method"],
            "customer": pi["customer"],
            "paid": paid,
            "status": "succeeded" if paid else "failed",
            "refunded": False,
            "disputed": False,
            "created": self.now(),
            "livemode": False,
        }
        self.charges[ch["id"]] = ch
        pi["latest_charge"] = ch["id"]
        return ch

    def _create_payment_intent(
        self, p: dict[str, Any]
    ) -> tuple[int, dict[str, Any], list[dict[str, Any]]]:
        try:
            amount = int(p.get("amount", ""))
        except ValueError:
            raise StripeFakeError(
                400, "invalid_request_error", "Invalid integer.", "amount"
            ) from None
        if amount < MIN_AMOUNT:
            raise StripeFakeError(
                400,
                "invalid_request_error",
                "Amount must be at least $0.50 usd",
                "amount",
            )
        if p.get("currency") != "usd":
            raise StripeFakeError(400, "invalid_request_error", "Invalid currency.", "currency")
        if p.get("confirm") != "true" or p.get("off_session") != "true":
            raise StripeFakeError(
                400,
                "invalid_request_error",
                "This fake only creates confirmed off-session PaymentIntents.",
                "confirm",
            )
        customer = p.get("customer")
        self._customer(str(customer))
        pm_id = str(p.get("payment_method"))
        pm = self.payment_methods.get(pm_id)
        if pm is None or pm["customer"] != customer:
            raise StripeFakeError(
                400,
                "invalid_request_error",
                f"No such PaymentMethod: '{pm_id}'",
                "payment_method",
                code="resource_missing",
            )
        pi: dict[str, Any] = {
            "id": "pi_" + _rand(24),
            "object": "payment_intent",
            "amount": amount,
            "amount_received": 0,
            "currency": "usd",
            "customer": customer,
            "payment_method": pm_id,
            "description": p.get("description"),
            "metadata": dict(p.get("metadata") or {}),
            "off_session": True,
            "confirmation_method": "automatic",
            "created": self.now(),
            "livemode": False,
            "latest_charge": None,
            "last_payment_error": None,
            "status": "processing",
        }
        self.payment_intents[pi["id"]] = pi
        behaviour = self._behaviour(pm_id)
        if behaviour is None:
            pi.update(status="succeeded", amount_received=amount)
            ch = self._new_charge(pi, paid=True)
            return (
                200,
                copy.deepcopy(pi),
                [self._event("payment_intent.succeeded", pi), self._event("charge.succeeded", ch)],
            )
        if behaviour == "authentication_required":
            error: dict[str, Any] = {
                "code": "authentication_required",
                "decline_code": "authentication_required",
                "doc_url": "https://stripe.com/docs/error-codes/authentication-required",
                "message": "Your card was declined. This transaction requires authentication.",
                "type": "card_error",
            }
            pi["status"] = self.sca_intent_status
            if self.sca_intent_status == "requires_action":
                pi["next_action"] = {"type": "use_stripe_sdk"}
        else:
            code, decline, advice = behaviour  # type: ignore[misc]
            error = {
                "code": code,
                "decline_code": decline,
                "doc_url": f"https://stripe.com/docs/error-codes/{code.replace('_', '-')}",
                "message": DECLINE_MESSAGES.get(decline, "Your card was declined."),
                "type": "card_error",
            }
            if advice:
                error["advice_code"] = advice
            pi["status"] = "requires_payment_method"
            ch = self._new_charge(pi, paid=False)
            error["charge"] = ch["id"]
        pi["last_payment_error"] = {**error, "payment_method": copy.deepcopy(pm)}
        body = {
            "error": {
                **error,
                "payment_intent": copy.deepcopy(pi),
                "payment_method": self._public_pm(pm),
                "request_log_url": "https://dashboard.stripe.com/test/logs/req_" + _rand(14),
            }
        }
        return 402, body, [self._event("payment_intent.payment_failed", pi)]

    @staticmethod
    def _public_pm(pm: dict[str, Any]) -> dict[str, Any]:
        out = copy.deepcopy(pm)
        out.pop("_number", None)
        return out

    def _search_payment_intents(self, p: dict[str, Any]) -> dict[str, Any]:
        m = _SEARCH_RE.match(str(p.get("query", "")))
        if m is None:
            raise StripeFakeError(400, "invalid_request_error", "Unsupported query.", "query")
        key, value = m.groups()
        found = [
            copy.deepcopy(pi)
            for pi in self.payment_intents.values()
            if pi["metadata"].get(key) == value
        ]
        return {
            "object": "search_result",
            "url": "/v1/payment_intents/search",
            "has_more": False,
            "data": found,
        }

    def _create_portal_session(self, p: dict[str, Any]) -> dict[str, Any]:
        self._customer(str(p.get("customer")))
        flow = p.get("flow_data") or {}
        if flow and flow.get("type") != "payment_method_update":
            raise StripeFakeError(
                400, "invalid_request_error", "Invalid flow type.", "flow_data[type]"
            )
        ps = {
            "id": "bps_" + _rand(24),
            "object": "billing_portal.session",
            "customer": p.get("customer"),
            "return_url": p.get("return_url"),
            "flow": {"type": flow.get("type")} if flow else None,
            "url": f"{self.url}/p/session/{_rand(24)}",
            "created": self.now(),
            "livemode": False,
        }
        self.portal_sessions.append(ps)
        return copy.deepcopy(ps)

    def _detach(self, pm_id: str) -> dict[str, Any]:
        pm = self.payment_methods.get(pm_id)
        if pm is None or pm["customer"] is None:
            raise StripeFakeError(
                400,
                "invalid_request_error",
                f"The payment method {pm_id} is not attached to a customer.",
                "payment_method",
            )
        pm["customer"] = None
        return self._event("payment_method.detached", self._public_pm(pm))

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
            "data": [self._public_session(self.sessions[i]) for i in ids[:limit]],
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
        obj = session
        if obj.get("object") == "checkout.session":
            obj = self._public_session(obj)
        elif obj.get("object") == "payment_method":
            obj = self._public_pm(obj)
        ev = {
            "id": "evt_1" + _rand(23),
            "object": "event",
            "api_version": stripe.api_version,
            "created": self.now(),
            "livemode": False,
            "pending_webhooks": 1,
            "request": {"id": None, "idempotency_key": None},
            "type": type_,
            "data": {"object": copy.deepcopy(obj)},
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
        card: str = "4242424242424242",
    ) -> list[dict[str, Any]]:
        """The customer pays (or, in setup mode, saves ``card``); returns the events
        emitted (delivered if ``deliver``).

        ``delayed`` = a bank method: ``checkout.session.completed`` with
        ``payment_status=unpaid``, then (unless ``settle=False``, which leaves
        that for ``settle_async``) paid with ``async_payment_succeeded``. A session
        with a customer and ``setup_future_usage`` (or in setup mode) attaches a
        PaymentMethod of the test ``card`` to that customer.
        """
        with self._lock:
            s = self._get(session_id)
            if s["status"] != "open":
                raise ValueError(f"session {session_id} is {s['status']}, not open")
            saves = s["mode"] == "setup" or bool(
                (s.get("payment_intent_data") or {}).get("setup_future_usage")
            )
            pm = self._new_payment_method(card, s["customer"] if saves else None)
            if s["mode"] == "setup":
                si = {
                    "id": "seti_" + _rand(24),
                    "object": "setup_intent",
                    "status": "succeeded",
                    "customer": s["customer"],
                    "payment_method": pm["id"],
                    "usage": "off_session",
                    "metadata": copy.deepcopy(s["metadata"]),
                    "created": self.now(),
                    "livemode": False,
                }
                self.setup_intents[si["id"]] = si
                s.update(status="complete", url=None, setup_intent=si["id"])
                evs = [self._event("checkout.session.completed", s)]
                if deliver:
                    for ev in evs:
                        self._auto_deliver(ev)
                return evs
            pi = {
                "id": "pi_" + _rand(24),
                "object": "payment_intent",
                "amount": s["amount_total"],
                "amount_received": 0 if delayed else s["amount_total"],
                "currency": "usd",
                "customer": s["customer"],
                "payment_method": pm["id"],
                "setup_future_usage": (s.get("payment_intent_data") or {}).get(
                    "setup_future_usage"
                ),
                "metadata": copy.deepcopy(
                    (s.get("payment_intent_data") or {}).get("metadata") or {}
                ),
                "status": "processing" if delayed else "succeeded",
                "latest_charge": None,
                "last_payment_error": None,
                "created": self.now(),
                "livemode": False,
            }
            self.payment_intents[pi["id"]] = pi
            if not delayed:
                self._new_charge(pi, paid=True)
            s.update(status="complete", url=None, payment_intent=pi["id"])
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
                pi = self.payment_intents.get(s["payment_intent"])
                if pi is not None:
                    pi.update(status="succeeded", amount_received=pi["amount"])
                    self._new_charge(pi, paid=True)
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
            return self._public_session(self._get(session_id))

    def payment_intent_of(self, session_id: str) -> dict[str, Any]:
        with self._lock:
            return copy.deepcopy(self.payment_intents[self._get(session_id)["payment_intent"]])

    def refund(
        self, payment_intent_id: str, amount: int | None = None, *, deliver: bool = True
    ) -> dict[str, Any]:
        """Refund (part of) a succeeded charge: ``charge.refunded`` (cumulative amount)."""
        with self._lock:
            pi = self._payment_intent(payment_intent_id)
            ch = self.charges[pi["latest_charge"]]
            amount = ch["amount"] - ch["amount_refunded"] if amount is None else amount
            if amount <= 0 or ch["amount_refunded"] + amount > ch["amount"]:
                raise ValueError("refund exceeds the charge")
            ch["amount_refunded"] += amount
            ch["refunded"] = ch["amount_refunded"] == ch["amount"]
            ev = self._event("charge.refunded", ch)
        if deliver:
            self._auto_deliver(ev)
        return ev

    def dispute(
        self, payment_intent_id: str, amount: int | None = None, *, deliver: bool = True
    ) -> dict[str, Any]:
        """The card holder disputes the charge: ``charge.dispute.created``."""
        with self._lock:
            pi = self._payment_intent(payment_intent_id)
            ch = self.charges[pi["latest_charge"]]
            du = {
                "id": "du_" + _rand(24),
                "object": "dispute",
                "amount": ch["amount"] if amount is None else amount,
                "currency": "usd",
                "charge": ch["id"],
                "payment_intent": payment_intent_id,
                "reason": "fraudulent",
                "status": "needs_response",
                "created": self.now(),
                "livemode": False,
            }
            self.disputes[du["id"]] = du
            ch["disputed"] = True
            ev = self._event("charge.dispute.created", du)
        if deliver:
            self._auto_deliver(ev)
        return ev

    def detach(self, payment_method_id: str, *, deliver: bool = True) -> dict[str, Any]:
        """The card is removed from the customer: ``payment_method.detached``."""
        with self._lock:
            ev = self._detach(payment_method_id)
        if deliver:
            self._auto_deliver(ev)
        return ev

    def set_default_card(
        self, customer_id: str, card: str, *, deliver: bool = True
    ) -> dict[str, Any]:
        """What the Customer Portal's payment-method update does: a new card, attached and
        made the default (``customer.updated``). Returns the new PaymentMethod."""
        with self._lock:
            cus = self._customer(customer_id)
            pm = self._new_payment_method(card, customer_id)
            cus["invoice_settings"]["default_payment_method"] = pm["id"]
            ev = self._event("customer.updated", cus)
        if deliver:
            self._auto_deliver(ev)
        return self._public_pm(pm)

    def events_of(self, type_: str) -> list[dict[str, Any]]:
        with self._lock:
            return [copy.deepcopy(e) for e in self.events if e["type"] == type_]

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
