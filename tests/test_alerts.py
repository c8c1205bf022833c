"""Alerts: an outbox written with each state change, delivered to a real HTTP receiver."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from tests.helpers import epoch_seconds, land_all
from walkeep.clock import ManualClock
from walkeep.config import Settings
from walkeep.db.models import AlertEvent, Memory
from walkeep.errors import NotFound, ValidationError
from walkeep.service import alerts
from walkeep.service.jobs import renew
from walkeep.service.operators import accounts
from walkeep.service.runtime import Runtime
from walkeep.service.tools import store, topup


@dataclass
class Receiver:
    """A real webhook receiver on a free port; answers 500 the first ``fail_first`` times
    it sees each event id, 200 afterwards."""

    fail_first: int = 0
    requests: list[tuple[dict[str, str], bytes]] = field(default_factory=list)
    seen: dict[str, int] = field(default_factory=dict)
    url: str = ""

    def bodies(self, *, ok_only: bool = True) -> list[dict[str, Any]]:
        out = []
        for headers, body in self.requests:
            event = json.loads(body)
            if not ok_only or headers.get("x-answered") == "200":
                out.append(event)
        return out


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    rec = Receiver()
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            event_id = json.loads(body)["id"]
            with lock:
                n = rec.seen.get(event_id, 0) + 1
                rec.seen[event_id] = n
                code = 500 if n <= rec.fail_first else 200
                headers = {k.lower(): v for k, v in self.headers.items()}
                headers["x-answered"] = str(code)
                rec.requests.append((headers, body))
            self.send_response(code)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    rec.url = f"http://127.0.0.1:{server.server_address[1]}/hooks/walkeep"
    yield rec
    server.shutdown()
    server.server_close()


def verify_signature(secret: str, header: str, body: bytes) -> bool:
    """What the README tells receivers to do."""
    parts = dict(p.split("=", 1) for p in header.split(","))
    expected = hmac.new(secret.encode(), f"{parts['t']}.".encode() + body, hashlib.sha256)
    return hmac.compare_digest(expected.hexdigest(), parts["v1"])


def _deliver_until_quiet(rt: Runtime, clock: ManualClock, rounds: int = 10) -> None:
    """Run the job, moving the clock past each back-off, until nothing is pending."""
    for _ in range(rounds):
        alerts.deliver_alerts(rt)
        with rt.db.read() as s:
            pending = s.scalars(
                select(AlertEvent.next_attempt_at).where(AlertEvent.status == "pending")
            ).all()
        if not pending:
            return
        clock.set(max(clock.now(), max(pending)))
    raise AssertionError("events still pending")


def _types(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in events]


@pytest.mark.parametrize("fail_first", [0, 2])
def test_low_then_paused_then_resumed_each_delivered_once_and_signed(
    rt: Runtime, clock: ManualClock, receiver: Receiver, fail_first: int
) -> None:
    receiver.fail_first = fail_first
    # 1 credit for the store + 400 mc: a tiny blob costs 63 mc per epoch to renew,
    # so 6 epochs are funded after the store (above the default threshold of 4).
    acct = accounts.create_account(rt.db, "alerted", credits_mc=1400).account_id
    secret = alerts.set_alert_webhook(rt, acct, receiver.url)
    assert secret.startswith("whsec_")
    store.store(rt, acct, content="keep me alive", request_id="r1")
    land_all(rt)

    _deliver_until_quiet(rt, clock)
    assert receiver.requests == []  # funded for 6 epochs: nothing to say

    step = epoch_seconds(rt) * 3
    clock.advance(step)
    assert renew.renew(rt).transactions == 1  # 189 mc spent: 211 left = 3 epochs < 4
    _deliver_until_quiet(rt, clock)
    assert _types(receiver.bodies()) == ["balance.low"]

    clock.advance(step)
    renew.renew(rt)  # 22 mc left: still low, no second balance.low
    _deliver_until_quiet(rt, clock)
    clock.advance(step)
    report = renew.renew(rt)
    assert report.paused_memories == 1 and report.transactions == 0
    _deliver_until_quiet(rt, clock)
    assert _types(receiver.bodies()) == ["balance.low", "memories.paused"]

    url = topup.top_up(rt, acct, "5.00", "pay-1").checkout_url
    cid = url.rsplit("/", 1)[1]
    assert topup.pay_local(rt, cid, topup.issue_pay_token(rt, cid)) is True
    _deliver_until_quiet(rt, clock)  # also re-arms balance.low (well funded now)

    events = receiver.bodies()
    assert sorted(_types(events)) == sorted(
        ["balance.low", "memories.paused", "topup.credited", "memories.resumed"]
    )
    assert len({e["id"] for e in events}) == len(events)  # each exactly once when accepted
    paused = next(e for e in events if e["type"] == "memories.paused")
    assert paused["account_id"] == acct and paused["data"]["paused_memories"] == 1
    low = next(e for e in events if e["type"] == "balance.low")
    assert low["data"]["funded_runway_epochs"] == 3 and low["data"]["threshold_epochs"] == 4
    # Every request (retries included) is signed over exactly the bytes sent.
    for headers, body in receiver.requests:
        assert verify_signature(secret, headers["walkeep-signature"], body)
        assert headers["walkeep-event-id"] == json.loads(body)["id"]
        assert not verify_signature("whsec_wrong", headers["walkeep-signature"], body)
    # A receiver that answered 500 twice saw each event three times, same bytes each time.
    assert len(receiver.requests) == len(events) * (fail_first + 1)
    by_id: dict[str, set[bytes]] = {}
    for _h, body in receiver.requests:
        by_id.setdefault(json.loads(body)["id"], set()).add(body)
    assert all(len(bodies) == 1 for bodies in by_id.values())

    log = alerts.recent_deliveries(rt, acct, limit=50)
    assert len(log) == len(receiver.requests)
    assert sum(d.ok for d in log) == len(events)
    assert all(d.status_code == 500 and d.error == "HTTP 5xx" for d in log if not d.ok)
    view = alerts.get_alert_settings(rt, acct)
    assert view is not None and view.pending_events == 0 and view.balance_low is False


def test_backoff_is_driven_by_the_clock_and_capped(
    rt: Runtime, clock: ManualClock, receiver: Receiver
) -> None:
    receiver.fail_first = 3
    acct = accounts.create_account(rt.db, "retry", credits_mc=0).account_id
    alerts.set_alert_webhook(rt, acct, receiver.url)
    event_id = alerts.send_test_event(rt, acct)
    assert alerts.deliver_alerts(rt).retrying == 1
    # Not due again until the back-off has passed: no sleeping, the clock decides.
    assert alerts.deliver_alerts(rt).attempted == 0
    clock.advance(29)
    assert alerts.deliver_alerts(rt).attempted == 0
    clock.advance(1)
    assert alerts.deliver_alerts(rt).retrying == 1  # second failure: next in 60 s
    clock.advance(59)
    assert alerts.deliver_alerts(rt).attempted == 0
    clock.advance(1)
    assert alerts.deliver_alerts(rt).retrying == 1
    clock.advance(120)
    assert alerts.deliver_alerts(rt).delivered == 1
    assert receiver.seen == {event_id: 4}
    assert [alerts.backoff_seconds(n, 3600) for n in (1, 2, 3, 8, 30)] == [
        30,
        60,
        120,
        3600,
        3600,
    ]


def test_unreachable_receiver_is_recorded_and_eventually_given_up(
    rt: Runtime, clock: ManualClock
) -> None:
    rt.settings.alert_max_attempts = 3
    acct = accounts.create_account(rt.db, "gone", credits_mc=0).account_id
    alerts.set_alert_webhook(rt, acct, "http://127.0.0.1:9/nobody-listens")
    alerts.send_test_event(rt, acct)
    for _ in range(3):
        alerts.deliver_alerts(rt)
        clock.advance(3600)
    with rt.db.read() as s:
        assert s.scalar(select(AlertEvent.status)) == "failed"
    log = alerts.recent_deliveries(rt, acct)
    assert [d.attempt for d in log] == [3, 2, 1]
    # Coarse, never the exception text (issue 29: the outcome is not a port scanner).
    assert all(d.status_code is None and d.error == "unreachable" for d in log)


def test_a_refused_renewal_emits_renewal_failed_once(
    rt: Runtime, clock: ManualClock, receiver: Receiver
) -> None:
    acct = accounts.create_account(rt.db, "refused", credits_mc=50_000).account_id
    alerts.set_alert_webhook(rt, acct, receiver.url)
    store.store(rt, acct, content="renew me", request_id="r1")
    land_all(rt)
    clock.advance(epoch_seconds(rt) * 3)
    rt.extras["faults"].fail_next_extends = 1
    report = renew.renew(rt)
    assert report.failed_transactions == 1
    _deliver_until_quiet(rt, clock)
    (failed,) = receiver.bodies()
    assert failed["type"] == "renewal.failed" and "fault injected" in failed["data"]["reason"]
    assert len(failed["data"]["blobs"]) == 1 and failed["data"]["digest"]
    clock.advance(120)  # past the renewal's back-off
    assert renew.renew(rt).transactions == 1  # renews now; no new event
    _deliver_until_quiet(rt, clock)
    assert _types(receiver.bodies()) == ["renewal.failed"]


def test_a_sender_that_dies_before_recording_is_retried_after_the_lease(
    rt: Runtime, clock: ManualClock, receiver: Receiver
) -> None:
    acct = accounts.create_account(rt.db, "lease", credits_mc=0).account_id
    alerts.set_alert_webhook(rt, acct, receiver.url)
    event_id = alerts.send_test_event(rt, acct)
    (claimed,) = alerts._claim(rt, 10, None)  # a worker took it, then died before sending
    assert claimed.event_id == event_id
    assert alerts.deliver_alerts(rt).attempted == 0  # leased: nobody else sends it meanwhile
    clock.advance(alerts.LEASE_SECONDS)
    assert alerts.deliver_alerts(rt).delivered == 1  # at least once
    assert receiver.seen == {event_id: 1}


def test_removing_the_webhook_drops_pending_events(rt: Runtime, receiver: Receiver) -> None:
    acct = accounts.create_account(rt.db, "remove", credits_mc=0).account_id
    alerts.set_alert_webhook(rt, acct, receiver.url)
    alerts.send_test_event(rt, acct)
    assert alerts.remove_alert_webhook(rt, acct) == 1
    assert alerts.get_alert_settings(rt, acct) is None
    assert alerts.deliver_alerts(rt).attempted == 0 and receiver.requests == []
    with rt.db.begin() as s:  # no webhook: state changes emit nothing any more
        assert alerts.emit(s, acct, "memories.paused", {}) is None
    with pytest.raises(NotFound):
        alerts.remove_alert_webhook(rt, acct)


def test_concurrent_checks_fire_balance_low_once(rt: Runtime, receiver: Receiver) -> None:
    """Several workers evaluating the same crossing at once (PostgreSQL: the settings row
    lock) still produce one event."""
    acct = accounts.create_account(rt.db, "racy", credits_mc=1100).account_id
    alerts.set_alert_webhook(rt, acct, receiver.url)
    store.store(rt, acct, content="one memory", request_id="r1")
    land_all(rt)  # 100 mc left for 63 mc per epoch: 1 epoch funded, below 4
    barrier = threading.Barrier(4)
    fired: list[int] = []

    def check() -> None:
        barrier.wait(timeout=10)
        fired.append(alerts.check_low_balances(rt))

    threads = [threading.Thread(target=check) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sorted(fired) == [0, 0, 0, 1]
    with rt.db.read() as s:
        assert s.scalars(select(AlertEvent.type)).all() == ["balance.low"]


def test_no_webhook_no_events_and_a_rolled_back_change_emits_nothing(
    rt: Runtime, receiver: Receiver
) -> None:
    quiet = accounts.create_account(rt.db, "quiet", credits_mc=0).account_id
    with rt.db.begin() as s:
        assert alerts.emit(s, quiet, "memories.paused", {}) is None
    acct = accounts.create_account(rt.db, "loud", credits_mc=0).account_id
    alerts.set_alert_webhook(rt, acct, receiver.url)
    with pytest.raises(RuntimeError), rt.db.begin() as s:
        alerts.emit(s, acct, "memories.paused", {"paused_memories": 1})
        raise RuntimeError("the pause failed to commit")
    with rt.db.read() as s:
        assert s.scalars(select(AlertEvent.id)).all() == []


@pytest.mark.parametrize(
    "url",
    [
        "ftp://example.com/hook",
        "https://user:pw@example.com/hook",
        "https://token@example.com/hook",
        "example.com/hook",
        "https:///nohost",
        "https://exa mple.com/",
        "http://example.com:99999/",
        "",
        "https://example.com/" + "a" * 2000,
    ],
)
def test_bad_urls_are_refused(rt: Runtime, url: str) -> None:
    acct = accounts.create_account(rt.db, "bad-url", credits_mc=0).account_id
    with pytest.raises(ValidationError):
        alerts.set_alert_webhook(rt, acct, url)
    assert alerts.get_alert_settings(rt, acct) is None


def test_settings_threshold_secret_rotation_and_unknown_account(
    rt: Runtime, receiver: Receiver
) -> None:
    acct = accounts.create_account(rt.db, "cfg", credits_mc=0).account_id
    first = alerts.set_alert_webhook(rt, acct, receiver.url, threshold_epochs=7)
    view = alerts.get_alert_settings(rt, acct)
    assert view is not None and view.threshold_epochs == 7 and view.url == receiver.url
    assert view.secret_hint.endswith(first[-4:]) and first not in repr(view)
    second = alerts.set_alert_webhook(rt, acct, receiver.url + "?v=2")
    view = alerts.get_alert_settings(rt, acct)
    assert second != first and view is not None and view.threshold_epochs == 7
    for bad in (0, 53, "4", True):
        with pytest.raises(ValidationError):
            alerts.set_alert_webhook(rt, acct, receiver.url, threshold_epochs=bad)  # type: ignore[arg-type]
    with pytest.raises(NotFound):
        alerts.set_alert_webhook(rt, "acct_nope", receiver.url)
    with pytest.raises(NotFound):
        alerts.send_test_event(rt, accounts.create_account(rt.db, "x").account_id)


def test_cli_set_show_and_test_against_a_real_receiver(
    rt: Runtime, settings: Settings, receiver: Receiver, tmp_path: Path
) -> None:
    accounts.create_account(rt.db, "cli-alerts", credits_mc=0)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("WALKEEP_", "STRIPE_"))},
        "HOME": str(tmp_path),
        "WALKEEP_DATA_DIR": str(settings.data_dir),
        "WALKEEP_DATABASE_URL": settings.db_url,
        "WALKEEP_MASTER_KEY": settings.master_key or "",
    }

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "walkeep.cli", "alerts", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    bad = cli("set", "--account", "cli-alerts", "--url", "https://u:p@example.com/h")
    assert bad.returncode == 1 and "credentials" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
    made = cli(
        "set", "--account", "cli-alerts", "--url", receiver.url, "--threshold-epochs", "6", "--json"
    )
    assert made.returncode == 0, made.stderr
    secret = json.loads(made.stdout)["secret"]
    sent = cli("test", "--account", "cli-alerts", "--json")
    assert sent.returncode == 0, sent.stderr
    assert json.loads(sent.stdout)["status_code"] == 200
    headers, body = receiver.requests[-1]
    assert json.loads(body)["type"] == "alert.test"
    assert verify_signature(secret, headers["walkeep-signature"], body)
    shown = cli("show", "--account", "cli-alerts", "--json")
    assert shown.returncode == 0, shown.stderr
    data = json.loads(shown.stdout)
    assert secret not in shown.stdout and data["secret_hint"].endswith(secret[-4:])
    assert data["threshold_epochs"] == 6 and data["deliveries"][0]["ok"] is True
    removed = cli("remove", "--account", "cli-alerts")
    assert removed.returncode == 0 and "removed" in removed.stdout
    assert cli("show", "--account", "cli-alerts").returncode == 1


def test_the_documented_verification_snippet_accepts_a_real_delivery(
    rt: Runtime, receiver: Receiver
) -> None:
    readme = (Path(__file__).resolve().parents[1] / "docs" / "operators.md").read_text()
    start = readme.index("import hashlib, hmac, time")
    namespace: dict[str, Any] = {}
    exec(readme[start : readme.index("```", start)], namespace)
    acct = accounts.create_account(rt.db, "readme", credits_mc=0).account_id
    secret = alerts.set_alert_webhook(rt, acct, receiver.url)
    alerts.send_test_event(rt, acct)
    assert alerts.deliver_alerts(rt).delivered == 1
    headers, body = receiver.requests[-1]
    # The test clock is days away from the wall clock: disable the age check here.
    assert namespace["verify"](secret, headers["walkeep-signature"], body, tolerance=10**9)
    assert not namespace["verify"](secret, headers["walkeep-signature"], body + b" ", 10**9)


def test_lapsed_memories_are_not_resumed_and_their_lapse_is_alerted(
    rt: Runtime, clock: ManualClock, receiver: Receiver
) -> None:
    """Regression (issue 30): memories lapsed one epoch after a pause; a top-up then sent
    `memories.resumed {resumed_memories: 5}` while check_runway showed all five expired,
    and nothing ever said they had lapsed. Export listed them too, unlike recall."""
    from walkeep.service.jobs import sweep
    from walkeep.service.tools import export, forget, runway

    acct = accounts.create_account(rt.db, "lapsing", credits_mc=4000).account_id
    alerts.set_alert_webhook(rt, acct, receiver.url)
    mids = [
        store.store(rt, acct, content=f"fact {i}", request_id=f"r{i}").memory_id for i in range(4)
    ]
    land_all(rt)
    forget.forget(rt, acct, memory_id=mids[3], request_id="f3")  # lapses by choice
    paid = sorted(mids[:3])
    step = epoch_seconds(rt)
    clock.advance(step * 3)  # runway 2: due, and nothing left to pay with
    assert renew.renew(rt).paused_memories == 3
    clock.advance(step * 2)  # runway 0: the blobs are gone; the sweep has not run yet
    assert {m.status for m in runway.check_runway(rt, acct).memories} == {"expired"}
    assert export.export(rt, acct).memories == []  # as recall: lapsed memories are gone

    url = topup.top_up(rt, acct, "5.00", "pay-1").checkout_url
    cid = url.rsplit("/", 1)[1]
    assert topup.pay_local(rt, cid, topup.issue_pay_token(rt, cid)) is True
    with rt.db.read() as s:
        queued = s.scalars(select(AlertEvent.type).where(AlertEvent.account_id == acct)).all()
        statuses = set(s.scalars(select(Memory.status).where(Memory.id.in_(paid))))
    assert "memories.resumed" not in queued and statuses == {"paused"}  # nothing resumed
    assert renew.resume_eligible(rt) == 0
    summary = runway.check_runway(rt, acct).account
    assert summary is not None and summary.active == 0

    report = sweep.sweep(rt)
    assert report.expired_memories == 4 and report.lapsed_paid_memories == 3
    assert sweep.sweep(rt).lapsed_paid_memories == 0  # once
    _deliver_until_quiet(rt, clock)
    events = receiver.bodies()
    assert "memories.resumed" not in _types(events)
    (expired,) = [e for e in events if e["type"] == "memories.expired"]
    assert expired["account_id"] == acct
    assert expired["data"]["expired_memories"] == 3 and expired["data"]["memory_ids"] == paid
    assert "gone from Walrus" in expired["data"]["note"]


def test_signing_secrets_are_sealed_at_rest(rt: Runtime, receiver: Receiver) -> None:
    """Issue 29: the signing secret sat in the database in clear, so a dump was enough to
    forge webhooks receivers trust; content keys were already wrapped, these were not."""
    from walkeep.crypto import DecryptionError
    from walkeep.db.models import AlertSettings

    acct = accounts.create_account(rt.db, "sealed", credits_mc=0).account_id
    other = accounts.create_account(rt.db, "other", credits_mc=0).account_id
    secret = alerts.set_alert_webhook(rt, acct, receiver.url)
    alerts.set_alert_webhook(rt, other, receiver.url)
    with rt.db.read() as s:
        stored = s.scalar(select(AlertSettings.secret).where(AlertSettings.account_id == acct))
    assert stored is not None and secret not in stored and secret[6:] not in stored
    assert stored.startswith("enc1:") and len(stored) <= 100
    alerts.send_test_event(rt, acct)
    assert alerts.deliver_alerts(rt).delivered == 1
    headers, body = receiver.requests[-1]
    assert verify_signature(secret, headers["walkeep-signature"], body)
    view = alerts.get_alert_settings(rt, acct)
    assert view is not None and view.secret_hint.endswith(secret[-4:])
    # Bound to its account: a sealed value copied to another row does not open there.
    with rt.db.begin() as s:
        s.get(AlertSettings, other).secret = stored  # type: ignore[union-attr]
    with pytest.raises(DecryptionError):
        alerts.get_alert_settings(rt, other)
    # A secret stored in clear before sealing keeps working until it is set again.
    with rt.db.begin() as s:
        s.get(AlertSettings, other).secret = "whsec_legacy-plain"  # type: ignore[union-attr]
    alerts.send_test_event(rt, other)
    assert alerts.deliver_alerts(rt).delivered == 1
    headers, body = receiver.requests[-1]
    assert verify_signature("whsec_legacy-plain", headers["walkeep-signature"], body)
