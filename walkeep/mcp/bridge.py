"""``walkeep mcp --url https://host/mcp``: stdio in front, a hosted Walkeep behind.

Claude Desktop and other hosts that only launch commands reach a remote Walkeep with
one config line and no extra npm tool. The bridge is a proxy built from the MCP SDK's
own pieces: a low-level stdio ``Server`` whose ``tools/list`` and ``tools/call``
handlers forward to an SDK ``Client`` over Streamable HTTP with the API key as a
bearer header. It holds no state: no database, no model, no local network (this
module imports none of them, and ``walkeep.cli`` imports it lazily), so it starts in
well under a second. Tool errors are already tool results (``isError`` with the
``{code, message, data}`` envelope) and pass through untouched. A refused key is
explained before the host's handshake (one line on stderr, exit status 1) and, if the
key is revoked mid-session, as an ``UNAUTHORIZED`` tool result.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import httpx

from walkeep import __version__
from walkeep.errors import ConfigurationError, envelope_of

log = logging.getLogger(__name__)

CONNECT_TIMEOUT = 30.0
READ_TIMEOUT = 300.0


def probe(url: str, api_key: str) -> dict[str, Any] | None:
    """One plain request to learn whether the remote takes this key.

    Returns the remote's 401 envelope when the key is refused, ``None`` when it is
    accepted; raises ``ConfigurationError`` with the reason when the URL is no
    Walkeep MCP endpoint at all.
    """
    ping = {"jsonrpc": "2.0", "id": 0, "method": "ping"}
    headers = {
        "Authorization": f"Bearer {api_key}",
        "Accept": "application/json, text/event-stream",
        "User-Agent": f"walkeep-bridge/{__version__}",
    }
    try:
        r = httpx.post(url, json=ping, headers=headers, timeout=CONNECT_TIMEOUT)
    except httpx.HTTPError as exc:
        raise ConfigurationError(f"cannot reach {url}: {exc}") from exc
    if r.status_code == 401:
        try:
            envelope = envelope_of(r.json())  # a JSON-RPC error, or an older server's envelope
        except ValueError:
            envelope = None
        return envelope or {
            "code": "UNAUTHORIZED",
            "message": r.text[:200] or "refused",
            "data": {},
        }
    if r.status_code in (404, 405):
        raise ConfigurationError(
            f"{url} answered {r.status_code}: is this a Walkeep MCP endpoint? "
            "It usually ends in /mcp, e.g. https://walkeep.example.com/mcp"
        )
    if r.status_code == 421:
        raise ConfigurationError(
            f"{url} refused its own host name (421): its operator must add it to "
            "WALKEEP_PUBLIC_URL or WALKEEP_ALLOWED_HOSTS"
        )
    return None


def refused_message(url: str, body: dict[str, Any]) -> str:
    return f"{url} refused the API key: {body.get('message', 'unauthorized')}"


def run_bridge(url: str, api_key: str, *, namespace: str | None = None) -> None:
    """Serve stdio until the host closes it; every call goes to ``url``."""
    import anyio

    refused = probe(url, api_key)
    if refused is not None:
        raise ConfigurationError(refused_message(url, refused))
    anyio.run(_serve, url, api_key, namespace)


async def _serve(url: str, api_key: str, namespace: str | None) -> None:
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.server.lowlevel import Server
    from mcp.server.stdio import stdio_server
    from mcp.types import (
        CallToolRequestParams,
        CallToolResult,
        ListToolsResult,
        PaginatedRequestParams,
        TextContent,
    )

    http = httpx2.AsyncClient(
        headers={
            "Authorization": f"Bearer {api_key}",
            "User-Agent": f"walkeep-bridge/{__version__}",
        },
        timeout=httpx2.Timeout(CONNECT_TIMEOUT, read=READ_TIMEOUT),
    )
    async with http, Client(streamable_http_client(url, http_client=http)) as remote:
        takes_namespace: set[str] = set()

        async def list_tools(_ctx: Any, params: PaginatedRequestParams | None) -> ListToolsResult:
            listing = await remote.list_tools(cursor=params.cursor if params else None)
            for tool in listing.tools:
                if "namespace" in (tool.input_schema or {}).get("properties", {}):
                    takes_namespace.add(tool.name)
            return listing

        async def call_tool(_ctx: Any, params: CallToolRequestParams) -> CallToolResult:
            args = dict(params.arguments or {})
            if namespace and params.name in takes_namespace and not args.get("namespace"):
                args["namespace"] = namespace
            try:
                return await remote.call_tool(params.name, args)
            except Exception:
                # Transport-level failure: a 401 (key revoked since start-up) becomes the
                # UNAUTHORIZED tool result an agent can read; anything else stays an error.
                body = await anyio_probe(url, api_key)
                if body is None:
                    raise
                return CallToolResult(
                    is_error=True,
                    structured_content=body,
                    content=[TextContent(type="text", text=json.dumps(body))],
                )

        server: Server[Any] = Server(
            "walkeep",
            version=__version__,
            instructions=f"Walkeep at {url} (via walkeep mcp --url).",
            on_list_tools=list_tools,
            on_call_tool=call_tool,
        )
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())


async def anyio_probe(url: str, api_key: str) -> dict[str, Any] | None:
    import anyio

    try:
        return await anyio.to_thread.run_sync(probe, url, api_key)
    except ConfigurationError:
        return None
