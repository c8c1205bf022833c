"""The ``walkeep`` command line (typer). Thin: parse, call one function, print.

Every failure an operator can cause (bad input, unknown account, unreachable
database, wrong configuration) ends in one line on stderr and a non-zero exit
status, never a traceback.
"""

from __future__ import annotations

import json
import sys
from decimal import Decimal
from typing import Annotated, Any

import typer
from sqlalchemy.exc import SQLAlchemyError

from walkeep import ledger
from walkeep.config import Settings, load_settings
from walkeep.db import Database, redact
from walkeep.db import migrate as migrations
from walkeep.errors import ConfigurationError, WalkeepError
from walkeep.service import accounts

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


class CliError(Exception):
    """A one-line message for the operator."""


def _settings() -> Settings:
    try:
        return load_settings()
    except Exception as exc:  # pydantic ValidationError: summarise, don't dump
        raise CliError(f"invalid configuration: {_first_line(exc)}") from exc


def open_db(settings: Settings | None = None, *, migrate: bool = True) -> Database:
    """Connect, and bring the schema to head (idempotent and quick when current)."""
    settings = settings or _settings()
    db = Database(settings.db_url)
    db.ping()
    if migrate:
        migrations.upgrade(settings.db_url)
    return db


def _usd(value: str, field: str) -> int:
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
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Create an account and its first API key (shown once)."""
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
    account: Annotated[str, typer.Option("--account", help="Account id or name.")],
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Show an account's balance."""
    balance(account=account, as_json=as_json)


@key_app.command("create")
def key_create(
    account: Annotated[str, typer.Option("--account", help="Account id or name.")],
    namespace: Annotated[
        str | None, typer.Option("--namespace", help="Default namespace for calls with this key.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Create another API key for an account (shown once)."""
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
    db = open_db()
    account_id = accounts.revoke_key(db, prefix)
    typer.echo(f"revoked {prefix} (account {account_id})")


@credits_app.command("grant")
def credits_grant(
    account: Annotated[str, typer.Option("--account", help="Account id or name.")],
    usd: Annotated[str, typer.Option("--usd", help="Amount in US dollars.")],
    reason: Annotated[str, typer.Option("--reason", help="Why (kept in the ledger).")],
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Grant credits to an account (promotions, support, corrections)."""
    mc = _usd(usd, "--usd")
    if mc == 0:
        raise CliError("--usd must be positive")
    db = open_db()
    account_id = _resolve_account(db, account)
    entry = accounts.grant(db, account_id, mc, reason=reason)
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
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Show an account's credits (1 credit = 1 US cent)."""
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


def first_run(settings: Settings, db: Database) -> None:
    """On an empty database: a `default` account with promo credits, its key saved
    (mode 0600) and printed with ready-to-paste MCP client configs."""
    from walkeep.mcp.stdio import credentials_path
    from walkeep.onboarding import client_configs, write_credentials

    if accounts.find_account_by_name(db, "default") is not None or _has_accounts(db):
        return
    promo = ledger.usd_to_mc(settings.promo_credits_usd)
    created = accounts.create_account(
        db, "default", credits_mc=promo, grant_reason="promo credits (early access)"
    )
    mcp_url = settings.public_url.rstrip("/") + "/mcp"
    path = credentials_path(settings)
    write_credentials(path, created.api_key, created.account_id, mcp_url)
    typer.echo(
        f"\nCreated account 'default' ({created.account_id}) with "
        f"{ledger.credits_display(promo)} promo credits.\n"
        f"API key (saved to {path}, mode 0600): {created.api_key}\n"
        f"MCP endpoint: {mcp_url}\n",
        err=True,
    )
    typer.echo(client_configs(mcp_url, created.api_key), err=True)


def _has_accounts(db: Database) -> bool:
    from sqlalchemy import select

    from walkeep.db.models import Account

    with db.read() as s:
        return s.scalar(select(Account.id).limit(1)) is not None


@app.command()
def serve(
    host: Annotated[str, typer.Option(help="Interface to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port.")] = 8080,
    no_worker: Annotated[
        bool, typer.Option("--no-worker", help="Don't run the scheduler in this process.")
    ] = False,
) -> None:
    """Serve MCP (/mcp) and REST (/v1); run the worker in-process unless --no-worker."""
    import uvicorn

    from walkeep import logs
    from walkeep.api.app import create_app
    from walkeep.bootstrap import build_runtime

    logs.setup("INFO")
    settings = _serve_settings(host, port)
    db = open_db(settings)
    first_run(settings, db)
    db.dispose()
    rt = build_runtime(settings)
    scheduler = None
    lock = None
    if not no_worker:
        from worker.jobs import acquire_worker_lock, build_scheduler

        try:
            lock = acquire_worker_lock(rt)
            scheduler = build_scheduler(rt, blocking=False)
        except ConfigurationError as exc:
            typer.echo(f"walkeep: not running the worker in-process: {exc}", err=True)

    def on_stop() -> None:
        rt.extras.setdefault("stop", __import__("threading").Event()).set()
        if scheduler is not None:
            scheduler.shutdown(wait=True)
        if lock is not None:
            lock.release()

    application = create_app(rt, on_start=scheduler.start if scheduler else None, on_stop=on_stop)
    typer.echo(
        f"Walkeep {rt.chain.network}/{rt.relayer.name} on http://{host}:{port} "
        f"(MCP {settings.public_url.rstrip('/')}/mcp, docs /docs)",
        err=True,
    )
    uvicorn.run(application, host=host, port=port, log_level="warning")


@app.command("mcp")
def mcp_stdio(
    api_key: Annotated[
        str | None,
        typer.Option("--api-key", help="Default: $WALKEEP_API_KEY or the credentials file."),
    ] = None,
    namespace: Annotated[
        str | None,
        typer.Option("--namespace", "--ns", help="Default namespace for calls that omit one."),
    ] = None,
) -> None:
    """Serve MCP over stdio (for hosts that launch a command)."""
    from walkeep.mcp.stdio import run_stdio

    run_stdio(_settings(), api_key=api_key, namespace=namespace)


@app.command()
def worker() -> None:
    """Run the background jobs (renewal, completion, sweep, reconciliation)."""
    from walkeep import logs
    from walkeep.bootstrap import build_runtime
    from worker.run import run_forever

    logs.setup("INFO")
    settings = _settings()
    open_db(settings).dispose()
    run_forever(build_runtime(settings, with_completer=False))


@app.command()
def devnet(
    host: Annotated[str, typer.Option(help="Interface to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port.")] = 31415,
) -> None:
    """Serve the local network in Walrus's publisher/aggregator HTTP format (local only)."""
    from walkeep.backends.localnet.devnet import serve_devnet
    from walkeep.backends.localnet.engine import LocalNetwork
    from walkeep.clock import SystemClock

    settings = _settings()
    network = LocalNetwork(
        settings.localnet_dir,
        SystemClock(),
        epoch_seconds=settings.local_epoch_seconds,
        storage_price_frost=settings.local_storage_price_frost,
    )
    typer.echo(
        f"walkeep devnet: Walrus publisher+aggregator API on http://{host}:{port} "
        f"(state in {settings.localnet_dir}; LOCAL network, not Walrus)",
        err=True,
    )
    serve_devnet(network, host=host, port=port)


@app.command()
def doctor(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
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
    typer.echo(
        f"OK in {result.seconds:.0f}s: memory {result.memory_id}, blob {result.blob_id}\n"
        f"  blob object {result.blob_object_id}\n"
        f"  end_epoch {result.end_epoch_before} → {result.end_epoch_after}\n"
        f"  renewal {result.digest}\n"
        f"  {result.explorer_url}"
    )


def _resolve_account(db: Database, ref: str) -> str:
    if ref.startswith("acct_"):
        return ref
    found = accounts.find_account_by_name(db, ref)
    if found is None:
        raise CliError(f"unknown account {ref!r}")
    return found


def _first_line(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", None) or exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


# --- alerts and audits (walkeep/service/alerts.py, walkeep/service/verify.py) ---------------

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
    as_json: Annotated[bool, typer.Option("--json")] = False,
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
    as_json: Annotated[bool, typer.Option("--json")] = False,
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
    as_json: Annotated[bool, typer.Option("--json")] = False,
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
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Audit renewals against the chain: one PASS/FAIL line per fact, non-zero on any FAIL."""
    from walkeep.service import verify as audit

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
        app(args=argv, standalone_mode=True)
    except CliError as exc:
        _die(str(exc))
    except WalkeepError as exc:
        _die(exc.message)
    except ConfigurationError as exc:
        _die(str(exc))
    except SQLAlchemyError as exc:
        _die(f"database error: {_first_line(exc)}")
    except RuntimeError as exc:  # smoke: the flow stopped with a reason
        _die(str(exc))
    except KeyboardInterrupt:
        _die("interrupted", code=130)


def _die(message: str, code: int = 1) -> None:
    typer.echo(f"walkeep: error: {message}", err=True)
    sys.exit(code)


if __name__ == "__main__":  # pragma: no cover
    main()
