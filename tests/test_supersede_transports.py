"""``supersedes`` and ``expires_at`` through every transport: MCP, REST and the Python
client accept them and return the new check_runway and export fields; MCP's store
schema tells an agent when to use each; the refusals keep their codes and data."""

from __future__ import annotations

from datetime import timedelta

import anyio
import httpx

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
from walkeep.service.operators import accounts


def test_mcp_store_accepts_both_and_check_runway_shows_the_links(live: Server) -> None:  # noqa: F811
    rt = live.rt
    key = accounts.create_account(rt.db, "mcp-links", credits_mc=100_000).api_key
    until = (rt.clock.now() + timedelta(days=3)).isoformat()

    async def go() -> None:
        async with mcp_client(live, key) as c:
            tools = {t.name: t for t in (await c.list_tools()).tools}
            props = tools["store"].input_schema["properties"]
            assert "CORRECTS" in props["supersedes"]["description"]
            assert "until a date" in props["expires_at"]["description"]
            old = await call_ok(c, "store", {"content": "Sam's desk is A4.", "request_id": "o"})
            await anyio.to_thread.run_sync(wait_landed, rt)
            new = await call_ok(
                c,
                "store",
                {
                    "content": "Sam's desk is B2.",
                    "request_id": "n",
                    "supersedes": old["memory_id"],
                    "expires_at": until,
                },
            )
            await anyio.to_thread.run_sync(wait_landed, rt)
            was = (await call_ok(c, "check_runway", {"memory_id": old["memory_id"]}))["memories"]
            now = (await call_ok(c, "check_runway", {"memory_id": new["memory_id"]}))["memories"]
            assert was[0]["superseded_by"] == new["memory_id"] and was[0]["status"] == "no-renew"
            assert now[0]["supersedes"] == old["memory_id"]
            assert now[0]["expires_at"].startswith(until[:19])
            err = await call_err(
                c,
                "store",
                {"content": "Sam's desk is C3.", "request_id": "x", "supersedes": old["memory_id"]},
                "VALIDATION_ERROR",
            )
            assert err["data"]["state"] == "superseded"
            assert err["data"]["superseded_by"] == new["memory_id"]
            await call_err(
                c,
                "store",
                {"content": "y", "request_id": "y", "supersedes": "mem_nothere"},
                "NOT_FOUND",
            )

    anyio.run(go)


def test_rest_and_the_python_client_accept_both_and_return_the_fields(live: Server) -> None:  # noqa: F811
    rt = live.rt
    key = accounts.create_account(rt.db, "py-links", credits_mc=100_000).api_key
    day = (rt.clock.now() + timedelta(days=5)).date()
    with WalkeepClient(live.url, api_key=key) as wk:
        old = wk.store("The build server is ci-1.", request_id="o")
        wait_landed(rt)
        new = wk.store(
            "The build server is ci-2.", request_id="n", supersedes=old.memory_id, expires_at=day
        )
        wait_landed(rt)
        assert wk.check_runway(old.memory_id).memories[0].superseded_by == new.memory_id
        view = wk.check_runway(new.memory_id).memories[0]
        assert view.supersedes == old.memory_id and view.expires_at is not None
        assert view.expires_at.date() == day + timedelta(days=1)  # the end of that day UTC
        exported = wk.export().memories
        assert [(m.memory_id, m.supersedes) for m in exported] == [(new.memory_id, old.memory_id)]
        try:
            wk.store("z", request_id="z", expires_at="2020-01-01")
        except errors.ValidationError as exc:
            assert exc.data["field"] == "expires_at"
        else:
            raise AssertionError("a past expires_at was accepted")
    # REST refuses a malformed expires_at before the service sees it.
    r = httpx.post(
        f"{live.url}/v1/store",
        headers={"Authorization": f"Bearer {key}"},
        json={"content": "w", "request_id": "w", "expires_at": "soon"},
    )
    assert r.status_code in (400, 422) and r.json()["code"] == "VALIDATION_ERROR"
