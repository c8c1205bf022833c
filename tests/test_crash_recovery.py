"""A server killed mid-store: every accepted store either lands and is billed once,
or is released — never billed without a memory, never a memory without a bill."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
from sqlalchemy import func, select

from tests.helpers import account
from walkeep import ledger, usage
from walkeep.bootstrap import build_runtime
from walkeep.clock import ManualClock
from walkeep.db import Database
from walkeep.db.models import Account, LedgerEntry, Memory
from walkeep.service.jobs import completion
from walkeep.service.operators import accounts
from walkeep.service.runtime import Runtime
from walkeep.service.tools import store


def _invariant_holds(rt: Runtime, account_id: str) -> None:
    """Captures == landed memories; no open holds; cached balance == ledger."""
    with rt.db.read() as s:
        landed = s.scalar(
            select(func.count())
            .select_from(Memory)
            .where(
                Memory.account_id == account_id, Memory.status.in_(["active", "paused", "no-renew"])
            )
        )
        captures = s.scalar(
            select(func.count())
            .select_from(LedgerEntry)
            .where(LedgerEntry.account_id == account_id, LedgerEntry.kind == "capture")
        )
        assert landed == captures
        assert ledger.open_holds(s, account_id) == []
        assert ledger.recompute(s, account_id) == ledger.balance(s, account_id)
        # The quota counter agrees with the memories it summarises.
        cached = s.scalar(select(Account.usage_bytes).where(Account.id == account_id))
        assert cached == usage.recount(s, account_id)


def test_crash_after_claim_before_relayer_accept_is_released(
    rt: Runtime, clock, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    """A remote relayer (MemWal) accepts over the network, after the claim commits."""
    a = account(rt, credits=5)
    monkeypatch.setattr(store, "_stage", lambda *a, **k: None)  # no in-transaction accept
    original = rt.relayer.accept

    class Died(BaseException):
        """Stands in for the process dying (not an Exception: nothing cleans up)."""

    def die(**_kw):  # type: ignore[no-untyped-def]
        raise Died()

    rt.relayer.accept = die  # type: ignore[method-assign]
    with contextlib.suppress(Died):
        store.store(rt, a, content="lost in the crash", request_id="r1")
    rt.relayer.accept = original  # type: ignore[method-assign]
    with rt.db.read() as s:
        assert s.scalar(select(Memory.status)) == "accepting"
        assert ledger.balance(s, a).held_mc == 1000
    clock.advance(121)
    report = completion.complete_writes(rt)
    assert report.recovered == 1
    with rt.db.read() as s:
        assert s.scalar(select(Memory.status)) == "failed"
        assert ledger.balance(s, a) == ledger.Balance(5000, 0)
    # The request id is not poisoned.
    assert store.store(rt, a, content="lost in the crash", request_id="r1").status == "storing"
    completion.complete_writes(rt)
    _invariant_holds(rt, a)


def test_crash_after_relayer_accept_before_recording_it_lands_once(
    rt: Runtime, clock, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    a = account(rt, credits=5)
    monkeypatch.setattr(store, "_stage", lambda *a, **k: None)  # no in-transaction accept
    original = rt.relayer.accept
    seen: list[str] = []

    class Died(BaseException):
        pass

    def accept_then_die(**kw):  # type: ignore[no-untyped-def]
        seen.append(original(**kw))
        raise Died()

    rt.relayer.accept = accept_then_die  # type: ignore[method-assign]
    with contextlib.suppress(Died):
        store.store(rt, a, content="accepted, then the process died", request_id="r1")
    rt.relayer.accept = original  # type: ignore[method-assign]
    assert len(seen) == 1
    clock.advance(121)
    completion.complete_writes(rt)
    with rt.db.read() as s:
        m = s.scalar(select(Memory))
        assert m is not None and m.status == "active" and m.job_id == seen[0]
        assert ledger.balance(s, a) == ledger.Balance(4000, 0)
    _invariant_holds(rt, a)


def test_self_relayer_accepts_inside_the_claim_transaction(rt: Runtime) -> None:
    """No window exists between claim and accept: they commit together."""
    from walkeep.db.models import WriteJob

    a = account(rt, credits=5)
    r = store.store(rt, a, content="atomic accept", request_id="r1")
    with rt.db.read() as s:
        m = s.get(Memory, r.memory_id)
        assert m is not None and m.status == "storing" and m.job_id
        assert s.get(WriteJob, m.job_id) is not None
    # A claim that fails (here: insufficient balance) leaves no job behind either.
    broke = account(rt, credits=0)
    try:
        store.store(rt, broke, content="never", request_id="r2")
    except Exception as exc:
        assert type(exc).__name__ == "InsufficientBalance"
    with rt.db.read() as s:
        assert s.scalar(select(func.count()).select_from(WriteJob)) == 1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_server_killed_between_accept_and_completion_then_restarted(
    settings, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    db = Database(settings.db_url)
    created = accounts.create_account(db, "victim", credits_mc=100_000)
    db.dispose()
    port = _free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("WALKEEP_", "STRIPE_"))},
        "HOME": str(tmp_path),
        "WALKEEP_DATA_DIR": str(settings.data_dir),
        "WALKEEP_DATABASE_URL": settings.db_url,
        "WALKEEP_MASTER_KEY": settings.master_key,
        # Writes take 10 minutes to land: the kill always comes first.
        "WALKEEP_LOCAL_WRITE_LATENCY_MS": str(10 * 60 * 1000),
        "WALKEEP_EMBEDDER": "hash",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "walkeep.cli", "serve", "--port", str(port), "--no-worker"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.1)
        # serve records where it answers, so `walkeep smoke` links its explorer (issue 13).
        recorded = json.loads((settings.data_dir / "server.json").read_text())
        assert recorded["public_url"] == url
        auth = {"Authorization": f"Bearer {created.api_key}"}
        for i in range(10):
            r = httpx.post(
                f"{url}/v1/store",
                json={"content": f"accepted before the crash #{i}", "request_id": f"r{i}"},
                headers=auth,
                timeout=30,
            )
            assert r.status_code == 200 and r.json()["status"] == "storing", r.text
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)

    # Restart: a new process (new runtime) finds the accepted stores in the database.
    clock = ManualClock(datetime.now(UTC) + timedelta(minutes=11))
    restarted = build_runtime(settings, clock=clock, with_completer=False)
    with restarted.db.read() as s:
        assert (
            s.scalar(select(func.count()).select_from(Memory).where(Memory.status == "storing"))
            == 10
        )
        assert ledger.balance(s, created.account_id).held_mc == 10_000
    report = completion.complete_writes(restarted)
    assert report.landed == 10 and report.failed == 0
    with restarted.db.read() as s:
        assert ledger.balance(s, created.account_id) == ledger.Balance(90_000, 0)
    _invariant_holds(restarted, created.account_id)
    assert completion.complete_writes(restarted).landed == 0  # idempotent: nothing left
