"""``walkeep mcp``: the stdio transport, for MCP hosts that launch a command.

stdout is the protocol wire: everything else (logs, warnings) goes to stderr.
The API key comes from ``--api-key``, else ``WALKEEP_API_KEY``, else the
credentials file ``walkeep serve`` writes on first run. The default namespace
follows MemWal's precedence: explicit argument > ``--namespace`` >
``WALKEEP_NAMESPACE`` > the key's own default > none, where ``store`` then uses
"default" and ``recall``/``export`` cover every namespace (as their tool
descriptions say). A key confined to its namespace has that one only: another
``--namespace`` is refused at start.
"""

from __future__ import annotations

import logging

import anyio

from walkeep import logs
from walkeep.api.auth import KeyCache
from walkeep.bootstrap import build_runtime
from walkeep.config import Settings
from walkeep.errors import ConfigurationError, Unauthorized
from walkeep.mcp.envelope import WalkeepMCP, error_result
from walkeep.mcp.server import Caller, build_mcp, current_caller
from walkeep.onboarding import credentials_path, resolve_api_key
from walkeep.service.runtime import Runtime

__all__ = ["credentials_path", "resolve_api_key", "run_stdio"]

log = logging.getLogger(__name__)


def build_stdio_mcp(
    rt: Runtime, api_key: str, namespace: str | None, *, keys: KeyCache | None = None
) -> WalkeepMCP:
    """The MCP server for one key over stdio, re-checking that key like the HTTP path does.

    A host keeps ``walkeep mcp`` running for days; checking the key only at start meant a
    revoked key kept working until the host restarted it. Every tool call now resolves the
    key through the same short-lived cache as HTTP, so a revocation (or a disabled account)
    takes effect within ``CACHE_TTL_SECONDS`` and the call answers UNAUTHORIZED.
    Raises ConfigurationError at start if the key is already refused.
    """
    keys = keys or KeyCache(rt)
    try:
        first = keys.resolve(api_key)
    except Unauthorized as exc:
        raise ConfigurationError(f"the API key was refused: {exc.message}") from exc
    default_ns = namespace or rt.settings.namespace or first.default_namespace
    if first.confined_to is not None and default_ns != first.confined_to:
        raise ConfigurationError(
            f"the API key is confined to namespace {first.confined_to!r}: drop "
            f"--namespace / WALKEEP_NAMESPACE ({default_ns!r}) or use another key"
        )
    mcp = build_mcp(lambda: rt, transport="stdio")
    inner = mcp.call_tool

    async def call_tool(name, arguments, context=None):  # type: ignore[no-untyped-def]
        try:
            who = await anyio.to_thread.run_sync(keys.resolve, api_key)
        except Unauthorized as exc:
            log.warning("stdio: refusing %s: %s", name, exc.message)
            return error_result(
                Unauthorized(
                    "this API key was revoked (or its account disabled); "
                    "configure a new key for this MCP server",
                    {"tool": name},
                )
            )
        token = current_caller.set(Caller(who.account_id, default_ns, who.confined_to))
        try:
            return await inner(name, arguments, context)
        finally:
            current_caller.reset(token)

    mcp.call_tool = call_tool  # type: ignore[method-assign]
    return mcp


def run_stdio(settings: Settings, *, api_key: str | None, namespace: str | None) -> None:
    logs.setup("WARNING", fmt=settings.log_format)
    key = resolve_api_key(settings, api_key)
    rt = build_runtime(settings)
    from walkeep.db import migrate

    migrate.upgrade(settings.db_url)
    mcp = build_stdio_mcp(rt, key, namespace)
    scheduler = _maybe_in_process_worker(rt)
    if rt.completer is not None:
        rt.completer.start()
    try:
        mcp.run()  # stdio is the default transport
    finally:
        if scheduler is not None:
            scheduler.shutdown(wait=True)
        if rt.completer is not None:
            rt.completer.stop()


def _maybe_in_process_worker(rt):  # type: ignore[no-untyped-def]
    """Run the jobs here too when nothing else does (embedded default, SQLite)."""
    from walkeep.scheduler.jobs import acquire_worker_lock, build_scheduler

    try:
        lock = acquire_worker_lock(rt)
    except ConfigurationError:
        return None  # a worker (or `walkeep serve`) already runs the jobs
    if lock is None:
        return None  # PostgreSQL deployments run `python -m worker`
    sched = build_scheduler(rt, blocking=False)
    sched.start()
    rt.extras["worker_lock"] = lock
    return sched
