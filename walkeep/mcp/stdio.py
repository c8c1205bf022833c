"""``walkeep mcp``: the stdio transport, for MCP hosts that launch a command.

stdout is the protocol wire: everything else (logs, warnings) goes to stderr.
The API key comes from ``--api-key``, else ``WALKEEP_API_KEY``, else the
credentials file ``walkeep serve`` writes on first run. The default namespace
follows MemWal's precedence: explicit argument > ``--namespace`` >
``WALKEEP_NAMESPACE`` > the key's own default > none, where ``store`` then uses
"default" and ``recall``/``export`` cover every namespace (as their tool
descriptions say).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from walkeep import logs
from walkeep.bootstrap import build_runtime
from walkeep.config import Settings
from walkeep.errors import ConfigurationError, Unauthorized
from walkeep.mcp.server import Caller, build_mcp
from walkeep.service import accounts

log = logging.getLogger(__name__)


def credentials_path(settings: Settings) -> Path:
    return settings.data_dir / "credentials.json"


def resolve_api_key(settings: Settings, flag: str | None) -> str:
    if flag:
        return flag
    if settings.api_key:
        return settings.api_key
    path = credentials_path(settings)
    if path.exists():
        try:
            return str(json.loads(path.read_text())["api_key"])
        except (ValueError, KeyError) as exc:
            raise ConfigurationError(f"{path} is not a valid credentials file") from exc
    raise ConfigurationError(
        "no API key: pass --api-key, set WALKEEP_API_KEY, or run `walkeep serve` once "
        f"to create {path}"
    )


def run_stdio(settings: Settings, *, api_key: str | None, namespace: str | None) -> None:
    logs.setup("WARNING")
    key = resolve_api_key(settings, api_key)
    rt = build_runtime(settings)
    from walkeep.db import migrate

    migrate.upgrade(settings.db_url)
    try:
        principal = accounts.authenticate(rt.db, key)
    except Unauthorized as exc:
        raise ConfigurationError(f"the API key was refused: {exc.message}") from exc
    default_ns = namespace or settings.namespace or principal.default_namespace
    mcp = build_mcp(
        lambda: rt, transport="stdio", fixed_caller=Caller(principal.account_id, default_ns)
    )
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
    from worker.jobs import acquire_worker_lock, build_scheduler

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
