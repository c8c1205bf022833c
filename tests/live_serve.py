"""A real ``walkeep serve`` in a subprocess on a free port, for black-box tests.

Used by the stdio bridge and Python client tests: they must talk to the process a
user runs, not to an app object in the test's own interpreter.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def walkeep_env(data_dir: Path, db_url: str, **extra: str) -> dict[str, str]:
    """The parent's environment minus any Walkeep/Stripe settings, plus these."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WALKEEP_", "STRIPE_"))}
    env.update(
        {
            "HOME": str(data_dir.parent),
            "WALKEEP_DATA_DIR": str(data_dir),
            "WALKEEP_DATABASE_URL": db_url,
            "WALKEEP_EMBEDDER": "hash",
            "WALKEEP_LOCAL_WRITE_LATENCY_MS": "0",
            "WALKEEP_LOG_FORMAT": "json",
        }
    )
    env.update(extra)
    return env


@dataclass
class Served:
    url: str
    api_key: str
    proc: subprocess.Popen[str]
    stderr_path: Path

    def stderr(self) -> str:
        return self.stderr_path.read_text()


@contextmanager
def walkeep_serve(
    tmp_path: Path, db_url: str, args: Sequence[str] = (), **env: str
) -> Iterator[Served]:
    """Start ``walkeep serve [args]``; yield once /healthz answers, with the first-run key.

    ``env`` adds WALKEEP_… settings to the server's environment."""
    port = free_port()
    data_dir = tmp_path / "serve-data"
    # stderr to a file, not a pipe: nobody drains a pipe while the test runs.
    stderr_path = tmp_path / "serve.stderr"
    with stderr_path.open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "walkeep.cli", "serve", "--port", str(port), *args],
            env=walkeep_env(data_dir, db_url, **env),
            stdout=subprocess.DEVNULL,
            stderr=err,
            text=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"walkeep serve exited: {proc.stderr.read() if proc.stderr else ''}"
                )
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("walkeep serve did not answer /healthz in time")
            time.sleep(0.1)
        creds = json.loads((data_dir / "credentials.json").read_text())
        yield Served(url=url, api_key=creds["api_key"], proc=proc, stderr_path=stderr_path)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
