"""End to end: the real MCP Python client against uvicorn on 127.0.0.1, and over stdio.

Covers every tool, every error code and the spec's flows (seeds/walkeep-tool-reference.txt).
"""

from __future__ import annotations

import json
import os
import re
import socket
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import httpx2
import pytest
import uvicorn
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from tests.helpers import console_sign_in
from walkeep.api.app import create_app
from walkeep.bootstrap import build_runtime
from walkeep.service.operators import accounts
from walkeep.service.runtime import Runtime

TOOLS = {"store", "recall", "check_runway", "check_balance", "top_up", "forget", "export"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """uvicorn in a thread; the public URL is fixed before the runtime is built."""

    def __init__(self, settings, clock, db) -> None:  # type: ignore[no-untyped-def]
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        settings.public_url = self.url
        self.rt = build_runtime(settings, clock=clock, database=db, with_completer=True)
        app = create_app(self.rt)
        self.server = uvicorn.Server(
            uvicorn.Config(
                app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="on"
            )
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> Server:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture
def live(settings, clock, db) -> Iterator[Server]:  # type: ignore[no-untyped-def]
    with Server(settings, clock, db) as srv:
        yield srv


@asynccontextmanager
async def mcp_client(srv: Server, key: str, mode: str = "auto"):  # type: ignore[no-untyped-def]
    async with (
        httpx2.AsyncClient(
            headers={"Authorization": f"Bearer {key}"}, timeout=httpx2.Timeout(30, read=60)
        ) as http,
        Client(streamable_http_client(f"{srv.url}/mcp", http_client=http), mode=mode) as c,
    ):  # type: ignore[arg-type]
        yield c


def sc(result: Any) -> dict[str, Any]:
    assert result.structured_content is not None, result
    return dict(result.structured_content)


async def call_ok(c: Any, tool: str, args: dict[str, Any] | None = None) -> dict[str, Any]:
    r = await c.call_tool(tool, args or {})
    assert not r.is_error, sc(r)
    return sc(r)


async def call_err(c: Any, tool: str, args: dict[str, Any], code: str) -> dict[str, Any]:
    r = await c.call_tool(tool, args)
    assert r.is_error, sc(r)
    body = sc(r)
    assert body["code"] == code, body
    assert set(body) == {"code", "message", "data"}
    assert json.loads(r.content[0].text) == body  # the text mirrors the envelope
    assert "Traceback" not in body["message"]
    return body


def wait_landed(rt: Runtime) -> None:
    assert rt.completer is not None and rt.completer.wait_idle(30), "completion did not finish"


def test_tool_list_schemas_and_annotations(live: Server) -> None:
    key = accounts.create_account(live.rt.db, "a").api_key

    async def go() -> None:
        async with mcp_client(live, key) as c:
            tools = {t.name: t for t in (await c.list_tools()).tools}
            assert set(tools) == TOOLS
            hints = {
                n: (
                    t.annotations.read_only_hint,
                    t.annotations.destructive_hint,
                    t.annotations.idempotent_hint,
                )
                for n, t in tools.items()
            }
            assert (
                hints["recall"][0]
                and hints["check_runway"][0]
                and hints["check_balance"][0]
                and hints["export"][0]
            )
            assert not hints["store"][0] and not hints["top_up"][0] and not hints["forget"][0]
            assert hints["forget"] == (False, True, True) and hints["top_up"][2] is True
            for t in tools.values():
                a = t.annotations
                assert None not in (
                    a.read_only_hint,
                    a.destructive_hint,
                    a.idempotent_hint,
                    a.open_world_hint,
                )
                assert t.description and len(t.description) > 80
                branches = t.output_schema["anyOf"]
                assert {"$ref": "#/$defs/WalkeepError"} in branches
            limit = tools["recall"].input_schema["properties"]["limit"]
            assert (limit["minimum"], limit["maximum"], limit["default"]) == (1, 50, 5)
            assert set(tools["store"].input_schema["required"]) == {"content", "request_id"}
            assert all(t.input_schema["additionalProperties"] is False for t in tools.values())

    anyio.run(go)


def test_the_store_flow_end_to_end(live: Server) -> None:
    rt = live.rt
    created = accounts.create_account(rt.db, "flow", credits_mc=100_000)

    async def go() -> None:
        async with mcp_client(live, created.api_key) as c:
            first = await call_ok(
                c, "store", {"content": "User prefers dark mode", "request_id": "req-42"}
            )
            assert first["status"] == "storing" and first["memory_id"].startswith("mem_")
            assert first["namespace"] == "default" and first["cost_credits"] == 1
            again = await call_ok(
                c, "store", {"content": "User prefers dark mode", "request_id": "req-42"}
            )
            assert again["memory_id"] == first["memory_id"]
            await anyio.to_thread.run_sync(wait_landed, rt)
            landed = await call_ok(
                c, "store", {"content": "User prefers dark mode", "request_id": "req-42"}
            )
            assert landed["status"] == "stored" and landed["memory_id"] == first["memory_id"]

            receipt = await call_ok(c, "check_runway", {"memory_id": first["memory_id"]})
            m = receipt["memories"][0]
            assert (
                m["status"] == "active" and m["runway_epochs"] == 5 and m["last_renewal_tx"] is None
            )

            hits = (await call_ok(c, "recall", {"query": "what theme does the user like?"}))[
                "results"
            ]
            assert hits[0]["content"] == "User prefers dark mode"
            assert (hits[0]["memory_id"], hits[0]["namespace"], hits[0]["metadata"]) == (
                first["memory_id"],
                "default",
                {},
            )
            by_blob = await call_ok(c, "check_runway", {"memory_id": hits[0]["blob_id"]})
            assert by_blob["memories"][0]["memory_id"] == first["memory_id"]

            exported = await call_ok(c, "export", {})
            assert exported["content_included"] is True and len(exported["memories"]) == 1
            assert exported["memories"][0]["metadata"] == {}
            bal = await call_ok(c, "check_balance")
            assert bal["balance_credits"] == 99 and bal["balance_usd"] == 0.99

            gone = await call_ok(c, "forget", {"memory_id": first["memory_id"], "request_id": "f1"})
            assert gone["status"] == "no-renew" and "no hard delete" in gone["note"]
            assert (await call_ok(c, "recall", {"query": "what theme does the user like?"}))[
                "results"
            ] == []
            summary = await call_ok(c, "check_runway", {})
            assert summary["account"]["no_renew"] == 1

        async with httpx.AsyncClient() as h:
            text = (await h.get(f"{live.url}/metrics")).text
        line = next(
            ln
            for ln in text.splitlines()
            if ln.startswith("walkeep_tool_calls_total{")
            and 'tool="store"' in ln
            and 'outcome="ok"' in ln
        )
        assert float(line.rsplit(" ", 1)[1]) >= 3
        assert 'walkeep_tool_latency_seconds_count{tool="recall",transport="http"}' in text

    anyio.run(go)


def test_insufficient_balance_then_top_up_then_replay(live: Server) -> None:
    rt = live.rt
    created = accounts.create_account(rt.db, "broke")

    async def go() -> None:
        async with mcp_client(live, created.api_key) as c:
            err = await call_err(
                c,
                "store",
                {"content": "remember this", "request_id": "r-1"},
                "INSUFFICIENT_BALANCE",
            )
            assert err["data"]["top_up"]["tool"] == "top_up"
            amount = err["data"]["top_up"]["arguments"]["amount_usd"]
            link = await call_ok(c, "top_up", {"amount_usd": amount, "request_id": "t-1"})
            assert link["checkout_url"].startswith(live.url + "/checkout/")
            same = await call_ok(c, "top_up", {"amount_usd": amount, "request_id": "t-1"})
            assert same["checkout_url"] == link["checkout_url"]
            # The human operator signs in to the console and pays on the local TEST MODE
            # checkout page (twice: credited once). The agent's link alone cannot pay.
            with httpx.Client(base_url=live.url) as h:
                path = link["checkout_url"].removeprefix(live.url)
                assert "pay_token" not in h.get(path).text
                console_sign_in(h, created.api_key)
                page = h.get(path)
                assert "TEST MODE" in page.text
                token = re.search(r'name="pay_token" value="([^"]+)"', page.text)
                assert token is not None
                for _ in range(2):
                    paid = h.post(path + "/pay", data={"pay_token": token.group(1)})
                    assert paid.status_code == 200
            assert (await call_ok(c, "check_balance"))["balance_credits"] == amount * 100
            replay = await call_ok(c, "store", {"content": "remember this", "request_id": "r-1"})
            assert replay["status"] == "storing"

    anyio.run(go)


def test_every_error_code(live: Server) -> None:
    rt = live.rt
    a = accounts.create_account(rt.db, "errs", credits_mc=100_000)
    b = accounts.create_account(rt.db, "other", credits_mc=100_000)

    async def go() -> None:
        async with mcp_client(live, b.api_key) as cb:
            theirs = await call_ok(
                cb, "store", {"content": "bob's private note", "request_id": "b1"}
            )
        await anyio.to_thread.run_sync(wait_landed, rt)
        async with mcp_client(live, a.api_key) as c:
            big = "x" * (256 * 1024 + 1)
            q = await call_err(c, "store", {"content": big, "request_id": "big"}, "QUOTA_EXCEEDED")
            assert q["data"]["limit_bytes"] == 256 * 1024
            await call_err(c, "check_runway", {"memory_id": theirs["memory_id"]}, "NOT_FOUND")
            await call_err(
                c, "forget", {"memory_id": theirs["memory_id"], "request_id": "f"}, "NOT_FOUND"
            )
            v = await call_err(c, "recall", {"query": "x", "limit": 0}, "VALIDATION_ERROR")
            assert v["data"]["errors"][0]["loc"] == "limit"
            await call_err(c, "store", {"request_id": "r"}, "VALIDATION_ERROR")
            u = await call_err(c, "no_such_tool", {}, "VALIDATION_ERROR")
            assert "store" in u["data"]["tools"]
            # A misspelled argument is never silently ignored: nothing is stored.
            typo = await call_err(
                c,
                "store",
                {"content": "x", "request_id": "typo", "namspace": "w"},
                "VALIDATION_ERROR",
            )
            assert typo["data"] == {"field": "namspace", "unknown": ["namspace"]}
            await call_err(c, "recall", {"query": "x", "limitt": 3}, "VALIDATION_ERROR")
            await call_err(c, "check_runway", {"request_id": "r"}, "VALIDATION_ERROR")
            await call_ok(c, "store", {"content": "one", "request_id": "dup"})
            await call_err(c, "store", {"content": "two", "request_id": "dup"}, "VALIDATION_ERROR")
            await call_err(c, "top_up", {"amount_usd": 0.49, "request_id": "t"}, "VALIDATION_ERROR")

            rt.extras["faults"].unreachable = True
            rt.relayer.invalidate_health()  # type: ignore[attr-defined]
            await call_err(
                c,
                "store",
                {"content": "during an outage", "request_id": "o1"},
                "RELAYER_UNAVAILABLE",
            )
            rt.extras["faults"].unreachable = False
            rt.relayer.invalidate_health()  # type: ignore[attr-defined]

            original = rt.relayer.search
            rt.relayer.search = lambda *a, **k: (_ for _ in ()).throw(
                RuntimeError("secret internal detail")
            )  # type: ignore[method-assign]
            try:
                crash = await call_err(c, "recall", {"query": "anything"}, "INTERNAL")
                assert "secret" not in crash["message"]
            finally:
                rt.relayer.search = original  # type: ignore[method-assign]

    anyio.run(go)


def test_a_renewal_digest_resolves_in_the_local_explorer(live: Server, clock) -> None:  # type: ignore[no-untyped-def]
    from walkeep.service.jobs import renew

    rt = live.rt
    created = accounts.create_account(rt.db, "auditor", credits_mc=10_000)

    async def go() -> None:
        async with mcp_client(live, created.api_key) as c:
            mid = (await call_ok(c, "store", {"content": "audit me", "request_id": "a1"}))[
                "memory_id"
            ]
            await anyio.to_thread.run_sync(wait_landed, rt)
            clock.advance(rt.chain.epoch_info().duration_seconds * 3)
            report = await anyio.to_thread.run_sync(renew.renew, rt)
            assert report.transactions == 1
            m = (await call_ok(c, "check_runway", {"memory_id": mid}))["memories"][0]
            assert m["renewals_performed"] == 1 and m["last_renewal_tx"]
            async with httpx.AsyncClient() as h:
                page = await h.get(m["last_renewal_url"])
                data = (await h.get(m["last_renewal_url"], params={"format": "json"})).json()
            assert page.status_code == 200 and m["last_renewal_tx"] in page.text
            assert "network: local" in page.text.lower()
            assert data["network"] == "local" and data["digest"] == m["last_renewal_tx"]
            assert data["calls"][0]["new_end_epoch"] == m["end_epoch"]

    anyio.run(go)


def test_legacy_protocol_clients_work_too(live: Server) -> None:
    key = accounts.create_account(live.rt.db, "legacy", credits_mc=5000).api_key

    async def go() -> None:
        async with mcp_client(live, key, mode="legacy") as c:
            bal = await call_ok(c, "check_balance")
            assert bal["balance_credits"] == 5
            await call_err(c, "check_runway", {"memory_id": "mem_nope"}, "NOT_FOUND")

    anyio.run(go)


def test_http_auth_and_rest_mirror(live: Server) -> None:
    created = accounts.create_account(live.rt.db, "rest", credits_mc=10_000)
    with httpx.Client(base_url=live.url, timeout=30) as h:
        r = h.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
        assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer")
        assert r.json()["error"]["data"]["code"] == "UNAUTHORIZED"
        bad = h.get("/v1/check_balance", headers={"Authorization": "Bearer wk_live_nope"})
        assert bad.status_code == 401 and bad.json()["code"] == "UNAUTHORIZED"
        auth = {"Authorization": f"Bearer {created.api_key}"}
        stored = h.post("/v1/store", json={"content": "via REST", "request_id": "x1"}, headers=auth)
        assert stored.status_code == 200 and stored.json()["status"] == "storing"
        assert (
            h.get("/v1/check_runway", params={"memory_id": "mem_nope"}, headers=auth).status_code
            == 404
        )
        v = h.post("/v1/recall", json={"query": "x", "limit": 99}, headers=auth)
        assert v.status_code == 422 and v.json()["code"] == "VALIDATION_ERROR"
        # Misspelled arguments are refused, in a body and in a query string alike.
        typo = h.post("/v1/recall", json={"query": "x", "limitt": 3}, headers=auth)
        assert typo.status_code == 422 and typo.json()["code"] == "VALIDATION_ERROR"
        for path, params in (
            ("/v1/check_runway", {"memroy_id": "mem_nope"}),
            ("/v1/export", {"namspace": "w"}),
            ("/v1/check_balance", {"x": "1"}),
        ):
            q = h.get(path, params=params, headers=auth)
            assert q.status_code == 422, (path, q.text)
            assert q.json()["data"] == {"field": next(iter(params)), "unknown": [*params]}
        ok = h.get("/v1/export", params={"limit": 1}, headers=auth)
        assert ok.status_code == 200
        broke = accounts.create_account(live.rt.db, "rest-broke").api_key
        p = h.post(
            "/v1/store",
            json={"content": "c", "request_id": "y"},
            headers={"Authorization": f"Bearer {broke}"},
        )
        assert p.status_code == 402 and p.json()["code"] == "INSUFFICIENT_BALANCE"
        assert h.get("/healthz").json()["status"] == "ok"
        ready = h.get("/readyz").json()
        assert ready["ready"] is True and ready["writes"] == "ok"
        assert ready["checks"]["embedder"]["model"]
        assert h.get("/docs").status_code == 200
        assert "/v1/store" in h.get("/openapi.json").json()["paths"]


def test_stdio_transport(settings, db, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    created = accounts.create_account(db, "stdio", credits_mc=5000)
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "WALKEEP_DATA_DIR": str(settings.data_dir),
        "WALKEEP_DATABASE_URL": settings.database_url,
        "WALKEEP_MASTER_KEY": settings.master_key,
        "WALKEEP_API_KEY": created.api_key,
        "WALKEEP_LOCAL_WRITE_LATENCY_MS": "0",
    }
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "walkeep.cli", "mcp", "--namespace", "work"], env=env
    )

    async def go() -> None:
        async with Client(params) as c:  # type: ignore[arg-type]
            assert {t.name for t in (await c.list_tools()).tools} == TOOLS
            bal = await call_ok(c, "check_balance")
            assert bal["balance_credits"] == 5
            stored = await call_ok(
                c, "store", {"content": "written over stdio", "request_id": "s1"}
            )
            assert stored["status"] == "storing" and stored["namespace"] == "work"
            explicit = await call_ok(
                c, "store", {"content": "explicit ns", "request_id": "s2", "namespace": "mine"}
            )
            assert explicit["namespace"] == "mine"
            await call_err(c, "check_runway", {"memory_id": "mem_nope"}, "NOT_FOUND")

    anyio.run(go)


def test_top_up_through_mcp_with_stripe_is_credited_once_by_webhook(settings, clock, db) -> None:  # type: ignore[no-untyped-def]
    from fakes.stripe_checkout import FakeStripe

    secret = "whsec_e2e_test"
    with FakeStripe("sk_test_e2e", clock=clock.time, webhook_secret=secret) as fake:
        settings.stripe_secret_key = "sk_test_e2e"
        settings.stripe_webhook_secret = secret
        settings.stripe_api_base = fake.url
        with Server(settings, clock, db) as srv:
            assert srv.rt.payments.provider == "stripe"
            fake.webhook_url = f"{srv.url}/webhooks/stripe"
            key = accounts.create_account(db, "payer").api_key

            async def go() -> None:
                async with mcp_client(srv, key) as c:
                    assert (await call_ok(c, "check_balance"))["balance_credits"] == 0
                    fake.outage = "500"  # Stripe down: typed error, nothing final recorded
                    down = await call_err(
                        c, "top_up", {"amount_usd": 5, "request_id": "t-1"}, "PAYMENTS_UNAVAILABLE"
                    )
                    assert "same request_id" in down["message"]
                    fake.outage = None
                    link = await call_ok(c, "top_up", {"amount_usd": 5, "request_id": "t-1"})
                    again = await call_ok(c, "top_up", {"amount_usd": 5, "request_id": "t-1"})
                    assert again["checkout_url"] == link["checkout_url"]
                    assert fake.sessions_created == 1 and link["amount_usd"] == 5.0
                    (session_id,) = fake.sessions
                    events = await anyio.to_thread.run_sync(lambda: fake.complete(session_id))
                    for _ in range(5):  # Stripe delivers at least once: duplicates change nothing
                        for ev in events:
                            await anyio.to_thread.run_sync(lambda ev=ev: fake.deliver(ev))
                    assert all(d.status == 200 for _, d in fake.deliveries)
                    bal = await call_ok(c, "check_balance")
                    assert bal["balance_credits"] == 500 and bal["balance_usd"] == 5.0
                    tampered = await anyio.to_thread.run_sync(
                        lambda: fake.deliver(events[0], tamper=True)
                    )
                    assert tampered.status == 400
                    assert (await call_ok(c, "check_balance"))["balance_credits"] == 500

            anyio.run(go)


def test_stdio_notices_a_revoked_key_within_the_cache_ttl(rt: Runtime) -> None:
    """Regression (issue 13): a running `walkeep mcp` checked its key only at start, so a
    revoked key kept working until the host restarted it. Same server as `walkeep mcp`,
    in-process through the official client, with the key cache's clock moved by hand."""
    from walkeep.api.auth import CACHE_TTL_SECONDS, KeyCache
    from walkeep.errors import ConfigurationError
    from walkeep.mcp.stdio import build_stdio_mcp

    created = accounts.create_account(rt.db, "stdio-revoke", credits_mc=5000)
    now = [1000.0]
    server = build_stdio_mcp(
        rt, created.api_key, "work", keys=KeyCache(rt, monotonic=lambda: now[0])
    )

    async def go() -> None:
        async with Client(server) as c:
            assert (await call_ok(c, "check_balance"))["balance_credits"] == 5
            stored = await call_ok(c, "store", {"content": "before", "request_id": "s1"})
            assert stored["namespace"] == "work"
            accounts.revoke_key(rt.db, created.key_prefix)
            now[0] += CACHE_TTL_SECONDS + 0.001
            denied = await call_err(c, "check_balance", {}, "UNAUTHORIZED")
            assert "revoked" in denied["message"]
            await call_err(c, "store", {"content": "after", "request_id": "s2"}, "UNAUTHORIZED")

    anyio.run(go)
    with pytest.raises(ConfigurationError, match="refused"):
        build_stdio_mcp(rt, created.api_key, None)
