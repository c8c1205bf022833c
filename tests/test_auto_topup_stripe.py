"""Automatic top-up against Stripe's wire format: the real ``stripe`` SDK, the in-repo fake.

Everything Walkeep sends goes through ``StripePayments`` over HTTP to
``tests/fakes/stripe_checkout.py``: Customers, Checkout in payment mode with
``setup_future_usage=off_session`` and in setup mode, off-session PaymentIntents answered
with Stripe's 402 card-error bodies (``decline_code``, ``advice_code``), replays under
``Idempotency-Key``, the Customer Portal, and ``payment_intent.*`` / ``charge.*`` /
``payment_method.*`` / ``customer.updated`` events signed like Stripe's. Webhooks are
handed to the service function with the exact bytes the fake signed, in whatever order a
test chooses.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import stripe
from fakes.stripe_checkout import FakeStripe
from sqlalchemy import select

from tests.helpers import account, land_all
from walkeep import ledger
from walkeep.clock import ManualClock
from walkeep.db.models import AlertEvent, AutoCharge, AutoTopUp, CheckoutSession, LedgerEntry
from walkeep.errors import ValidationError
from walkeep.payments.stripe import StripePayments, charge_params, classify_failure
from walkeep.service import alerts, autocharge
from walkeep.service.jobs import autotopup as job
from walkeep.service.operators import autotopup as ops
from walkeep.service.operators import statements
from walkeep.service.runtime import Runtime
from walkeep.service.tools import balance, store, topup
from walkeep.service.tools.topup import handle_stripe_webhook

KEY = "sk_test_fake_auto"
WHSEC = "whsec_auto_secret"
VISA = "4242424242424242"
CARDS = {
    "generic": "4000000000000002",
    "insufficient_funds": "4000000000009995",
    "lost_card": "4000000000009987",
    "stolen_card": "4000000000009979",
    "expired_card": "4000000000000069",
    "sca": "4000002760003184",
}


@pytest.fixture
def fake(clock: ManualClock) -> Iterator[FakeStripe]:
    with FakeStripe(KEY, clock=clock.time, webhook_secret=WHSEC) as f:
        yield f


@pytest.fixture
def srt(settings, clock, db, fake: FakeStripe) -> Iterator[Runtime]:  # type: ignore[no-untyped-def]
    """A runtime on the local network whose payments are Stripe (the fake)."""
    from walkeep.bootstrap import build_runtime

    settings.stripe_secret_key = KEY
    settings.stripe_webhook_secret = WHSEC
    settings.stripe_api_base = fake.url
    settings.auto_top_up_retry_seconds = 60
    settings.auto_top_up_min_interval_seconds = 60
    rt = build_runtime(settings, clock=clock, database=db, with_completer=False)
    assert isinstance(rt.payments, StripePayments)
    rt.payments.close()
    rt.payments = StripePayments(settings, max_network_retries=0, timeout_seconds=10)
    yield rt
    rt.payments.close()  # type: ignore[attr-defined]


def deliver(rt: Runtime, fake: FakeStripe, event: dict[str, Any]) -> str:
    """What Stripe does: POST the exact signed bytes; returns the action taken."""
    body, sig = fake.signed(event)
    return handle_stripe_webhook(rt, body, sig).action


def _kept(rt: Runtime, name: str | None = None) -> str:
    a = account(rt, credits=1000, name=name)
    store.store(rt, a, content="a fact worth keeping", request_id=f"{a}-0")
    land_all(rt)
    with rt.db.begin() as s:
        ledger.debit(s, a, ledger.balance(s, a).available_mc, ref="test:drain")
    alerts.set_alert_webhook(rt, a, "http://127.0.0.1:9/hook")
    return a


def _save_card(rt: Runtime, fake: FakeStripe, a: str, card: str = VISA, rid: str = "s1") -> str:
    """The human pays a save_card top-up with ``card``; the webhook records the card."""
    topup.top_up(rt, a, "5.00", rid, save_card=True)
    with rt.db.read() as s:
        sid = s.scalar(
            select(CheckoutSession.provider_session_id).where(
                CheckoutSession.request_id == rid, CheckoutSession.account_id == a
            )
        )
    assert sid
    (completed,) = fake.complete(sid, card=card, deliver=False)
    assert deliver(rt, fake, completed) == "credited"
    return sid


def _enable(rt: Runtime, fake: FakeStripe, a: str, card: str = VISA) -> None:
    _save_card(rt, fake, a, card)
    with rt.db.begin() as s:  # the $5 the save_card checkout paid: spent
        ledger.debit(s, a, ledger.balance(s, a).available_mc, ref="test:spend-checkout")
    ops.set_rule(rt, a, below_runway_epochs=4, to_runway_epochs=12, monthly_cap_usd="20")


def _charges(rt: Runtime, a: str) -> list[AutoCharge]:
    with rt.db.read() as s:
        return list(
            s.scalars(
                select(AutoCharge).where(AutoCharge.account_id == a).order_by(AutoCharge.created_at)
            )
        )


def _types(rt: Runtime, a: str) -> list[str]:
    with rt.db.read() as s:
        return sorted(
            t
            for t in s.scalars(select(AlertEvent.type).where(AlertEvent.account_id == a))
            if t.startswith(("auto_top_up.", "payment."))
        )


def _ledger_matches_stripe(rt: Runtime, fake: FakeStripe, a: str) -> int:
    """Every automatic credit is a succeeded PaymentIntent at Stripe and vice versa."""
    with rt.db.read() as s:
        credited = sum(
            s.scalars(
                select(LedgerEntry.amount_mc).where(
                    LedgerEntry.account_id == a, LedgerEntry.kind == "auto_topup"
                )
            )
        )
        assert ledger.recompute(s, a) == ledger.balance(s, a)
    at_stripe = sum(
        pi["amount"]
        for pi in fake.payment_intents.values()
        if pi["status"] == "succeeded"
        and pi["metadata"].get("walkeep_charge_id")
        and pi["metadata"].get("account_id") == a
    )
    assert credited == at_stripe * 1000
    return at_stripe


# --- saving a card, with consent --------------------------------------------------------------


def test_a_save_card_top_up_asks_stripe_to_keep_the_card_and_records_it(
    srt: Runtime, fake: FakeStripe
) -> None:
    a = _kept(srt)
    sid = _save_card(srt, fake, a)
    raw = fake.sessions[sid]
    assert raw["customer"] in fake.customers
    assert fake.customers[raw["customer"]]["metadata"] == {"account_id": a}
    assert raw["payment_intent_data"]["setup_future_usage"] == "off_session"
    assert "authorise Walkeep to charge it later" in raw["custom_text"]["submit"]["message"]
    pi = fake.payment_intent_of(sid)
    view = balance.auto_top_up_view(srt, a)
    assert view.card == "visa •••• 4242" and view.status == "off"
    with srt.db.read() as s:
        row = s.get(AutoTopUp, a)
        assert row is not None and row.payment_method_id == pi["payment_method"]
        assert row.customer_id == raw["customer"]
    # A second save_card top-up reuses the customer (one per account).
    topup.top_up(srt, a, "5.00", "s2", save_card=True)
    assert len(fake.customers) == 1


def test_a_setup_mode_checkout_saves_a_card_and_charges_nothing(
    srt: Runtime, fake: FakeStripe
) -> None:
    a = _kept(srt)
    url = ops.card_link(srt, a)
    (sid,) = [k for k, v in fake.sessions.items() if v["mode"] == "setup"]
    assert url == fake.sessions[sid]["url"]
    assert fake.sessions[sid]["customer"] in fake.customers
    (completed,) = fake.complete(sid, card=CARDS["insufficient_funds"], deliver=False)
    assert deliver(srt, fake, completed) == "card_saved"
    assert deliver(srt, fake, fake.make_event("checkout.session.completed", sid)) == "card_saved"
    assert balance.auto_top_up_view(srt, a).card == "visa •••• 9995"
    assert balance.check_balance(srt, a).balance_usd == 0


# --- charging ----------------------------------------------------------------------------------


def test_an_off_session_charge_is_credited_once_whichever_signal_comes_first(
    srt: Runtime, fake: FakeStripe
) -> None:
    a = _kept(srt)
    _enable(srt, fake, a)
    early: list[dict[str, Any]] = []

    def webhook_before_the_answer(charge_id: str) -> None:
        # Stripe's event reaches the webhook before the synchronous answer is recorded.
        (ev,) = [e for e in fake.events_of("payment_intent.succeeded") if e not in early]
        early.append(ev)
        assert deliver(srt, fake, ev) == "charge_settled"

    srt.extras["autocharge_hooks"] = {"after_charge": webhook_before_the_answer}
    report = job.auto_top_up(srt)
    assert report.succeeded == 1 and len(early) == 1
    (ch,) = _charges(srt, a)
    pi = fake.payment_intents[ch.payment_intent_id or ""]
    assert (pi["off_session"], pi["customer"], pi["payment_method"]) == (
        True,
        ch.customer_id,
        ch.payment_method_id,
    )
    assert pi["metadata"] == {"account_id": a, "walkeep_charge_id": ch.id}
    assert ("POST", "/v1/payment_intents", ch.idempotency_key) in fake.requests
    # The same event again, and the reconciler: nothing more.
    assert deliver(srt, fake, early[0]) == "duplicate"
    assert deliver(srt, fake, fake._event("payment_intent.succeeded", pi)) == "charge_settled"
    assert _ledger_matches_stripe(srt, fake, a) == ch.amount_cents
    assert _types(srt, a) == ["auto_top_up.enabled", "auto_top_up.succeeded"]


def test_a_lost_answer_is_replayed_under_the_same_key_and_never_charges_twice(
    srt: Runtime, fake: FakeStripe
) -> None:
    a = _kept(srt)
    _enable(srt, fake, a)
    fake.outage = "lose_response"  # Stripe charges, the answer never arrives
    assert job.auto_top_up(srt).pending == 1
    fake.outage = None
    (ch,) = _charges(srt, a)
    assert ch.status == "pending" and ch.payment_intent_id is None
    srt.clock.advance(autocharge.GRACE_SECONDS)  # type: ignore[attr-defined]
    assert job.auto_top_up(srt).settled == 1
    posts = [r for r in fake.requests if r[:2] == ("POST", "/v1/payment_intents")]
    assert posts == [("POST", "/v1/payment_intents", ch.idempotency_key)] * 2
    charged = [p for p in fake.payment_intents.values() if "walkeep_charge_id" in p["metadata"]]
    assert len(charged) == 1
    (ch,) = _charges(srt, a)
    assert ch.status == "succeeded" and ch.payment_intent_id
    assert _ledger_matches_stripe(srt, fake, a) == ch.amount_cents


def test_after_a_day_the_charge_is_found_by_search_not_replayed(
    srt: Runtime, fake: FakeStripe
) -> None:
    """Stripe forgets idempotency keys after 24 h: a replay then would charge again."""
    a = _kept(srt)
    _enable(srt, fake, a)
    fake.outage = "lose_response"
    job.auto_top_up(srt)
    fake.outage = None
    srt.clock.advance(hours=24)  # type: ignore[attr-defined]
    (ch,) = _charges(srt, a)
    report = autocharge.reconcile(srt)
    assert report.settled == 1
    posts = [r for r in fake.requests if r[:2] == ("POST", "/v1/payment_intents")]
    assert len(posts) == 1
    assert ("GET", "/v1/payment_intents/search", None) in fake.requests
    assert _charges(srt, a)[0].status == "succeeded"
    assert _ledger_matches_stripe(srt, fake, a) == ch.amount_cents


@pytest.mark.parametrize("card", ["lost_card", "stolen_card", "expired_card"])
def test_a_hard_decline_disables_at_once_and_forgets_the_card(
    srt: Runtime, fake: FakeStripe, card: str
) -> None:
    a = _kept(srt)
    _enable(srt, fake, a, CARDS[card])
    assert job.auto_top_up(srt).declined == 1
    (ch,) = _charges(srt, a)
    assert (ch.status, ch.failure, ch.decline_code) == ("declined", "hard_declined", card)
    assert ch.payment_intent_id in fake.payment_intents  # the 402 body carried it
    view = balance.auto_top_up_view(srt, a)
    assert view.status == "disabled" and view.card is None
    assert view.last_attempt is not None and view.last_attempt.outcome == "declined"
    assert _types(srt, a) == ["auto_top_up.disabled", "auto_top_up.enabled"]
    srt.clock.advance(3600)  # type: ignore[attr-defined]
    assert job.auto_top_up(srt).charged == 0
    with pytest.raises(ValidationError, match="save a card first"):
        ops.set_rule(srt, a, below_runway_epochs=4, to_runway_epochs=12, monthly_cap_usd="20")


def test_a_removed_card_is_a_hard_decline(srt: Runtime, fake: FakeStripe) -> None:
    a = _kept(srt)
    _enable(srt, fake, a)
    with srt.db.read() as s:
        pm = s.get(AutoTopUp, a).payment_method_id  # type: ignore[union-attr]
    fake.detach(pm or "", deliver=False)  # its webhook is lost
    assert job.auto_top_up(srt).declined == 1
    (ch,) = _charges(srt, a)
    assert (ch.failure, ch.decline_code) == ("hard_declined", "resource_missing")
    assert balance.auto_top_up_view(srt, a).status == "disabled"


def test_soft_declines_back_off_and_disable_at_the_third(srt: Runtime, fake: FakeStripe) -> None:
    a = _kept(srt)
    _enable(srt, fake, a, CARDS["insufficient_funds"])
    for n, wait in ((1, 60), (2, 120), (3, None)):
        assert job.auto_top_up(srt).declined == 1, n
        if wait:
            srt.clock.advance(wait - 1)  # type: ignore[attr-defined]
            assert job.auto_top_up(srt).charged == 0
            srt.clock.advance(1)  # type: ignore[attr-defined]
    charges = _charges(srt, a)
    assert [c.decline_code for c in charges] == ["insufficient_funds"] * 3
    assert len({c.idempotency_key for c in charges}) == 3  # three charges, three keys
    view = balance.auto_top_up_view(srt, a)
    assert view.status == "disabled" and view.card == "visa •••• 9995"
    assert _types(srt, a) == [
        "auto_top_up.disabled",
        "auto_top_up.enabled",
        "auto_top_up.failed",
        "auto_top_up.failed",
    ]
    # Stripe's payment_failed events, delivered late, change nothing more.
    for ev in fake.events_of("payment_intent.payment_failed"):
        assert deliver(srt, fake, ev) == "charge_settled"
    assert len(_types(srt, a)) == 4


@pytest.mark.parametrize("intent_status", ["requires_payment_method", "requires_action"])
def test_authentication_required_gives_a_checkout_that_reactivates(
    srt: Runtime, fake: FakeStripe, intent_status: str
) -> None:
    fake.sca_intent_status = intent_status
    a = _kept(srt)
    _enable(srt, fake, a, CARDS["sca"])
    assert job.auto_top_up(srt).action_required == 1
    (ch,) = _charges(srt, a)
    assert (ch.status, ch.failure) == ("authentication_required", "authentication_required")
    view = balance.check_balance(srt, a).auto_top_up
    assert view.status == "action_required" and view.action_url
    # The link opens a Stripe Checkout for the same amount that saves the card again.
    url = topup.action_checkout(srt, ch.id)
    (sid,) = [k for k, v in fake.sessions.items() if v["url"] == url]
    raw = fake.sessions[sid]
    assert raw["amount_total"] == ch.amount_cents
    assert raw["payment_intent_data"]["setup_future_usage"] == "off_session"
    # The webhook of the failed PaymentIntent changes nothing (no retries).
    for ev in fake.events_of("payment_intent.payment_failed"):
        deliver(srt, fake, ev)
    srt.clock.advance(3600)  # type: ignore[attr-defined]
    assert job.auto_top_up(srt).charged == 0
    (completed,) = fake.complete(sid, card=VISA, deliver=False)
    assert deliver(srt, fake, completed) == "credited"
    view = balance.auto_top_up_view(srt, a)
    assert view.status == "active" and view.card == "visa •••• 4242" and view.action_url is None
    assert _types(srt, a) == [
        "auto_top_up.action_required",
        "auto_top_up.enabled",
        "auto_top_up.enabled",
    ]


# --- cards changing under us -------------------------------------------------------------------


def test_a_card_removed_at_stripe_disables_it(srt: Runtime, fake: FakeStripe) -> None:
    a = _kept(srt)
    _enable(srt, fake, a)
    with srt.db.read() as s:
        pm = s.get(AutoTopUp, a).payment_method_id  # type: ignore[union-attr]
    ev = fake.detach(pm or "", deliver=False)
    assert deliver(srt, fake, ev) == "card_removed"
    view = balance.auto_top_up_view(srt, a)
    assert view.status == "disabled" and view.card is None and "removed" in (view.reason or "")


def test_the_customer_portal_updates_the_card(srt: Runtime, fake: FakeStripe) -> None:
    a = _kept(srt)
    _enable(srt, fake, a)
    url = ops.portal_link(srt, a, "https://walkeep.test/console/account")
    (portal,) = fake.portal_sessions
    assert url == portal["url"] and portal["flow"] == {"type": "payment_method_update"}
    with srt.db.read() as s:
        customer = s.get(AutoTopUp, a).customer_id  # type: ignore[union-attr]
    new = fake.set_default_card(customer or "", CARDS["insufficient_funds"], deliver=False)
    (ev,) = fake.events_of("customer.updated")
    assert deliver(srt, fake, ev) == "card_updated"
    with srt.db.read() as s:
        assert s.get(AutoTopUp, a).payment_method_id == new["id"]  # type: ignore[union-attr]
    assert balance.auto_top_up_view(srt, a).card == "visa •••• 9995"


# --- refunds and disputes -----------------------------------------------------------------------


def test_refunds_and_disputes_take_back_what_was_credited_never_below_zero(
    srt: Runtime, fake: FakeStripe
) -> None:
    a = _kept(srt)
    _enable(srt, fake, a)
    job.auto_top_up(srt)
    (ch,) = _charges(srt, a)
    pi = ch.payment_intent_id or ""
    credited = ch.amount_cents * 1000
    # A partial refund of 20 cents: 20,000 mc back.
    ev = fake.refund(pi, 20, deliver=False)
    assert deliver(srt, fake, ev) == "reversed"
    assert deliver(srt, fake, ev) == "duplicate"
    with srt.db.read() as s:
        assert ledger.balance(s, a).available_mc == credited - 20_000
    # Spend most of the rest; a dispute of the whole charge can only take what is left.
    with srt.db.begin() as s:
        ledger.debit(s, a, credited - 20_000 - 5_000, ref="test:spend")
    ev = fake.dispute(pi, deliver=False)
    assert deliver(srt, fake, ev) == "reversed"
    # The refund event again (new id, same facts): nothing more is taken.
    assert (
        deliver(
            srt,
            fake,
            fake._event("charge.refunded", fake.charges[fake.payment_intents[pi]["latest_charge"]]),
        )
        == "charge_settled"
    )
    with srt.db.read() as s:
        assert ledger.balance(s, a).balance_mc == 0  # never below zero
        row = s.get(AutoCharge, ch.id)
        assert row is not None
        assert row.reversed_mc == 20_000 + 5_000
        assert row.reversal_shortfall_mc == credited - 25_000
        assert ledger.recompute(s, a) == ledger.balance(s, a)
    view = balance.auto_top_up_view(srt, a)
    assert view.status == "disabled" and "disputed" in (view.reason or "")
    reversed_events = []
    with srt.db.read() as s:
        for body in s.scalars(
            select(AlertEvent.body).where(
                AlertEvent.account_id == a, AlertEvent.type == "payment.reversed"
            )
        ):
            reversed_events.append(json.loads(body)["data"])
    assert sorted((e["cause"], e["debited_mc"], e["shortfall_mc"]) for e in reversed_events) == [
        ("dispute", 5_000, credited - 25_000),
        ("refund", 20_000, 0),
    ]
    day = srt.clock.now().date()
    text = statements.to_csv(srt.db, a, day - timedelta(days=1), day)
    kinds = [row.split(",")[1] for row in text.splitlines()[2:-1]]
    assert kinds.count("auto_topup") == 1 and kinds.count("reversal") == 2
    assert "reconciled" in text.splitlines()[-1]


# --- the fake speaks Stripe's wire format (checked with the bare SDK) ------------------------


def test_the_fake_replays_a_402_under_its_key_and_refuses_other_params(
    fake: FakeStripe,
) -> None:
    sdk = stripe.StripeClient(KEY, base_addresses={"api": fake.url}, max_network_retries=0)
    cus = sdk.v1.customers.create(params={"metadata": {"account_id": "a"}})
    # A declining card, saved through a setup-mode session.
    sess = sdk.v1.checkout.sessions.create(
        params={
            "mode": "setup",
            "currency": "usd",
            "customer": cus.id,
            "success_url": "https://x.test/ok",
            "expires_at": int(fake.now()) + 3600,
        }
    )
    fake.complete(sess.id, card=CARDS["insufficient_funds"], deliver=False)
    si = sdk.v1.checkout.sessions.retrieve(sess.id, params={"expand": ["setup_intent"]})
    pm = si.setup_intent.payment_method  # type: ignore[union-attr]
    params: dict[str, Any] = {
        "amount": 500,
        "currency": "usd",
        "customer": cus.id,
        "payment_method": pm,
        "off_session": True,
        "confirm": True,
    }
    errors = []
    for _ in range(2):
        with pytest.raises(stripe.CardError) as caught:
            sdk.v1.payment_intents.create(params=params, options={"idempotency_key": "k-402"})  # type: ignore[arg-type]
        errors.append(caught.value)
    first, second = errors
    assert first.http_status == 402 and first.code == "card_declined"
    body = first.json_body["error"]  # type: ignore[index]
    assert body["decline_code"] == "insufficient_funds" and body["advice_code"] == "try_again_later"
    assert body["payment_intent"]["status"] == "requires_payment_method"
    assert second.json_body["error"]["payment_intent"]["id"] == body["payment_intent"]["id"]  # type: ignore[index]
    assert second.headers.get("Idempotent-Replayed") == "true"  # type: ignore[union-attr]
    assert classify_failure(body) == "declined"
    with pytest.raises(stripe.IdempotencyError):
        sdk.v1.payment_intents.create(  # type: ignore[arg-type]
            params={**params, "amount": 600}, options={"idempotency_key": "k-402"}
        )


def test_charge_params_are_a_pure_function_of_the_row() -> None:
    from walkeep.payments.base import ChargeRequest

    req = ChargeRequest(
        "atu_1", "acct_1", 75, "usd", "cus_1", "pm_1", "k", "Walkeep automatic top-up"
    )
    assert (
        charge_params(req)
        == charge_params(req)
        == {
            "amount": 75,
            "currency": "usd",
            "customer": "cus_1",
            "payment_method": "pm_1",
            "off_session": True,
            "confirm": True,
            "description": "Walkeep automatic top-up",
            "metadata": {"account_id": "acct_1", "walkeep_charge_id": "atu_1"},
        }
    )


def test_a_card_saved_in_test_mode_is_never_charged_through_stripe(
    srt: Runtime, fake: FakeStripe
) -> None:
    """Regression: switching from TEST MODE to Stripe kept the local customer id, so a
    save_card checkout asked Stripe for a customer it never had."""
    a = _kept(srt)
    now = srt.clock.now()
    with srt.db.begin() as s:
        s.add(
            AutoTopUp(
                account_id=a,
                status="active",
                below_runway_epochs=4,
                to_runway_epochs=12,
                monthly_cap_cents=2000,
                provider="local",
                customer_id=f"cus_local_{a}",
                payment_method_id="pm_test_succeeds_abc",
                card_brand="visa",
                card_last4="4242",
                created_at=now,
                updated_at=now,
            )
        )
    assert balance.auto_top_up_view(srt, a).card is None  # not a card Stripe can charge
    assert job.auto_top_up(srt).charged == 0
    _save_card(srt, fake, a)
    with srt.db.read() as s:
        row = s.get(AutoTopUp, a)
        assert row is not None and row.provider == "stripe"
        assert row.customer_id in fake.customers
    assert balance.auto_top_up_view(srt, a).card == "visa •••• 4242"
