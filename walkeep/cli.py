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
    except KeyboardInterrupt:
        _die("interrupted", code=130)


def _die(message: str, code: int = 1) -> None:
    typer.echo(f"walkeep: error: {message}", err=True)
    sys.exit(code)


if __name__ == "__main__":  # pragma: no cover
    main()
