"""``python -m worker``: run the scheduler in the foreground."""

from worker.run import main

main()
