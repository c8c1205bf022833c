"""The network around Walkeep: the local ``devnet``, ``doctor``'s checks and the end-to-end ``smoke`` run."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    pass
from walkeep.cli._common import JSON_HELP, CliError, _bind, _check_port, _settings


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
    if settings.network != "local":
        # It would serve (and configure) the local network under the data dir while this
        # configuration names a real one: refused before anything is opened.
        raise CliError(
            f"devnet serves the local network only; WALKEEP_NETWORK={settings.network} "
            "here (unset it, or set WALKEEP_NETWORK=local)"
        )
    listener = _bind(host, port, "--port")  # a port in use fails before anything changes
    network = open_local_network(settings, SystemClock(), owner=True)
    typer.echo(
        f"walkeep devnet: Walrus publisher+aggregator API on http://{host}:{port} "
        f"(state in {settings.localnet_dir}; LOCAL network, not Walrus)",
        err=True,
    )
    serve_devnet(network, host=host, port=port, sock=listener)


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
