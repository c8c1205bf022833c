"""Issue 29: closed edges — what unauthenticated callers, logs and /mcp errors reveal.

Each test here failed before its fix; they run on SQLite and PostgreSQL.
"""

from __future__ import annotations

import json
import logging

import pytest

from walkeep.api.app import readiness
from walkeep.backends.base import Health
from walkeep.service.runtime import Runtime

DRIVER_TEXT = (
    'connection to server at "db.internal" (10.1.2.3), port 5433 failed: FATAL: password '
    'authentication failed for user "walkeep_admin"'
)
SECRETS = ("db.internal", "10.1.2.3", "5433", "walkeep_admin", "password")


def test_readyz_gives_coarse_backend_and_chain_states_and_logs_the_detail(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Regression: ``checks.backend.detail`` carried the driver's text (host, port, user)."""
    monkeypatch.setattr(rt.relayer, "health", lambda: Health(False, "paused", DRIVER_TEXT))
    with caplog.at_level(logging.WARNING):
        report = readiness(rt)
    text = json.dumps(report)
    assert report["checks"]["backend"] == {  # type: ignore[index]
        "ok": False,
        "name": rt.relayer.name,
        "writes": "paused",
    }
    for secret in SECRETS:
        assert secret not in text
    assert any(DRIVER_TEXT in r.getMessage() for r in caplog.records)  # the operator's copy

    def boom() -> Health:
        raise OSError(DRIVER_TEXT)

    def chain_down() -> int:
        raise OSError(DRIVER_TEXT)

    monkeypatch.setattr(rt.relayer, "health", boom)
    monkeypatch.setattr(rt.chain, "current_epoch", chain_down)
    report = readiness(rt)
    text = json.dumps(report)
    assert report["ready"] is False
    assert report["checks"]["backend"]["error"] == "unreachable"  # type: ignore[index]
    assert report["checks"]["chain"]["error"] == "unreachable"  # type: ignore[index]
    for secret in SECRETS:
        assert secret not in text
