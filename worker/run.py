"""Start the worker's scheduler (jobs are registered in ``worker.jobs``)."""

from __future__ import annotations

import sys


def main() -> None:
    from walkeep.cli import main as cli_main

    cli_main(["worker", *sys.argv[1:]])
