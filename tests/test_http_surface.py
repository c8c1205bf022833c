"""Issue 13: the HTTP/tool surface — bounded work per key, typed outage errors,
honest 405s, request ids, offline docs, paged export, namespace defaults.

Real uvicorn on a free port and the official MCP client, on SQLite or PostgreSQL.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import anyio
import httpx
import pytest
from helpers import account, land_all
from test_mcp_e2e import Server, call_ok, mcp_client, sc

from walkeep.db import Database
from walkeep.errors import ValidationError
from walkeep.mcp.server import TEXT_INLINE_MAX
from walkeep.service.operators import accounts
from walkeep.service.runtime import Runtime
from walkeep.service.tools import export, recall, store


@pytest.fixture
def live(settings, clock, db) -> Iterator[Server]:  # type: ignore[no-untyped-def]
    with Server(settings, clock, db) as srv:
        yield srv


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


# --- 405s --------------------------------------------------------------------------------


def test_get_mcp_is_405_with_allow_instead_of_an_endless_stream(live: Server) -> None:
    """Regression: GET /mcp opened an event stream that never ended (1,000 held 1,053 fds)."""
    key = accounts.create_account(live.rt.db, "sse").api_key
    for method in ("GET", "DELETE"):
        r = httpx.request(
            method,
            f"{live.url}/mcp",
            headers={**_auth(key), "Accept": "text/event-stream"},
            timeout=5,
        )
        assert r.status_code == 405, r.text
        assert r.headers["allow"] == "POST"
        assert r.json()["code"] == "VALIDATION_ERROR" and r.json()["data"]["allow"] == ["POST"]


def test_rest_405_names_the_allowed_methods(live: Server) -> None:
    r = httpx.post(f"{live.url}/v1/check_balance", timeout=5)
    assert r.status_code == 405 and r.headers["allow"] == "GET"
    assert set(r.json()) == {"code", "message", "data"}


def test_empty_memory_id_is_a_documented_422(live: Server) -> None:
    key = accounts.create_account(live.rt.db, "rest").api_key
    r = httpx.get(
        f"{live.url}/v1/check_runway", params={"memory_id": ""}, headers=_auth(key), timeout=5
    )
    assert r.status_code == 422 and r.json()["code"] == "VALIDATION_ERROR"
    spec = httpx.get(f"{live.url}/openapi.json", timeout=5).json()
    param = spec["paths"]["/v1/check_runway"]["get"]["parameters"][0]
    assert param["name"] == "memory_id"
    assert param["schema"]["anyOf"][0]["minLength"] == 1


# --- request ids and the access log ------------------------------------------------------


def test_request_id_in_and_out_and_one_access_line(
    live: Server, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG, logger="walkeep.access"):
        mine = httpx.get(f"{live.url}/healthz", headers={"X-Request-Id": "trace-42.a"}, timeout=5)
        fresh = httpx.get(f"{live.url}/healthz", timeout=5)
        junk = httpx.get(f"{live.url}/healthz", headers={"X-Request-Id": "a b\tc"}, timeout=5)
        unauth = httpx.get(f"{live.url}/v1/check_balance", timeout=5)
    assert mine.headers["x-request-id"] == "trace-42.a"
    assert len(fresh.headers["x-request-id"]) == 24
    assert junk.headers["x-request-id"] != "a b\tc" and len(junk.headers["x-request-id"]) == 24
    assert unauth.status_code == 401 and unauth.headers["x-request-id"]
    lines = [r for r in caplog.records if r.name == "walkeep.access"]
    by_id = {getattr(r, "request_id", None): r for r in lines}
    line = by_id["trace-42.a"]
    assert (line.method, line.path, line.status) == ("GET", "/healthz", 200)  # type: ignore[attr-defined]
    assert line.levelno == logging.DEBUG  # a probe: logged, but below INFO
    denied = by_id[unauth.headers["x-request-id"]]
    assert denied.status == 401 and denied.levelno == logging.INFO  # type: ignore[attr-defined]


def test_rest_access_lines_name_the_calling_account(
    live: Server, caplog: pytest.LogCaptureFixture
) -> None:
    """An operator reading the access log can tell which tenant a REST call came from, as
    for MCP: the line carries the account id (never the key)."""
    created = accounts.create_account(live.rt.db, "logged")
    with caplog.at_level(logging.INFO, logger="walkeep.access"):
        r = httpx.get(f"{live.url}/v1/check_balance", headers=_auth(created.api_key), timeout=5)
    assert r.status_code == 200
    line = next(
        x
        for x in caplog.records
        if x.name == "walkeep.access"
        and getattr(x, "request_id", None) == r.headers["x-request-id"]
    )
    assert line.account_id == created.account_id  # type: ignore[attr-defined]


# --- /docs works offline -----------------------------------------------------------------


def test_docs_are_served_from_the_package_not_a_cdn(live: Server) -> None:
    page = httpx.get(f"{live.url}/docs", timeout=5)
    assert page.status_code == 200
    assert "/docs/assets/swagger-ui-bundle.js" in page.text
    assert "cdn" not in page.text.lower() and "https://" not in page.text.replace(
        "https://fastapi", ""
    )
    js = httpx.get(f"{live.url}/docs/assets/swagger-ui-bundle.js", timeout=5)
    assert js.status_code == 200 and len(js.content) > 100_000
    assert httpx.get(f"{live.url}/docs/assets/swagger-ui.css", timeout=5).status_code == 200


# --- a database outage is a typed, retryable error ----------------------------------------

DOWN_URL = "postgresql+psycopg://walkeep_user:s3cret@127.0.0.1:1/walkeep_secret_db"


def test_database_outage_is_service_unavailable_and_readyz_hides_the_url(live: Server) -> None:
    created = accounts.create_account(live.rt.db, "outage", credits_mc=10_000)
    real_db = live.rt.db

    async def go() -> None:
        async with mcp_client(live, created.api_key) as c:
            await call_ok(c, "check_balance")  # the key is now cached
            live.rt.db = Database(DOWN_URL, connect_args={"connect_timeout": 2})
            try:
                r = await c.call_tool("check_balance", {})
                body = sc(r)
                assert r.is_error and body["code"] == "SERVICE_UNAVAILABLE", body
                assert body["data"]["retry"] is True
                with httpx.Client(base_url=live.url, timeout=10) as h:
                    rest = h.get("/v1/check_balance", headers=_auth(created.api_key))
                    assert rest.status_code == 503 and rest.headers["retry-after"]
                    assert rest.json()["code"] == "SERVICE_UNAVAILABLE"
                    assert rest.json()["data"] == {"retry": True}
                    ready = h.get("/readyz")
                    assert ready.status_code == 503
                    assert ready.json()["checks"]["database"]["ok"] is False
                    assert ready.json()["checks"]["database"]["error"] == "unreachable"
                    for secret in ("walkeep_user", "s3cret", "127.0.0.1", "walkeep_secret_db"):
                        assert secret not in ready.text
            finally:
                live.rt.db.dispose()
                live.rt.db = real_db

    anyio.run(go)


# --- per-key rate limits ---------------------------------------------------------------------


def test_rate_limit_per_account_and_tool_on_rest_and_mcp(live: Server) -> None:
    live.rt.settings.rate_limits = {"check_balance": 2}  # 2 per minute, burst 2
    a = accounts.create_account(live.rt.db, "hasty", credits_mc=10_000).api_key
    b = accounts.create_account(live.rt.db, "calm", credits_mc=10_000).api_key
    with httpx.Client(base_url=live.url, timeout=10) as h:
        assert [h.get("/v1/check_balance", headers=_auth(a)).status_code for _ in range(2)] == [
            200,
            200,
        ]
        limited = h.get("/v1/check_balance", headers=_auth(a))
        assert limited.status_code == 429 and limited.headers["retry-after"] == "30"
        assert limited.json()["code"] == "RATE_LIMITED"
        assert limited.json()["data"]["retry_after_seconds"] == 30
        # Another tool and another account have their own buckets.
        assert h.get("/v1/check_runway", headers=_auth(a)).status_code == 200
        assert h.get("/v1/check_balance", headers=_auth(b)).status_code == 200
        live.rt.clock.advance(seconds=30)  # type: ignore[attr-defined]
        assert h.get("/v1/check_balance", headers=_auth(a)).status_code == 200
        assert h.get("/v1/check_balance", headers=_auth(a)).status_code == 429

    third = accounts.create_account(live.rt.db, "mcp", credits_mc=10_000).api_key

    async def go() -> None:
        async with mcp_client(live, third) as c:
            await call_ok(c, "check_balance")
            await call_ok(c, "check_balance")
            r = await c.call_tool("check_balance", {})
            body = sc(r)
            assert r.is_error and body["code"] == "RATE_LIMITED"
            assert 1 <= body["data"]["retry_after_seconds"] <= 30

    anyio.run(go)


# --- export: paged, tamper-safe cursors, no duplicated text --------------------------------


def _stored(rt: Runtime, a: str, content: str, rid: str, **kw: Any) -> str:
    mid = store.store(rt, a, content=content, request_id=rid, **kw).memory_id
    land_all(rt)
    return mid


def _all_pages(rt: Runtime, a: str, **kw: Any) -> list[list[str]]:
    pages: list[list[str]] = []
    cursor = None
    while True:
        res = export.export(rt, a, cursor=cursor, **kw)
        pages.append([m.memory_id for m in res.memories])
        cursor = res.next_cursor
        if cursor is None:
            return pages


def test_export_pages_by_count_and_bytes_and_resumes_exactly(rt: Runtime) -> None:
    a = account(rt, credits=1000)
    stored = {_stored(rt, a, f"fact number {i} " + "x" * 1000, f"r{i}") for i in range(7)}
    everything = export.export(rt, a)
    ids = [m.memory_id for m in everything.memories]  # (stored_at, memory_id) order
    assert set(ids) == stored and everything.next_cursor is None
    pages = _all_pages(rt, a, limit=3)
    assert [len(p) for p in pages] == [3, 3, 1]
    assert [i for p in pages for i in p] == ids
    # A byte budget smaller than one memory still makes progress: one per page.
    rt.settings.export_page_max_bytes = 1500
    assert [len(p) for p in _all_pages(rt, a)] == [1] * 7
    rt.settings.export_page_max_bytes = 2500
    assert [len(p) for p in _all_pages(rt, a)] == [2, 2, 2, 1]
    # Keyset: a memory stored between pages shows up once, at the end.
    rt.settings.export_page_max_bytes = 4 * 1024 * 1024
    first = export.export(rt, a, limit=4)
    rt.clock.advance(seconds=1)  # type: ignore[attr-defined]
    late = _stored(rt, a, "stored while paging", "late")
    rest = _all_pages(rt, a, limit=4)
    assert late in rest[-1]
    following = export.export(rt, a, limit=100, cursor=first.next_cursor)
    assert [m.memory_id for m in following.memories] == [*ids[4:], late]


def test_export_cursor_is_opaque_and_bound_to_account_and_namespace(rt: Runtime) -> None:
    a, b = account(rt), account(rt)
    for i in range(3):
        _stored(rt, a, f"a{i}", f"r{i}", namespace="ns")
    cursor = export.export(rt, a, namespace="ns", limit=1).next_cursor
    assert cursor is not None and "mem_" not in cursor
    assert len(export.export(rt, a, namespace="ns", limit=1, cursor=cursor).memories) == 1
    head, _, tag = cursor.partition(".")

    def flip(text: str) -> str:  # the first base64 character carries six full bits
        return ("B" if text[0] == "A" else "A") + text[1:]

    for bad in (f"{flip(head)}.{tag}", f"{head}.{flip(tag)}", head, "x.y", ".", "!" * 600):
        with pytest.raises(ValidationError):
            export.export(rt, a, namespace="ns", cursor=bad)
    with pytest.raises(ValidationError):
        export.export(rt, b, namespace="ns", cursor=cursor)  # another account
    with pytest.raises(ValidationError):
        export.export(rt, a, namespace="other", cursor=cursor)  # another namespace
    with pytest.raises(ValidationError):
        export.export(rt, a, limit=0)


def test_mcp_export_is_paged_and_large_results_are_not_repeated_as_text(live: Server) -> None:
    created = accounts.create_account(live.rt.db, "exporter", credits_mc=100_000)
    rt = live.rt
    for i in range(5):
        store.store(rt, created.account_id, content=f"{i}" + "y" * 8000, request_id=f"e{i}")
    assert rt.completer is not None and rt.completer.wait_idle(30)

    async def go() -> None:
        async with mcp_client(live, created.api_key) as c:
            tools = {t.name: t for t in (await c.list_tools()).tools}
            for name in ("recall", "export"):
                desc = tools[name].input_schema["properties"]["namespace"]["description"]
                assert "every namespace" in desc, desc
            assert (
                '"default"' in tools["store"].input_schema["properties"]["namespace"]["description"]
            )
            assert "next_cursor" in tools["export"].description

            big = await c.call_tool("export", {})
            body = sc(big)
            assert len(body["memories"]) == 5 and body["next_cursor"] is None
            text = big.content[0].text
            assert len(json.dumps(body)) > TEXT_INLINE_MAX
            assert len(text) < 1000 and "structuredContent" in text and "y" * 100 not in text

            page = await c.call_tool("export", {"limit": 2})
            first = sc(page)
            assert len(first["memories"]) == 2 and first["next_cursor"]
            rest = sc(await c.call_tool("export", {"cursor": first["next_cursor"], "limit": 10}))
            ids = [m["memory_id"] for m in first["memories"] + rest["memories"]]
            assert ids == [m["memory_id"] for m in body["memories"]]

            small = await c.call_tool("check_balance", {})
            assert json.loads(small.content[0].text) == sc(small)  # small results: full JSON

    anyio.run(go)


# --- namespace defaults: tool argument > configured default > every namespace -------------


def test_recall_and_export_namespace_defaults(rt: Runtime) -> None:
    a = account(rt)
    _stored(rt, a, "The office cat is called Miso.", "r1", namespace="home")
    _stored(rt, a, "The office dog is called Rex.", "r2", namespace="work")
    # No namespace configured: every namespace (what the tool description now says).
    assert len(recall.recall(rt, a, query="office pets", limit=5).results) == 2
    assert {m.namespace for m in export.export(rt, a).memories} == {"home", "work"}
    # A namespace (explicit, or the configured default the transports pass): only it.
    only = recall.recall(rt, a, query="office pets", namespace="work", limit=5).results
    assert [h.content for h in only] == ["The office dog is called Rex."]
    assert {m.namespace for m in export.export(rt, a, namespace="home").memories} == {"home"}


def test_a_value_the_database_cannot_hold_is_a_validation_error(live: Server) -> None:
    """Regression (PostgreSQL): a NUL in an identifier was a 500/INTERNAL from psycopg."""
    key = accounts.create_account(live.rt.db, "nul", credits_mc=10_000).api_key
    r = httpx.post(
        f"{live.url}/v1/forget",
        json={"memory_id": "\x00A", "request_id": "f1"},
        headers=_auth(key),
        timeout=10,
    )
    assert r.status_code == 422 and r.json()["code"] == "VALIDATION_ERROR"

    async def go() -> None:
        async with mcp_client(live, key) as c:
            res = await c.call_tool("forget", {"memory_id": "\x00A", "request_id": "f2"})
            body = sc(res)
            # Refused alike on both databases (never INTERNAL), naming the field.
            assert res.is_error and body["code"] == "VALIDATION_ERROR", body
            assert body["data"]["field"] == "memory_id", body

    anyio.run(go)
