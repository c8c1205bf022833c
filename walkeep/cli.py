"""The ``walkeep`` command line (typer). Thin: parse, call one function, print.

Every failure an operator can cause (bad input, unknown account, unreachable
database, wrong configuration) ends in one line on stderr and a non-zero exit
status, never a traceback.

Imports of the database, the service layer and the runtime are lazy (inside the
commands): ``walkeep --version``, ``--help`` and the ``walkeep mcp --url`` bridge must
start fast and never load models, an ONNX runtime or the local network.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import socket
import sys
from decimal import Decimal
from typing import TYPE_CHECKING, Annotated, Any

import typer

from walkeep import __version__
from walkeep.config import Settings, load_settings
from walkeep.errors import ConfigurationError, WalkeepError

if TYPE_CHECKING:
    from walkeep.db import Database

app = typer.Typer(
    name="walkeep",
    help="Durable, prepaid, auto-renewed memory for AI agents on Walrus.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
account_app = typer.Typer(help="Create and inspect accounts.", no_args_is_help=True)
key_app = typer.Typer(help="Create and revoke API keys.", no_args_is_help=True)
credits_app = typer.Typer(help="Grant credits.", no_args_is_help=True)
app.add_typer(account_app, name="account")
app.add_typer(key_app, name="key")
app.add_typer(credits_app, name="credits")

JSON_HELP = "Print one JSON object instead of text."


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"walkeep {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            help="Print the version and exit.",
            callback=_print_version,
            is_eager=True,
        ),
    ] = False,
) -> None:
    """Durable, prepaid, auto-renewed memory for AI agents on Walrus."""


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


@app.command()
def migrate() -> None:
    """Create or upgrade the database schema to the latest version."""
    from walkeep.db import Database, redact
    from walkeep.db import migrate as migrations

    settings = _settings()
    db = Database(settings.db_url)
    db.ping()
    migrations.upgrade(settings.db_url)
    typer.echo(f"database at head: {redact(settings.db_url)}")


@account_app.command("create")
def account_create(
    name: Annotated[str, typer.Argument(help="Unique account name.")],
    credits_usd: Annotated[
        str, typer.Option("--credits-usd", help="Starting credits, in US dollars.")
    ] = "0",
    namespace: Annotated[
        str | None, typer.Option("--namespace", help="Default namespace for the first key.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False,
) -> None:
    """Create an account and its first API key (shown once)."""
    from walkeep import ledger
    from walkeep.service.operators import accounts

    mc = _usd(credits_usd, "--credits-usd")
    db = open_db()
    created = accounts.create_account(db, name, credits_mc=mc, default_namespace=namespace)
    _emit(
        {"account_id": created.account_id, "api_key": created.api_key},
        as_json,
        f"account {created.account_id} ({created.name}) created with "
        f"{ledger.credits_display(mc)} credits\n"
        f"API key (shown once, store it now): {created.api_key}",
    )


@account_app.command("show")
def account_show(
    name: Annotated[
        str | None,
        typer.Argument(help="Account id or name (as `account create NAME`).", show_default=False),
    ] = None,
    account: Annotated[
        str | None, typer.Option("--account", help="Account id or name (as other commands).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False,
) -> None:
    """Show an account's balance: `account show NAME` or `account show --account NAME`."""
    if (name is None) == (account is None):
        raise CliError("give the account once: `walkeep account show NAME` (or --account NAME)")
    balance(account=name or account or "", as_json=as_json)


@key_app.command("create")
def key_create(
    account: Annotated[str, typer.Option("--account", help="Account id or name.")],
    namespace: Annotated[
        str | None, typer.Option("--namespace", help="Default namespace for calls with this key.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False,
) -> None:
    """Create another API key for an account (shown once)."""
    from walkeep.service.operators import accounts

    db = open_db()
    created = accounts.create_key(db, _resolve_account(db, account), default_namespace=namespace)
    _emit(
        {"account_id": created.account_id, "api_key": created.api_key, "prefix": created.prefix},
        as_json,
        f"API key for {created.account_id} (shown once): {created.api_key}",
    )


@key_app.command("revoke")
def key_revoke(prefix: Annotated[str, typer.Argument(help="The key's display prefix.")]) -> None:
    """Revoke an API key by its display prefix (e.g. wk_live_AbCd1234)."""
    from walkeep.service.operators import accounts

    db = open_db()
    account_id = accounts.revoke_key(db, prefix)
    typer.echo(f"revoked {prefix} (account {account_id})")


@credits_app.command("grant")
def credits_grant(
    account: Annotated[str, typer.Option("--account", help="Account id or name.")],
    usd: Annotated[str, typer.Option("--usd", help="Amount in US dollars.")],
    reason: Annotated[str, typer.Option("--reason", help="Why (kept in the ledger).")],
    as_json: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False,
) -> None:
    """Grant credits to an account (promotions, support, corrections)."""
    from walkeep import ledger
    from walkeep.service.operators import accounts

    mc = _usd(usd, "--usd")
    if mc == 0:
        raise CliError("--usd must be positive")
    from walkeep.service.pausing import current_epoch_or_none

    rt = _runtime()  # the chain's epoch: paused memories resume now, lapsed ones never
    account_id = _resolve_account(rt.db, account)
    entry = accounts.grant(
        rt.db, account_id, mc, reason=reason, current_epoch=current_epoch_or_none(rt)
    )
    _emit(
        {
            "account_id": account_id,
            "granted_credits": ledger.credits_display(mc),
            "balance_credits": ledger.credits_display(entry.balance_after_mc),
        },
        as_json,
        f"granted {ledger.credits_display(mc)} credits to {account_id}; "
        f"balance {ledger.credits_display(entry.balance_after_mc)} credits",
    )


@app.command()
def balance(
    account: Annotated[str, typer.Option("--account", help="Account id or name.")],
    as_json: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False,
) -> None:
    """Show an account's credits (1 credit = 1 US cent)."""
    from walkeep import ledger
    from walkeep.service.operators import accounts

    db = open_db()
    acct = accounts.get_account(db, _resolve_account(db, account))
    data = {
        "account_id": acct.account_id,
        "name": acct.name,
        "balance_credits": ledger.credits_display(acct.balance_mc),
        "held_credits": ledger.credits_display(acct.held_mc),
        "available_credits": ledger.credits_display(acct.available_mc),
        "balance_usd": ledger.mc_to_usd_str(acct.balance_mc),
    }
    _emit(
        data,
        as_json,
        f"{acct.account_id} ({acct.name}): {data['balance_credits']} credits "
        f"(${data['balance_usd']}), {data['held_credits']} held",
    )


# --- serving ---------------------------------------------------------------------------


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


@app.command()
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
) -> None:
    """Serve MCP (/mcp) and REST (/v1); run the worker in-process unless --no-worker."""
    _check_port(port, "--port")
    from walkeep import logs
    from walkeep.api.serve import check_workers, serve_many, serve_one
    from walkeep.bootstrap import build_runtime

    settings = _serve_settings(host, port)
    check_workers(settings, workers)  # before anything is opened or bound
    listener = _bind(host, port, "--port")  # before anything is changed
    logs.setup(settings.log_level, fmt=settings.log_format)
    db = open_db(settings)
    from walkeep.ops import record_server

    record_server(settings)  # so `walkeep smoke` links to this server's explorer
    welcome = first_run(settings, db)
    db.dispose()
    # With --workers the web processes build their own runtimes; this one configures the
    # local network once and runs the scheduler and the completer (walkeep.api.serve).
    rt = build_runtime(settings, configure_network=True)
    schedule = None
    if not no_worker:
        from walkeep.scheduler.jobs import schedule_note

        # Refuses an interval set too long for the epoch before anything is served.
        schedule = schedule_note(rt)
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


@app.command("mcp")
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


@app.command()
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
    from walkeep.scheduler.run import run_forever

    if metrics_port is not None:
        _check_port(metrics_port, "--metrics-port")
    settings = _settings()
    logs.setup(settings.log_level, fmt=settings.log_format)
    open_db(settings).dispose()
    rt = build_runtime(settings, with_completer=False, configure_network=True)
    run_forever(rt, metrics_port=metrics_port, metrics_host=metrics_host)


@app.command()
def devnet(
    host: Annotated[str, typer.Option(help="Interface to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port.")] = 31415,
) -> None:
    """Serve the local network in Walrus's publisher/aggregator HTTP format (local only)."""
    from walkeep.backends.localnet.devnet import serve_devnet
    from walkeep.bootstrap import open_local_network
    from walkeep.clock import SystemClock

    _check_port(port, "--port")
    settings = _settings()
    listener = _bind(host, port, "--port")  # a port in use fails before anything changes
    network = open_local_network(settings, SystemClock(), owner=True)
    typer.echo(
        f"walkeep devnet: Walrus publisher+aggregator API on http://{host}:{port} "
        f"(state in {settings.localnet_dir}; LOCAL network, not Walrus)",
        err=True,
    )
    serve_devnet(network, host=host, port=port, sock=listener)


@app.command()
def doctor(as_json: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False) -> None:
    """Check configuration and connectivity; say exactly what is missing."""
    from walkeep.ops import doctor as run_doctor

    report = run_doctor(_settings())
    if as_json:
        typer.echo(json.dumps({"ok": report.ok, "checks": [c.__dict__ for c in report.checks]}))
    else:
        for c in report.checks:
            mark = "ok  " if c.ok else "FAIL"
            typer.echo(
                f"[{mark}] {c.name}: {c.detail}"
                + (f"\n       → {c.fix}" if c.fix and not c.ok else "")
            )
    if not report.ok:
        raise typer.Exit(1)


@app.command()
def smoke(
    network: Annotated[
        str | None,
        typer.Option("--network", help="local | testnet | mainnet (default: configured)"),
    ] = None,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the write to land.")] = 600,
) -> None:
    """Store a memory, wait for it to land, renew it, print the renewal's explorer URL."""
    from walkeep.ops import smoke as run_smoke

    settings = _settings()
    if network is not None:
        if network not in ("local", "testnet", "mainnet"):
            raise CliError("--network must be local, testnet or mainnet")
        relayer = (
            settings.relayer if network == "local" or settings.relayer != "local" else "walrus"
        )
        settings = settings.model_copy(update={"network": network, "relayer": relayer})
    result = run_smoke(settings, timeout_seconds=timeout, say=lambda m: typer.echo(m, err=True))
    reach = {True: "", False: "  (not answering now: start `walkeep serve`)", None: ""}
    typer.echo(
        f"OK in {result.seconds:.0f}s: memory {result.memory_id}, blob {result.blob_id}\n"
        f"  blob object {result.blob_object_id}\n"
        f"  end_epoch {result.end_epoch_before} → {result.end_epoch_after}\n"
        f"  renewal {result.digest}\n"
        f"  {result.explorer_url}{reach[result.explorer_reachable]}"
    )


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


def _check_port(port: int, flag: str) -> None:
    """Refuse what the OS would silently replace (``:99999`` listened elsewhere)."""
    if not 1 <= port <= 65535:
        raise CliError(f"{flag} must be a TCP port between 1 and 65535, got {port}")


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


index_app = typer.Typer(help="Recall's search index (derived data).", no_args_is_help=True)
app.add_typer(index_app, name="index")


@index_app.command("rebuild")
def index_rebuild(
    account: Annotated[
        str | None, typer.Option("--account", help="Account id or name (default: all).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False,
) -> None:
    """Re-derive the search index from the stored memories, then write fresh index files.

    Fills in what older versions did not index (word hashes), indexes visible memories
    that have no index rows, and writes each account's segment under <data_dir>/index.
    Safe beside a running server, and resumable: run it again to continue."""
    from walkeep.service.jobs import reindex

    rt = _runtime()
    bars: dict[str, Any] = {}

    def progress(name: str, done: int, total: int) -> None:
        if as_json:
            return
        bar = bars.get(name)
        if bar is None:
            bar = bars[name] = typer.progressbar(length=max(total, 1), label=f"{name:<20}")
            bar.__enter__()
        bar.update(done - bar.pos)
        if done >= total:
            bar.render_finish()

    report = reindex.rebuild(rt, account, progress=progress)
    for bar in bars.values():
        bar.__exit__(None, None, None)
    data = dataclasses.asdict(report)
    _emit(
        data,
        as_json,
        f"{report.accounts} account(s): {report.rows_backfilled} rows got word hashes, "
        f"{report.memories_indexed} memories indexed, {report.segments_written} index files "
        f"written" + (f", {report.unreadable} unreadable (lapsed)" if report.unreadable else ""),
    )


def build_command() -> Any:
    """The click command tree, with help that reads cleanly (see ``tidy_help``)."""
    command = typer.main.get_command(app)
    tidy_help(command)
    return command


def tidy_help(command: Any, parent: Any = None) -> None:
    """Replace typer's ``<str>``/``<bool>`` type placeholders with plain metavars.

    Flags show no value at all; an option that takes a value shows its name in
    capitals (``--port PORT``) unless it declared a metavar. Applied to the whole tree,
    so commands added later read the same way; tests/test_cli_help.py pins it. Duck
    typed: recent typer vendors its own click, older typer uses click itself.
    """
    ctx = command.context_class(command, info_name=command.name, parent=parent)
    params = list(command.params)
    help_option = command.get_help_option(ctx)
    if help_option is not None:
        params.append(help_option)
    for param in params:
        if getattr(param, "is_flag", False) or getattr(param, "count", False):
            param.metavar = ""
        elif param.metavar is None and param.name:
            param.metavar = param.name.upper()
        if getattr(param, "param_type_name", "") == "argument":
            # The name column already says NAME; typer would add a "<str>" type column.
            param.display_type_rich = lambda ctx: None
    for sub in (getattr(command, "commands", None) or {}).values():
        tidy_help(sub, ctx)


# --- console, account list, statements (issue 12) --------------------------------------------


@account_app.command("list")
def account_list(as_json: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False) -> None:
    """Every account with balance, memories, lapsed and paused counts and least runway,
    worst first (lapsed or paused memories, then the least runway)."""
    from walkeep import ledger
    from walkeep.bootstrap import build_runtime
    from walkeep.service.operators import console

    settings = _settings()
    open_db(settings).dispose()
    rt = build_runtime(settings, with_completer=False)
    rows = console.account_summaries(rt)
    if as_json:
        typer.echo(json.dumps([r.to_json() for r in rows]))
        return
    if not rows:
        typer.echo("no accounts yet: walkeep account create NAME")
        return
    header = (
        f"{'ACCOUNT':<24} {'BALANCE':>12} {'MEMORIES':>8} {'LAPSED':>6} {'PAUSED':>6} "
        f"{'RUNWAY':>7}  LAST RENEWAL"
    )
    typer.echo(header)
    for r in rows:
        runway = "-" if r.min_runway_epochs is None else str(r.min_runway_epochs)
        last = r.last_renewal_at.strftime("%Y-%m-%d %H:%M") if r.last_renewal_at else "-"
        name = r.name if len(r.name) <= 24 else r.name[:23] + "…"
        typer.echo(
            f"{name:<24} {'$' + ledger.mc_to_usd_str(r.available_mc):>12} {r.memories:>8} "
            f"{r.lapsed:>6} {r.paused:>6} {runway:>7}  {last}"
        )


@app.command()
def statement(
    account: Annotated[str, typer.Option("--account", help="Account id or name.")],
    start: Annotated[str, typer.Option("--from", help="First UTC day, YYYY-MM-DD.")],
    end: Annotated[str, typer.Option("--to", help="Last UTC day (inclusive), YYYY-MM-DD.")],
    as_csv: Annotated[bool, typer.Option("--csv", help="CSV on stdout.")] = False,
) -> None:
    """Every ledger entry of a period with its running balance; totals reconcile."""
    from walkeep.service.operators import statements

    first = statements.parse_day(start, "--from")
    last = statements.parse_day(end, "--to")
    db = open_db()
    account_id = _resolve_account(db, account)
    if as_csv:
        run = statements.open_statement(db, account_id, first, last)
        for chunk in statements.csv_chunks(db, run):
            sys.stdout.write(chunk)
        sys.stdout.flush()
        if not run.reconciled:
            raise CliError("the ledger does not reconcile over this period (see the closing row)")
        return
    st = statements.statement(db, account_id, first, last)
    cr = statements.credits_str
    typer.echo(f"Statement for {st.account_name} ({st.account_id}), {st.start} to {st.end} (UTC)")
    typer.echo(f"{'opening balance':<40} {cr(st.opening_balance_mc):>14}")
    for line in st.lines:
        typer.echo(
            f"{line.at.strftime('%Y-%m-%d %H:%M:%S')} {line.kind:<9} "
            f"{cr(line.balance_effect_mc, signed=True):>12} {cr(line.balance_after_mc):>14}  "
            f"{line.ref}"
        )
    for kind, total in sorted(st.totals_by_kind.items()):
        typer.echo(f"{'total ' + kind:<40} {cr(total, signed=True):>14}")
    typer.echo(f"{'closing balance':<40} {cr(st.closing_balance_mc):>14}")
    if not st.reconciled:
        raise CliError("the ledger does not reconcile over this period (see the closing row)")


@app.command("console-link")
def console_link(
    account: Annotated[
        str | None, typer.Option("--account", help="Sign in as this account's operator.")
    ] = None,
    admin: Annotated[bool, typer.Option("--admin", help="Sign in as an admin.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False,
) -> None:
    """Print a one-time console sign-in link (single use, expires in 15 minutes)."""
    from walkeep.service.operators import console

    if admin == (account is not None):
        raise CliError("give either --account NAME or --admin")
    settings = _settings()
    db = open_db(settings)
    account_id = None if admin else _resolve_account(db, account or "")
    token, expires = console.create_console_link(
        db, account_id, minutes=settings.console_link_minutes
    )
    # The running server's address (WALKEEP_PUBLIC_URL if set, else what `walkeep serve`
    # recorded in the data dir): a link to the default port may reach something else.
    from walkeep.ops import server_public_url

    url = f"{server_public_url(settings)}/console/link/{token}"
    _emit(
        {"url": url, "expires_at": expires.isoformat(), "admin": admin, "account_id": account_id},
        as_json,
        f"{url}\n(single use; expires {expires.strftime('%Y-%m-%d %H:%M')} UTC)",
    )


# --- alerts and audits (walkeep/service/alerts.py, walkeep/service/operators/verify.py) ---------------

alerts_app = typer.Typer(help="Webhook alerts before anything pauses.", no_args_is_help=True)
app.add_typer(alerts_app, name="alerts")


def _runtime() -> Any:
    """A Runtime for one-shot commands (no background threads), schema brought to head."""
    from walkeep.bootstrap import build_runtime

    settings = _settings()
    db = open_db(settings)
    return build_runtime(settings, database=db, with_completer=False)


def _when(value: Any) -> str | None:
    return value.isoformat() if value is not None else None


@alerts_app.command("set")
def alerts_set(
    account: Annotated[str, typer.Option("--account", help="Account id or name.")],
    url: Annotated[str, typer.Option("--url", help="http(s) URL that receives the events.")],
    threshold_epochs: Annotated[
        int | None,
        typer.Option(
            "--threshold-epochs", help="balance.low below this funded runway (default 4)."
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False,
) -> None:
    """Set the account's alert webhook; prints a new signing secret (shown once)."""
    from walkeep.service import alerts

    rt = _runtime()
    account_id = _resolve_account(rt.db, account)
    secret = alerts.set_alert_webhook(rt, account_id, url, threshold_epochs)
    view = alerts.get_alert_settings(rt, account_id)
    assert view is not None
    data = {
        "account_id": account_id,
        "url": view.url,
        "threshold_epochs": view.threshold_epochs,
        "secret": secret,
    }
    _emit(
        data,
        as_json,
        f"alerts for {account_id} → {view.url} (balance.low below "
        f"{view.threshold_epochs} epochs)\n"
        f"signing secret (shown once, store it now): {secret}",
    )


@alerts_app.command("show")
def alerts_show(
    account: Annotated[str, typer.Option("--account", help="Account id or name.")],
    limit: Annotated[int, typer.Option(help="How many recent deliveries to list.")] = 20,
    as_json: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False,
) -> None:
    """Show the webhook (never the secret) and the latest delivery attempts."""
    from walkeep.service import alerts

    rt = _runtime()
    account_id = _resolve_account(rt.db, account)
    view = alerts.get_alert_settings(rt, account_id)
    if view is None:
        raise CliError(f"no alert webhook is set for {account_id} (walkeep alerts set …)")
    deliveries = alerts.recent_deliveries(rt, account_id, limit=max(1, limit))
    data = {
        "account_id": account_id,
        "url": view.url,
        "threshold_epochs": view.threshold_epochs,
        "secret_hint": view.secret_hint,
        "balance_low": view.balance_low,
        "pending_events": view.pending_events,
        "deliveries": [
            {
                "event_id": d.event_id,
                "type": d.type,
                "attempt": d.attempt,
                "ok": d.ok,
                "status_code": d.status_code,
                "error": d.error,
                "attempted_at": _when(d.attempted_at),
            }
            for d in deliveries
        ],
    }
    lines = [
        f"{account_id} → {view.url}  secret {view.secret_hint}",
        f"balance.low below {view.threshold_epochs} epochs (now "
        f"{'low' if view.balance_low else 'ok'}), {view.pending_events} event(s) pending",
    ]
    for d in deliveries:
        outcome = "ok" if d.ok else (d.error or "failed")
        lines.append(
            f"  {_when(d.attempted_at)}  {d.type:<17} {d.event_id}  #{d.attempt}  {outcome}"
        )
    _emit(data, as_json, "\n".join(lines))


@alerts_app.command("test")
def alerts_test(
    account: Annotated[str, typer.Option("--account", help="Account id or name.")],
    as_json: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False,
) -> None:
    """Send an alert.test event now and report what the receiver answered."""
    from walkeep.service import alerts

    rt = _runtime()
    account_id = _resolve_account(rt.db, account)
    event_id = alerts.send_test_event(rt, account_id)
    alerts.deliver_alerts(rt, event_id=event_id)
    last = next(
        (d for d in alerts.recent_deliveries(rt, account_id, limit=5) if d.event_id == event_id),
        None,
    )
    ok = last is not None and last.ok
    data = {
        "event_id": event_id,
        "ok": ok,
        "status_code": last.status_code if last else None,
        "error": last.error if last else None,
    }
    human = (
        f"delivered {event_id} (HTTP {data['status_code']})"
        if ok
        else f"delivery of {event_id} failed: {data['error']}; it will be retried with backoff"
    )
    _emit(data, as_json, human)
    if not ok:
        raise typer.Exit(1)


@alerts_app.command("remove")
def alerts_remove(
    account: Annotated[str, typer.Option("--account", help="Account id or name.")],
) -> None:
    """Stop sending alerts for the account (pending events are dropped)."""
    from walkeep.service import alerts

    rt = _runtime()
    account_id = _resolve_account(rt.db, account)
    dropped = alerts.remove_alert_webhook(rt, account_id)
    typer.echo(f"alerts removed for {account_id} ({dropped} pending event(s) dropped)")


@app.command()
def verify(
    digest: Annotated[
        str | None, typer.Argument(help="A renewal transaction digest.", show_default=False)
    ] = None,
    memory: Annotated[
        str | None, typer.Option("--memory", help="Check every renewal of this memory's blob.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False,
) -> None:
    """Audit renewals against the chain: one PASS/FAIL line per fact, non-zero on any FAIL."""
    from walkeep.service.operators import verify as audit

    if (digest is None) == (memory is None):
        raise CliError("give exactly one of DIGEST or --memory mem_…")
    rt = _runtime()
    report = audit.verify_digest(rt, digest) if digest else audit.verify_memory(rt, memory or "")
    if as_json:
        typer.echo(json.dumps(report.to_dict()))
    else:
        for fact in report.facts:
            typer.echo(fact.line())
        typer.echo(
            f"{'OK' if report.ok else 'MISMATCH'}: {report.subject} on {report.network} "
            f"({sum(f.ok for f in report.facts)}/{len(report.facts)} facts hold)"
        )
    if not report.ok:
        raise typer.Exit(1)


def main(argv: list[str] | None = None) -> None:
    """Console entry point: run the app, turn every expected failure into one line."""
    try:
        build_command().main(args=argv, prog_name="walkeep", standalone_mode=True)
    except CliError as exc:
        _die(str(exc))
    except WalkeepError as exc:
        _die(exc.message)
    except ConfigurationError as exc:
        _die(str(exc))
    except RuntimeError as exc:  # smoke: the flow stopped with a reason
        _die(str(exc))
    except KeyboardInterrupt:
        _die("interrupted", code=130)
    except Exception as exc:
        # A database error can only come from an imported SQLAlchemy: check without
        # importing it, so light commands stay light.
        sa_exc = sys.modules.get("sqlalchemy.exc")
        if sa_exc is not None and isinstance(exc, sa_exc.SQLAlchemyError):
            _die(f"database error: {_first_line(exc)}")
        raise


def _die(message: str, code: int = 1) -> None:
    typer.echo(f"walkeep: error: {message}", err=True)
    sys.exit(code)


if __name__ == "__main__":  # pragma: no cover
    main()
