"""``python -m worker`` from a checkout (the Procfile's worker process).

A shim, not packaged: the scheduler wiring lives in ``walkeep.scheduler``; the wheel
installs only the ``walkeep`` namespace. Installed users run ``walkeep worker``.
"""
