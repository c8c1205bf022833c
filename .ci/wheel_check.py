"""Check the built wheel the way a user meets it, from a virtualenv outside the checkout.

Run with the *wheel's* virtualenv's Python (``.ci/run`` does): the wheel installs only
the ``walkeep`` namespace; ``walkeep --version``, ``walkeep migrate`` and ``walkeep serve``
work with no checkout around; over MCP (the official client), one store lands and one
recall finds it. Exits non-zero with a reason on the first failure.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import anyio
import httpx
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client


def fail(message: str) -> None:
    print(f"wheel check: FAIL: {message}", file=sys.stderr)
    sys.exit(1)


def check_wheel_layout(wheel: Path) -> None:
    tops = {name.split("/", 1)[0] for name in zipfile.ZipFile(wheel).namelist()}
    extra = {t for t in tops if t != "walkeep" and not t.endswith(".dist-info")}
    if extra:
        fail(f"the wheel installs generic top-level names: {sorted(extra)}")
    names = zipfile.ZipFile(wheel).namelist()
    for needed in (
        "walkeep/py.typed",
        "walkeep/_migrations/env.py",
        "walkeep/_migrations/script.py.mako",
    ):
        if needed not in names:
            fail(f"{needed} is missing from the wheel")
    for generic in ("worker", "migrations"):
        if importlib.util.find_spec(generic) is not None:
            fail(f"`import {generic}` works in the wheel's venv: it must not be installed")
    origin = importlib.util.find_spec("walkeep")
    if origin is None or "site-packages" not in str(origin.origin):
        fail(f"walkeep is imported from {origin and origin.origin}, not the installed wheel")


def run(cmd: list[str], env: dict[str, str], cwd: Path) -> str:
    out = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        fail(f"{' '.join(cmd)} exited {out.returncode}: {out.stderr.strip()[-2000:]}")
    return out.stdout


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def store_and_recall(url: str, key: str) -> None:
    async with (
        httpx2.AsyncClient(
            headers={"Authorization": f"Bearer {key}"}, timeout=httpx2.Timeout(30, read=120)
        ) as http,
        Client(streamable_http_client(f"{url}/mcp", http_client=http)) as c,
    ):
        tools = {t.name for t in (await c.list_tools()).tools}
        if "store" not in tools or "recall" not in tools:
            fail(f"tools/list: {sorted(tools)}")
        r = await c.call_tool("store", {"content": "wheels roll on Walrus", "request_id": "w1"})
        if r.is_error or not r.structured_content:
            fail(f"store: {r.structured_content}")
        memory_id = r.structured_content["memory_id"]
        deadline = time.monotonic() + 120
        while True:
            rw = await c.call_tool("check_runway", {"memory_id": memory_id})
            status = (rw.structured_content or {}).get("memories", [{}])[0].get("status")
            if status == "active":
                break
            if time.monotonic() > deadline:
                fail(f"the store did not land: {rw.structured_content}")
            await anyio.sleep(0.2)
        hits = await c.call_tool("recall", {"query": "what rolls on Walrus?"})
        found = [h["content"] for h in (hits.structured_content or {}).get("results", [])]
        if "wheels roll on Walrus" not in found:
            fail(f"recall did not find the memory: {hits.structured_content}")


def main() -> None:
    wheel = Path(sys.argv[1])
    check_wheel_layout(wheel)
    bindir = Path(sys.executable).parent
    walkeep = str(bindir / "walkeep")
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("WALKEEP_", "STRIPE_"))}
        env.update({"HOME": str(home), "WALKEEP_DATA_DIR": str(home / "data"), "PYTHONPATH": ""})
        version = run([walkeep, "--version"], env, home).strip()
        expected = f"walkeep {importlib.metadata.version('walkeep')}"
        if version != expected:
            fail(f"--version printed {version!r}, expected {expected!r}")
        print(f"wheel check: {version}")
        print("wheel check:", run([walkeep, "migrate"], env, home).strip())

        port = free_port()
        url = f"http://127.0.0.1:{port}"
        proc = subprocess.Popen(
            [walkeep, "serve", "--port", str(port)],
            env=env,
            cwd=home,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            deadline = time.monotonic() + 120
            while True:
                if proc.poll() is not None:
                    fail(f"walkeep serve exited: {proc.communicate()[1][-2000:]}")
                try:
                    health = httpx.get(f"{url}/healthz", timeout=2)
                    if health.status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    fail("walkeep serve did not answer /healthz")
                time.sleep(0.2)
            print("wheel check: serve /healthz", health.json())
            key = json.loads((home / "data" / "credentials.json").read_text())["api_key"]
            anyio.run(store_and_recall, url, key)
            print("wheel check: MCP store → landed → recall found it")
        finally:
            proc.terminate()
            try:
                proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
    print("wheel check: OK")


if __name__ == "__main__":
    main()
