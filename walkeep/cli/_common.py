"""What every command group shares: settings, the database, one-line errors, JSON output.

Imports of the database, the service layer and the runtime stay inside the functions, so
``walkeep --help`` and the ``mcp --url`` bridge start without loading them.
"""

from __future__ import annotations

import errno
import json
import socket
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import typer

from walkeep.config import Settings, load_settings

if TYPE_CHECKING:
    from walkeep.db import Database

JSON_HELP = "Print one JSON object instead of text."


class CliError(Exception):
    """A one-line message for the operator."""


def _settings() -> Settings:
    return load_settings()  # ConfigurationError names each bad WALKEEP_… variable


def open_db(settings: Settings | None = None, *, migrate: bool = True) -> Database:
    """Connect, and bring the schema to head (idempotent and quick when current)."""
    from walkeep.db import Database
    from walkeep.db import migrate as migrations

    settings = settings or _settings()
    db = Database(settings.db_url)
    db.ping()
    if migrate:
        migrations.upgrade(settings.db_url)
    return db


def _usd(value: str, field: str) -> int:
    from walkeep import ledger

    try:
        d = Decimal(value)
    except Exception as exc:
        raise CliError(f"{field} must be a number, got {value!r}") from exc
    if d < 0:
        raise CliError(f"{field} must not be negative")
    return ledger.usd_to_mc(d)


def _emit(data: dict[str, Any], as_json: bool, human: str) -> None:
    typer.echo(json.dumps(data, sort_keys=False) if as_json else human)


def _resolve_account(db: Database, ref: str) -> str:
    from walkeep.service.operators import accounts

    if ref.startswith("acct_"):
        return ref
    found = accounts.find_account_by_name(db, ref)
    if found is None:
        raise CliError(f"unknown account {ref!r}")
    return found


def _first_line(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", None) or exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _runtime() -> Any:
    """A Runtime for one-shot commands (no background threads), schema brought to head."""
    from walkeep.bootstrap import build_runtime

    settings = _settings()
    db = open_db(settings)
    return build_runtime(settings, database=db, with_completer=False)


def _when(value: Any) -> str | None:
    return value.isoformat() if value is not None else None


def _bind(host: str, port: int, flag: str) -> socket.socket:
    """Bind the listening socket before anything else happens.

    Why first: a second ``walkeep serve`` (or ``devnet``) on a port in use used to
    migrate, rewrite ``server.json`` and reconfigure the running local network before
    uvicorn found the port taken. Binding up front makes that case one line and no
    side effect; the server then serves on this very socket (no window for a race).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise CliError(
                f"{host}:{port} is already in use (another `walkeep serve`?); nothing was "
                f"changed. Stop that process or pick another {flag}"
            ) from None
        raise CliError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.set_inheritable(True)  # --workers: uvicorn hands it to the web processes
    return sock


def refuse_early(settings: Settings, *, schedules: bool) -> None:
    """Every refusal a start can know from its settings, before anything is changed.

    DESIGN invariant 11: ``serve`` and ``worker`` record the server's address, create the
    first account and set the local network's epoch length; refused afterwards, they left
    a running server's ``server.json`` pointing at nothing and its epochs changed. So the
    wrong combinations (:func:`walkeep.bootstrap.check_config`) and job intervals that
    cannot keep up with the epoch length the network *will* have are checked here, first.
    Off the local network the epoch length is the chain's: checked once the runtime is
    built, still before anything is recorded.
    """
    from walkeep.bootstrap import planned_epoch_seconds, refuse_bad_config

    refuse_bad_config(settings)
    if schedules:
        from walkeep.scheduler.jobs import job_intervals

        job_intervals(settings, planned_epoch_seconds(settings))


def serve_metrics(host: str, port: int, flag: str) -> int:
    """Serve ``/metrics`` on its own port now (before anything is changed), or refuse."""
    from walkeep import metrics

    try:
        return metrics.serve(port, host)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise CliError(
                f"{host}:{port} is already in use; nothing was changed. Pick another {flag}"
            ) from None
        raise CliError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


def _check_port(port: int, flag: str) -> None:
    """Refuse what the OS would silently replace (``:99999`` listened elsewhere)."""
    if not 1 <= port <= 65535:
        raise CliError(f"{flag} must be a TCP port between 1 and 65535, got {port}")
