"""The ceiling of our own stack: a ``store`` tool that does nothing, served exactly as Walkeep's.

Same MCP SDK (``MCPServer``), same tool signature and output schema, same
Streamable HTTP transport settings (stateless, JSON responses), same ASGI
server and settings (uvicorn, one process). Whatever Walkeep's store costs on
top of this is ours; what this costs is the SDK's, the transport's and the
load generator's (which shares the machine's two cores with the server).

    python bench/ceiling.py [--clients 16] [--seconds 15] [--accounts 1]
                            [--client sdk|wire] [--pg-server URL]

drives this server and Walkeep (``walkeep serve``) with the same load generator
(``bench/load.py``) for the same time, in alternating rounds with the other one
stopped (``load.alternate``), and prints both and the ratio.
``python bench/ceiling.py --serve PORT`` only runs the do-nothing server.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Annotated

from mcp.types import CallToolResult, TextContent
from pydantic import Field

from walkeep.api.serve import freeze_start_up_heap
from walkeep.service.tools.schemas import StoreResult

sys.path.insert(0, str(Path(__file__).resolve().parent))

from load import (
    LEGACY,
    MODERN,
    Served,
    alternate,
    free_port,
    scratch_database,
    start_walkeep,
    wait_healthy,
)


def serve(port: int) -> None:
    import uvicorn
    from mcp.server.mcpserver import MCPServer

    mcp = MCPServer("ceiling", log_level="WARNING")

    @mcp.tool(name="store")
    async def store_tool(
        content: Annotated[str, Field(min_length=1)],
        request_id: Annotated[str, Field(min_length=1, max_length=255)],
        namespace: Annotated[str | None, Field(default=None, min_length=1, max_length=255)] = None,
        metadata: dict[str, str] | None = None,
    ) -> Annotated[CallToolResult, StoreResult]:
        """Accept nothing, answer like a store receipt."""
        data = {
            "memory_id": "mem_" + request_id,
            "status": "storing",
            "namespace": namespace or "default",
            "cost_credits": 1,
            "note": "ceiling",
        }
        return CallToolResult(
            structured_content=data, content=[TextContent(type="text", text=str(data))]
        )

    app = mcp.streamable_http_app(
        streamable_http_path="/mcp", stateless_http=True, json_response=True
    )
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    app.router.routes.append(Route("/healthz", lambda _r: PlainTextResponse("ok")))
    freeze_start_up_heap()  # as `walkeep serve` does: no full-heap collections mid-burst
    uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")).run()


def start(accounts: int) -> Served:
    """Start the do-nothing server in a session of its own (``freeze`` stops it whole)."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_healthy(f"http://127.0.0.1:{port}/healthz", lambda: proc.poll() is None)
    except SystemExit:
        proc.kill()
        raise
    return Served(proc, port, [f"ceiling-{n}" for n in range(accounts)])


def add_load_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=15)
    ap.add_argument("--accounts", type=int, default=1, help="spread the clients over N accounts")
    ap.add_argument("--client", choices=["sdk", "wire"], default="sdk")
    ap.add_argument(
        "--era",
        choices=[LEGACY, MODERN],
        default=LEGACY,
        help="protocol revision the wire client speaks (the SDK client negotiates its own)",
    )
    ap.add_argument(
        "--pg-server",
        metavar="URL",
        default=None,
        help="run Walkeep on PostgreSQL: a scratch database is created on this server and "
        "dropped afterwards (e.g. postgresql+psycopg://postgres@127.0.0.1:5432/test)",
    )
    ap.add_argument("--workers", type=int, default=1, help="walkeep serve --workers N")
    ap.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="alternate the ceiling and Walkeep this many times, --seconds split among them",
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--serve", type=int, metavar="PORT", help="only run the do-nothing server")
    add_load_args(ap)
    args = ap.parse_args()
    if args.serve:
        serve(args.serve)
        return
    load = dict(clients=args.clients, kind=args.client, era=args.era)
    roof = start(args.accounts)
    try:
        with scratch_database(args.pg_server) as db_url:
            server = start_walkeep(db_url, accounts=args.accounts, args=worker_args(args.workers))
            try:
                ceiling, walkeep = alternate(
                    [roof, server], rounds=args.rounds, seconds=args.seconds, **load
                )
            finally:
                server.stop()
    finally:
        roof.stop()
    db = "postgresql" if args.pg_server else "sqlite"
    print(f"load: {args.clients} clients, {args.accounts} account(s), client={args.client}")
    print(f"ceiling (do-nothing store):       {ceiling.line()}")
    print(f"walkeep store ({db}, {args.workers} proc): {walkeep.line()}")
    print(f"ratio: {walkeep.rate / ceiling.rate:.2f} of the ceiling")


def worker_args(workers: int) -> list[str]:
    return ["--workers", str(workers)] if workers > 1 else []


if __name__ == "__main__":
    main()
