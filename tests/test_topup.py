"""Top-ups end to end: service calls, the real webhook endpoint over HTTP, both providers.

Stripe flows use the real SDK against ``fakes.stripe_checkout.FakeStripe``;
the fake POSTs signed events to a real FastAPI app served by uvicorn on a
free port. Time is a ManualClock shared by the app and the fake.
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

import httpx
import pytest
import uvicorn
from fakes.stripe_checkout import FakeStripe
from fastapi import FastAPI
from sqlalchemy import func, select

from tests.helpers import console_sign_in
from walkeep import ledger, lifecycle
from walkeep.api.payments import router
from walkeep.backends.base import BlobObject
from walkeep.clock import ManualClock
from walkeep.config import Settings
from walkeep.db import Database
from walkeep.db.models import Blob, CheckoutSession, LedgerEntry, Memory, StripeEvent
from walkeep.errors import NotFound, PaymentsUnavailable, ValidationError
from walkeep.ledger import Kind
from walkeep.payments.base import InvalidSignature
from walkeep.payments.local import LocalPayments
from walkeep.payments.stripe import StripePayments
from walkeep.service.operators import accounts
from walkeep.service.runtime import Runtime
from walkeep.service.tools.topup import (
    checkout_status,
    credit_checkout,
    handle_stripe_webhook,
    idempotency_key,
    issue_pay_token,
    pay_local,
    reconcile_payments,
    top_up,
)

KEY = "sk_test_fake_key"
WHSEC = "whsec_topup_secret"
PUBLIC = "https://walkeep.test"
BOUNDS = {"min_usd": "0.50", "max_usd": "10000", "max_decimals": 2}


# --- harness -------------------------------------------------------------------------


def page_token(page: str) -> str:
    """The one-time pay token of a rendered TEST MODE checkout page."""
    found = re.search(r'name="pay_token" value="([^"]+)"', page)
    assert found is not None, page
    return found.group(1)


@contextmanager
def serve(app: FastAPI) -> Iterator[str]:
    """Run ``app`` under uvicorn on a pre-bound free port (connections queue until it's up)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


@dataclass
class Env:
    rt: Runtime
    db: Database
    clock: ManualClock
    fake: FakeStripe
    account_id: str
    base_url: str | None = None

    def row(self, request_id: str) -> CheckoutSession:
        with self.db.read() as s:
            row = s.scalar(
                select(CheckoutSession).where(
                    CheckoutSession.account_id == self.account_id,
                    CheckoutSession.request_id == request_id,
                )
            )
            assert row is not None
            return row

    def session_id(self, request_id: str) -> str:
        sid = self.row(request_id).provider_session_id
        assert sid
        return sid

    def balance_mc(self) -> int:
        with self.db.read() as s:
            bal = ledger.balance(s, self.account_id)
            assert ledger.recompute(s, self.account_id) == bal
            return bal.balance_mc

    def topup_entries(self) -> int:
        with self.db.read() as s:
            return int(
                s.scalar(
                    select(func.count())
                    .select_from(LedgerEntry)
                    .where(
                        LedgerEntry.account_id == self.account_id, LedgerEntry.kind == Kind.TOPUP
                    )
                )
                or 0
            )


def _settings(tmp_path: Path, fake: FakeStripe | None) -> Settings:
    values: dict[str, object] = {"data_dir": tmp_path, "public_url": PUBLIC}
    if fake is not None:
        values.update(stripe_secret_key=KEY, stripe_webhook_secret=WHSEC, stripe_api_base=fake.url)
    return Settings(**values)  # type: ignore[arg-type]


class _Epoch0:
    """The one chain fact a credit reads: which paused memories are still paid for, and
    which of them the next renewal reaches before they end (the epoch clock)."""

    def current_epoch(self) -> int:
        return 0

    def epoch_info(self):  # type: ignore[no-untyped-def]
        from walkeep.backends.base import EpochInfo

        return EpochInfo(epoch=0, started_at=None, duration_seconds=3600)


def _runtime(db: Database, clock: ManualClock, settings: Settings, payments: object) -> Runtime:
    return Runtime(
        settings=settings,
        db=db,
        clock=clock,
        chain=_Epoch0(),  # type: ignore[arg-type]
        relayer=None,  # type: ignore[arg-type]
        payments=payments,  # type: ignore[arg-type]
    )


def _app(rt: Runtime) -> FastAPI:
    from walkeep.api.console import router as console_router

    app = FastAPI()
    app.include_router(router)
    app.include_router(console_router)  # the operator signs in to pay TEST MODE checkouts
    app.state.runtime = rt
    return app


@pytest.fixture
def fake(clock: ManualClock) -> Iterator[FakeStripe]:
    with FakeStripe(KEY, clock=clock.time, webhook_secret=WHSEC) as f:
        yield f


@pytest.fixture
def env(db: Database, clock: ManualClock, fake: FakeStripe, tmp_path: Path) -> Iterator[Env]:
    """Stripe provider, no HTTP app (webhooks are not delivered automatically)."""
    settings = _settings(tmp_path, fake)
    payments = StripePayments(settings, max_network_retries=0, timeout_seconds=10)
    rt = _runtime(db, clock, settings, payments)
    acct = accounts.create_account(db, "alice").account_id
    yield Env(rt, db, clock, fake, acct)
    payments.close()


@pytest.fixture
def web(env: Env) -> Iterator[Env]:
    """``env`` plus the real app on uvicorn; the fake delivers webhooks to it."""
    with serve(_app(env.rt)) as base:
        env.base_url = base
        env.fake.webhook_url = f"{base}/webhooks/stripe"
        yield env
        env.fake.webhook_url = None


@pytest.fixture
def local(db: Database, clock: ManualClock, tmp_path: Path) -> Iterator[Env]:
    """The embedded default: local TEST MODE payments, served over HTTP."""
    from walkeep.backends.localnet import LocalChain, LocalNetwork

    settings = _settings(tmp_path, None)
    rt = _runtime(db, clock, settings, LocalPayments(db, settings))
    # The console's pages (where the operator signs in to pay) name the network.
    network = LocalNetwork(tmp_path / "localnet", clock)
    rt.chain = LocalChain(network, public_url=PUBLIC)
    acct = accounts.create_account(db, "bob").account_id
    with serve(_app(rt)) as base:
        yield Env(rt, db, clock, None, acct, base)  # type: ignore[arg-type]
    network.close()


def _paused_memory(db: Database, clock: ManualClock, account_id: str) -> str:
    """A paused memory whose blob is paid until epoch 5 (the test chain is at epoch 0)."""
    now = clock.now()
    with db.begin() as s:
        blob = Blob(
            **lifecycle.blob_row(
                BlobObject("b" * 43, "0x" + "1" * 64, 10, 1000, 0, 5, "0x" + "2" * 64),
                account_id,
                lifecycle.BlobStatus.LIVE,
                now,
                2,
            )
        )
        s.add(blob)
        s.flush()
        s.add(
            Memory(
                id="mem_pausedpausedpausedpaused01",
                account_id=account_id,
                namespace="default",
                metadata_={},
                size_bytes=10,
                content_hash="0" * 64,
                status="paused",
                blob_pk=blob.id,
                blob_id=blob.blob_id,
                cost_mc=1000,
                accepted_at=now,
                deadline_at=now,
                stored_at=now,
                status_changed_at=now,
            )
        )
    return "mem_pausedpausedpausedpaused01"


def _memory_status(db: Database, memory_id: str) -> str:
    with db.read() as s:
        m = s.get(Memory, memory_id)
        assert m is not None
        return m.status


# --- top_up: idempotency and validation -----------------------------------------------


def test_replay_returns_the_same_url_and_one_session(env: Env) -> None:
    first = top_up(env.rt, env.account_id, "5.00", "req-1")
    assert first.amount_usd == 5.0
    assert first.checkout_url.startswith(env.fake.url + "/c/pay/cs_test_")
    env.clock.advance(hours=1)
    for amount in (5, 5.0, Decimal("5"), "5"):
        again = top_up(env.rt, env.account_id, amount, "req-1")
        assert again.checkout_url == first.checkout_url
    assert env.fake.sessions_created == 1

    row = env.row("req-1")
    assert (row.status, row.amount_cents, row.currency, row.provider) == (
        "open",
        500,
        "usd",
        "stripe",
    )
    assert row.expires_at == row.created_at + timedelta(hours=24)
    assert row.idempotency_key == f"walkeep-topup-{env.account_id}-req-1"
    stored = env.fake.session(row.provider_session_id or "")
    assert stored["expires_at"] == int(row.expires_at.timestamp())
    assert stored["client_reference_id"] == env.account_id
    assert stored["metadata"] == {
        "account_id": env.account_id,
        "request_id": "req-1",
        "checkout_id": row.id,
    }
    assert stored["success_url"] == f"{PUBLIC}/topup/done?session_id={{CHECKOUT_SESSION_ID}}"
    assert stored["cancel_url"] == f"{PUBLIC}/topup/cancel"


def test_request_ids_are_per_account(env: Env) -> None:
    other = accounts.create_account(env.db, "carol").account_id
    a = top_up(env.rt, env.account_id, "5.00", "shared")
    b = top_up(env.rt, other, "5.00", "shared")
    assert a.checkout_url != b.checkout_url
    assert env.fake.sessions_created == 2


def test_same_request_id_different_amount_is_refused(env: Env) -> None:
    top_up(env.rt, env.account_id, "5.00", "req-1")
    with pytest.raises(ValidationError) as exc:
        top_up(env.rt, env.account_id, "6.00", "req-1")
    assert exc.value.code == "VALIDATION_ERROR"
    assert exc.value.data["original_amount_usd"] == "5.00"
    assert env.fake.sessions_created == 1


BAD_AMOUNTS: list[object] = [
    0.49,
    "0.49",
    "10000.01",
    1.234,
    "1.234",
    0.1 + 0.2,
    "abc",
    "NaN",
    "-5",
    0,
    True,
]


def test_amount_bounds(env: Env) -> None:
    for amount in BAD_AMOUNTS:
        with pytest.raises(ValidationError) as exc:
            top_up(env.rt, env.account_id, amount, "req-bad")  # type: ignore[arg-type]
        assert exc.value.code == "VALIDATION_ERROR", amount
        assert {k: exc.value.data[k] for k in BOUNDS} == BOUNDS, amount
    assert env.fake.sessions_created == 0
    with env.db.read() as s:
        assert s.scalar(select(func.count()).select_from(CheckoutSession)) == 0


def test_amount_edges_are_accepted_exactly(env: Env) -> None:
    assert top_up(env.rt, env.account_id, "0.50", "min").amount_usd == 0.5
    assert top_up(env.rt, env.account_id, 10000, "max").amount_usd == 10000.0
    assert top_up(env.rt, env.account_id, 12.34, "float").amount_usd == 12.34
    assert top_up(env.rt, env.account_id, "1.230", "zeros").amount_usd == 1.23
    assert [env.row(r).amount_cents for r in ("min", "max", "float", "zeros")] == [
        50,
        1_000_000,
        1234,
        123,
    ]


def test_request_id_bounds(env: Env) -> None:
    for request_id in ("", "x" * 256, None):
        with pytest.raises(ValidationError) as exc:
            top_up(env.rt, env.account_id, "5.00", request_id)  # type: ignore[arg-type]
        assert exc.value.data["max_chars"] == 255
    assert env.fake.sessions_created == 0


def test_long_request_id_gets_a_hashed_idempotency_key(env: Env) -> None:
    rid = "r" * 255
    top_up(env.rt, env.account_id, "5.00", rid)
    key = env.row(rid).idempotency_key
    assert len(key) <= 255 and "sha256" in key
    assert key == idempotency_key(env.account_id, rid)
    assert top_up(env.rt, env.account_id, "5.00", rid).checkout_url
    assert env.fake.sessions_created == 1


def test_unknown_account(env: Env) -> None:
    with pytest.raises(NotFound):
        top_up(env.rt, "acct_nope", "5.00", "req-1")


def test_provider_unreachable_then_replay_succeeds_once(env: Env) -> None:
    env.fake.outage = "drop"
    with pytest.raises(PaymentsUnavailable) as exc:
        top_up(env.rt, env.account_id, "5.00", "req-1")
    assert exc.value.code == "PAYMENTS_UNAVAILABLE"
    row = env.row("req-1")
    assert (row.status, row.provider_session_id, row.url) == ("creating", None, None)
    assert env.fake.sessions_created == 0

    env.fake.outage = None
    env.clock.advance(minutes=10)
    result = top_up(env.rt, env.account_id, "5.00", "req-1")
    assert env.fake.sessions_created == 1
    assert env.row("req-1").status == "open"
    assert top_up(env.rt, env.account_id, "5.00", "req-1").checkout_url == result.checkout_url


def test_lost_response_replay_gets_the_same_session(env: Env) -> None:
    """The crash window: Stripe created the session but we never stored it."""
    env.fake.outage = "lose_response"
    with pytest.raises(PaymentsUnavailable):
        top_up(env.rt, env.account_id, "5.00", "req-1")
    assert env.fake.sessions_created == 1
    assert env.row("req-1").status == "creating"
    (created_id,) = env.fake.sessions

    env.fake.outage = None
    env.clock.advance(hours=2)  # the request is rebuilt from the row, so it's identical
    result = top_up(env.rt, env.account_id, "5.00", "req-1")
    assert env.fake.sessions_created == 1
    assert env.session_id("req-1") == created_id
    assert created_id in result.checkout_url


def test_creating_row_too_old_for_its_expiry_starts_a_fresh_attempt(env: Env) -> None:
    env.fake.outage = "drop"
    with pytest.raises(PaymentsUnavailable):
        top_up(env.rt, env.account_id, "5.00", "req-1")
    env.fake.outage = None
    env.clock.advance(hours=23, minutes=45)  # Stripe needs ≥ 30 min left on expires_at
    top_up(env.rt, env.account_id, "5.00", "req-1")
    row = env.row("req-1")
    assert row.status == "open" and row.idempotency_key.endswith(":2")
    assert row.expires_at == env.clock.now() + timedelta(hours=24)
    assert env.fake.sessions_created == 1


# --- webhooks over HTTP ---------------------------------------------------------------


def test_completed_and_paid_credits_once(web: Env) -> None:
    top_up(web.rt, web.account_id, "5.00", "req-1")
    (completed,) = web.fake.complete(web.session_id("req-1"))
    (event_id, first), *_ = web.fake.deliveries
    assert event_id == completed["id"] and first.status == 200
    assert first.json()["received"] is True and first.json()["credited"] is True
    assert web.balance_mc() == 500_000

    for _ in range(4):
        again = web.fake.deliver(completed)
        assert again.status == 200 and again.json()["duplicate"] is True
    assert web.balance_mc() == 500_000 and web.topup_entries() == 1
    row = web.row("req-1")
    assert (row.status, row.payment_status) == ("complete", "paid")
    with web.db.read() as s:
        entry = s.get(LedgerEntry, row.credited_entry_id)
        assert entry is not None and entry.ref == f"topup:{row.id}" and entry.amount_mc == 500_000
    # The replayed tool call still answers (no second session).
    assert top_up(web.rt, web.account_id, "5.00", "req-1").amount_usd == 5.0
    assert web.fake.sessions_created == 1


def test_duplicates_and_out_of_order_credit_once(web: Env) -> None:
    top_up(web.rt, web.account_id, "12.34", "req-1")
    completed, succeeded = web.fake.complete(web.session_id("req-1"), delayed=True, deliver=False)
    results = [
        web.fake.deliver(ev) for ev in (succeeded, completed, succeeded, completed, completed)
    ]
    assert [r.status for r in results] == [200] * 5
    assert [r.json()["credited"] for r in results] == [True, False, False, False, False]
    assert web.balance_mc() == 1_234_000 and web.topup_entries() == 1


def test_bad_signatures_are_rejected_and_change_nothing(web: Env) -> None:
    top_up(web.rt, web.account_id, "5.00", "req-1")
    (completed,) = web.fake.complete(web.session_id("req-1"), deliver=False)
    assert web.fake.deliver(completed, tamper=True).status == 400
    assert web.fake.deliver(completed, secret="whsec_wrong").status == 400
    body, _sig = web.fake.signed(completed)
    assert FakeStripe.post(web.fake.webhook_url, body, None).status == 400
    assert web.balance_mc() == 0
    with web.db.read() as s:
        assert s.scalar(select(func.count()).select_from(StripeEvent)) == 0
    assert web.row("req-1").status == "open"
    # The same event, correctly signed, is then processed normally.
    assert web.fake.deliver(completed).json()["credited"] is True
    assert web.balance_mc() == 500_000


def test_signed_but_malformed_events_are_400_and_change_nothing(
    web: Env, caplog: pytest.LogCaptureFixture
) -> None:
    """Regression (issue 13): a correctly signed `[]` or an event without `type` answered
    500, which Stripe retries for days; a signature from the future was accepted."""
    top_up(web.rt, web.account_id, "5.00", "req-1")
    (completed,) = web.fake.complete(web.session_id("req-1"), deliver=False)
    no_type = {k: v for k, v in completed.items() if k != "type"}
    no_id = {k: v for k, v in completed.items() if k != "id"}
    bad_session = {**completed, "data": {"object": {"object": "checkout.session", "id": 7}}}
    for body in (
        b"[]",
        b"null",
        b'"evt"',
        b"{}",
        *(
            json.dumps(e).encode()
            for e in (no_type, no_id, {**completed, "type": ["x"]}, bad_session)
        ),
    ):
        with caplog.at_level("WARNING"):
            r = FakeStripe.post(web.fake.webhook_url, body, FakeStripe.sign(body, WHSEC))
        assert r.status == 400, (body[:60], r.status, r.body)
        # Issue 29: signed, so the payload is the problem, not the signature.
        assert r.json()["error"] == "invalid_payload", (body[:60], r.body)
    assert "rejected webhook" in caplog.text and "signed" in caplog.text
    future = int(time.time()) + 3600
    stale = web.fake.deliver(completed, timestamp=future)
    assert stale.status == 400 and stale.json()["error"] == "invalid_signature"
    assert web.balance_mc() == 0
    with web.db.read() as s:
        assert s.scalar(select(func.count()).select_from(StripeEvent)) == 0
    # A little clock skew is fine; the event is then processed normally.
    ok = web.fake.deliver(completed, timestamp=int(time.time()) + 60)
    assert ok.status == 200 and ok.json()["credited"] is True


def test_delayed_payment_credits_only_when_it_succeeds(web: Env) -> None:
    top_up(web.rt, web.account_id, "5.00", "req-1")
    sid = web.session_id("req-1")
    web.fake.complete(sid, delayed=True, settle=False)
    assert web.fake.deliveries[-1][1].json()["action"] == "pending"
    assert web.balance_mc() == 0
    row = web.row("req-1")
    assert (row.status, row.payment_status) == ("open", "unpaid")

    web.fake.settle_async(sid, succeeded=True)
    assert web.fake.deliveries[-1][1].json()["action"] == "credited"
    assert web.balance_mc() == 500_000


def test_failed_delayed_payment_is_marked_and_replay_starts_over(web: Env) -> None:
    first = top_up(web.rt, web.account_id, "5.00", "req-1")
    web.fake.fail_async(web.session_id("req-1"))
    assert web.fake.deliveries[-1][1].json()["action"] == "failed"
    assert web.row("req-1").status == "failed" and web.balance_mc() == 0

    again = top_up(web.rt, web.account_id, "5.00", "req-1")
    assert again.checkout_url != first.checkout_url
    assert web.fake.sessions_created == 2
    assert web.row("req-1").idempotency_key.endswith(":2")


def test_expired_session_is_marked_and_replay_gets_a_fresh_one(web: Env) -> None:
    first = top_up(web.rt, web.account_id, "5.00", "req-1")
    old_sid = web.session_id("req-1")
    expired = web.fake.expire(old_sid)
    assert web.fake.deliveries[-1][1].json()["action"] == "expired"
    assert web.row("req-1").status == "expired"

    fresh = top_up(web.rt, web.account_id, "5.00", "req-1")
    assert fresh.checkout_url != first.checkout_url and web.fake.sessions_created == 2
    row = web.row("req-1")
    assert row.status == "open" and row.provider_session_id != old_sid
    # A late re-delivery about the dead session doesn't touch the new one.
    assert web.fake.deliver(expired).json()["duplicate"] is True
    late = web.fake.make_event("checkout.session.expired", old_sid)
    assert web.fake.deliver(late).json()["action"] == "superseded"
    assert web.row("req-1").status == "open"
    # …and the fresh session pays normally.
    web.fake.complete(row.provider_session_id or "")
    assert web.balance_mc() == 500_000


def test_replay_after_expiry_time_asks_the_provider_first(env: Env) -> None:
    """Paid just before expiry, webhook lost: the replay credits instead of starting over."""
    first = top_up(env.rt, env.account_id, "5.00", "req-1")
    env.fake.complete(env.session_id("req-1"), deliver=False)
    env.clock.advance(hours=25)
    again = top_up(env.rt, env.account_id, "5.00", "req-1")
    assert again.checkout_url == first.checkout_url
    assert env.fake.sessions_created == 1
    assert env.balance_mc() == 500_000 and env.row("req-1").status == "complete"


def test_webhook_matches_a_row_whose_create_response_was_lost(web: Env) -> None:
    """The row is still "creating" (no session id): metadata.checkout_id finds it."""
    web.fake.outage = "lose_response"
    with pytest.raises(PaymentsUnavailable):
        top_up(web.rt, web.account_id, "5.00", "req-1")
    web.fake.outage = None
    (sid,) = web.fake.sessions
    assert web.row("req-1").provider_session_id is None
    web.fake.complete(sid)
    assert web.fake.deliveries[-1][1].json()["credited"] is True
    row = web.row("req-1")
    assert (row.status, row.provider_session_id) == ("complete", sid)
    assert web.balance_mc() == 500_000
    top_up(web.rt, web.account_id, "5.00", "req-1")  # the replay finds it paid
    assert web.fake.sessions_created == 1 and web.balance_mc() == 500_000


def test_amount_mismatch_is_never_credited(web: Env) -> None:
    top_up(web.rt, web.account_id, "5.00", "req-1")
    sid = web.session_id("req-1")
    web.fake.sessions[sid]["amount_total"] = 50  # the provider reports a different amount
    web.fake.complete(sid)
    assert web.fake.deliveries[-1][1].json()["action"] == "amount_mismatch"
    assert web.balance_mc() == 0 and web.row("req-1").status == "open"


def test_credit_checkout_requires_paid(env: Env) -> None:
    top_up(env.rt, env.account_id, "5.00", "req-1")
    sid = env.session_id("req-1")
    unpaid = env.rt.payments.retrieve_session(sid)
    env.fake.complete(sid, deliver=False)
    paid = env.rt.payments.retrieve_session(sid)
    cid = env.row("req-1").id
    with env.db.begin() as s:
        row = s.get(CheckoutSession, cid)
        assert row is not None
        assert credit_checkout(s, row, unpaid, source="test", rt=env.rt) is False
        assert credit_checkout(s, row, paid, source="test", rt=env.rt) is True
        assert credit_checkout(s, row, paid, source="test", rt=env.rt) is False
    assert env.balance_mc() == 500_000


def test_unknown_and_irrelevant_events_are_acknowledged(web: Env) -> None:
    top_up(web.rt, web.account_id, "5.00", "req-1")
    other = web.fake.make_event("customer.created", web.session_id("req-1"))
    assert web.fake.deliver(other).json()["action"] == "ignored"
    stranger = {
        "id": "evt_stranger",
        "object": "event",
        "type": "checkout.session.completed",
        "created": 0,
        "data": {"object": {"id": "cs_test_not_ours", "object": "checkout.session"}},
    }
    result = web.fake.deliver(stranger)
    assert result.status == 200 and result.json()["action"] == "unknown_session"
    assert web.balance_mc() == 0


def test_provider_down_during_webhook_answers_503_for_a_retry(web: Env) -> None:
    top_up(web.rt, web.account_id, "5.00", "req-1")
    (completed,) = web.fake.complete(web.session_id("req-1"), deliver=False)
    web.fake.outage = "500"
    assert web.fake.deliver(completed).status == 503
    with web.db.read() as s:
        assert s.get(StripeEvent, completed["id"]) is None  # not marked seen
    web.fake.outage = None
    assert web.fake.deliver(completed).json()["credited"] is True


def test_concurrent_deliveries_credit_once(web: Env) -> None:
    top_up(web.rt, web.account_id, "7.00", "req-1")
    sid = web.session_id("req-1")
    (completed,) = web.fake.complete(sid, deliver=False)
    succeeded = web.fake.make_event("checkout.session.async_payment_succeeded", sid)
    events = [completed, succeeded] * 4
    barrier = threading.Barrier(len(events))

    def send(ev: dict) -> tuple[int, bool]:
        barrier.wait(timeout=10)
        r = web.fake.deliver(ev)
        return r.status, bool(r.json().get("credited"))

    with ThreadPoolExecutor(max_workers=len(events)) as pool:
        results = list(pool.map(send, events))
    assert [status for status, _ in results] == [200] * 8
    assert sum(credited for _, credited in results) == 1
    assert web.balance_mc() == 700_000 and web.topup_entries() == 1
    with web.db.read() as s:
        assert s.scalar(select(func.count()).select_from(StripeEvent)) == 2


def test_top_up_resumes_paused_memories(web: Env) -> None:
    mem = _paused_memory(web.db, web.clock, web.account_id)
    top_up(web.rt, web.account_id, "5.00", "req-1")
    web.fake.complete(web.session_id("req-1"), delayed=True, settle=False)
    assert _memory_status(web.db, mem) == "paused"  # unpaid: nothing changes
    web.fake.settle_async(web.session_id("req-1"))
    assert _memory_status(web.db, mem) == "active"


# --- reconciliation -------------------------------------------------------------------


def test_reconcile_credits_a_missed_webhook_and_marks_expiry(env: Env) -> None:
    top_up(env.rt, env.account_id, "5.00", "paid")
    top_up(env.rt, env.account_id, "6.00", "abandoned")
    top_up(env.rt, env.account_id, "7.00", "waiting")
    env.fake.complete(env.session_id("paid"), deliver=False)  # webhook lost
    env.fake.expire(env.session_id("abandoned"), deliver=False)

    assert reconcile_payments(env.rt, older_than_seconds=300).checked == 0  # too fresh
    assert env.balance_mc() == 0
    env.clock.advance(301)
    report = reconcile_payments(env.rt, older_than_seconds=300)
    assert (report.checked, report.credited, report.expired, report.pending) == (3, 1, 1, 1)
    assert env.balance_mc() == 500_000
    assert env.row("paid").status == "complete" and env.row("abandoned").status == "expired"

    again = reconcile_payments(env.rt, older_than_seconds=300)
    assert (again.checked, again.credited) == (1, 0)  # only the still-open one
    assert env.balance_mc() == 500_000 and env.topup_entries() == 1


def test_reconcile_survives_bad_rows(env: Env) -> None:
    top_up(env.rt, env.account_id, "5.00", "a")
    top_up(env.rt, env.account_id, "6.00", "b")
    env.fake.complete(env.session_id("a"), deliver=False)
    env.clock.advance(600)
    env.fake.outage = "500"
    report = reconcile_payments(env.rt)
    assert (report.checked, report.errors, report.credited) == (2, 2, 0)
    env.fake.outage = None
    assert reconcile_payments(env.rt).credited == 1


# --- the local TEST MODE provider ------------------------------------------------------


def test_local_checkout_page_and_pay_button(local: Env) -> None:
    mem = _paused_memory(local.db, local.clock, local.account_id)
    result = top_up(local.rt, local.account_id, "5.00", "req-1")
    row = local.row("req-1")
    assert result.checkout_url == f"{PUBLIC}/checkout/{row.id}"
    assert top_up(local.rt, local.account_id, "5.00", "req-1").checkout_url == result.checkout_url
    assert (row.status, row.provider, row.provider_session_id) == (
        "open",
        "local",
        f"cs_local_{row.id}",
    )

    with httpx.Client(base_url=local.base_url or "") as http:
        # Issue 13.4: the link alone (the agent holds it) shows no Pay button and cannot
        # pay, even with a valid one-time token; the account's operator signs in first.
        anon = http.get(f"/checkout/{row.id}")
        assert anon.status_code == 200 and "pay_token" not in anon.text
        assert "Only the account's operator can pay" in anon.text
        forged = http.post(
            f"/checkout/{row.id}/pay", data={"pay_token": issue_pay_token(local.rt, row.id)}
        )
        assert forged.status_code == 403 and local.balance_mc() == 0
        other = accounts.create_account(local.db, "mallory").api_key
        console_sign_in(http, other)  # another account's operator cannot pay it either
        assert "pay_token" not in http.get(f"/checkout/{row.id}").text
        http.cookies.clear()
        console_sign_in(http, accounts.create_key(local.db, local.account_id).api_key)

        page = http.get(f"/checkout/{row.id}")
        assert page.status_code == 200
        assert "TEST MODE" in page.text and "$5.00" in page.text and "bob" in page.text
        assert f'action="/checkout/{row.id}/pay"' in page.text

        paid = http.post(f"/checkout/{row.id}/pay", data={"pay_token": page_token(page.text)})
        assert paid.status_code == 200 and "TEST MODE" in paid.text
        assert "credits were added" in paid.text
        assert local.balance_mc() == 500_000
        assert _memory_status(local.db, mem) == "active"

        repeat = http.post(f"/checkout/{row.id}/pay")
        assert repeat.status_code == 200 and "Already paid" in repeat.text
        assert local.balance_mc() == 500_000 and local.topup_entries() == 1
        assert "Already paid" in http.get(f"/checkout/{row.id}").text

        assert http.get("/checkout/tu_nope").status_code == 404
        # Regression (issue 13): a NUL in the id was a 500 on PostgreSQL.
        for path in ("/checkout/tu_%00", "/checkout/tu_%00/pay"):
            bad = http.get(path) if not path.endswith("pay") else http.post(path)
            assert bad.status_code == 422 and "checkout_id" in bad.text, (path, bad.text)
        assert http.get("/topup/done", params={"session_id": "x"}).status_code == 200
        assert http.get("/topup/cancel").status_code == 200
        # No Stripe configured: the webhook endpoint refuses everything.
        hook = http.post(
            "/webhooks/stripe", content=b"{}", headers={"Stripe-Signature": "t=1,v1=00"}
        )
        assert hook.status_code == 400
    assert pay_local(local.rt, row.id, None) is False
    assert checkout_status(local.rt, row.id).credited is True


def test_local_pay_is_exactly_once_under_concurrency(local: Env) -> None:
    top_up(local.rt, local.account_id, "3.00", "req-1")
    cid = local.row("req-1").id
    barrier = threading.Barrier(6)

    token = issue_pay_token(local.rt, cid)

    def press() -> bool:
        barrier.wait(timeout=10)
        return pay_local(local.rt, cid, token)

    with ThreadPoolExecutor(max_workers=6) as pool:
        results = list(pool.map(lambda _: press(), range(6)))
    assert sum(results) == 1
    assert local.balance_mc() == 300_000 and local.topup_entries() == 1


def test_local_session_expires_and_replay_revives_it(local: Env) -> None:
    top_up(local.rt, local.account_id, "5.00", "req-1")
    cid = local.row("req-1").id
    local.clock.advance(hours=25)
    with httpx.Client(base_url=local.base_url or "") as http:
        assert "expired" in http.get(f"/checkout/{cid}").text
        assert http.post(f"/checkout/{cid}/pay").status_code in (403, 422)
    assert local.balance_mc() == 0
    assert reconcile_payments(local.rt).expired == 1
    assert local.row("req-1").status == "expired"

    again = top_up(local.rt, local.account_id, "5.00", "req-1")
    assert again.checkout_url.endswith(f"/checkout/{cid}")
    row = local.row("req-1")
    assert row.status == "open" and row.idempotency_key.endswith(":2")
    assert pay_local(local.rt, cid, issue_pay_token(local.rt, cid)) is True
    assert local.balance_mc() == 500_000


def test_pay_local_is_refused_with_stripe(env: Env) -> None:
    top_up(env.rt, env.account_id, "5.00", "req-1")
    with pytest.raises(ValidationError):
        pay_local(env.rt, env.row("req-1").id, "anything")
    assert env.balance_mc() == 0


def test_stripe_checkouts_have_no_local_page(web: Env) -> None:
    top_up(web.rt, web.account_id, "5.00", "req-1")
    cid = web.row("req-1").id
    with httpx.Client(base_url=web.base_url or "") as http:
        assert http.get(f"/checkout/{cid}").status_code == 404
        assert http.post(f"/checkout/{cid}/pay").status_code == 404
    assert web.balance_mc() == 0


def test_local_webhook_parse_always_refuses(local: Env) -> None:
    with pytest.raises(InvalidSignature):
        handle_stripe_webhook(local.rt, b"{}", "t=1,v1=00")


# --- issue 13: the Pay action needs the rendered page, not just the link ----------------


def test_local_pay_needs_the_pages_one_time_token(local: Env) -> None:
    """Regression: POSTing the Pay action with the bare checkout link (all the agent
    has) used to credit up to $10,000. Now only the rendered page's token pays, once."""
    result = top_up(local.rt, local.account_id, "10000", "req-1")
    cid = local.row("req-1").id
    with httpx.Client(base_url=local.base_url or "") as http:
        # Even the operator, signed in, pays only with the rendered page's token.
        console_sign_in(http, accounts.create_key(local.db, local.account_id).api_key)
        bare = http.post(f"/checkout/{cid}/pay")
        assert bare.status_code == 401 and "checkout page" in bare.text
        forged = http.post(f"/checkout/{cid}/pay", data={"pay_token": "guess"})
        assert forged.status_code == 401
        assert local.balance_mc() == 0

        first = page_token(http.get(result.checkout_url.removeprefix(PUBLIC)).text)
        second = page_token(http.get(f"/checkout/{cid}").text)
        assert first != second and first not in result.model_dump_json()
        # Rendering the page again replaced the token: the older page is stale.
        assert http.post(f"/checkout/{cid}/pay", data={"pay_token": first}).status_code == 401
        assert local.balance_mc() == 0

        paid = http.post(f"/checkout/{cid}/pay", data={"pay_token": second})
        assert paid.status_code == 200 and "credits were added" in paid.text
        assert local.balance_mc() == 1_000_000_000
    with local.db.read() as s:
        assert s.get(CheckoutSession, cid).pay_token_hash is None  # type: ignore[union-attr]
    # Single use: the token is gone; the checkout is paid, so nothing more is credited.
    assert pay_local(local.rt, cid, second) is False
    assert local.topup_entries() == 1


def test_a_used_token_cannot_pay_a_revived_checkout(local: Env) -> None:
    top_up(local.rt, local.account_id, "5.00", "req-1")
    cid = local.row("req-1").id
    stale = issue_pay_token(local.rt, cid)
    local.clock.advance(hours=25)
    with pytest.raises(ValidationError):
        pay_local(local.rt, cid, stale)  # expired first
    top_up(local.rt, local.account_id, "5.00", "req-1")  # a fresh session, same row
    from walkeep.errors import Unauthorized

    with pytest.raises(Unauthorized):
        pay_local(local.rt, cid, "")
    with pytest.raises(Unauthorized):
        pay_local(local.rt, cid, stale)  # a page of the dead session
    assert local.balance_mc() == 0
    assert pay_local(local.rt, cid, issue_pay_token(local.rt, cid)) is True
    assert local.balance_mc() == 500_000


def test_test_mode_payments_refuse_to_boot_on_real_networks(tmp_path: Path) -> None:
    from walkeep.bootstrap import check_config

    for network in ("testnet", "mainnet"):
        problems = {
            p.setting: p.message
            for p in check_config(Settings(data_dir=tmp_path, network=network, relayer="walrus"))
        }
        assert "STRIPE_SECRET_KEY" in problems, network
    with_stripe = check_config(
        Settings(
            data_dir=tmp_path,
            network="testnet",
            relayer="walrus",
            stripe_secret_key="sk_test_x",
            stripe_webhook_secret="whsec_x",
        )
    )
    assert "STRIPE_SECRET_KEY" not in {p.setting for p in with_stripe}
    assert check_config(Settings(data_dir=tmp_path)) == []
