"""Store-accept throughput and latency through MCP over HTTP, embedded default.

Starts ``walkeep serve`` (SQLite, local network, in-process worker) in a
separate process on a fresh data dir, then runs N concurrent MCP clients
calling ``store`` with distinct request ids for a fixed duration. Prints
accepts/s and p50/p99 latency, then waits until every accepted write has
landed and been billed (completion runs in the background during the burst,
at lower CPU priority, on the same two cores) and prints the sustained
end-to-end rate.

    python bench/store.py [--clients 16] [--seconds 20] [--client sdk|wire]
                          [--era 2025-11-25|2026-07-28] [--pg-server URL]

Two load generators, both speaking MCP Streamable HTTP to ``/mcp``:
- ``sdk``: the official ``mcp`` Python client (what agents' hosts run). It
  negotiates the sessionless 2026-07-28 revision with this server;
- ``wire``: a lean httpx client posting the same JSON-RPC ``tools/call``
  requests in either revision: 2025-11-25 (the default: what the MCP
  Inspector and mcp 1.x clients speak, served by the SDK's per-request
  stateless transport) or 2026-07-28.

Target (issue 4): at least 200 accepts/s with 16 clients on this machine.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def scratch_database(server_url: str | None) -> Iterator[str | None]:
    """A throwaway PostgreSQL database on the server of ``server_url`` (None: SQLite)."""
    if server_url is None:
        yield None
        return
    url = make_url(server_url)
    name = f"walkeep_bench_{secrets.token_hex(4)}"
    admin = create_engine(url, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield url.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as c:
            c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def start_server(data_dir: Path, port: int, db_url: str | None) -> subprocess.Popen[bytes]:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("WALKEEP_", "STRIPE_"))},
        **(
            {"WALKEEP_LOCAL_WRITE_LATENCY_MS": os.environ["BENCH_LATENCY_MS"]}
            if "BENCH_LATENCY_MS" in os.environ
            else {}
        ),
        "WALKEEP_DATA_DIR": str(data_dir),
        "WALKEEP_PROMO_CREDITS_USD": "10000",
        "WALKEEP_MAX_STORES_PER_DAY": "10000000",
        **({"WALKEEP_DATABASE_URL": db_url} if db_url else {}),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "walkeep.cli", "serve", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit("server did not start")


async def client_loop(
    url: str, key: str, cid: int, until: float, lat: list[float], errors: list[str]
) -> None:
    async with (
        httpx2.AsyncClient(
            headers={"Authorization": f"Bearer {key}"}, timeout=httpx2.Timeout(60)
        ) as http,
        Client(streamable_http_client(url, http_client=http)) as c,
    ):  # type: ignore[arg-type]
        i = 0
        while time.monotonic() < until:
            t0 = time.perf_counter()
            r = await c.call_tool(
                "store",
                {
                    "content": f"client {cid} fact {i}: the build server is in rack {i % 40}",
                    "request_id": f"c{cid}-{i}",
                },
            )
            dt = time.perf_counter() - t0
            if r.is_error:
                errors.append(str((r.structured_content or {}).get("code")))
            else:
                lat.append(dt)
            i += 1


MODERN = "2026-07-28"


async def wire_loop(
    url: str,
    key: str,
    cid: int,
    until: float,
    lat: list[float],
    errors: list[str],
    era: str = "2025-11-25",
) -> None:
    headers = {
        "Authorization": f"Bearer {key}",
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": era,
    }
    if era == MODERN:
        # Sessionless era: the envelope travels in _meta and the routing headers.
        headers |= {"Mcp-Method": "tools/call", "Mcp-Name": "store"}
    async with httpx.AsyncClient(headers=headers, timeout=60) as http:
        i = 0
        while time.monotonic() < until:
            params: dict[str, object] = {
                "name": "store",
                "arguments": {
                    "content": f"client {cid} fact {i}: the build server is in rack {i % 40}",
                    "request_id": f"w{cid}-{i}",
                },
            }
            if era == MODERN:
                params["_meta"] = {
                    "io.modelcontextprotocol/protocolVersion": MODERN,
                    "io.modelcontextprotocol/clientCapabilities": {},
                    "io.modelcontextprotocol/clientInfo": {"name": "bench", "version": "1"},
                }
            body = {"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": params}
            t0 = time.perf_counter()
            r = (await http.post(url, json=body)).json()["result"]
            dt = time.perf_counter() - t0
            if r.get("isError"):
                errors.append(str(r["structuredContent"]["code"]))
            else:
                lat.append(dt)
            i += 1


async def run(
    url: str, key: str, clients: int, seconds: float, kind: str = "sdk", era: str = MODERN
) -> tuple[list[float], list[str], float]:
    lat: list[float] = []
    errors: list[str] = []
    # Warm up one call (model loads lazily in the server's completer, not here).
    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"}) as http,
        Client(
            streamable_http_client(url, http_client=http)  # type: ignore[arg-type]
        ) as c,
    ):
        await c.call_tool("check_balance", {})
    start = time.monotonic()
    until = start + seconds
    async with anyio.create_task_group() as tg:
        for cid in range(clients):
            if kind == "wire":
                tg.start_soon(wire_loop, url, key, cid, until, lat, errors, era)
            else:
                tg.start_soon(client_loop, url, key, cid, until, lat, errors)
    return lat, errors, time.monotonic() - start


def measure(
    args: argparse.Namespace, db_url: str | None
) -> tuple[list[float], list[str], float, dict[str, int], float]:
    data_dir = Path(tempfile.mkdtemp(prefix="walkeep-bench-"))
    port = free_port()
    proc = start_server(data_dir, port, db_url)
    try:
        creds = json.loads((data_dir / "credentials.json").read_text())
        url = f"http://127.0.0.1:{port}/mcp"
        lat, errors, elapsed = anyio.run(
            run, url, creds["api_key"], args.clients, args.seconds, args.client, args.era
        )
        # Sustained capacity: how long until every accepted write has landed and
        # been billed (completion kept running during the burst, sharing the CPU).
        drain_start = time.monotonic()
        while True:
            runway = httpx.get(
                f"http://127.0.0.1:{port}/v1/check_runway",
                headers={"Authorization": f"Bearer {creds['api_key']}"},
                timeout=60,
            ).json()["account"]
            if runway["active"] >= len(lat) or time.monotonic() - drain_start > 300:
                break
            time.sleep(1)
        return lat, errors, elapsed, runway, time.monotonic() - drain_start
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--client", choices=["sdk", "wire"], default="sdk")
    ap.add_argument(
        "--era",
        choices=["2025-11-25", MODERN],
        default="2025-11-25",
        help="protocol revision the wire client speaks (the SDK client negotiates its own)",
    )
    ap.add_argument(
        "--pg-server",
        metavar="URL",
        default=None,
        help="run on PostgreSQL: a scratch database is created on this server and dropped "
        "afterwards (e.g. postgresql+psycopg://postgres@127.0.0.1:5432/test)",
    )
    args = ap.parse_args()
    with scratch_database(args.pg_server) as db_url:
        lat, errors, elapsed, runway, drain = measure(args, db_url)
    lat.sort()
    n = len(lat)
    era = args.era if args.client == "wire" else f"{MODERN} (negotiated)"
    print(
        f"database={'postgresql' if args.pg_server else 'sqlite'} "
        f"client={args.client} protocol={era} clients={args.clients} duration={elapsed:.1f}s accepted={n} errors={len(errors)} {sorted(set(errors))}"
    )
    print(f"throughput: {n / elapsed:.0f} accepts/s")
    print(
        f"latency: p50 {statistics.median(lat) * 1000:.1f} ms, "
        f"p99 {lat[int(n * 0.99) - 1] * 1000:.1f} ms, max {lat[-1] * 1000:.1f} ms"
    )
    print(
        f"completion: {runway['active']} of {n} landed and billed {drain:.1f}s after the burst "
        f"→ {runway['active'] / (elapsed + drain):.0f} stores/s end to end (sustained)"
    )
    print(f"target >= 200 accepts/s: {'PASS' if n / elapsed >= 200 else 'MISS'}")


if __name__ == "__main__":
    main()
