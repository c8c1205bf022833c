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
import gc
import itertools
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
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
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


# One client's call: store (content, request_id) → None if accepted, else the error code.
Call = Callable[[str, str], Awaitable[str | None]]


@contextlib.asynccontextmanager
async def _sdk_client(url: str, key: str, era: str) -> AsyncIterator[Call]:
    del era  # the SDK negotiates its own revision
    async with (
        httpx2.AsyncClient(
            headers={"Authorization": f"Bearer {key}"}, timeout=httpx2.Timeout(60)
        ) as http,
        Client(streamable_http_client(url, http_client=http)) as c,  # type: ignore[arg-type]
    ):

        async def call(text: str, request_id: str) -> str | None:
            r = await c.call_tool("store", {"content": text, "request_id": request_id})
            return str((r.structured_content or {}).get("code")) if r.is_error else None

        yield call


@contextlib.asynccontextmanager
async def _wire_client(url: str, key: str, era: str) -> AsyncIterator[Call]:
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
        ids = itertools.count()

        async def call(text: str, request_id: str) -> str | None:
            params: dict[str, object] = {
                "name": "store",
                "arguments": {"content": text, "request_id": request_id},
            }
            if era == MODERN:
                params["_meta"] = {
                    "io.modelcontextprotocol/protocolVersion": MODERN,
                    "io.modelcontextprotocol/clientCapabilities": {},
                    "io.modelcontextprotocol/clientInfo": {"name": "bench", "version": "1"},
                }
            body = {"jsonrpc": "2.0", "id": next(ids), "method": "tools/call", "params": params}
            r = (await http.post(url, json=body)).json()["result"]
            return str(r["structuredContent"]["code"]) if r.get("isError") else None

        yield call


async def _loop(call: Call, cid: int, until: float, burst: Burst) -> None:
    i = 0
    while time.monotonic() < until:
        t0 = time.perf_counter()
        error = await call(content(burst.tag, cid, i), f"{burst.tag}c{cid}-{i}")
        dt = time.perf_counter() - t0
        if error is None:
            burst.latencies.append(dt)
        else:
            burst.errors.append(error)
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
    """Open every client first, then start the clock: building an HTTP client (its TLS
    context, certificates and all) blocks the generator's event loop for tens of
    milliseconds, so sixteen built inside the window stalled its first 0.75 s — the
    first calls of every round, of the ceiling and Walkeep alike, waited up to 0.9 s,
    and those waits *were* the p99 (measured on a slow machine, per 250 ms of a burst)."""
    burst = Burst()
    open_client = _wire_client if kind == "wire" else _sdk_client
    async with contextlib.AsyncExitStack() as stack:
        calls = [
            await stack.enter_async_context(open_client(url, keys[cid % len(keys)], era))
            for cid in range(clients)
        ]
        # One call per client, one client at a time, before the clock: each opens its
        # connection alone. Opened at once, all sixteen went to one of `--workers 2`'s
        # web processes (asyncio accepts every pending connection when it wakes), and
        # the other served nothing.
        for cid, call in enumerate(calls):
            await call(content(burst.tag, cid, -1), f"{burst.tag}c{cid}-open")
        # The generator's own full collections (its heap holds the MCP SDK, SQLAlchemy…)
        # stopped every call in flight for ~120 ms every few seconds on a slow machine:
        # its p99, not the server's. As `walkeep serve` does, take what exists out of sight.
        gc.collect()
        gc.freeze()
        start = time.monotonic()
        until = start + seconds
        async with anyio.create_task_group() as tg:
            for cid, call in enumerate(calls):
                tg.start_soon(_loop, call, cid, until, burst)
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
        from walkeep.service.operators.accounts import create_account

        db = Database(url)
        for n in range(1, accounts):
            keys.append(
                create_account(db, f"bench-{n}", credits_mc=ledger.usd_to_mc("10000")).api_key
            )
        db.dispose()
    return Walkeep(proc=proc, port=port, keys=keys, data_dir=data_dir, db_url=url)
