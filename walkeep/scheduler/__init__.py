"""The background worker: APScheduler wiring for the service layer's jobs.

Holds no business logic: every job is a function in ``walkeep.service``. It lives
inside the ``walkeep`` package so the wheel installs no generic top-level name; the
repository's ``worker/`` folder is a thin, unpackaged shim for ``python -m worker``.
"""
