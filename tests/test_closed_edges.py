"""Issue 29: closed edges — what unauthenticated callers, logs and /mcp errors reveal.

Each test here failed before its fix; they run on SQLite and PostgreSQL.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import anyio
import httpx
import pytest
from mcp.shared.exceptions import MCPError

from tests.test_mcp_e2e import Server, mcp_client
from walkeep.api.app import readiness
from walkeep.backends.base import Health
from walkeep.db import Database
from walkeep.logs import JsonFormatter, TextFormatter
from walkeep.mcp import bridge
from walkeep.service.operators import accounts
from walkeep.service.runtime import Runtime

ACCEPT = "application/json, text/event-stream"

DRIVER_TEXT = (
    'connection to server at "db.internal" (10.1.2.3), port 5433 failed: FATAL: password '
    'authentication failed for user "walkeep_admin"'
)
SECRETS = ("db.internal", "10.1.2.3", "5433", "walkeep_admin", "password")


def test_readyz_gives_coarse_backend_and_chain_states_and_logs_the_detail(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Regression: ``checks.backend.detail`` carried the driver's text (host, port, user)."""
    monkeypatch.setattr(rt.relayer, "health", lambda: Health(False, "paused", DRIVER_TEXT))
    with caplog.at_level(logging.WARNING):
        report = readiness(rt)
    text = json.dumps(report)
    assert report["checks"]["backend"] == {  # type: ignore[index]
        "ok": False,
        "name": rt.relayer.name,
        "writes": "paused",
    }
    for secret in SECRETS:
        assert secret not in text
    assert any(DRIVER_TEXT in r.getMessage() for r in caplog.records)  # the operator's copy

    def boom() -> Health:
        raise OSError(DRIVER_TEXT)

    def chain_down() -> int:
        raise OSError(DRIVER_TEXT)

    monkeypatch.setattr(rt.relayer, "health", boom)
    monkeypatch.setattr(rt.chain, "current_epoch", chain_down)
    report = readiness(rt)
    text = json.dumps(report)
    assert report["ready"] is False
    assert report["checks"]["backend"]["error"] == "unreachable"  # type: ignore[index]
    assert report["checks"]["chain"]["error"] == "unreachable"  # type: ignore[index]
    for secret in SECRETS:
        assert secret not in text


# --- /mcp answers failures outside the tools as JSON-RPC errors ----------------------------

DOWN_URL = "postgresql+psycopg://walkeep_user:s3cret@127.0.0.1:1/walkeep_secret_db"
RPC = {"jsonrpc": "2.0", "id": 7, "method": "tools/list"}


@pytest.fixture
def live(settings, clock, db) -> Iterator[Server]:  # type: ignore[no-untyped-def]
    with Server(settings, clock, db) as srv:
        yield srv


async def _refusal(live: Server, key: str) -> MCPError:
    """The MCPError the official client raises (the SDK may wrap it in groups)."""
    try:
        async with mcp_client(live, key) as c:
            await c.list_tools()
    except BaseException as exc:  # the SDK may wrap it in exception groups
        found: list[MCPError] = []

        def walk(e: BaseException) -> None:
            if isinstance(e, MCPError):
                found.append(e)
            for inner in getattr(e, "exceptions", ()):
                walk(inner)
            if e.__context__ is not None and not found:
                walk(e.__context__)

        walk(exc)
        assert found, exc
        return found[0]
    raise AssertionError("the client was not refused")


def test_mcp_during_a_database_outage_is_503_with_a_typed_jsonrpc_error(live: Server) -> None:
    """Regression: the API-key lookup in front of the MCP app raised past every handler,
    and an uncached key got a bare 500 with an empty body."""
    key = accounts.create_account(live.rt.db, "outage", credits_mc=1000).api_key
    real_db = live.rt.db
    live.rt.db = Database(DOWN_URL, connect_args={"connect_timeout": 2})
    try:
        r = httpx.post(
            f"{live.url}/mcp",
            json=RPC,
            headers={"Authorization": f"Bearer {key}", "Accept": ACCEPT},
            timeout=30,
        )
        assert r.status_code == 503, r.text
        assert r.headers["retry-after"] == "5"
        body = r.json()
        assert body["jsonrpc"] == "2.0" and "id" in body
        assert body["error"]["data"]["code"] == "SERVICE_UNAVAILABLE"
        assert body["error"]["data"]["data"] == {"retry": True}
        for secret in ("walkeep_user", "s3cret", "walkeep_secret_db"):
            assert secret not in r.text

        async def official_client() -> None:
            err = await _refusal(live, key)
            assert "database is unreachable" in str(err)
            assert err.error.data["code"] == "SERVICE_UNAVAILABLE"

        anyio.run(official_client)
    finally:
        live.rt.db.dispose()
        live.rt.db = real_db


def test_the_official_mcp_client_reads_why_its_key_was_refused(live: Server) -> None:
    """Issue 30 item 6: the SDK surfaces only JSON-RPC error objects; a 401 with the REST
    envelope reached the agent as "Server returned an error response"."""

    async def go() -> None:
        err = await _refusal(live, "wk_live_" + "x" * 43)
        assert "not accepted" in str(err) and "walkeep key create" in str(err)
        assert err.error.data["code"] == "UNAUTHORIZED"

    anyio.run(go)
    r = httpx.post(f"{live.url}/mcp", json=RPC, headers={"Accept": ACCEPT}, timeout=30)
    assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer")
    # The stdio bridge (walkeep mcp --url) reads the same answer and prints its message.
    refused = bridge.probe(f"{live.url}/mcp", "wk_live_nope")
    assert refused is not None and refused["code"] == "UNAUTHORIZED"
    assert "not accepted" in bridge.refused_message(f"{live.url}/mcp", refused)


# --- secrets stay out of logs ---------------------------------------------------------------


def test_one_time_console_links_are_not_logged_in_clear(
    live: Server, caplog: pytest.LogCaptureFixture
) -> None:
    """Regression: the access log wrote /console/link/wkc_… (a redeemable token) at info."""
    from walkeep.service.operators import console as console_service

    created = accounts.create_account(live.rt.db, "linked", credits_mc=0)
    token, _ = console_service.create_console_link(live.rt.db, created.account_id, minutes=15)
    with caplog.at_level(logging.INFO, logger="walkeep.access"):
        r = httpx.get(f"{live.url}/console/link/{token}", timeout=10)
        httpx.get(f"{live.url}/console/link/wkc_{'q' * 40}", timeout=10)
    assert r.status_code < 500
    lines = [rec for rec in caplog.records if rec.name == "walkeep.access"]
    assert any("/console/link/" in rec.getMessage() for rec in lines)
    formatted = [JsonFormatter().format(rec) for rec in lines]
    for rec, line in zip(lines, formatted, strict=True):
        assert token not in rec.getMessage() and token not in str(rec.path)  # type: ignore[attr-defined]
        assert token not in line and "q" * 40 not in line


def test_every_log_line_is_redacted_whatever_logged_it() -> None:
    key = "wk_live_" + "A1b2" * 11
    try:
        raise RuntimeError(f"connect postgresql+psycopg://u:hunter2@db/x with {key}")
    except RuntimeError:
        import sys

        exc_info = sys.exc_info()
    record = logging.LogRecord(
        "some.library", logging.ERROR, __file__, 1, "refused %s", (key,), exc_info
    )
    record.authorization = "Bearer " + key
    record.secret = "whsec_" + "z" * 40
    for formatter in (JsonFormatter(), TextFormatter()):
        line = formatter.format(record)
        assert key not in line and "hunter2" not in line and "z" * 40 not in line, line
        assert "refused wk_live_" in line  # still says what it was


def test_first_run_key_is_not_printed_when_the_output_is_not_a_terminal(
    settings: Any, db: Database
) -> None:
    from walkeep.cli.serve import first_run
    from walkeep.onboarding import credentials_path

    banner = first_run(settings, db, show_key=False)
    assert banner is not None
    path = credentials_path(settings)
    key = json.loads(path.read_text())["api_key"]
    assert key.startswith("wk_") and key not in banner
    assert str(path) in banner and "not a terminal" in banner


# --- pages: no framing, no caching of tokens, no redirects from the Host header -------------


def test_pages_refuse_framing_and_caching(live: Server) -> None:
    """Regression: checkout, /topup/done, the explorer and /docs could be framed
    (clickjacking the Pay button) and cached with their tokens."""
    from walkeep.service.tools import topup

    acct = accounts.create_account(live.rt.db, "framed", credits_mc=0).account_id
    checkout = topup.top_up(live.rt, acct, "5.00", "frame-1").checkout_url
    cid = checkout.rsplit("/", 1)[1]
    address = live.rt.chain.owner_address()
    with httpx.Client(base_url=live.url, timeout=10) as h:
        for path in (
            f"/checkout/{cid}",
            f"/topup/done?checkout_id={cid}",
            f"/explorer/address/{address}",
            "/docs",
            "/",
            "/console/login",
        ):
            r = h.get(path)
            assert r.headers["content-type"].startswith("text/html"), path
            assert r.headers["x-frame-options"] == "DENY", path
            assert "frame-ancestors 'none'" in r.headers["content-security-policy"], path
            assert r.headers["cache-control"] == "no-store", path


def test_redirects_are_never_built_from_the_host_header(live: Server) -> None:
    """Regression: ``GET /console/`` with ``Host: evil.example`` redirected there."""
    with httpx.Client(base_url=live.url, timeout=10) as h:
        r = h.get("/console/", headers={"Host": "evil.example"}, follow_redirects=False)
        assert r.status_code in (301, 302, 303, 307, 308)
        assert r.headers["location"] == "/console"
        for path in ("/docs/", "/v1/check_balance/", "/explorer/tx/x/"):
            other = h.get(path, headers={"Host": "evil.example"}, follow_redirects=False)
            assert "evil.example" not in other.headers.get("location", ""), path
