"""Accounts, keys, credits and the schema: the operator's bookkeeping commands."""

from __future__ import annotations

import json
from datetime import datetime
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    pass
from walkeep.cli._common import (
    JSON_HELP,
    CliError,
    _emit,
    _resolve_account,
    _runtime,
    _settings,
    _usd,
    _when,
    open_db,
)


def _master_key() -> bytes:
    """The configured master key: keys' default namespaces are sealed with it."""
    from walkeep.crypto import load_master_key

    return load_master_key(_settings())


def migrate() -> None:
    """Create or upgrade the database schema to the latest version."""
    from walkeep.db import Database, redact
    from walkeep.db import migrate as migrations

    settings = _settings()
    db = Database(settings.db_url)
    db.ping()
    migrations.upgrade(settings.db_url)
    typer.echo(f"database at head: {redact(settings.db_url)}")


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
    created = accounts.create_account(
        db, name, credits_mc=mc, default_namespace=namespace, master_key=_master_key()
    )
    _emit(
        {"account_id": created.account_id, "api_key": created.api_key},
        as_json,
        f"account {created.account_id} ({created.name}) created with "
        f"{ledger.credits_display(mc)} credits\n"
        f"API key (shown once, store it now): {created.api_key}",
    )


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


def key_create(
    account: Annotated[str, typer.Option("--account", help="Account id or name.")],
    namespace: Annotated[
        str | None, typer.Option("--namespace", help="Default namespace for calls with this key.")
    ] = None,
    only_namespace: Annotated[
        bool,
        typer.Option(
            "--only-namespace",
            help="Confine the key to --namespace: naming another is refused (FORBIDDEN), "
            "ids from other namespaces are not found, and it cannot sign in to the console.",
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False,
) -> None:
    """Create another API key for an account (shown once; its prefix names it later)."""
    from walkeep.service.operators import accounts

    if only_namespace and namespace is None:
        raise CliError(
            "--only-namespace confines the key to a namespace: give it with --namespace NS"
        )
    db = open_db()
    created = accounts.create_key(
        db,
        _resolve_account(db, account),
        default_namespace=namespace,
        only_namespace=only_namespace,
        master_key=_master_key(),
    )
    confined = (
        f"\nconfined to namespace {created.default_namespace!r}" if created.only_namespace else ""
    )
    _emit(
        {
            "account_id": created.account_id,
            "api_key": created.api_key,
            "prefix": created.prefix,
            "only_namespace": created.only_namespace,
        },
        as_json,
        f"API key for {created.account_id} (shown once): {created.api_key}\n"
        f"prefix: {created.prefix} (what `walkeep key list` shows and "
        f"`walkeep key revoke` takes){confined}",
    )


def key_list(
    account: Annotated[str, typer.Option("--account", help="Account id or name.")],
    as_json: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False,
) -> None:
    """An account's API keys: prefix, default namespace (marked "only" when the key is
    confined to it), created, last used (to within a minute) and revoked. Never the keys
    themselves."""
    from walkeep.service.operators import accounts

    db = open_db()
    account_id = _resolve_account(db, account)
    keys = accounts.list_keys(db, account_id, _master_key())
    if as_json:
        typer.echo(
            json.dumps(
                [
                    {
                        "prefix": k.prefix,
                        "namespace": k.default_namespace,
                        "only_namespace": k.only_namespace,
                        "created_at": _when(k.created_at),
                        "last_used_at": _when(k.last_used_at),
                        "revoked_at": _when(k.revoked_at),
                    }
                    for k in keys
                ]
            )
        )
        return

    def minute(at: datetime | None, never: str) -> str:
        return at.strftime("%Y-%m-%d %H:%M") if at is not None else never

    typer.echo(f"API keys of {account_id} (last used: to within a minute; times UTC)")
    typer.echo(
        f"{'PREFIX':<18} {'NAMESPACE':<16} {'ONLY':<4}  {'CREATED':<16}  {'LAST USED':<16}  STATUS"
    )
    for k in keys:
        ns = k.default_namespace or "-"
        ns = ns if len(ns) <= 16 else ns[:15] + "…"
        only = "yes" if k.only_namespace else "-"
        status = f"revoked {minute(k.revoked_at, '')}" if k.revoked_at else "active"
        typer.echo(
            f"{k.prefix:<18} {ns:<16} {only:<4}  {minute(k.created_at, '-'):<16}  "
            f"{minute(k.last_used_at, 'never'):<16}  {status}"
        )


def key_revoke(
    key: Annotated[
        str, typer.Argument(help="The key's prefix (as `key list` shows it) or the whole key.")
    ],
) -> None:
    """Revoke an API key by its prefix (e.g. wk_live_AbCd1234) or the whole key."""
    from walkeep.service.operators import accounts

    db = open_db()
    revoked = accounts.revoke_key(db, key)
    note = " (it was already revoked)" if revoked.already else ""
    typer.echo(f"revoked {revoked.prefix} (account {revoked.account_id}){note}")


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
    from walkeep.service.pausing import renewal_reach

    rt = _runtime()  # the chain's epoch: paused memories resume now, lapsed ones never
    account_id = _resolve_account(rt.db, account)
    entry = accounts.grant(rt.db, account_id, mc, reason=reason, current_epoch=renewal_reach(rt))
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
