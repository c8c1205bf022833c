"""``walkeep mcp --url``: stdio in front of a real, separately running ``walkeep serve``.

The host side is the official MCP client over stdio (``mcp.client.stdio`` through
``mcp.Client``); the remote is ``walkeep serve`` in its own process on a free port.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, StdioServerParameters

from tests.live_serve import Served, walkeep_env, walkeep_serve

TOOLS = {"store", "recall", "check_runway", "check_balance", "top_up", "forget", "export"}


@pytest.fixture
def served(tmp_path: Path, db_url: str) -> Iterator[Served]:
    with walkeep_serve(tmp_path, db_url) as s:
        yield s


def bridge_params(tmp_path: Path, url: str, key: str, *extra: str) -> StdioServerParameters:
    # The bridge gets its own empty data dir and no database URL: it must need neither.
    env = walkeep_env(tmp_path / "bridge-data", "", WALKEEP_API_KEY=key)
    env.pop("WALKEEP_DATABASE_URL")
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "walkeep.cli", "mcp", "--url", f"{url}/mcp", *extra],
        env=env,
    )


def sc(result: Any) -> dict[str, Any]:
    assert result.structured_content is not None, result
    return dict(result.structured_content)


def test_bridge_proxies_tools_and_passes_errors_through(served: Served, tmp_path: Path) -> None:
    async def go() -> None:
        async with Client(bridge_params(tmp_path, served.url, served.api_key)) as c:
            assert c.server_info is None or c.server_info.name == "walkeep"
            tools = {t.name: t for t in (await c.list_tools()).tools}
            assert set(tools) == TOOLS
            assert tools["store"].output_schema  # schemas come through untouched

            bal = await c.call_tool("check_balance", {})
            assert not bal.is_error and sc(bal)["balance_credits"] == 100

            stored = await c.call_tool(
                "store", {"content": "the bridge carries memories", "request_id": "b1"}
            )
            assert not stored.is_error, sc(stored)
            memory_id = sc(stored)["memory_id"]

            # The remote lands the write in the background; poll its receipt.
            deadline = time.monotonic() + 60
            while True:
                runway = sc(await c.call_tool("check_runway", {"memory_id": memory_id}))
                status = runway["memories"][0]["status"]
                if status != "storing" or time.monotonic() > deadline:
                    break
                await anyio.sleep(0.1)
            assert status == "active", runway

            found = sc(await c.call_tool("recall", {"query": "bridge memories"}))
            assert any("bridge carries" in r["content"] for r in found["results"]), found

            # A domain error is a tool result with the envelope, not a protocol error.
            missing = await c.call_tool("check_runway", {"memory_id": "mem_nope"})
            assert missing.is_error
            body = sc(missing)
            assert body["code"] == "NOT_FOUND" and set(body) == {"code", "message", "data"}
            assert json.loads(missing.content[0].text) == body

    anyio.run(go)


def test_bridge_refused_key_is_one_clear_line(served: Served, tmp_path: Path) -> None:
    env = walkeep_env(tmp_path / "bridge-data", "", WALKEEP_API_KEY="wk_live_" + "x" * 43)
    env.pop("WALKEEP_DATABASE_URL")
    r = subprocess.run(
        [sys.executable, "-m", "walkeep.cli", "mcp", "--url", f"{served.url}/mcp"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert r.returncode == 1
    assert r.stdout == ""  # stdout is the protocol wire: nothing else on it
    assert "refused the API key" in r.stderr and "walkeep key create" in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1

    no_key = walkeep_env(tmp_path / "empty-data", "")
    r = subprocess.run(
        [sys.executable, "-m", "walkeep.cli", "mcp", "--url", f"{served.url}/mcp"],
        env=no_key,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert r.returncode == 1 and "no API key" in r.stderr, r.stderr


def test_bridge_loads_no_database_models_or_local_network(tmp_path: Path) -> None:
    """The bridge's whole import graph, checked in a fresh interpreter."""
    code = """
import sys
import walkeep.cli
import walkeep.mcp.bridge
import walkeep.onboarding
import mcp, mcp.client.streamable_http, mcp.server.lowlevel, mcp.server.stdio
heavy = [m for m in sys.modules if m.startswith(
    ("walkeep.db", "walkeep.service", "walkeep.backends", "walkeep.bootstrap",
     "onnxruntime", "tokenizers", "pysui", "sqlalchemy", "walkeep.index"))]
print(heavy)
"""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout
