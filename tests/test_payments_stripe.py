"""The Stripe adapter and the fake Checkout server: the 13 checks of notes/stripe.md §5.3.

Everything goes through the real ``stripe`` 16.x SDK over HTTP to the in-repo
fake (``tests/fakes/stripe_checkout.py``), through ``StripePayments`` where
the check concerns Walkeep's own code. The fake's "now" is the test's
ManualClock, so expiry windows move with the clock, never with sleeping.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest
import stripe
from fakes.stripe_checkout import FakeStripe
from sqlalchemy import select

from walkeep import ledger
from walkeep.clock import ManualClock
from walkeep.config import Settings
from walkeep.db import Database
from walkeep.db.models import CheckoutSession
from walkeep.errors import Internal, NotFound, PaymentsUnavailable, ValidationError
from walkeep.payments.base import CheckoutRequest, InvalidSignature, Payments
from walkeep.payments.stripe import IdempotencyConflict, StripePayments, checkout_params
from walkeep.service.operators import accounts
from walkeep.service.runtime import Runtime
from walkeep.service.tools.topup import handle_stripe_webhook, top_up

KEY = "sk_test_fake_key"
WHSEC = "whsec_test_secret"


@pytest.fixture
def fake(clock: ManualClock) -> Iterator[FakeStripe]:
    with FakeStripe(KEY, clock=clock.time, webhook_secret=WHSEC) as f:
        yield f


def _settings(tmp_path: Path, fake: FakeStripe, **over: object) -> Settings:
    values: dict[str, object] = {
        "data_dir": tmp_path,
        "stripe_secret_key": KEY,
        "stripe_webhook_secret": WHSEC,
        "stripe_api_base": fake.url,
        "public_url": "https://walkeep.test",
    }
    values.update(over)
    return Settings(**values)  # type: ignore[arg-type]


@pytest.fixture
def payments(tmp_path: Path, fake: FakeStripe) -> Iterator[StripePayments]:
    p = StripePayments(_settings(tmp_path, fake), max_network_retries=0, timeout_seconds=5)
    yield p
    p.close()


@pytest.fixture
def sdk(fake: FakeStripe) -> stripe.StripeClient:
    """A bare SDK client on the fake, for checks about the SDK/fake contract itself."""
    return stripe.StripeClient(KEY, base_addresses={"api": fake.url}, max_network_retries=0)


def _req(
    clock: ManualClock, *, cents: int = 500, key: str = "walkeep-topup-acct_1-r1"
) -> CheckoutRequest:
    """A request as top_up builds it: expiry fixed from the row's creation time."""
    return CheckoutRequest(
        checkout_id="tu_test0000000000000000001",
        account_id="acct_1",
        request_id="r1",
        amount_cents=cents,
        currency="usd",
        idempotency_key=key,
        expires_at=clock.now() + timedelta(hours=24),
        success_url="https://walkeep.test/topup/done?session_id={CHECKOUT_SESSION_ID}",
        cancel_url="https://walkeep.test/topup/cancel",
    )


def test_stripe_payments_implements_the_port(payments: StripePayments) -> None:
    assert isinstance(payments, Payments)
    assert payments.provider == "stripe"


def test_session_params_reach_stripe_as_specified(
    payments: StripePayments, fake: FakeStripe, clock: ManualClock
) -> None:
    req = _req(clock, cents=1234)
    ps = payments.create_session(req)
    stored = fake.session(ps.session_id)
    assert stored["amount_total"] == 1234 and stored["currency"] == "usd"
    assert stored["client_reference_id"] == "acct_1"
    assert stored["metadata"] == {
        "account_id": "acct_1",
        "request_id": "r1",
        "checkout_id": req.checkout_id,
    }
    assert stored["expires_at"] == int(req.expires_at.timestamp())
    assert stored["success_url"] == req.success_url and stored["cancel_url"] == req.cancel_url
    assert fake.requests[-1] == ("POST", "/v1/checkout/sessions", req.idempotency_key)
    assert (ps.status, ps.payment_status, ps.amount_total, ps.currency) == (
        "open",
        "unpaid",
        1234,
        "usd",
    )
    assert ps.url == stored["url"] and ps.metadata == stored["metadata"]
    params = checkout_params(req)
    assert params["line_items"] == [
        {
            "quantity": 1,
            "price_data": {
                "currency": "usd",
                "unit_amount": 1234,
                "product_data": {"name": "Walkeep credits"},
            },
        }
    ]


# --- check 1: replay ------------------------------------------------------------------


def test_check01_replay_returns_the_same_session(
    payments: StripePayments, fake: FakeStripe, clock: ManualClock
) -> None:
    req = _req(clock)
    first = payments.create_session(req)
    again = payments.create_session(req)
    assert again.session_id == first.session_id and again.url == first.url
    assert first.session_id.startswith("cs_test_")
    assert fake.sessions_created == 1


# --- check 2: crash before the DB write, replay later ---------------------------------


def test_check02_replay_after_a_crash_gets_the_same_session_via_the_key(
    payments: StripePayments, fake: FakeStripe, clock: ManualClock
) -> None:
    req = _req(clock)  # expires_at fixed when the row was written
    fake.outage = "lose_response"  # Stripe creates it; we never hear back
    with pytest.raises(PaymentsUnavailable):
        payments.create_session(req)
    assert fake.sessions_created == 1
    fake.outage = None
    clock.advance(1.2)
    again = payments.create_session(req)  # rebuilt from the row: identical params
    assert again.session_id in fake.sessions
    assert fake.sessions_created == 1
    # The pitfall: an expiry computed from "now" changes the params under the same key.
    with pytest.raises(IdempotencyConflict):
        payments.create_session(replace(req, expires_at=clock.now() + timedelta(hours=24)))
    assert fake.sessions_created == 1


# --- check 3: same key, different params ------------------------------------------------


def test_check03_same_key_different_params_is_an_idempotency_error(
    payments: StripePayments, sdk: stripe.StripeClient, fake: FakeStripe, clock: ManualClock
) -> None:
    req = _req(clock)
    payments.create_session(req)
    with pytest.raises(stripe.IdempotencyError) as raw:
        sdk.v1.checkout.sessions.create(
            params=checkout_params(replace(req, amount_cents=700)),  # type: ignore[arg-type]
            options={"idempotency_key": req.idempotency_key},
        )
    assert raw.value.http_status == 400
    with pytest.raises(IdempotencyConflict) as ours:
        payments.create_session(replace(req, amount_cents=700))
    assert isinstance(ours.value, Internal) and ours.value.code == "INTERNAL"
    assert fake.sessions_created == 1


# --- check 4: below Stripe's minimum ---------------------------------------------------


def test_check04_below_the_minimum_is_rejected_with_param(
    payments: StripePayments, sdk: stripe.StripeClient, fake: FakeStripe, clock: ManualClock
) -> None:
    req = _req(clock, cents=49, key="k-min")
    with pytest.raises(stripe.InvalidRequestError) as raw:
        sdk.v1.checkout.sessions.create(params=checkout_params(req))  # type: ignore[arg-type]
    assert raw.value.http_status == 400 and raw.value.param == "line_items"
    assert "at least $0.50" in (raw.value.user_message or "")
    with pytest.raises(ValidationError) as ours:
        payments.create_session(req)
    assert ours.value.data["param"] == "line_items"
    assert fake.sessions_created == 0
    # A failed validation is not stored under the key: fixing the request works.
    assert payments.create_session(replace(req, amount_cents=50)).amount_total == 50


def test_expiry_window_is_validated(payments: StripePayments, clock: ManualClock) -> None:
    req = _req(clock)
    clock.advance(hours=23, minutes=31)  # less than 30 minutes left
    with pytest.raises(ValidationError) as exc:
        payments.create_session(req)
    assert exc.value.data["param"] == "expires_at"


# --- checks 5 and 6: crediting exactly once ---------------------------------------------


def _runtime(
    db: Database, clock: ManualClock, payments: StripePayments, settings: Settings
) -> Runtime:
    return Runtime(
        settings=settings,
        db=db,
        clock=clock,
        chain=None,  # type: ignore[arg-type]
        relayer=None,  # type: ignore[arg-type]
        payments=payments,
    )


def _session_id(db: Database, account_id: str, request_id: str) -> str:
    with db.read() as s:
        row = s.scalar(
            select(CheckoutSession).where(
                CheckoutSession.account_id == account_id, CheckoutSession.request_id == request_id
            )
        )
        assert row is not None and row.provider_session_id
        return row.provider_session_id


def test_check05_and_06_events_in_any_order_credit_once(
    db: Database, clock: ManualClock, fake: FakeStripe, payments: StripePayments, tmp_path: Path
) -> None:
    rt = _runtime(db, clock, payments, _settings(tmp_path, fake))
    acct = accounts.create_account(db, "payer").account_id

    def send(event: dict) -> bool:
        body, sig = fake.signed(event)
        return handle_stripe_webhook(rt, body, sig).credited

    # 5: card payment; completed delivered twice, then a late async_payment_succeeded.
    top_up(rt, acct, "5.00", "card")
    sid = _session_id(db, acct, "card")
    (completed,) = fake.complete(sid, deliver=False)
    late = fake.make_event("checkout.session.async_payment_succeeded", sid)
    assert (send(completed), send(completed), send(late)) == (True, False, False)
    with db.read() as s:
        assert ledger.balance(s, acct).balance_mc == 500 * 1000

    # 6: delayed method, async_payment_succeeded arrives before completed.
    top_up(rt, acct, "12.34", "bank")
    sid = _session_id(db, acct, "bank")
    completed, succeeded = fake.complete(sid, delayed=True, deliver=False)
    assert completed["data"]["object"]["payment_status"] == "unpaid"
    assert (send(succeeded), send(completed)) == (True, False)
    with db.read() as s:
        assert ledger.balance(s, acct).balance_mc == 1734 * 1000
        assert ledger.recompute(s, acct).balance_mc == 1734 * 1000


# --- checks 7–9: signatures ---------------------------------------------------------------


def _event_payload(
    fake: FakeStripe, payments: StripePayments, clock: ManualClock
) -> tuple[dict, bytes]:
    ps = payments.create_session(_req(clock))
    (ev,) = fake.complete(ps.session_id, deliver=False)
    return ev, json.dumps(ev).encode()


def test_check07_tampered_body_is_rejected(
    payments: StripePayments, fake: FakeStripe, clock: ManualClock
) -> None:
    ev, body = _event_payload(fake, payments, clock)
    sig = FakeStripe.sign(body, WHSEC)
    tampered = body.replace(b'"amount_total": 500', b'"amount_total": 50000')
    assert tampered != body
    with pytest.raises(stripe.SignatureVerificationError, match="No signatures found"):
        stripe.Webhook.construct_event(tampered, sig, WHSEC)
    with pytest.raises(InvalidSignature):
        payments.parse_webhook(tampered, sig)
    with pytest.raises(InvalidSignature):
        payments.parse_webhook(body, FakeStripe.sign(body, "whsec_wrong"))
    with pytest.raises(InvalidSignature):
        payments.parse_webhook(body, None)
    assert payments.parse_webhook(body, sig).event_id == ev["id"]  # the untampered one passes


def test_check08_stale_timestamp_is_rejected(
    payments: StripePayments, fake: FakeStripe, clock: ManualClock
) -> None:
    _ev, body = _event_payload(fake, payments, clock)
    stale = FakeStripe.sign(body, WHSEC, timestamp=int(time.time()) - 600)
    with pytest.raises(stripe.SignatureVerificationError, match="tolerance zone"):
        stripe.Webhook.construct_event(body, stale, WHSEC)
    with pytest.raises(InvalidSignature):
        payments.parse_webhook(body, stale)
    # The age check is the only objection: without a tolerance the header verifies.
    assert stripe.WebhookSignature.verify_header(body.decode(), stale, WHSEC, tolerance=None)


def test_check09_sdk_generated_signature_verifies(
    payments: StripePayments, fake: FakeStripe, clock: ManualClock
) -> None:
    ev, body = _event_payload(fake, payments, clock)
    header = stripe.WebhookSignature.generate_signature_header(body.decode(), WHSEC)
    t, v1 = header.split(",")
    assert t.startswith("t=") and v1.startswith("v1=") and len(v1) == 3 + 64
    parsed = payments.parse_webhook(body, header)
    assert (parsed.event_id, parsed.type) == (ev["id"], "checkout.session.completed")
    assert parsed.session_id == ev["data"]["object"]["id"]


def test_parse_webhook_needs_a_configured_secret(
    tmp_path: Path, fake: FakeStripe, payments: StripePayments, clock: ManualClock
) -> None:
    _ev, body = _event_payload(fake, payments, clock)
    no_secret = StripePayments(
        _settings(tmp_path, fake, stripe_webhook_secret=None), max_network_retries=0
    )
    with pytest.raises(InvalidSignature, match="not configured"):
        no_secret.parse_webhook(body, FakeStripe.sign(body, WHSEC))
    with pytest.raises(InvalidSignature):
        payments.parse_webhook(b"not json", FakeStripe.sign(b"not json", WHSEC))


# --- checks 10–13: expire, list, retrieve, async ------------------------------------------


def test_check10_expire(
    payments: StripePayments, sdk: stripe.StripeClient, fake: FakeStripe, clock: ManualClock
) -> None:
    ps = payments.create_session(_req(clock))
    expired = sdk.v1.checkout.sessions.expire(ps.session_id)
    assert (expired.status, expired.url) == ("expired", None)
    again = payments.retrieve_session(ps.session_id)
    assert (again.status, again.url, again.payment_status) == ("expired", None, "unpaid")
    assert fake.events[-1]["type"] == "checkout.session.expired"
    with pytest.raises(stripe.InvalidRequestError) as exc:
        sdk.v1.checkout.sessions.expire(ps.session_id)
    assert exc.value.http_status == 400


def test_check11_list_newest_first_with_has_more(
    payments: StripePayments, sdk: stripe.StripeClient, fake: FakeStripe, clock: ManualClock
) -> None:
    payments.create_session(_req(clock, key="k-a"))
    b = payments.create_session(_req(clock, key="k-b"))
    c = payments.create_session(_req(clock, key="k-c"))
    fake.expire(b.session_id, deliver=False)
    fake.complete(c.session_id, deliver=False)
    page = sdk.v1.checkout.sessions.list(params={"limit": 2})
    assert [s.status for s in page.data] == ["complete", "expired"]
    assert page.has_more is True
    assert [s.id for s in page.data] == [c.session_id, b.session_id]


def test_check12_retrieve_unknown(payments: StripePayments, sdk: stripe.StripeClient) -> None:
    with pytest.raises(stripe.InvalidRequestError) as raw:
        sdk.v1.checkout.sessions.retrieve("cs_test_nope")
    assert raw.value.http_status == 404
    assert raw.value.user_message == "No such checkout.session: 'cs_test_nope'"
    with pytest.raises(NotFound):
        payments.retrieve_session("cs_test_nope")


def test_check13_async_retrieve(
    payments: StripePayments, fake: FakeStripe, clock: ManualClock
) -> None:
    ps = payments.create_session(_req(clock))
    fake.complete(ps.session_id, deliver=False)

    async def go() -> tuple[str | None, str]:
        s = await payments.client.v1.checkout.sessions.retrieve_async(ps.session_id)
        return s.status, s.payment_status

    assert asyncio.run(go()) == ("complete", "paid")
    assert payments.retrieve_session(ps.session_id).payment_status == "paid"


# --- error mapping ------------------------------------------------------------------------


@pytest.mark.parametrize("outage", ["drop", "500", "429"])
def test_provider_trouble_is_payments_unavailable(
    payments: StripePayments, fake: FakeStripe, clock: ManualClock, outage: str
) -> None:
    fake.outage = outage  # type: ignore[assignment]
    with pytest.raises(PaymentsUnavailable) as exc:
        payments.create_session(_req(clock))
    assert exc.value.code == "PAYMENTS_UNAVAILABLE"
    assert "same request_id" in exc.value.message and exc.value.data["retry"] is True
    assert fake.sessions_created == 0


def test_timeout_is_payments_unavailable(
    tmp_path: Path, fake: FakeStripe, clock: ManualClock
) -> None:
    slow = StripePayments(_settings(tmp_path, fake), max_network_retries=0, timeout_seconds=0.3)
    fake.outage = "hang"
    started = time.monotonic()
    with pytest.raises(PaymentsUnavailable):
        slow.retrieve_session("cs_test_any")
    assert time.monotonic() - started < 5


def test_retries_reuse_the_idempotency_key(
    tmp_path: Path, fake: FakeStripe, clock: ManualClock
) -> None:
    retrying = StripePayments(_settings(tmp_path, fake), max_network_retries=1, timeout_seconds=5)
    fake.outage = "500"
    with pytest.raises(PaymentsUnavailable):
        retrying.create_session(_req(clock, key="k-retry"))
    assert fake.requests == [("POST", "/v1/checkout/sessions", "k-retry")] * 2


def test_bad_api_key_is_an_operator_problem(
    tmp_path: Path, fake: FakeStripe, clock: ManualClock
) -> None:
    wrong = StripePayments(
        _settings(tmp_path, fake, stripe_secret_key="sk_test_wrong"), max_network_retries=0
    )
    with pytest.raises(PaymentsUnavailable) as exc:
        wrong.create_session(_req(clock))
    assert "STRIPE_SECRET_KEY" in exc.value.message
    assert exc.value.data["operator_action"]
    assert fake.sessions_created == 0
