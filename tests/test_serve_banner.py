"""`walkeep serve` prints its banner once it is listening, after the start-up logs,
so a newcomer finds the key and the client configs at the bottom, not between logs."""

from __future__ import annotations

import json
import os
import pty
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.live_serve import free_port, walkeep_env, walkeep_serve
from walkeep import __version__


def test_banner_comes_last_with_the_key_and_configs(tmp_path: Path, db_url: str) -> None:
    with walkeep_serve(tmp_path, db_url) as served:
        # A request after start-up: the banner was printed before the server answered.
        assert httpx.get(f"{served.url}/healthz", timeout=10).status_code == 200
        lines = served.stderr().splitlines()
    starts = [i for i, line in enumerate(lines) if f"Walkeep {__version__} is up on" in line]
    assert len(starts) == 1, lines
    before, banner = lines[: starts[0]], "\n".join(lines[starts[0] :])
    logs_before = [json.loads(line) for line in before if line.startswith('{"ts"')]
    assert logs_before, "start-up logs come first"
    assert not any(line.startswith('{"ts"') for line in lines[starts[0] :]), banner
    assert f"{served.url}/mcp" in banner
    # First run, stderr not a terminal (a log file here): the key stays in the credentials
    # file, and the banner says where it is…
    assert served.api_key not in served.stderr()
    assert "credentials.json" in banner and "not a terminal" in banner
    assert "claude mcp add --transport http walkeep" in banner  # …with ready-to-paste configs
    # The noise that used to bury it is gone.
    noisy = {"apscheduler.scheduler", "alembic.runtime.migration", "alembic.runtime.plugins"}
    assert not [r for r in logs_before if r["logger"] in noisy]


def test_start_up_heap_is_frozen_out_of_the_collectors_sight() -> None:
    """What start-up built is never garbage; without the freeze every full collection
    walked all of it again and stopped every request for ~150 ms (bench/store.py's p99)."""
    import gc

    from walkeep.api.serve import freeze_start_up_heap

    before = gc.get_freeze_count()
    try:
        freeze_start_up_heap()
        assert gc.get_freeze_count() > before
        assert gc.get_count()[0] < 700  # and what was collectable went first
    finally:
        gc.unfreeze()


class _Terminal:
    """``walkeep serve`` with its stderr on a pseudo-terminal, read as a person would see it."""

    def __init__(self, tmp_path: Path, db_url: str, args: list[str]) -> None:
        self.port = free_port()
        master, slave = pty.openpty()
        self.master = master
        env = walkeep_env(tmp_path / "tty-data", db_url, WALKEEP_LOG_FORMAT="auto")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "walkeep.cli", "serve", "--port", str(self.port), *args],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=slave,
        )
        os.close(slave)
        self.seen = b""
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()  # a pty's buffer is small: the server must never block on it

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self.master, 65536)
            except OSError:
                return
            if not chunk:
                return
            self.seen += chunk

    def text(self) -> str:
        return self.seen.decode(errors="replace")

    def wait_for(self, needle: str) -> None:
        deadline = time.monotonic() + 90
        while needle not in self.text():
            assert self.proc.poll() is None, self.text()
            assert time.monotonic() < deadline, self.text()
            time.sleep(0.05)

    def close(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(5)
        os.close(self.master)


def _requests(port: int) -> None:
    for _ in range(5):
        assert httpx.get(f"http://127.0.0.1:{port}/", timeout=10).status_code == 200
    last = httpx.get(f"http://127.0.0.1:{port}/v1/check_balance", timeout=10)
    assert last.status_code == 401


@pytest.mark.parametrize("asked", [False, True])
def test_on_a_terminal_requests_are_not_logged_unless_asked(
    tmp_path: Path, db_url: str, asked: bool
) -> None:
    """Regression (issue 39): on a terminal every request printed an access-log line,
    scrolling the banner (with the key and the client configs) and the worker's lines
    away. There the access log is off unless ``--access-log``."""
    term = _Terminal(tmp_path, db_url, ["--no-worker", *(["--access-log"] if asked else [])])
    try:
        term.wait_for(f"Walkeep {__version__} is up on")
        term.wait_for("─" * 72 + "\r\n\r\n")  # the banner's closing rule
        _requests(term.port)
    finally:
        term.close()  # everything it wrote has been read once it has exited
    after = term.text()[term.text().index(f"Walkeep {__version__} is up on") :]
    lines = [line for line in after.splitlines() if "walkeep.access" in line]
    if asked:
        assert len(lines) == 6, after
        assert "Access log" not in after
    else:
        assert lines == [], after
        assert "Access log     off (--access-log prints a line per request)" in after
        assert "API key (saved to" in after  # the terminal banner, key and all
