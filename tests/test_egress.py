"""Issue 29, items 1 and 2: alert webhooks are not an SSRF tool, and one tenant's
receiver cannot stall or bloat everyone's alerts.

Real HTTP receivers on 127.0.0.1 (allowed here the way an operator allows a private
receiver), a fake DNS only where a name must resolve to a chosen address. Every
database test runs on SQLite and PostgreSQL.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from sqlalchemy import select

from walkeep import egress
from walkeep.config import Settings
from walkeep.db.models import AlertDelivery, AlertEvent
from walkeep.errors import ConfigurationError, ValidationError
from walkeep.service import alerts
from walkeep.service.operators import accounts
from walkeep.service.runtime import Runtime

SSRF_URLS = [
    "http://127.0.0.1:5432/",
    "http://[::1]:8080/",
    "http://0.0.0.0:8080/",
    "http://2130706433/",
    "http://0x7f.1/",
    "http://127.1/",
    "http://0177.0.0.1/",
    "http://[::ffff:127.0.0.1]/",
    "http://[::ffff:7f00:1]/",
    "http://[64:ff9b::7f00:1]/",
    "http://[2002:7f00:1::]/",
    "http://10.0.0.1/",
    "http://172.16.5.4/",
    "http://192.168.1.1/",
    "http://100.64.0.1/",
    "http://169.254.169.254/latest/meta-data/",
    "http://[fe80::1]/",
    "http://[fd00:ec2::254]/",
    "http://224.0.0.1/",
    "http://[ff02::1]/",
    "http://[::]/",
    "http://localhost:8080/",
]


@pytest.fixture
def strict(rt: Runtime) -> Runtime:
    """No private receivers at all (the default off the local network)."""
    rt.settings.alert_egress_allow = ""
    return rt


def _acct(rt: Runtime, name: str) -> str:
    return accounts.create_account(rt.db, name, credits_mc=0).account_id


@pytest.mark.parametrize("url", SSRF_URLS)
def test_non_public_receivers_are_refused_at_save_time(strict: Runtime, url: str) -> None:
    acct = _acct(strict, "ssrf")
    with pytest.raises(ValidationError) as info:
        alerts.set_alert_webhook(strict, acct, url)
    assert "refused by policy" in info.value.message
    assert alerts.get_alert_settings(strict, acct) is None


class FakeDNS:
    """``socket.getaddrinfo`` for chosen names: one answer list per lookup (the last
    repeats; ``None``: no such name), each lookup of them counted; other hosts (the test
    receivers' 127.0.0.1) go to the real resolver."""

    def __init__(
        self, monkeypatch: pytest.MonkeyPatch, table: dict[str, list[list[str] | None]]
    ) -> None:
        self.table = table
        self.lookups: list[str] = []
        real = socket.getaddrinfo

        def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
            name = host.decode() if isinstance(host, bytes) else host
            if name not in self.table:
                return real(host, port, *args, **kwargs)
            self.lookups.append(name)
            n = self.lookups.count(name) - 1
            answers = self.table[name]
            answer = answers[min(n, len(answers) - 1)]
            if answer is None:
                raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
            out = []
            for a in answer:
                v6 = ":" in a
                sockaddr = (a, int(port or 0), 0, 0) if v6 else (a, int(port or 0))
                family = socket.AF_INET6 if v6 else socket.AF_INET
                out.append((family, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", sockaddr))
            return out

        monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


INTERNAL_NAMES: dict[str, list[list[str] | None]] = {
    "metadata.google.internal": [["169.254.169.254"]],
    "db.corp.internal": [["10.1.2.3"]],
    # One public and one private answer: refused, not a coin toss.
    "mixed.example": [["93.184.216.34", "10.1.2.3"]],
    "nothere.corp.internal": [None],
}


def test_saving_a_url_is_not_a_dns_oracle_for_internal_names(
    strict: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression (issue 39): a name resolving to a private address was refused when saved
    and a name that does not exist was accepted, so saving told a tenant which internal
    names exist. Now no name is looked up when saved, and every delivery to such a name
    is recorded alike: ``unreachable``, whether it resolved privately or not at all."""
    dns = FakeDNS(monkeypatch, INTERNAL_NAMES)
    outcomes = {}
    for i, name in enumerate(INTERNAL_NAMES):
        acct = _acct(strict, f"oracle-{i}")
        alerts.set_alert_webhook(strict, acct, f"http://{name}/hook")  # accepted, unasked
        assert dns.lookups == []
        alerts.send_test_event(strict, acct)
        outcomes[name] = acct
    report = alerts.deliver_alerts(strict)
    assert report.attempted == len(INTERNAL_NAMES) and report.delivered == 0
    assert sorted(dns.lookups) == sorted(INTERNAL_NAMES)  # once each, at send time
    seen = set()
    for acct in outcomes.values():
        (d,) = _deliveries(strict, acct)
        seen.add((d.ok, d.status_code, d.error, d.outcome))
    assert seen == {(False, None, "unreachable", "unreachable")}


# --- real receivers ---------------------------------------------------------------------


@contextmanager
def serve(handle: Callable[[BaseHTTPRequestHandler], None]) -> Iterator[str]:
    """An HTTP server on 127.0.0.1 whose POST handler is ``handle``; yields its base URL."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            handle(self)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _read_body(h: BaseHTTPRequestHandler) -> bytes:
    return h.rfile.read(int(h.headers.get("Content-Length", "0")))


def _answer(h: BaseHTTPRequestHandler, code: int, extra: dict[str, str] | None = None) -> None:
    h.send_response(code)
    for k, v in (extra or {}).items():
        h.send_header(k, v)
    h.send_header("Content-Length", "0")
    h.end_headers()


class Seen:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests: list[tuple[float, dict[str, str], bytes]] = []

    def handler(self, code: int = 200) -> Callable[[BaseHTTPRequestHandler], None]:
        def handle(h: BaseHTTPRequestHandler) -> None:
            body = _read_body(h)
            with self.lock:
                self.requests.append((time.monotonic(), dict(h.headers.items()), body))
            _answer(h, code)

        return handle


def _deliveries(rt: Runtime, account_id: str) -> list[alerts.DeliveryView]:
    return alerts.recent_deliveries(rt, account_id, limit=50)


def test_the_check_is_repeated_at_send_time_and_refusals_are_coarse(rt: Runtime) -> None:
    """Saved while allowed; by send time the policy refuses it: nothing is sent, and the
    tenant reads ``refused by policy``, not why."""
    seen = Seen()
    with serve(seen.handler()) as base:
        acct = _acct(rt, "later")
        alerts.set_alert_webhook(rt, acct, base + "/hook")  # local profile: loopback allowed
        alerts.send_test_event(rt, acct)
        rt.settings.alert_egress_allow = "none"
        report = alerts.deliver_alerts(rt)
    assert report.attempted == 1 and report.delivered == 0
    assert seen.requests == []
    (d,) = _deliveries(rt, acct)
    assert (d.ok, d.status_code, d.error) == (False, None, "refused by policy")


def test_dns_is_asked_once_and_the_checked_address_is_the_one_connected_to(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DNS rebinding: the second answer for the name is private. The delivery must use
    the first (checked) one and keep the name in Host, not look the name up again."""
    seen = Seen()
    with serve(seen.handler()) as base:
        port = base.rsplit(":", 1)[1]
        dns = FakeDNS(monkeypatch, {"hooks.example": [["127.0.0.1"], ["10.9.9.9"]]})
        rt.settings.alert_egress_allow = "127.0.0.1/32"
        acct = _acct(rt, "pinned")
        alerts.set_alert_webhook(rt, acct, f"http://hooks.example:{port}/hook")
        assert dns.lookups == []  # names are looked up to send, not to save
        alerts.send_test_event(rt, acct)
        report = alerts.deliver_alerts(rt)
        assert report.delivered == 1, _deliveries(rt, acct)
        assert dns.lookups == ["hooks.example"]  # once per delivery
        (_, headers, _) = seen.requests[0]
        assert headers["Host"] == f"hooks.example:{port}"
        # The next delivery resolves again, gets the private answer, and is refused.
        alerts.send_test_event(rt, acct)
        report = alerts.deliver_alerts(rt)
    assert report.delivered == 0 and len(seen.requests) == 1
    assert _deliveries(rt, acct)[0].error == "unreachable"  # as a name that does not resolve


def test_redirects_are_not_followed(rt: Runtime) -> None:
    target = Seen()
    with serve(target.handler()) as elsewhere:

        def redirect(h: BaseHTTPRequestHandler) -> None:
            _read_body(h)
            _answer(h, 307, {"Location": elsewhere + "/x"})

        with serve(redirect) as base:
            acct = _acct(rt, "redirect")
            alerts.set_alert_webhook(rt, acct, base + "/hook")
            alerts.send_test_event(rt, acct)
            assert alerts.deliver_alerts(rt).retrying == 1
    assert target.requests == []
    (d,) = _deliveries(rt, acct)
    assert (d.status_code, d.error) == (307, "HTTP 3xx")


def test_operator_allowlist_names_hosts_and_networks(
    strict: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    acct = _acct(strict, "allowed")
    seen = Seen()
    with serve(seen.handler()) as base:
        port = base.rsplit(":", 1)[1]
        FakeDNS(monkeypatch, {"hooks.corp.example": [["127.0.0.1"]]})
        alerts.set_alert_webhook(strict, acct, f"http://hooks.corp.example:{port}/h")
        alerts.send_test_event(strict, acct)
        assert alerts.deliver_alerts(strict).delivered == 0  # a private answer: not sent
        assert seen.requests == [] and _deliveries(strict, acct)[0].error == "unreachable"
        strict.settings.alert_egress_allow = "hooks.corp.example"
        strict.clock.advance(3600)  # type: ignore[attr-defined]
        assert alerts.deliver_alerts(strict).delivered == 1  # the named host may
        with pytest.raises(ValidationError):  # the name is trusted, not its network
            alerts.set_alert_webhook(strict, acct, "http://127.0.0.1/h")
    strict.settings.alert_egress_allow = "10.20.0.0/16, fd00::/8"
    alerts.set_alert_webhook(strict, acct, "http://10.20.30.41/h")
    alerts.set_alert_webhook(strict, acct, "http://[fd00::5]/h")
    with pytest.raises(ValidationError):
        alerts.set_alert_webhook(strict, acct, "http://10.21.0.1/h")


def test_the_allowlist_setting_is_checked_at_start_and_defaults_by_network() -> None:
    from walkeep.config import load_settings

    with pytest.raises(ConfigurationError) as info:
        load_settings(alert_egress_allow="10.0.0.0/8, not a host/")
    assert "WALKEEP_ALERT_EGRESS_ALLOW" in str(info.value)
    local = Settings(network="local")
    assert local.egress_policy.networks == egress.LOOPBACK
    assert Settings(network="testnet").egress_policy == egress.EgressPolicy()
    assert Settings(network="local", alert_egress_allow="none").egress_policy.networks == ()


# --- one tenant cannot stall or bloat the others -------------------------------------------


def test_a_trickling_receiver_holds_back_only_its_own_account(rt: Runtime) -> None:
    """Regression: deliveries ran one after another with a per-read timeout, so a receiver
    trickling a byte at a time held every later account's alert back (150 s seen)."""
    rt.settings.alert_timeout_seconds = 1.0
    stop = threading.Event()

    def trickle(h: BaseHTTPRequestHandler) -> None:
        _read_body(h)
        h.wfile.write(b"HTTP/1.1 200 OK\r\n")
        for _ in range(60):  # a header byte every 50 ms for up to 3 s: never a full answer
            if stop.wait(0.05):
                return
            try:
                h.wfile.write(b"X")
                h.wfile.flush()
            except OSError:
                return

    fast = Seen()
    with serve(trickle) as slow_url, serve(fast.handler()) as fast_url:
        slow = _acct(rt, "slow")
        quick = _acct(rt, "quick")
        alerts.set_alert_webhook(rt, slow, slow_url + "/hook")
        alerts.set_alert_webhook(rt, quick, fast_url + "/hook")
        alerts.send_test_event(rt, slow)  # claimed first
        rt.clock.advance(1)  # type: ignore[attr-defined]
        alerts.send_test_event(rt, quick)
        started = time.monotonic()
        report = alerts.deliver_alerts(rt)
        elapsed = time.monotonic() - started
        stop.set()
    assert report.attempted == 2 and report.delivered == 1
    (received_at, _, _) = fast.requests[0]
    assert received_at - started < 0.9, "the quick account waited behind the slow one"
    assert elapsed < 2.5, "the slow delivery outlived its total deadline"
    (d,) = _deliveries(rt, slow)
    assert d.error == "timed out" and d.duration_ms < 2000


@contextmanager
def tarpit() -> Iterator[str]:
    """A socket on 127.0.0.1 that accepts every connection and never answers."""
    listener = socket.create_server(("127.0.0.1", 0), backlog=128)
    held: list[socket.socket] = []
    stop = threading.Event()

    def hold() -> None:
        listener.settimeout(0.05)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            held.append(conn)  # read nothing, say nothing

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        listener.close()


def test_many_tarpits_of_one_tenant_do_not_delay_another_accounts_alert(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression (issue 39): 24 receivers that accept and never answer held all 8 slots
    for their whole deadline, three waves in a row, before anyone else's alert went out
    (30 s with the 10-s default). Another account's alert is now delivered within its own
    deadline, long before the tarpits' run out (three 0.2-s slot turns here)."""
    deadline = 3.0
    rt.settings.alert_timeout_seconds = deadline
    monkeypatch.setattr(alerts, "SLOT_SECONDS", 0.2)
    assert rt.settings.alert_concurrency == 8
    fast = Seen()
    with tarpit() as slow_url, serve(fast.handler()) as fast_url:
        tarpits = [_acct(rt, f"tarpit-{i}") for i in range(24)]
        for acct in tarpits:
            alerts.set_alert_webhook(rt, acct, slow_url + "/hook")
            alerts.send_test_event(rt, acct)  # claimed first
        rt.clock.advance(1)  # type: ignore[attr-defined]
        victim = _acct(rt, "victim")
        alerts.set_alert_webhook(rt, victim, fast_url + "/hook")
        alerts.send_test_event(rt, victim)
        started = time.monotonic()
        report = alerts.deliver_alerts(rt)
        elapsed = time.monotonic() - started
    assert (report.attempted, report.delivered) == (25, 1)
    (received_at, _, _) = fast.requests[0]
    assert received_at - started < deadline, (
        f"the victim's alert waited {received_at - started:.1f} s behind the tarpits"
    )
    assert elapsed < 2 * deadline, "the tarpits outlived their deadline"
    assert {_deliveries(rt, a)[0].error for a in tarpits} == {"timed out"}


def test_retries_queue_behind_first_attempts(rt: Runtime) -> None:
    """With one slot, an account whose receiver failed last time waits for an account
    sending its first event, even though its retry fell due earlier."""
    rt.settings.alert_concurrency = 1
    order: list[str] = []

    def handler(name: str, code: int) -> Callable[[BaseHTTPRequestHandler], None]:
        def handle(h: BaseHTTPRequestHandler) -> None:
            _read_body(h)
            order.append(name)
            _answer(h, code)

        return handle

    codes = {"flaky": 500}
    with (
        serve(lambda h: handler("flaky", codes["flaky"])(h)) as flaky_url,
        serve(handler("steady", 200)) as steady_url,
    ):
        flaky, steady = _acct(rt, "flaky"), _acct(rt, "steady")
        alerts.set_alert_webhook(rt, flaky, flaky_url + "/hook")
        alerts.send_test_event(rt, flaky)
        assert alerts.deliver_alerts(rt).retrying == 1  # due again in 30 s
        codes["flaky"] = 200
        rt.clock.advance(31)  # type: ignore[attr-defined]
        alerts.set_alert_webhook(rt, steady, steady_url + "/hook")
        alerts.send_test_event(rt, steady)  # due now, after the retry
        assert alerts.deliver_alerts(rt).delivered == 2
    assert order == ["flaky", "steady", "flaky"]


def test_a_huge_answer_is_not_read(rt: Runtime) -> None:
    """Regression: the whole response body was read (1 GiB took serve to 2.5 GB)."""
    total = 64 * 1024 * 1024
    written = [0]

    def flood(h: BaseHTTPRequestHandler) -> None:
        _read_body(h)
        h.send_response(200)
        h.send_header("Content-Length", str(total))
        h.end_headers()
        chunk = b"\0" * 65536
        try:
            while written[0] < total:
                h.wfile.write(chunk)
                written[0] += len(chunk)
        except OSError:
            return

    with serve(flood) as base:
        acct = _acct(rt, "flood")
        alerts.set_alert_webhook(rt, acct, base + "/hook")
        alerts.send_test_event(rt, acct)
        assert alerts.deliver_alerts(rt).delivered == 1
    # What the kernel's socket buffers took before the connection closed, not 64 MiB.
    assert written[0] < 16 * 1024 * 1024


def test_a_failing_receiver_backs_off_its_whole_account(rt: Runtime) -> None:
    failing = Seen()
    with serve(failing.handler(500)) as base:
        acct = _acct(rt, "down")
        alerts.set_alert_webhook(rt, acct, base + "/hook")
        for _ in range(3):
            alerts.send_test_event(rt, acct)
            rt.clock.advance(1)  # type: ignore[attr-defined]
        report = alerts.deliver_alerts(rt)
        assert (report.attempted, report.retrying) == (1, 1)  # not three in a row
        assert len(failing.requests) == 1
        assert alerts.deliver_alerts(rt).attempted == 0  # all three wait out the back-off
        now = rt.clock.now()
        with rt.db.read() as s:
            waits = s.scalars(select(AlertEvent.next_attempt_at)).all()
        assert all(w >= now + _seconds(29) for w in waits)
        rt.clock.advance(30)  # type: ignore[attr-defined]
        assert alerts.deliver_alerts(rt).attempted == 1


def _seconds(n: int) -> Any:
    from datetime import timedelta

    return timedelta(seconds=n)


def test_old_rows_with_exception_text_are_shown_coarsely(rt: Runtime) -> None:
    acct = _acct(rt, "legacy")
    seen = Seen()
    with serve(seen.handler()) as base:
        alerts.set_alert_webhook(rt, acct, base + "/hook")
        event_id = alerts.send_test_event(rt, acct)
    with rt.db.begin() as s:
        s.add(
            AlertDelivery(
                event_id=event_id,
                account_id=acct,
                url="http://127.0.0.1:5432/",
                attempt=1,
                status_code=None,
                error="ConnectError: [Errno 111] Connection refused",
                duration_ms=1,
                attempted_at=rt.clock.now(),
            )
        )
    (d,) = _deliveries(rt, acct)
    assert d.error == "unreachable"


# --- the policy itself, without a database ---------------------------------------------------


@pytest.mark.parametrize(
    "host,address",
    [
        ("2130706433", "127.0.0.1"),
        ("0x7f.1", "127.0.0.1"),
        ("127.1", "127.0.0.1"),
        ("0177.0.0.1", "127.0.0.1"),
        ("0x7f000001", "127.0.0.1"),
        ("[::ffff:127.0.0.1]", "::ffff:7f00:1"),
        ("example.com", None),
        ("cafe", None),
    ],
)
def test_odd_ipv4_spellings_are_read_as_addresses(host: str, address: str | None) -> None:
    got = egress.literal_ip(host)
    assert (str(got) if got is not None else None) == address


def test_embedded_ipv4_is_unwrapped_and_public_addresses_pass() -> None:
    policy = egress.EgressPolicy()
    for public in ("93.184.216.34", "2606:4700::1111", "::ffff:93.184.216.34"):
        assert egress.is_public(ipaddress.ip_address(public))
        policy.check("x", [ipaddress.ip_address(public)])
    with pytest.raises(egress.EgressRefused):
        policy.check("x", [])
    loop = egress.EgressPolicy.parse("loopback")
    assert loop.check("x", [ipaddress.ip_address("::ffff:127.0.0.1")]) == (
        ipaddress.ip_address("127.0.0.1")
    )


def test_start_up_says_where_alert_webhooks_may_go(tmp_path: Any) -> None:
    from walkeep.cli.serve import serve_banner

    def banner(**kw: Any) -> str:
        settings = Settings(data_dir=tmp_path, **kw)
        return serve_banner(
            settings, host="127.0.0.1", port=8080, network="x", storage="y", first_run_text=None
        )

    local = banner(network="local")
    assert "Alert egress" in local and "127.0.0.0/8" in local and "local network" in local
    assert "webhooks may reach public addresses only" in banner(network="testnet")
    assert "10.0.0.0/8 (WALKEEP_ALERT_EGRESS_ALLOW)" in banner(
        network="testnet", alert_egress_allow="10.0.0.0/8"
    )
