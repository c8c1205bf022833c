"""Identifiers and text the databases refuse: one VALIDATION_ERROR on SQLite and PostgreSQL.

Regression (issue 13): a NUL in request_id, namespace, memory_id or a top-up request id
answered INTERNAL/500 on PostgreSQL (and logged the SQL with its parameters) while SQLite
stored it. Driven through the real MCP client and the REST mirror over HTTP.
"""

from __future__ import annotations

import unicodedata
from typing import Any

import anyio
import httpx
import pytest
from sqlalchemy.exc import IntegrityError

from tests.test_mcp_e2e import Server, call_err, call_ok, mcp_client, wait_landed
from walkeep.db import Database
from walkeep.db.models import Account
from walkeep.service.operators import accounts

NUL = "\x00"


@pytest.fixture
def live(settings, clock, db):  # type: ignore[no-untyped-def]
    with Server(settings, clock, db) as srv:
        yield srv


def _field(body: dict[str, Any], field: str) -> None:
    assert body["data"]["field"] == field, body
    assert field in body["message"] or field.split("_")[0] in body["message"], body


BAD_MCP_CALLS: list[tuple[str, dict[str, Any], str]] = [
    ("store", {"content": "x", "request_id": f"r{NUL}1"}, "request_id"),
    ("store", {"content": "x", "request_id": "r\x1b[31m"}, "request_id"),
    ("store", {"content": "x", "request_id": "r2", "namespace": f"a{NUL}b"}, "namespace"),
    ("store", {"content": "x", "request_id": "r3", "namespace": "   "}, "namespace"),
    ("store", {"content": "x", "request_id": "r4", "metadata": {"k": f"v{NUL}"}}, "metadata"),
    ("store", {"content": "x", "request_id": "r5", "metadata": {f"k{NUL}": "v"}}, "metadata"),
    ("check_runway", {"memory_id": f"mem_{NUL}"}, "memory_id"),
    ("forget", {"memory_id": f"mem_x{NUL}", "request_id": "f1"}, "memory_id"),
    ("forget", {"memory_id": "mem_x", "request_id": f"f{NUL}"}, "request_id"),
    ("top_up", {"amount_usd": 5, "request_id": f"t{NUL}"}, "request_id"),
    ("recall", {"query": "x", "namespace": f"n{NUL}"}, "namespace"),
    ("recall", {"query": "x", "namespace": "\t \n"}, "namespace"),
    ("export", {"namespace": f"n{NUL}"}, "namespace"),
    # Issue 29: bidirectional controls make one identifier display as another.
    ("store", {"content": "x", "request_id": "r6", "namespace": "abc\u202edcba"}, "namespace"),
    ("store", {"content": "x", "request_id": "r\u2066x\u2069"}, "request_id"),
    ("forget", {"memory_id": "mem_\u200fx", "request_id": "f2"}, "memory_id"),
    ("recall", {"query": "x", "namespace": "n\u061c"}, "namespace"),
]


def test_mcp_tools_refuse_unstorable_identifiers_alike_on_both_databases(live: Server) -> None:
    created = accounts.create_account(live.rt.db, "nul", credits_mc=100_000)

    async def go() -> None:
        async with mcp_client(live, created.api_key) as c:
            for tool, args, field in BAD_MCP_CALLS:
                _field(await call_err(c, tool, args, "VALIDATION_ERROR"), field)
            # Nothing was stored or charged, and the service still works.
            ok = await call_ok(c, "store", {"content": "after the bad calls", "request_id": "r"})
            assert ok["status"] == "storing"
            await anyio.to_thread.run_sync(wait_landed, live.rt)
            bal = await call_ok(c, "check_balance")
            assert bal["balance_credits"] == 99  # the one good store, nothing else

    anyio.run(go)


def test_namespaces_are_nfc_normalised(live: Server) -> None:
    created = accounts.create_account(live.rt.db, "nfc", credits_mc=100_000)
    decomposed = "cafe\u0301"  # "café" as e + combining acute
    composed = unicodedata.normalize("NFC", decomposed)
    assert decomposed != composed

    async def go() -> None:
        async with mcp_client(live, created.api_key) as c:
            stored = await call_ok(
                c,
                "store",
                {"content": "espresso, no sugar", "request_id": "n1", "namespace": decomposed},
            )
            assert stored["namespace"] == composed
            await anyio.to_thread.run_sync(wait_landed, live.rt)
            exported = await call_ok(c, "export", {"namespace": composed})
            assert [m["namespace"] for m in exported["memories"]] == [composed]
            again = await call_ok(c, "export", {"namespace": decomposed})
            assert len(again["memories"]) == 1
            hits = await call_ok(c, "recall", {"query": "espresso", "namespace": decomposed})
            assert len(hits["results"]) == 1
            # The same request replayed with either spelling is the same request.
            replay = await call_ok(
                c,
                "store",
                {"content": "espresso, no sugar", "request_id": "n1", "namespace": composed},
            )
            assert replay["memory_id"] == stored["memory_id"]

    anyio.run(go)


def test_rest_refuses_unstorable_identifiers_alike_on_both_databases(live: Server) -> None:
    created = accounts.create_account(live.rt.db, "nul-rest", credits_mc=100_000)
    auth = {"Authorization": f"Bearer {created.api_key}"}
    calls: list[tuple[str, str, dict[str, Any], str]] = [
        ("POST", "/v1/store", {"content": "x", "request_id": f"r{NUL}"}, "request_id"),
        ("POST", "/v1/store", {"content": "x", "request_id": "r", "namespace": NUL}, "namespace"),
        ("POST", "/v1/store", {"content": "x", "request_id": "r", "namespace": " "}, "namespace"),
        (
            "POST",
            "/v1/store",
            {"content": "x", "request_id": "r", "metadata": {"k": NUL}},
            "metadata",
        ),
        ("POST", "/v1/forget", {"memory_id": f"mem_{NUL}", "request_id": "f"}, "memory_id"),
        ("POST", "/v1/forget", {"memory_id": "mem_x", "request_id": NUL}, "request_id"),
        ("POST", "/v1/top_up", {"amount_usd": "5", "request_id": f"t{NUL}"}, "request_id"),
        ("POST", "/v1/recall", {"query": "x", "namespace": NUL}, "namespace"),
        ("GET", "/v1/check_runway", {"memory_id": f"mem_{NUL}"}, "memory_id"),
        ("GET", "/v1/export", {"namespace": NUL}, "namespace"),
        (
            "POST",
            "/v1/store",
            {"content": "x", "request_id": "r", "namespace": "a\u202eb"},
            "namespace",
        ),
    ]
    with httpx.Client(base_url=live.url, timeout=30, headers=auth) as h:
        for method, path, payload, field in calls:
            if method == "GET":
                r = h.get(path, params=payload)
            else:
                r = h.post(path, json=payload)
            assert r.status_code == 422, (path, payload, r.status_code, r.text)
            body = r.json()
            assert body["code"] == "VALIDATION_ERROR", body
            _field(body, field)


def test_database_errors_never_carry_their_parameters(db_url: str) -> None:
    """The text of a database error (what an INTERNAL failure logs) names the statement,
    never the values bound to it."""
    from datetime import UTC, datetime

    db = Database(db_url)
    try:
        now = datetime.now(UTC)
        with db.begin() as s:
            s.add(Account(id="acct_one", name="a-very-secret-name", created_at=now))
        with pytest.raises(IntegrityError) as caught, db.begin() as s:
            s.add(Account(id="acct_two", name="a-very-secret-name", created_at=now))
        text = str(caught.value)
        assert "SQL parameters hidden" in text
        # (PostgreSQL's own DETAIL may still name the duplicate key; the bound values are gone.)
        assert "acct_two" not in text and "balance_mc': 0" not in text
    finally:
        db.dispose()


def test_lone_surrogates_are_validation_errors_on_mcp_as_on_rest(live: Server) -> None:
    """Regression: a JSON \\uD800 escape got the MCP SDK's bare parse error (-32700)
    where REST answers VALIDATION_ERROR naming the field; paired ones (emoji) still work."""
    created = accounts.create_account(live.rt.db, "surrogates", credits_mc=100_000)
    headers = {
        "Authorization": f"Bearer {created.api_key}",
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
    }

    def call(arguments: str, method: str = "tools/call") -> httpx.Response:
        params = '{"name":"store","arguments":' + arguments + "}"
        raw = '{"jsonrpc":"2.0","id":41,"method":"' + method + '","params":' + params + "}"
        return httpx.post(f"{live.url}/mcp", content=raw.encode(), headers=headers, timeout=30)

    for arguments, field in (
        ('{"content":"x\\ud800y","request_id":"s1"}', "content"),
        ('{"content":"x","request_id":"s\\udc00"}', "request_id"),
        ('{"content":"x","request_id":"s3","metadata":{"k\\ud83d":"v"}}', "metadata"),
    ):
        r = call(arguments)
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["id"] == 41 and body["result"]["isError"] is True, body
        _field(body["result"]["structuredContent"], field)
        assert body["result"]["structuredContent"]["code"] == "VALIDATION_ERROR"
    paired = call('{"content":"coffee \\ud83d\\ude00","request_id":"s4"}')
    assert paired.status_code == 200 and not paired.json()["result"]["isError"], paired.text
    rest = httpx.post(
        f"{live.url}/v1/store",
        content=b'{"content":"x","request_id":"r\\ud800"}',
        headers=headers,
        timeout=30,
    )
    assert rest.status_code == 422 and rest.json()["code"] == "VALIDATION_ERROR"
