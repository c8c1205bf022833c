"""``walkeep index rebuild`` and ``purge``: recall's index is derived data, rebuilt from the database."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    pass
from walkeep.cli._common import JSON_HELP, _emit, _resolve_account, _runtime


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


def index_purge(
    account: Annotated[str, typer.Option("--account", help="Account id or name.")],
    as_json: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False,
) -> None:
    """Purge, now, what the account's forgotten, superseded, expired, lapsed and failed memories left behind.

    Their content hashes, metadata and index rows leave the database, and this host's
    index files are written anew without them (other hosts rebuild on their next query).
    The sweep does the same within WALKEEP_PURGE_WITHIN_HOURS. Safe beside a running server."""
    from walkeep.service.jobs import purge

    rt = _runtime()
    account_id = _resolve_account(rt.db, account)
    report = purge.purge(rt, [account_id])
    _emit(
        dataclasses.asdict(report),
        as_json,
        f"{report.memories} departed memories purged ({report.index_rows} index rows), "
        f"{report.segments_written} index files written",
    )
