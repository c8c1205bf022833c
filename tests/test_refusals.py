"""DESIGN invariant 11: nothing changes before a refusal (issue 39, item 2).

Every command that runs the local network (``serve``, ``worker``/``python -m worker``,
``devnet``) and ``smoke`` is refused here for its configuration — a job interval that
cannot keep up, a bad or busy port, a wrong combination — *beside a running server on
the same data dir*. Each refusal must be one line and a non-zero exit, and must leave the
running server's ``server.json`` and the local network's recorded configuration (its
epoch schedule and storage price) byte for byte as they were.
"""

from __future__ import annotations

import socket
import sqlite3
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.conftest import ON_PG
from tests.live_serve import free_port, walkeep_env, walkeep_serve
from walkeep.backends.localnet.engine import DB_FILE

SERVER_EPOCH = "60"  # what the running server set
OTHER_EPOCH = "30"  # what every refused command asks for


def _state(data_dir: Path) -> dict[str, bytes]:
    """What a refused command must not touch: server.json and the network's settings."""
    conn = sqlite3.connect(data_dir / "localnet" / DB_FILE)
    try:
        meta = dict(
            conn.execute(
                "SELECT key, value FROM meta WHERE key IN ('schedule', 'storage_price_frost')"
            ).fetchall()
        )
    finally:
        conn.close()
    return {
        "server.json": (data_dir / "server.json").read_bytes(),
        "schedule": str(meta["schedule"]).encode(),
        "storage_price_frost": str(meta["storage_price_frost"]).encode(),
    }


def _refused(argv: list[str], env: dict[str, str], expect: str) -> tuple[str, str | None]:
    """Run one command; returns (its stderr, what is wrong with the outcome or None)."""
    try:
        out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired as exc:
        return str(exc.stderr or ""), "still running after 60 s: not refused"
    lines = out.stderr.strip().splitlines()
    if out.returncode == 0:
        return out.stderr, "exited 0"
    if not lines or not lines[0].startswith("walkeep: error:"):
        return out.stderr, "not a walkeep error"  # a wrong combination lists each problem
    if expect not in out.stderr:
        return out.stderr, f"expected {expect!r}"
    if "Traceback" in out.stderr:
        return out.stderr, "a traceback"
    return out.stderr, None


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "walkeep.cli", *args]


def test_every_refusal_beside_a_running_server_changes_nothing(tmp_path: Path, db_url: str) -> None:
    with walkeep_serve(tmp_path, db_url, WALKEEP_LOCAL_EPOCH_SECONDS=SERVER_EPOCH) as served:
        data_dir = tmp_path / "serve-data"
        port = int(served.url.rsplit(":", 1)[1])
        before = _state(data_dir)
        assert b'"public_url": "' + served.url.encode() in before["server.json"]

        def env(**extra: str) -> dict[str, str]:
            return walkeep_env(data_dir, db_url, WALKEEP_LOCAL_EPOCH_SECONDS=OTHER_EPOCH, **extra)

        slow_renew = {"WALKEEP_RENEW_INTERVAL_SECONDS": "600"}
        slow_sweep = {"WALKEEP_SWEEP_INTERVAL_SECONDS": "600"}
        wrong = {"WALKEEP_RELAYER": "memwal"}  # memwal stores on a real Walrus network
        busy = socket.socket()
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        busy_port = str(busy.getsockname()[1])
        other = str(free_port())
        cases: list[tuple[str, list[str], dict[str, str], str]] = [
            # serve
            (
                "serve: interval",
                _cli("serve", "--port", other),
                env(**slow_renew),
                "cannot keep up",
            ),
            ("serve: sweep", _cli("serve", "--port", other), env(**slow_sweep), "cannot keep up"),
            ("serve: busy port", _cli("serve", "--port", str(port)), env(), "already in use"),
            ("serve: bad port", _cli("serve", "--port", "99999"), env(), "between 1 and 65535"),
            ("serve: combination", _cli("serve", "--port", other), env(**wrong), "memwal"),
            (
                "serve: workers 0",
                _cli("serve", "--port", other, "--workers", "0"),
                env(),
                "at least 1",
            ),
            # worker, both ways of starting it
            ("worker: interval", _cli("worker"), env(**slow_renew), "cannot keep up"),
            ("worker: combination", _cli("worker"), env(**wrong), "memwal"),
            (
                "worker: busy metrics port",
                _cli("worker", "--metrics-port", busy_port),
                env(),
                # On SQLite the running server's worker lock is met first.
                "already in use" if ON_PG else "already running",
            ),
            (
                "worker: bad metrics port",
                _cli("worker", "--metrics-port", "99999"),
                env(),
                "between 1 and 65535",
            ),
            (
                "python -m worker: interval",
                [sys.executable, "-m", "worker"],
                env(**slow_renew),
                "cannot keep up",
            ),
            # devnet
            ("devnet: busy port", _cli("devnet", "--port", busy_port), env(), "already in use"),
            ("devnet: bad port", _cli("devnet", "--port", "0"), env(), "between 1 and 65535"),
            (
                "devnet: combination",
                _cli("devnet", "--port", other),
                env(WALKEEP_NETWORK="testnet"),
                "local network",
            ),
            # smoke
            ("smoke: bad network", _cli("smoke", "--network", "moon"), env(), "--network must be"),
            (
                "smoke: combination",
                _cli("smoke", "--network", "testnet"),
                env(),
                "WALKEEP_SUI_PRIVATE_KEY",
            ),
        ]
        if not ON_PG:
            # SQLite runs one worker: the server's holds the lock; and it has one writer.
            cases.append(("worker: second on SQLite", _cli("worker"), env(), "already running"))
            cases.append(
                (
                    "serve: --workers on SQLite",
                    _cli("serve", "--port", other, "--workers", "2"),
                    env(),
                    "needs PostgreSQL",
                )
            )
        try:
            with ThreadPoolExecutor(max_workers=2) as pool:
                outcomes = list(pool.map(lambda c: (c[0], *_refused(c[1], c[2], c[3])), cases))
        finally:
            busy.close()
        problems = [f"{name}: {why}\n{err}" for name, err, why in outcomes if why]
        assert not problems, "\n\n".join(problems)
        after = _state(data_dir)
        for what in before:
            assert after[what] == before[what], f"{what} changed by a refused command"
        assert served.proc.poll() is None  # the running server is untouched


@pytest.mark.parametrize("command", ["serve", "worker"])
def test_a_refused_start_on_a_fresh_data_dir_creates_nothing(
    tmp_path: Path, fresh_db_url: str, command: str
) -> None:
    """Validation comes before the first file, account or network is made."""
    data_dir = tmp_path / "fresh"
    argv = _cli(command, *(["--port", str(free_port())] if command == "serve" else []))
    env = walkeep_env(
        data_dir,
        fresh_db_url,
        WALKEEP_LOCAL_EPOCH_SECONDS=OTHER_EPOCH,
        WALKEEP_RENEW_INTERVAL_SECONDS="600",
    )
    err, why = _refused(argv, env, "cannot keep up")
    assert why is None, f"{why}\n{err}"
    assert not data_dir.exists() or not any(data_dir.iterdir()), sorted(data_dir.iterdir())
