"""walkeep.client against a real server (uvicorn on a free port): typed results and
the typed error for every envelope."""

from __future__ import annotations

import anyio
import pytest

from tests.test_mcp_e2e import Server, live, wait_landed  # noqa: F401  (fixture)
from walkeep import errors
from walkeep.client import AsyncWalkeepClient, WalkeepClient
from walkeep.service.operators import accounts
from walkeep.service.tools.schemas import RecallResult, StoreResult


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
        top = hits.results[0]  # what was stored, read back
        assert (top.memory_id, top.namespace, top.metadata) == (
            stored.memory_id,
            "default",
            {"k": "v"},
        )
        runway = wk.check_runway(stored.memory_id)
        assert runway.memories[0].status == "active"
        balance = wk.check_balance()
        assert balance.balance_credits < 100  # the store was captured
        link = wk.top_up("5.00", request_id="t1")
        assert link.checkout_url.startswith("http") and link.amount_usd == 5.0
        exported = wk.export()
        assert [m.memory_id for m in exported.memories] == [stored.memory_id]
        assert exported.memories[0].metadata == {"k": "v"}
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


def test_no_key_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv("WALKEEP_API_KEY", raising=False)
    monkeypatch.setenv("WALKEEP_DATA_DIR", str(tmp_path))  # no saved key there either
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


def test_export_pages_and_export_all_walks_every_page(live: Server) -> None:  # noqa: F811
    """Regression (issue 30): export() took only namespace; limit/cursor raised TypeError."""
    key = accounts.create_account(live.rt.db, "pager", credits_mc=10_000).api_key
    with WalkeepClient(live.url, api_key=key) as wk:
        ids = [wk.store(f"fact {i}", request_id=f"p{i}").memory_id for i in range(5)]
        assert wk.wait_until_stored(ids[-1]).status == "active"
        wait_landed(live.rt)
        first = wk.export(limit=2)
        assert len(first.memories) == 2 and first.next_cursor
        second = wk.export(cursor=first.next_cursor, limit=2)
        assert {m.memory_id for m in first.memories}.isdisjoint(
            m.memory_id for m in second.memories
        )
        assert sorted(m.memory_id for m in wk.export_all(limit=2)) == sorted(ids)

    async def go() -> None:
        async with AsyncWalkeepClient(live.url, api_key=key) as wk:
            assert (await wk.wait_until_stored(ids[0])).status == "active"
            seen = [m.memory_id async for m in wk.export_all(limit=3)]
            assert sorted(seen) == sorted(ids)

    anyio.run(go)


def test_a_placeholder_key_is_a_clear_error_not_a_unicode_crash() -> None:
    """Regression (issue 30): the README's `api_key="wk_live_…"` crashed inside httpx
    with UnicodeEncodeError."""
    with pytest.raises(ValueError, match="placeholder"):
        WalkeepClient("http://127.0.0.1:1", api_key="wk_live_…")


def test_the_readme_client_example_runs_as_written(tmp_path, db_url: str) -> None:  # type: ignore[no-untyped-def]
    """Regression (issue 30): the README's example crashed on its own placeholder key and
    recalled before the store had landed. Run that very block against `walkeep serve`
    (only the address is swapped for the test server's port)."""
    import re
    import subprocess
    import sys
    from pathlib import Path

    from tests.live_serve import walkeep_env, walkeep_serve

    readme = (Path(__file__).parent.parent / "README.md").read_text()
    section = readme.split("## Python client", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None
    with walkeep_serve(tmp_path, db_url) as served:
        example = code.group(1).replace("http://127.0.0.1:8080", served.url)
        out = subprocess.run(
            [sys.executable, "-c", example],
            env=walkeep_env(tmp_path / "serve-data", db_url),  # no WALKEEP_API_KEY
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert any(line.endswith("The user prefers metric units.") for line in lines), lines
    assert any(line.startswith("mem_") for line in lines)  # exported
    assert lines[-1].endswith("credits left")
