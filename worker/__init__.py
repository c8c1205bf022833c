"""The background worker: APScheduler wiring for the service layer's jobs.

Holds no business logic: every job is a function in ``walkeep.service``.
"""
