"""``walkeep statement``: an account's ledger for a period, with running balances."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    pass
from walkeep.cli._common import CliError, _resolve_account, open_db


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
