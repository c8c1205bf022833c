"""Issue 39, item 6: ``serve --workers N`` must not outlive its supervisor.

After a ``kill -9`` of the supervisor its web processes kept accepting stores whose holds
never settled (the completer lived in the dead process), ``/readyz`` still said ready,
and a new ``serve`` could not bind the port until the orphans were killed by hand. Now a
web process dies with its parent (``PR_SET_PDEATHSIG``, and a parent-pid watch as the
portable backstop), and ``/readyz`` is unready whenever nothing finishes the writes the
process accepts: its own completer dead or hung, or its supervisor's heartbeat stale.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.live_serve import walkeep_serve
from tests.test_serve_workers import _wait_for_banner
from walkeep.api.app import COMPLETER_STALE_SECONDS, readiness
from walkeep.pressure import Heartbeat
from walkeep.service.jobs import completion
from walkeep.service.jobs.completion import Completer
from walkeep.service.runtime import Runtime


def _gone(pid: int) -> bool:
    """Exited (a zombie waiting for a reaper counts: it holds no socket any more)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def _wait_gone(pids: list[int], seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        left = [p for p in pids if not _gone(p)]
        if not left:
            return []
        time.sleep(0.1)
    return [p for p in pids if not _gone(p)]


def _children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(x) for x in (task / "children").read_text().split()]
    return found


_CHILD = textwrap.dedent(
    """
    import os, signal, sys, threading
    from pathlib import Path
    if sys.argv[2] == "watch-only":  # no prctl: only the parent-pid watch remains
        import ctypes
        def no_prctl(*_a, **_k):
            raise OSError("no prctl here")
        ctypes.CDLL = no_prctl
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))  # as uvicorn's graceful stop
    from walkeep.api.serve import die_with_parent
    die_with_parent(os.getppid())
    Path(sys.argv[1]).write_text(str(os.getpid()))
    threading.Event().wait()
    """
)
_PARENT = textwrap.dedent(
    """
    import subprocess, sys, threading
    subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2], sys.argv[3]])
    threading.Event().wait()
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("how", ["pdeathsig", "watch-only"])
def test_a_process_set_to_die_with_its_parent_does(tmp_path: Path, how: str) -> None:
    pid_file = tmp_path / "child.pid"
    parent = subprocess.Popen([sys.executable, "-c", _PARENT, _CHILD, str(pid_file), how])
    try:
        deadline = time.monotonic() + 60
        while not pid_file.exists() or not pid_file.read_text():
            assert time.monotonic() < deadline and parent.poll() is None, "child never started"
            time.sleep(0.05)
        child = int(pid_file.read_text())
        assert not _gone(child)
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        assert _wait_gone([child], 10) == [], f"child {child} outlived its parent ({how})"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


# --- readiness: something must finish the writes this process accepts -------------------


def test_readyz_is_unready_while_this_process_completer_is_dead_or_hung(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The completer's rounds are held inside drain_due on cue: a round really in progress,
    # not a timestamp written over the thread's own (which its next round reset under load).
    entered, release = threading.Event(), threading.Event()
    real = completion.drain_due

    def held(rt_: Runtime, *a: object, **k: object) -> object:
        entered.set()
        release.wait(30)
        return real(rt_, *a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(completion, "drain_due", held)
    completer = Completer(rt)
    rt.completer = completer
    assert readiness(rt)["checks"]["completer"] == {"ok": False, "runs": "in this process"}  # type: ignore[index]
    assert readiness(rt)["ready"] is False  # never started: nothing lands
    completer.start()
    try:
        assert entered.wait(30), "the completer never began a round"
        report = readiness(rt)  # in a round, not for long: ready
        assert report["ready"] is True and report["checks"]["completer"]["ok"] is True  # type: ignore[index]
        completer.STUCK_SECONDS = 0.0  # the same round, now longer than the limit: hung
        assert readiness(rt)["ready"] is False
        completer.STUCK_SECONDS = Completer.STUCK_SECONDS
        assert readiness(rt)["ready"] is True
    finally:
        release.set()
        completer.stop()
    assert readiness(rt)["ready"] is False  # stopped


def test_readyz_of_a_web_process_follows_its_supervisor_heartbeat(
    rt: Runtime, tmp_path: Path
) -> None:
    now = [1000.0]
    beat = Heartbeat(tmp_path / "completer", monotonic=lambda: now[0])
    rt.completer = None
    rt.extras["completer_heartbeat"] = beat
    assert readiness(rt)["ready"] is False  # nothing posted yet
    beat.post()
    report = readiness(rt)
    assert report["ready"] is True
    assert report["checks"]["completer"] == {"ok": True, "runs": "in the supervisor"}  # type: ignore[index]
    now[0] += COMPLETER_STALE_SECONDS + 1  # the supervisor stopped posting
    assert readiness(rt)["ready"] is False


# --- the whole thing: serve --workers 2, kill -9 the supervisor -----------------------------


@pytest.mark.postgres
def test_web_processes_exit_with_their_killed_supervisor_and_free_the_port(
    tmp_path: Path, fresh_db_url: str
) -> None:
    with walkeep_serve(tmp_path, fresh_db_url, ["--workers", "2"]) as served:
        _wait_for_banner(served)
        port = int(served.url.rsplit(":", 1)[1])
        ready = httpx.get(f"{served.url}/readyz", timeout=10)
        assert ready.status_code == 200, ready.text
        assert ready.json()["checks"]["completer"] == {"ok": True, "runs": "in the supervisor"}
        web = _children(served.proc.pid)
        assert len(web) >= 2, web
        served.proc.send_signal(signal.SIGKILL)
        served.proc.wait(10)
        assert _wait_gone(web, 15) == [], "web processes outlived their supervisor"
        with socket.socket() as again:  # the port is free: nothing listens on it
            again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            again.bind(("127.0.0.1", port))
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{served.url}/healthz", timeout=5)
