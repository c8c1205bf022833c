"""``python -m walkeep.cli``: the same entry point as the ``walkeep`` script."""

from walkeep.cli import main

main()
