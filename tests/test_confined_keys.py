"""Keys confined to one namespace (issue 42, item 5), through every transport: MCP over
streamable HTTP and stdio, REST, the Python client, and the console's refusal. Another
namespace named is FORBIDDEN; another namespace's ids are NOT_FOUND word for word as
unknown ones; the summary and export hold only the key's namespace; credits stay
account-wide; an unconfined key of the same account sees everything, as before.
Runs on SQLite and PostgreSQL."""

from __future__ import annotations

import re
from typing import Any

import anyio
import httpx
import pytest
from sqlalchemy import select

from tests.helpers import account, land_all
from tests.test_mcp_e2e import (  # noqa: F401  (fixture)
    Server,
    call_err,
    call_ok,
    live,
    mcp_client,
    wait_landed,
)
from walkeep import errors
from walkeep.client import WalkeepClient
from walkeep.db.models import Memory
from walkeep.errors import ConfigurationError, Forbidden
from walkeep.mcp.server import build_mcp
from walkeep.service import digests
from walkeep.service.operators import accounts
from walkeep.service.runtime import Runtime
from walkeep.service.tools import confine, export, forget, runway, store

NS = "team-ops"
OTHER = "hr-private"


def _keys(rt: Runtime, name: str) -> tuple[str, str, str]:
    """An account with an unconfined key and a key confined to NS: (account, open, confined)."""
    made = accounts.create_account(rt.db, name, credits_mc=100_000)
    confined = accounts.create_key(
        rt.db,
        made.account_id,
        default_namespace=NS,
        only_namespace=True,
        master_key=digests.master_key(rt),
    )
    return made.account_id, made.api_key, confined.api_key


def test_every_tool_has_its_place_in_the_confinement_rule(rt: Runtime) -> None:
    """A new tool must be placed: named (namespace substituted or refused), restricted
    (told ``confined_to``) or account-wide; else a confined key would pass it unchecked."""

    async def names() -> set[str]:
        return {t.name for t in await build_mcp(lambda: rt).list_tools()}

    placed = confine.NAMED | confine.RESTRICTED | confine.ACCOUNT_WIDE
    assert anyio.run(names) == placed
    assert (
        not confine.NAMED & confine.ACCOUNT_WIDE and not confine.RESTRICTED & confine.ACCOUNT_WIDE
    )


def test_the_rule_substitutes_refuses_and_restricts() -> None:
    assert confine.confine("recall", {"namespace": None}, None) == {"namespace": None}
    assert confine.confine("recall", {"namespace": None}, NS) == {"namespace": NS}
    assert confine.confine("store", {"namespace": NS}, NS) == {"namespace": NS, "confined_to": NS}
    assert confine.confine("forget", {"memory_id": "m"}, NS) == {
        "memory_id": "m",
        "confined_to": NS,
    }
    assert confine.confine("top_up", {"amount_usd": 5}, NS) == {"amount_usd": 5}
    with pytest.raises(Forbidden) as refused:
        confine.confine("export", {"namespace": OTHER}, NS)
    assert refused.value.http_status == 403
    assert refused.value.body()["data"] == {"field": "namespace", "namespace": NS}
    # The same name in another Unicode form is the same namespace.
    assert confine.confine("recall", {"namespace": "cafe\u0301"}, "caf\u00e9")["namespace"]


def test_forget_by_a_shared_blob_id_stops_only_the_key_s_namespace(rt: Runtime) -> None:
    """Identical content in two namespaces shares one blob: a confined key forgetting
    that blob_id stops its own copy only, and its note never names the other."""
    a = account(rt)
    mine = store.store(rt, a, content="same words", request_id="m", namespace=NS).memory_id
    theirs = store.store(rt, a, content="same words", request_id="t", namespace=OTHER).memory_id
    land_all(rt)
    with rt.db.read() as s:
        shared = set(s.scalars(select(Memory.blob_id).where(Memory.account_id == a)))
    assert len(shared) == 1
    (public,) = shared
    result = forget.forget(rt, a, memory_id=public, request_id="f", confined_to=NS)
    assert theirs not in result.note and "this memory" in result.note
    assert runway.check_runway(rt, a, mine).memories[0].status == "no-renew"
    assert runway.check_runway(rt, a, theirs).memories[0].status == "active"
    assert [m.memory_id for m in export.export(rt, a).memories] == [theirs]


def test_mcp_over_http_confines_every_tool(live: Server) -> None:  # noqa: F811
    rt = live.rt
    _, open_key, confined_key = _keys(rt, "mcp-confined")

    async def go() -> None:
        async with mcp_client(live, open_key) as c:
            theirs = await call_ok(
                c,
                "store",
                {"content": "salary review notes", "request_id": "t", "namespace": OTHER},
            )
        await anyio.to_thread.run_sync(wait_landed, rt)
        async with mcp_client(live, confined_key) as c:
            mine = await call_ok(c, "store", {"content": "deploy runbook v2", "request_id": "m"})
            assert mine["namespace"] == NS
            await call_ok(
                c, "store", {"content": "oncall rota", "request_id": "m2", "namespace": NS}
            )
            await anyio.to_thread.run_sync(wait_landed, rt)
            for tool, args in [
                ("store", {"content": "x", "request_id": "x", "namespace": OTHER}),
                ("recall", {"query": "salary", "namespace": OTHER}),
                ("export", {"namespace": OTHER}),
            ]:
                err = await call_err(c, tool, args, "FORBIDDEN")
                assert err["data"] == {"field": "namespace", "namespace": NS}
            # Another namespace's ids: NOT_FOUND in the very words of an unknown id.
            for tool, args in [
                ("check_runway", {"memory_id": "{id}"}),
                ("forget", {"memory_id": "{id}", "request_id": "f"}),
                ("store", {"content": "y", "request_id": "y", "supersedes": "{id}"}),
            ]:
                bodies = []
                for ident in (theirs["memory_id"], "mem_doesnotexist000000000000"):
                    filled = {k: v.replace("{id}", ident) for k, v in args.items()}
                    bodies.append(await call_err(c, tool, filled, "NOT_FOUND"))
                assert bodies[0]["message"] == bodies[1]["message"]
                assert {k: v for k, v in bodies[0]["data"].items() if k != "memory_id"} == {
                    k: v for k, v in bodies[1]["data"].items() if k != "memory_id"
                }
            hits = (await call_ok(c, "recall", {"query": "salary review runbook"}))["results"]
            assert hits and all(h["namespace"] == NS for h in hits)
            listed = (await call_ok(c, "export", {}))["memories"]
            assert sorted(m["namespace"] for m in listed) == [NS, NS]
            summary = await call_ok(c, "check_runway", {})
            assert summary["account"]["total_memories"] == 2
            assert [n["namespace"] for n in summary["account"]["namespaces"]] == [NS]
            assert summary["account"]["more_namespaces"] == 0
            assert {m["memory_id"] for m in summary["memories"]} <= {
                mine["memory_id"],
                *(m["memory_id"] for m in listed),
            }
            own = await call_ok(c, "check_runway", {"memory_id": mine["memory_id"]})
            assert own["memories"][0]["status"] == "active"
            balance = await call_ok(c, "check_balance", {})
            link = await call_ok(c, "top_up", {"amount_usd": 5, "request_id": "t"})
            assert link["checkout_url"]
            await call_ok(c, "forget", {"memory_id": mine["memory_id"], "request_id": "f2"})
        async with mcp_client(live, open_key) as c:
            # Credits are the account's: both keys see the same balance.
            again = await call_ok(c, "check_balance", {})
            assert again["balance_credits"] == balance["balance_credits"]
            # The unconfined key sees every namespace, as before.
            everything = await call_ok(c, "check_runway", {})
            assert {n["namespace"] for n in everything["account"]["namespaces"]} == {NS, OTHER}
            assert everything["account"]["total_memories"] == 3
            hits = await call_ok(c, "recall", {"query": "salary review", "namespace": OTHER})
            assert hits["results"][0]["memory_id"] == theirs["memory_id"]
            await call_ok(c, "check_runway", {"memory_id": theirs["memory_id"]})

    anyio.run(go)


def test_rest_and_the_python_client_see_forbidden_and_not_found(live: Server) -> None:  # noqa: F811
    rt = live.rt
    a, open_key, confined_key = _keys(rt, "rest-confined")
    theirs = store.store(rt, a, content="board minutes", request_id="t", namespace=OTHER)
    wait_landed(rt)
    auth = {"Authorization": f"Bearer {confined_key}"}
    with httpx.Client(base_url=live.url, headers=auth, timeout=30) as http:
        refused = http.post("/v1/recall", json={"query": "board", "namespace": OTHER})
        assert refused.status_code == 403
        assert refused.json() == {
            "code": "FORBIDDEN",
            "message": refused.json()["message"],
            "data": {"field": "namespace", "namespace": NS},
        }
        assert http.get("/v1/export", params={"namespace": OTHER}).status_code == 403
        missing = http.get("/v1/check_runway", params={"memory_id": theirs.memory_id})
        assert missing.status_code == 404 and missing.json()["code"] == "NOT_FOUND"
        made = http.post("/v1/store", json={"content": "standup at 9", "request_id": "s"})
        assert made.status_code == 200 and made.json()["namespace"] == NS
        wait_landed(rt)
        summary = http.get("/v1/check_runway").json()["account"]
        assert [n["namespace"] for n in summary["namespaces"]] == [NS]
        assert http.get("/v1/export").json()["memories"][0]["namespace"] == NS
    with WalkeepClient(live.url, api_key=confined_key) as wk:
        with pytest.raises(errors.Forbidden) as err:
            wk.store("x", request_id="x", namespace=OTHER)
        assert err.value.data["namespace"] == NS
        with pytest.raises(errors.NotFound):
            wk.forget(theirs.memory_id, request_id="f")
        confined_balance = wk.check_balance()
    with WalkeepClient(live.url, api_key=open_key) as wk:
        assert wk.check_balance() == confined_balance
        spaces = wk.check_runway().account
        assert spaces is not None and {n.namespace for n in spaces.namespaces} == {NS, OTHER}


def test_stdio_holds_a_confined_key_to_its_namespace(rt: Runtime) -> None:
    from mcp.client import Client

    from walkeep.mcp.stdio import build_stdio_mcp

    _, _, confined_key = _keys(rt, "stdio-confined")
    with pytest.raises(ConfigurationError, match="confined to namespace 'team-ops'"):
        build_stdio_mcp(rt, confined_key, OTHER)
    server = build_stdio_mcp(rt, confined_key, None)

    async def go() -> None:
        async with Client(server) as c:
            stored = await call_ok(c, "store", {"content": "stdio note", "request_id": "s"})
            assert stored["namespace"] == NS
            await call_err(c, "recall", {"query": "x", "namespace": OTHER}, "FORBIDDEN")
            summary = await call_ok(c, "check_runway", {})
            assert [n["namespace"] for n in summary["account"]["namespaces"]] == [NS]

    anyio.run(go)


def test_a_confined_key_cannot_sign_in_to_the_console(live: Server) -> None:  # noqa: F811
    from walkeep.api.console import COOKIE

    rt = live.rt
    _, open_key, confined_key = _keys(rt, "console-confined")

    def sign_in(http: httpx.Client, key: str) -> Any:
        page = http.get("/console/login")
        csrf = re.search(r'name="csrf" value="([^"]+)"', page.text)
        assert csrf is not None
        if page.cookies.get(COOKIE):
            http.cookies.set(COOKIE, page.cookies[COOKIE])
        return http.post(
            "/console/login",
            data={"credential": key, "csrf": csrf.group(1)},
            follow_redirects=False,
        )

    with httpx.Client(base_url=live.url, timeout=30) as http:
        refused = sign_in(http, confined_key)
        assert refused.status_code == 403
        assert "confined to one namespace" in refused.text
    with httpx.Client(base_url=live.url, timeout=30) as http:
        assert sign_in(http, open_key).status_code == 303  # unconfined: as before


def test_forbidden_is_in_every_list_of_error_codes() -> None:
    """The MCP error schema, the REST responses and the Python client all know FORBIDDEN."""
    from walkeep.api.rest import ERRORS
    from walkeep.mcp.envelope import ERROR_SCHEMA

    assert "FORBIDDEN" in errors.ALL_CODES
    described = ERROR_SCHEMA["properties"]["code"]["description"]
    assert all(code in described for code in errors.ALL_CODES)
    assert "FORBIDDEN" in ERRORS[403]["description"]
    body = {"code": "FORBIDDEN", "message": "m", "data": {"namespace": NS}}
    assert isinstance(errors.from_body(body), errors.Forbidden)
