"""``walkeep auto-top-up``: an account's automatic top-up (set, show, off).

Operators only: this is how automatic top-up is turned on (with a rule and a monthly
cap; it needs a saved card) and off. ``show --json`` prints exactly the object
``check_balance.auto_top_up`` returns, so scripts and agents read the same names.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from walkeep.cli._common import JSON_HELP, _resolve_account, _runtime


def _human(view: Any) -> str:
    lines = [f"automatic top-up: {view.status}"]
    if view.below_runway_epochs is not None:
        lines.append(
            f"rule: below {view.below_runway_epochs} epochs of funded runway, charge up to "
            f"{view.to_runway_epochs} epochs; cap ${view.monthly_cap_usd:.2f} a month (UTC)"
        )
    lines.append(f"card: {view.card or 'none saved'}")
    lines.append(f"charged this month: ${view.charged_this_month_usd:.2f}")
    if view.last_attempt is not None:
        a = view.last_attempt
        lines.append(f"last charge: ${a.amount_usd:.2f} {a.outcome} at {a.at.isoformat()}")
    if view.action_url:
        lines.append(f"the card holder must act: {view.action_url}")
    if view.reason:
        lines.append(f"reason: {view.reason}")
    return "\n".join(lines)


def _print(view: Any, as_json: bool) -> None:
    typer.echo(json.dumps(view.model_dump(mode="json")) if as_json else _human(view))


def auto_top_up_set(
    account: Annotated[str, typer.Option("--account", help="Account id or name.")],
    below_runway_epochs: Annotated[
        int,
        typer.Option("--below-runway-epochs", help="Charge when funded runway falls below this."),
    ],
    to_runway_epochs: Annotated[
        int, typer.Option("--to-runway-epochs", help="Charge enough to fund this many epochs.")
    ],
    monthly_cap_usd: Annotated[
        str,
        typer.Option("--monthly-cap-usd", help="Never charge more in a calendar month (UTC)."),
    ],
    test_card: Annotated[
        str | None,
        typer.Option(
            "--test-card",
            help="TEST MODE only: save a test card that succeeds, declines or needs "
            "authentication_required.",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False,
) -> None:
    """Turn automatic top-up on with this rule (needs a saved card)."""
    from walkeep.service.operators import autotopup

    rt = _runtime()
    account_id = _resolve_account(rt.db, account)
    view = autotopup.set_rule(
        rt,
        account_id,
        below_runway_epochs=below_runway_epochs,
        to_runway_epochs=to_runway_epochs,
        monthly_cap_usd=monthly_cap_usd,
        test_card_behaviour=test_card,
    )
    _print(view, as_json)


def auto_top_up_show(
    account: Annotated[str, typer.Option("--account", help="Account id or name.")],
    as_json: Annotated[
        bool, typer.Option("--json", help="Print check_balance's auto_top_up object.")
    ] = False,
) -> None:
    """Show the account's automatic top-up as agents see it in check_balance."""
    from walkeep.service.tools import balance

    rt = _runtime()
    _print(balance.auto_top_up_view(rt, _resolve_account(rt.db, account)), as_json)


def auto_top_up_off(
    account: Annotated[str, typer.Option("--account", help="Account id or name.")],
    as_json: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False,
) -> None:
    """Turn automatic top-up off (the card and rule are kept)."""
    from walkeep.service.operators import autotopup

    rt = _runtime()
    _print(autotopup.turn_off(rt, _resolve_account(rt.db, account)), as_json)
