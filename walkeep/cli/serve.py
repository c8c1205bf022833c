"""Running Walkeep: ``serve`` (MCP, REST, console; the worker in-process), the stdio ``mcp`` bridge and the standalone ``worker``, and the first-run banner."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Annotated

import typer

from walkeep import __version__
from walkeep.config import Settings

if TYPE_CHECKING:
    from walkeep.db import Database
from walkeep.cli._common import (
    CliError,
    _bind,
    _check_port,
    _settings,
    open_db,
    refuse_early,
    serve_metrics,
)


def _serve_settings(host: str, port: int) -> Settings:
    settings = _settings()
    if "public_url" not in settings.model_fields_set:
        shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
        settings.public_url = f"http://{shown}:{port}"
    return settings


def first_run(settings: Settings, db: Database, *, show_key: bool | None = None) -> str | None:
    """On an empty database: a `default` account with promo credits, its key saved
    (mode 0600). Returns the banner that shows the key with ready-to-paste MCP client
    configs (``walkeep serve`` prints it once the server is up), or None.

    The key itself is in the banner only when the banner goes to a terminal
    (``show_key``, default: whether stderr is one). Otherwise the output is likely a log
    file or a log shipper, where a live key must not land: the banner says where the
    credentials file is instead.
    """
    from walkeep import ledger
    from walkeep.onboarding import client_configs, credentials_path, write_credentials
    from walkeep.service.operators import accounts

    if accounts.find_account_by_name(db, "default") is not None or _has_accounts(db):
        return None
    if show_key is None:
        show_key = sys.stderr.isatty()
    promo = ledger.usd_to_mc(settings.promo_credits_usd)
    created = accounts.create_account(
        db, "default", credits_mc=promo, grant_reason="promo credits (early access)"
    )
    mcp_url = settings.public_url.rstrip("/") + "/mcp"
    path = credentials_path(settings)
    write_credentials(path, created.api_key, created.account_id, mcp_url)
    head = (
        f"Created account 'default' ({created.account_id}) with "
        f"{ledger.credits_display(promo)} promo credits.\n"
    )
    if show_key:
        return (
            head
            + f"API key (saved to {path}, mode 0600): {created.api_key}\n\n"
            + client_configs(mcp_url, created.api_key)
        )
    placeholder = "YOUR_API_KEY"  # ASCII: it is pasted into JSON and shell commands
    return (
        head + f"API key saved to {path} (mode 0600); not printed here because this output is "
        f"not a terminal. Read it there, then use it in place of {placeholder} below.\n\n"
        + client_configs(mcp_url, placeholder)
    )


def _has_accounts(db: Database) -> bool:
    from sqlalchemy import select

    from walkeep.db.models import Account

    with db.read() as s:
        return s.scalar(select(Account.id).limit(1)) is not None


def serve_banner(
    settings: Settings,
    *,
    host: str,
    port: int,
    network: str,
    storage: str,
    first_run_text: str | None,
    workers: int = 1,
    worker_in_process: bool = True,
    schedule: str | None = None,
) -> str:
    """What a person at the terminal needs, printed after start-up logging."""
    from walkeep import logs
    from walkeep.onboarding import credentials_path

    base = settings.public_url.rstrip("/")
    rule = "─" * 72
    lines = [
        "",
        rule,
        f"Walkeep {__version__} is up on http://{host}:{port}  ({network} network, "
        f"{storage} storage)",
        f"  MCP endpoint   {base}/mcp",
        f"  REST + docs    {base}/v1  ·  {base}/docs",
    ]
    if workers > 1:
        jobs = f"scheduler in pid {os.getpid()}" if worker_in_process else "no scheduler"
        lines.append(f"  Processes      {workers} web processes on one port, {jobs}")
    if schedule:
        lines.append(f"  Worker         {schedule}")
    from walkeep.egress import start_notice

    egress = start_notice(settings.egress_policy, default=settings.alert_egress_allow is None)
    lines.append(f"  Alert egress   webhooks may reach {egress}")
    if not logs.access_log_on(settings.access_log):
        lines.append("  Access log     off (--access-log prints a line per request)")
    if first_run_text:
        lines += ["", first_run_text.rstrip()]
    else:
        path = credentials_path(settings)
        where = (
            f"the key saved on first run is in {path}"
            if path.exists()
            else "create one with `walkeep key create --account NAME`"
        )
        lines.append(f"  API key        {where}")
    lines += [rule, ""]
    return "\n".join(lines)


def serve(
    host: Annotated[str, typer.Option(help="Interface to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port to listen on.")] = 8080,
    no_worker: Annotated[
        bool, typer.Option("--no-worker", help="Don't run the scheduler in this process.")
    ] = False,
    workers: Annotated[
        int,
        typer.Option(
            "--workers",
            help="Web processes sharing the port (PostgreSQL only); the scheduler still "
            "runs once, in this process.",
        ),
    ] = 1,
    access_log: Annotated[
        bool | None,
        typer.Option(
            "--access-log/--no-access-log",
            help="One log line per request. Default: on, except on a terminal "
            "(WALKEEP_ACCESS_LOG).",
        ),
    ] = None,
) -> None:
    """Serve MCP (/mcp) and REST (/v1); run the worker in-process unless --no-worker."""
    _check_port(port, "--port")
    from walkeep import logs
    from walkeep.api.serve import check_workers, serve_many, serve_one
    from walkeep.bootstrap import build_runtime

    settings = _serve_settings(host, port)
    if access_log is not None:
        settings.access_log = "on" if access_log else "off"  # the web processes read it too
    # Everything that can refuse comes first: nothing is opened, bound or written yet.
    check_workers(settings, workers)
    refuse_early(settings, schedules=not no_worker)
    listener = _bind(host, port, "--port")  # before anything is changed
    logs.setup(settings.log_level, fmt=settings.log_format)
    logs.access_log(settings.access_log)
    db = open_db(settings)
    # With --workers the web processes build their own runtimes; this one configures the
    # local network once and runs the scheduler and the completer (walkeep.api.serve).
    rt = build_runtime(settings, configure_network=True)
    schedule = None
    if not no_worker:
        from walkeep.scheduler.jobs import schedule_note

        # Off the local network the chain's epoch length is known only now: an interval
        # that cannot keep up is refused here, still before anything is recorded.
        schedule = schedule_note(rt)
    from walkeep.ops import record_server

    record_server(settings)  # so `walkeep smoke` links to this server's explorer
    welcome = first_run(settings, db)
    db.dispose()
    banner = serve_banner(
        settings,
        host=host,
        port=port,
        network=rt.chain.network,
        storage=rt.relayer.name,
        first_run_text=welcome,
        workers=workers,
        worker_in_process=not no_worker,
        schedule=schedule,
    )
    if workers == 1:
        serve_one(rt, host=host, port=port, banner=banner, scheduler=not no_worker, sock=listener)
    elif not serve_many(
        rt,
        host=host,
        port=port,
        workers=workers,
        banner=banner,
        scheduler=not no_worker,
        sock=listener,
    ):
        raise CliError("a web process failed to start (its error is above); stopped them all")


def mcp_stdio(
    url: Annotated[
        str | None,
        typer.Option(
            "--url",
            metavar="URL",
            help="A hosted Walkeep's MCP endpoint (https://…/mcp): bridge stdio to it "
            "instead of serving locally.",
        ),
    ] = None,
    api_key: Annotated[
        str | None,
        typer.Option(
            "--api-key",
            metavar="KEY",
            help="API key (wk_live_…). Default: $WALKEEP_API_KEY, else the credentials file.",
        ),
    ] = None,
    namespace: Annotated[
        str | None,
        typer.Option("--namespace", "--ns", help="Default namespace for calls that omit one."),
    ] = None,
) -> None:
    """Serve MCP over stdio, for hosts that launch a command (local, or --url remote)."""
    settings = _settings()
    if url is not None:
        from walkeep.mcp.bridge import run_bridge
        from walkeep.onboarding import resolve_api_key

        if not url.startswith(("http://", "https://")):
            raise CliError(f"--url must be an http(s) URL ending in /mcp, got {url!r}")
        run_bridge(
            url, resolve_api_key(settings, api_key), namespace=namespace or settings.namespace
        )
        return
    from walkeep.mcp.stdio import run_stdio

    run_stdio(settings, api_key=api_key, namespace=namespace)


def worker(
    metrics_port: Annotated[
        int | None,
        typer.Option(
            "--metrics-port",
            envvar="WALKEEP_WORKER_METRICS_PORT",
            help="Serve Prometheus /metrics on this port (default: off).",
        ),
    ] = None,
    metrics_host: Annotated[
        str, typer.Option("--metrics-host", help="Interface for --metrics-port.")
    ] = "127.0.0.1",
) -> None:
    """Run the background jobs (renewal, completion, sweep, reconciliation)."""
    from walkeep import logs
    from walkeep.bootstrap import build_runtime
    from walkeep.db import sqlite_file
    from walkeep.scheduler.jobs import log, worker_lock_for
    from walkeep.scheduler.run import run_forever

    if metrics_port is not None:
        _check_port(metrics_port, "--metrics-port")
    settings = _settings()
    # Everything that can refuse comes first (DESIGN invariant 11): the configuration,
    # the intervals, SQLite's one-worker lock and the metrics port, all before the local
    # network is configured.
    refuse_early(settings, schedules=True)
    lock = worker_lock_for(sqlite_file(settings.db_url))
    logs.setup(settings.log_level, fmt=settings.log_format)
    if metrics_port is not None:
        bound = serve_metrics(metrics_host, metrics_port, "--metrics-port")
        log.info("metrics served", extra={"url": f"http://{metrics_host}:{bound}/metrics"})
    open_db(settings).dispose()
    rt = build_runtime(settings, with_completer=False, configure_network=True)
    run_forever(rt, lock=lock)
