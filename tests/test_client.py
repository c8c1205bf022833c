"""walkeep.client against a real server (uvicorn on a free port): typed results and
the typed error for every envelope."""

from __future__ import annotations

import anyio
import pytest

from tests.test_mcp_e2e import Server, live, wait_landed  # noqa: F401  (fixture)
from walkeep import errors
from walkeep.client import AsyncWalkeepClient, WalkeepClient
from walkeep.service import accounts
from walkeep.service.schemas import RecallResult, StoreResult


def test_every_method_round_trips(live: Server) -> None:  # noqa: F811
    key = accounts.create_account(live.rt.db, "py", credits_mc=10_000).api_key
    # The MCP URL that `walkeep serve` prints works too.
    with WalkeepClient(f"{live.url}/mcp", api_key=key) as wk:
        stored = wk.store("The user prefers metric units.", request_id="c1", metadata={"k": "v"})
        assert isinstance(stored, StoreResult) and stored.status == "storing"
        replay = wk.store("The user prefers metric units.", request_id="c1", metadata={"k": "v"})
        assert replay.memory_id == stored.memory_id  # a replay never stores or charges twice
        wait_landed(live.rt)
        hits = wk.recall("which units", limit=3)
        assert isinstance(hits, RecallResult)
        assert hits.results and hits.results[0].content == "The user prefers metric units."
        runway = wk.check_runway(stored.memory_id)
        assert runway.memories[0].status == "active"
        balance = wk.check_balance()
        assert balance.balance_credits < 100  # the store was captured
        link = wk.top_up("5.00", request_id="t1")
        assert link.checkout_url.startswith("http") and link.amount_usd == 5.0
        exported = wk.export()
        assert [m.memory_id for m in exported.memories] == [stored.memory_id]
        gone = wk.forget(stored.memory_id, request_id="f1")
        assert gone.status == "no-renew"


def test_errors_are_the_matching_walkeep_error(live: Server) -> None:  # noqa: F811
    key = accounts.create_account(live.rt.db, "err", credits_mc=10_000).api_key
    broke = accounts.create_account(live.rt.db, "broke").api_key
    with WalkeepClient(live.url, api_key=key) as wk:
        with pytest.raises(errors.NotFound) as nf:
            wk.check_runway("mem_nope")
        assert nf.value.code == "NOT_FOUND" and nf.value.message
        with pytest.raises(errors.ValidationError):
            wk.recall("x", limit=99)
    with (
        WalkeepClient(live.url, api_key=broke) as wk,
        pytest.raises(errors.InsufficientBalance) as ib,
    ):
        wk.store("no credits", request_id="b1")
    assert "top_up" in ib.value.data
    with (
        WalkeepClient(live.url, api_key="wk_live_" + "x" * 43) as wk,
        pytest.raises(errors.Unauthorized) as un,
    ):
        wk.check_balance()
    assert "walkeep key create" in un.value.message


def test_no_key_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WALKEEP_API_KEY", raising=False)
    with pytest.raises(ValueError, match="WALKEEP_API_KEY"):
        WalkeepClient("http://127.0.0.1:1")


def test_async_client(live: Server) -> None:  # noqa: F811
    key = accounts.create_account(live.rt.db, "aio", credits_mc=1_000).api_key

    async def go() -> None:
        async with AsyncWalkeepClient(live.url, api_key=key) as wk:
            assert (await wk.check_balance()).balance_credits == 1
            with pytest.raises(errors.NotFound):
                await wk.check_runway("mem_nope")

    anyio.run(go)
