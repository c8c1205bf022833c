"""``walkeep verify``: audit renewals against the chain, one PASS/FAIL line per fact."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    pass
from walkeep.cli._common import JSON_HELP, CliError, _runtime


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
