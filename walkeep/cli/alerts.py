"""``walkeep alerts``: an account's webhook alerts (set, show, test, remove)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    pass
from walkeep.cli._common import JSON_HELP, CliError, _emit, _resolve_account, _runtime, _when


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
    from walkeep.service.tools.views import epochs_text

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
        f"{epochs_text(view.threshold_epochs)})\n"
        f"signing secret (shown once, store it now): {secret}",
    )


def alerts_show(
    account: Annotated[str, typer.Option("--account", help="Account id or name.")],
    limit: Annotated[int, typer.Option(help="How many recent deliveries to list.")] = 20,
    as_json: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False,
) -> None:
    """Show the webhook (never the secret) and the latest delivery attempts."""
    from walkeep.service import alerts
    from walkeep.service.tools.views import epochs_text

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
        f"balance.low below {epochs_text(view.threshold_epochs)} (now "
        f"{'low' if view.balance_low else 'ok'}), {view.pending_events} event(s) pending",
    ]
    for d in deliveries:
        outcome = "ok" if d.ok else (d.error or "failed")
        lines.append(
            f"  {_when(d.attempted_at)}  {d.type:<17} {d.event_id}  #{d.attempt}  {outcome}"
        )
    _emit(data, as_json, "\n".join(lines))


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


def alerts_remove(
    account: Annotated[str, typer.Option("--account", help="Account id or name.")],
) -> None:
    """Stop sending alerts for the account (pending events are dropped)."""
    from walkeep.service import alerts

    rt = _runtime()
    account_id = _resolve_account(rt.db, account)
    dropped = alerts.remove_alert_webhook(rt, account_id)
    typer.echo(f"alerts removed for {account_id} ({dropped} pending event(s) dropped)")
