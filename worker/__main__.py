"""``python -m worker``: the same as ``walkeep worker [args]``."""

import sys

from walkeep.cli import main

main(["worker", *sys.argv[1:]])
