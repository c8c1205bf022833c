"""The load generator every throughput benchmark shares, so their ratios compare like with like.

Two clients, both speaking MCP Streamable HTTP to ``/mcp`` and calling ``store``
with distinct request ids until a deadline:

- ``sdk``: the official ``mcp`` Python client (what agents' hosts run); it
  negotiates the sessionless 2026-07-28 revision with these servers;
- ``wire``: a lean httpx client posting the same JSON-RPC ``tools/call`` in either
  revision (2025-11-25: what the MCP Inspector and mcp 1.x clients speak).

``accounts`` > 1 spreads the clients over that many API keys (client *i* uses key
*i mod accounts*), so one busy account's row is not the only thing measured.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

MODERN = "2026-07-28"
LEGACY = "2025-11-25"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_healthy(url: str, proc_alive: object, timeout: float = 90) -> None:
    """Poll ``url`` until it answers 200 (``proc_alive()`` False: the server died)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if callable(proc_alive) and not proc_alive():
            raise SystemExit(f"server for {url} exited during start-up")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{url} did not come up")


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


@dataclass
class Burst:
    """What one timed burst of store calls saw."""

    latencies: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    elapsed: float = 0.0
    # Prefixes request ids, so two bursts against one server never replay each other.
    tag: str = field(default_factory=lambda: secrets.token_hex(3))

    @property
    def accepted(self) -> int:
        return len(self.latencies)

    @property
    def rate(self) -> float:
        return self.accepted / self.elapsed if self.elapsed else 0.0

    def pct(self, q: float) -> float:
        """The q-quantile latency in milliseconds."""
        lat = sorted(self.latencies)
        return lat[max(0, int(len(lat) * q) - 1)] * 1000 if lat else float("nan")

    def line(self) -> str:
        p50 = statistics.median(self.latencies) * 1000 if self.latencies else float("nan")
        errs = f" errors={len(self.errors)} {sorted(set(self.errors))}" if self.errors else ""
        return (
            f"{self.rate:.0f} calls/s ({self.accepted} in {self.elapsed:.1f}s), "
            f"p50 {p50:.1f} ms, p99 {self.pct(0.99):.1f} ms{errs}"
        )


def content(tag: str, cid: int, i: int) -> str:
    """Distinct per burst too: identical texts would be one patch (a different path)."""
    return f"client {cid} fact {i} of run {tag}: the build server is in rack {i % 40}"


async def _sdk_loop(url: str, key: str, cid: int, until: float, burst: Burst) -> None:
    async with (
        httpx2.AsyncClient(
            headers={"Authorization": f"Bearer {key}"}, timeout=httpx2.Timeout(60)
        ) as http,
        Client(streamable_http_client(url, http_client=http)) as c,  # type: ignore[arg-type]
    ):
        i = 0
        while time.monotonic() < until:
            t0 = time.perf_counter()
            r = await c.call_tool(
                "store",
                {"content": content(burst.tag, cid, i), "request_id": f"{burst.tag}c{cid}-{i}"},
            )
            dt = time.perf_counter() - t0
            if r.is_error:
                burst.errors.append(str((r.structured_content or {}).get("code")))
            else:
                burst.latencies.append(dt)
            i += 1


async def _wire_loop(
    url: str, key: str, cid: int, until: float, burst: Burst, era: str = LEGACY
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
                    "content": content(burst.tag, cid, i),
                    "request_id": f"{burst.tag}w{cid}-{i}",
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
                burst.errors.append(str(r["structuredContent"]["code"]))
            else:
                burst.latencies.append(dt)
            i += 1


async def _burst(
    url: str, keys: Sequence[str], clients: int, seconds: float, kind: str, era: str, warmup: float
) -> Burst:
    # Warm up: one call per key (auth caches, connection pools), untimed.
    for key in keys:
        async with (
            httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"}) as http,
            Client(streamable_http_client(url, http_client=http)) as c,  # type: ignore[arg-type]
        ):
            await c.list_tools()
    if warmup > 0:  # the same load, untimed: caches, pools, prepared statements, keys
        await _run(url, keys, clients, warmup, kind, era)
    return await _run(url, keys, clients, seconds, kind, era)


async def _run(
    url: str, keys: Sequence[str], clients: int, seconds: float, kind: str, era: str
) -> Burst:
    burst = Burst()
    start = time.monotonic()
    until = start + seconds
    async with anyio.create_task_group() as tg:
        for cid in range(clients):
            key = keys[cid % len(keys)]
            if kind == "wire":
                tg.start_soon(_wire_loop, url, key, cid, until, burst, era)
            else:
                tg.start_soon(_sdk_loop, url, key, cid, until, burst)
    burst.elapsed = time.monotonic() - start
    return burst


def combine(bursts: Sequence[Burst]) -> Burst:
    """One burst's figures from several rounds of the same load."""
    out = Burst()
    for b in bursts:
        out.latencies += b.latencies
        out.errors += b.errors
        out.elapsed += b.elapsed
    return out


def alternate(
    servers: Sequence[Served],
    *,
    rounds: int = 3,
    seconds: float = 15,
    warmup: float = 3.0,
    **load: Any,
) -> list[Burst]:
    """Drive each server in turn, ``rounds`` times, ``seconds / rounds`` a round, each
    round after ``warmup`` untimed seconds of the same load (a third of it after the
    first); the servers not being driven are stopped (SIGSTOP), so none takes CPU from
    the one measured. One burst per server, its rounds combined.

    Why rounds: this shared 2-core machine's speed drifts by a third within minutes, so a
    ceiling measured a minute before the server it bounds could be measured on a
    different machine, in effect. Alternating short rounds puts both under the same
    drift, and their ratio is what the benchmarks compare."""
    for server in servers:
        server.pause()
    rounds_of: list[list[Burst]] = [[] for _ in servers]
    for r in range(rounds):
        for server, done in zip(servers, rounds_of, strict=True):
            server.resume()
            try:
                done.append(
                    drive(
                        server.mcp_url,
                        server.keys,
                        seconds=seconds / rounds,
                        warmup=warmup if r == 0 else warmup / 3,
                        **load,
                    )
                )
            finally:
                server.pause()
    for server in servers:
        server.resume()
    return [combine(done) for done in rounds_of]


def freeze(proc: subprocess.Popen[bytes], frozen: bool) -> None:
    """Stop (or continue) a server started in a session of its own, with its children
    (the web processes of ``--workers N``)."""
    os.killpg(proc.pid, signal.SIGSTOP if frozen else signal.SIGCONT)


def drive(
    url: str,
    keys: Sequence[str],
    *,
    clients: int = 16,
    seconds: float = 20,
    kind: str = "sdk",
    era: str = LEGACY,
    warmup: float = 3.0,
) -> Burst:
    """Run ``clients`` concurrent store loops against ``url`` for ``seconds``, after
    ``warmup`` seconds of the same load that are not counted."""
    return anyio.run(_burst, url, list(keys), clients, seconds, kind, era, warmup)


@dataclass
class Served:
    """A server a benchmark started in a session of its own, and the keys to drive it with."""

    proc: subprocess.Popen[bytes]
    port: int
    keys: list[str]

    @property
    def mcp_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def pause(self) -> None:
        freeze(self.proc, True)

    def resume(self) -> None:
        freeze(self.proc, False)

    def stop(self) -> None:
        self.resume()  # a stopped process would not see the SIGTERM until continued
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@dataclass
class Walkeep(Served):
    """A ``walkeep serve`` started for a benchmark: its data directory and database."""

    data_dir: Path
    db_url: str


def walkeep_env(
    data_dir: Path, db_url: str | None, extra: dict[str, str] | None = None
) -> dict[str, str]:
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith(("WALKEEP_", "STRIPE_"))},
        **(
            {"WALKEEP_LOCAL_WRITE_LATENCY_MS": os.environ["BENCH_LATENCY_MS"]}
            if "BENCH_LATENCY_MS" in os.environ
            else {}
        ),
        "WALKEEP_DATA_DIR": str(data_dir),
        "WALKEEP_PROMO_CREDITS_USD": "10000",
        "WALKEEP_MAX_STORES_PER_DAY": "10000000",
        # A benchmark drives one account far past an agent's pace on purpose.
        "WALKEEP_RATE_LIMIT_PER_MINUTE": "0",
        **({"WALKEEP_DATABASE_URL": db_url} if db_url else {}),
        **(extra or {}),
    }


def start_walkeep(
    db_url: str | None,
    *,
    accounts: int = 1,
    args: Sequence[str] = (),
    extra_env: dict[str, str] | None = None,
) -> Walkeep:
    """Start ``walkeep serve`` on a fresh data dir; ``accounts`` API keys with credits."""
    data_dir = Path(tempfile.mkdtemp(prefix="walkeep-bench-"))
    port = free_port()
    env = walkeep_env(data_dir, db_url, extra_env)
    proc = subprocess.Popen(
        [sys.executable, "-m", "walkeep.cli", "serve", "--port", str(port), *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its own process group: ``freeze`` stops it whole
    )
    try:
        wait_healthy(f"http://127.0.0.1:{port}/healthz", lambda: proc.poll() is None)
    except SystemExit:
        proc.kill()
        raise
    url = db_url or f"sqlite:///{data_dir / 'walkeep.db'}"
    keys = [json.loads((data_dir / "credentials.json").read_text())["api_key"]]
    if accounts > 1:
        from walkeep import ledger
        from walkeep.db import Database
        from walkeep.service.accounts import create_account

        db = Database(url)
        for n in range(1, accounts):
            keys.append(
                create_account(db, f"bench-{n}", credits_mc=ledger.usd_to_mc("10000")).api_key
            )
        db.dispose()
    return Walkeep(proc=proc, port=port, keys=keys, data_dir=data_dir, db_url=url)
