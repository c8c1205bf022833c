"""The one error envelope of Walkeep's MCP tools, on every path a call can fail.

Every failure is a tool result with ``isError: true`` and ``structuredContent``
``{code, message, data}``: domain errors, schema validation, an argument a tool does not
take, unknown tools and crashes alike. Every published outputSchema admits that envelope
(``anyOf[success, error]``) so strict clients such as MCP Inspector accept it
(notes/mcp.md §1.3–1.4). The tools themselves are in ``server.py``.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import pydantic
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError, UnexpectedToolError
from mcp.types import CallToolResult, TextContent

from walkeep import metrics
from walkeep.db import is_outage
from walkeep.errors import Internal, ServiceUnavailable, ValidationError, WalkeepError

log = logging.getLogger(__name__)

ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "Returned with isError: true.",
    "required": ["code", "message"],
    "properties": {
        "code": {
            "type": "string",
            "description": "INSUFFICIENT_BALANCE | NOT_FOUND | FORBIDDEN | QUOTA_EXCEEDED | "
            "RELAYER_UNAVAILABLE | VALIDATION_ERROR | PAYMENTS_UNAVAILABLE | UNAUTHORIZED | "
            "RATE_LIMITED | SERVICE_UNAVAILABLE | INTERNAL",
        },
        "message": {"type": "string"},
        "data": {"type": "object"},
    },
}


def error_result(err: WalkeepError) -> CallToolResult:
    body = err.body()
    return CallToolResult(
        is_error=True,
        structured_content=body,
        content=[TextContent(type="text", text=json.dumps(body))],
    )


def with_error_branch(schema: dict[str, Any]) -> dict[str, Any]:
    body = dict(schema)
    defs = body.pop("$defs", {})
    return {
        "type": "object",
        "$defs": {**defs, "WalkeepError": ERROR_SCHEMA},
        "anyOf": [body, {"$ref": "#/$defs/WalkeepError"}],
    }


class WalkeepMCP(MCPServer):
    """MCPServer with one error envelope for every failure and honest output schemas."""

    transport = "http"
    # Each tool's argument names, read once: the tools are fixed when the server is built.
    _arguments: dict[str, frozenset[str]] | None = None

    async def list_tools(self):  # type: ignore[no-untyped-def]
        tools = await super().list_tools()
        out = []
        for t in tools:
            # A misspelled argument is refused (call_tool), and the input schema says so.
            update: dict[str, Any] = {
                "input_schema": {**t.input_schema, "additionalProperties": False}
            }
            if t.output_schema:
                update["output_schema"] = with_error_branch(t.output_schema)
            out.append(t.model_copy(update=update))
        return out

    async def _unknown_arguments(self, name: str, arguments: dict[str, Any] | None) -> list[str]:
        """Arguments the tool does not take. The SDK drops them silently, so a misspelled
        optional argument (``namspace``) would quietly change what a call means."""
        if not arguments:
            return []
        if self._arguments is None:
            self._arguments = {
                t.name: frozenset((t.input_schema or {}).get("properties", {}))
                for t in await super().list_tools()
            }
        known = self._arguments.get(name)
        if known is None:  # an unknown tool: the SDK's error path names it
            return []
        return sorted(set(arguments) - known)

    async def call_tool(self, name, arguments, context=None):  # type: ignore[no-untyped-def]
        started = time.perf_counter()
        try:
            unknown = await self._unknown_arguments(name, arguments)
            if unknown:
                result = error_result(
                    ValidationError(
                        f"{name} does not take {', '.join(map(repr, unknown))}",
                        {"field": unknown[0], "unknown": unknown},
                    )
                )
            else:
                result = await super().call_tool(name, arguments, context)
        except UnexpectedToolError as exc:
            if is_outage(exc):
                log.warning("tool %s: database unavailable", name)
                result = error_result(
                    ServiceUnavailable("Walkeep's database is unreachable; retry shortly")
                )
            else:
                log.exception("tool %s crashed", name)
                result = error_result(Internal(f"{name} failed unexpectedly; the error was logged"))
        except ToolError as exc:
            cause = exc.__cause__
            if isinstance(cause, pydantic.ValidationError):
                errors = [
                    {"loc": ".".join(map(str, e["loc"])), "msg": e["msg"], "type": e["type"]}
                    for e in cause.errors(include_url=False)
                ]
                result = error_result(
                    ValidationError(f"invalid arguments for {name}", {"errors": errors})
                )
            else:
                known = sorted(t.name for t in await super().list_tools())
                if name not in known:
                    result = error_result(
                        ValidationError(f"unknown tool {name!r}", {"tool": name, "tools": known})
                    )
                else:
                    log.warning("tool %s raised ToolError: %s", name, exc)
                    result = error_result(ValidationError(str(exc)))
        outcome = "ok"
        if isinstance(result, CallToolResult) and result.is_error:
            sc = result.structured_content or {}
            outcome = str(sc.get("code", "ERROR"))
        metrics.TOOL_CALLS.labels(name, self.transport, outcome).inc()
        metrics.TOOL_LATENCY.labels(name, self.transport).observe(time.perf_counter() - started)
        return result
