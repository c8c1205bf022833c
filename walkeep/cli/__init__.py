"""The ``walkeep`` command line (typer). Thin: parse, call one function, print.

Every failure an operator can cause (bad input, unknown account, unreachable
database, wrong configuration) ends in one line on stderr and a non-zero exit
status, never a traceback.

This module is the command tree, in the order ``walkeep --help`` lists it; each command
lives in the module of its group (``accounts``, ``serve``, ``network``, ``statement``,
``index``, ``alerts``, ``autotopup``, ``verify``) and what they share in ``_common``. Imports of the
database, the service layer and the runtime are lazy (inside the commands):
``walkeep --version``, ``--help`` and the ``walkeep mcp --url`` bridge must start fast and
never load models, an ONNX runtime or the local network.
"""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer

from walkeep import __version__
from walkeep.cli import accounts, alerts, autotopup, index, network, serve, statement, verify
from walkeep.cli._common import CliError, _first_line
from walkeep.errors import ConfigurationError, WalkeepError

app = typer.Typer(
    name="walkeep",
    help="Durable, prepaid, auto-renewed memory for AI agents on Walrus.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
account_app = typer.Typer(help="Create and inspect accounts.", no_args_is_help=True)
key_app = typer.Typer(help="Create, list and revoke API keys.", no_args_is_help=True)
credits_app = typer.Typer(help="Grant credits.", no_args_is_help=True)
index_app = typer.Typer(help="Recall's search index (derived data).", no_args_is_help=True)
alerts_app = typer.Typer(help="Webhook alerts before anything pauses.", no_args_is_help=True)
auto_top_up_app = typer.Typer(
    help="Automatic top-up: charge a saved card when runway runs low.", no_args_is_help=True
)


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


# --- the tree ------------------------------------------------------------------------------

app.command()(accounts.migrate)
app.command()(accounts.balance)
app.command()(serve.serve)
app.command("mcp")(serve.mcp_stdio)
app.command()(serve.worker)
app.command()(network.devnet)
app.command()(network.doctor)
app.command()(network.smoke)
app.command()(statement.statement)
app.command("console-link")(accounts.console_link)
app.command()(verify.verify)

app.add_typer(account_app, name="account")
account_app.command("create")(accounts.account_create)
account_app.command("show")(accounts.account_show)
account_app.command("list")(accounts.account_list)

app.add_typer(key_app, name="key")
key_app.command("create")(accounts.key_create)
key_app.command("list")(accounts.key_list)
key_app.command("revoke")(accounts.key_revoke)

app.add_typer(credits_app, name="credits")
credits_app.command("grant")(accounts.credits_grant)

app.add_typer(index_app, name="index")
index_app.command("rebuild")(index.index_rebuild)
index_app.command("purge")(index.index_purge)

app.add_typer(alerts_app, name="alerts")
alerts_app.command("set")(alerts.alerts_set)
alerts_app.command("show")(alerts.alerts_show)
alerts_app.command("test")(alerts.alerts_test)
alerts_app.command("remove")(alerts.alerts_remove)

app.add_typer(auto_top_up_app, name="auto-top-up")
auto_top_up_app.command("set")(autotopup.auto_top_up_set)
auto_top_up_app.command("show")(autotopup.auto_top_up_show)
auto_top_up_app.command("off")(autotopup.auto_top_up_off)


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


__all__ = ["app", "build_command", "main"]
