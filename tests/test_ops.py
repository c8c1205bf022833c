"""Operations: configuration refusal, doctor, smoke, first run, the worker process."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import TEST_MASTER_KEY_BYTES
from walkeep.bootstrap import build_runtime, check_config
from walkeep.config import Settings
from walkeep.errors import ConfigurationError
from walkeep.ops import doctor, smoke


def _problems(**kw: object) -> dict[str, str]:
    return {p.setting: p.message for p in check_config(Settings(**kw))}  # type: ignore[arg-type]


def test_wrong_combinations_refuse_to_boot_saying_what_to_set(tmp_path: Path) -> None:
    assert _problems(data_dir=tmp_path) == {}
    assert "WALKEEP_NETWORK" in _problems(data_dir=tmp_path, relayer="memwal")
    p = _problems(data_dir=tmp_path, network="testnet", relayer="memwal")
    assert {
        "WALKEEP_MEMWAL_URL",
        "WALKEEP_MEMWAL_DELEGATE_KEY",
        "WALKEEP_MEMWAL_ACCOUNT_ID",
        "WALKEEP_SUI_PRIVATE_KEY",
    } <= set(p)
    assert "WALKEEP_RELAYER" in _problems(data_dir=tmp_path, network="testnet")
    # Testnet has public Walrus endpoints; mainnet has no public publisher.
    assert "WALKEEP_WALRUS_PUBLISHER_URL" not in _problems(
        data_dir=tmp_path, network="testnet", relayer="walrus"
    )
    main = _problems(data_dir=tmp_path, network="mainnet", relayer="walrus")
    assert "run your own" in main["WALKEEP_WALRUS_PUBLISHER_URL"]
    assert "STRIPE_SECRET_KEY" in main  # never give real-money credits away in TEST MODE
    assert "STRIPE_WEBHOOK_SECRET" in _problems(data_dir=tmp_path, stripe_secret_key="sk_test_x")
    bad_key = _problems(
        data_dir=tmp_path, network="testnet", relayer="memwal", memwal_delegate_key="zz"
    )
    assert "hex" in bad_key["WALKEEP_MEMWAL_DELEGATE_KEY"]
    with pytest.raises(ConfigurationError, match="WALKEEP_RELAYER"):
        build_runtime(Settings(data_dir=tmp_path, network="testnet"))


def test_doctor_passes_on_the_embedded_default(settings: Settings) -> None:
    from walkeep.db import migrate

    migrate.upgrade(settings.db_url)
    report = doctor(settings)
    assert report.ok, [c for c in report.checks if not c.ok]
    names = {c.name for c in report.checks}
    assert {
        "database",
        "chain",
        "storage backend",
        "embedder",
        "payments",
        "encryption key",
    } <= names


def test_doctor_names_what_is_missing(tmp_path: Path) -> None:
    report = doctor(Settings(data_dir=tmp_path, network="testnet", relayer="walrus"))
    assert not report.ok
    failing = {c.name: c for c in report.checks if not c.ok}
    assert failing["config WALKEEP_SUI_PRIVATE_KEY"].fix == "set WALKEEP_SUI_PRIVATE_KEY"
    # An unmigrated database is reported with the command that fixes it.
    assert "walkeep migrate" in failing["database"].fix


def test_smoke_runs_the_whole_promise_on_the_local_network(settings: Settings, clock) -> None:  # type: ignore[no-untyped-def]
    from walkeep.db import Database
    from walkeep.service.operators import accounts
    from walkeep.service.tools import runway

    lines: list[str] = []
    result = smoke(settings, say=lines.append, clock=clock, timeout_seconds=30)
    assert result.end_epoch_after > result.end_epoch_before
    assert result.explorer_url.endswith(f"/explorer/tx/{result.digest}")
    assert any("landed" in line for line in lines)
    # Regression (issue 13): it left a funded `smoke` account renewing its memory for ever.
    db = Database(settings.db_url, clock=clock)
    try:
        acct = accounts.get_account(db, result.account_id)
        assert (acct.name, acct.balance_mc, acct.held_mc) == ("smoke", 0, 0)
        assert any("taken back" in line and result.account_id in line for line in lines)
        assert any(f"memory {result.memory_id} forgotten" in line for line in lines)
        rt = build_runtime(settings, clock=clock, database=db, with_completer=False)
        view = runway.check_runway(rt, result.account_id, result.memory_id).memories[0]
        assert view.status == "no-renew"
        again = smoke(settings, say=lines.append, clock=clock, timeout_seconds=30)
        assert again.account_id == result.account_id
        assert accounts.get_account(db, result.account_id).balance_mc == 0
    finally:
        db.dispose()


def test_smoke_links_the_running_servers_explorer(settings: Settings, clock, db) -> None:  # type: ignore[no-untyped-def]
    """Regression (issue 13): smoke printed http://127.0.0.1:8080/… whatever port
    `walkeep serve` listened on."""
    from tests.test_mcp_e2e import Server
    from walkeep.ops import record_server

    unset = Settings(
        data_dir=settings.data_dir,
        database_url=settings.database_url,
        local_write_latency_ms=0,
        master_key=settings.master_key,
    )
    assert "public_url" not in unset.model_fields_set
    with Server(settings, clock, db) as srv:
        record_server(settings)  # what `walkeep serve` does at start
        lines: list[str] = []
        result = smoke(unset, say=lines.append, clock=clock, timeout_seconds=30)
        assert result.explorer_url == f"{srv.url}/explorer/tx/{result.digest}"
        assert result.explorer_reachable is True
    # Nothing answers there any more: smoke says so instead of printing a dead link silently.
    again = smoke(unset, say=lines.append, clock=clock, timeout_seconds=30)
    assert again.explorer_url.startswith(srv.url) and again.explorer_reachable is False
    assert any("walkeep serve" in line for line in lines)


def test_first_run_creates_a_default_account_and_a_private_credentials_file(
    settings: Settings,
) -> None:
    from walkeep.cli.serve import first_run
    from walkeep.db import Database
    from walkeep.service.operators import accounts

    db = Database(settings.db_url)
    first_run(settings, db)
    creds_path = settings.data_dir / "credentials.json"
    creds = json.loads(creds_path.read_text())
    assert stat.S_IMODE(creds_path.stat().st_mode) == 0o600
    assert creds["mcp_url"] == "http://127.0.0.1:8080/mcp"
    principal = accounts.authenticate(db, creds["api_key"], TEST_MASTER_KEY_BYTES)
    assert accounts.get_account(db, principal.account_id).balance_mc == 100_000  # $1.00 promo
    first_run(settings, db)  # idempotent: never a second account
    assert accounts.find_account_by_name(db, "default") == principal.account_id


def test_client_configs_are_ready_to_paste() -> None:
    from walkeep.onboarding import client_configs

    text = client_configs("http://127.0.0.1:8080/mcp", "wk_live_abc")
    assert (
        'claude mcp add --transport http walkeep http://127.0.0.1:8080/mcp --header "Authorization: Bearer wk_live_abc"'
        in text
    )
    blocks = [b for b in text.split("\n\n") if b.strip().startswith("{") or "{\n" in b]
    parsed = [json.loads(b[b.index("{") :]) for b in blocks]
    assert parsed[0]["mcpServers"]["walkeep"]["headers"]["Authorization"] == "Bearer wk_live_abc"
    # Absolute (issue 30): hosts start commands with a minimal PATH, as the README says.
    command = parsed[1]["mcpServers"]["walkeep"]["command"]
    assert Path(command).is_absolute() and Path(command).name == "walkeep"
    assert os.access(command, os.X_OK)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_worker_process_runs_jobs_and_stops_gracefully_on_sigterm(
    settings: Settings, tmp_path: Path
) -> None:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("WALKEEP_", "STRIPE_"))},
        "HOME": str(tmp_path),
        "WALKEEP_DATA_DIR": str(settings.data_dir),
        "WALKEEP_DATABASE_URL": settings.db_url,
        "WALKEEP_MASTER_KEY": settings.master_key or "",
        "WALKEEP_EMBEDDER": "hash",
        # Idle runs log only at debug level ("job idle"); an idle worker is quiet at info.
        "WALKEEP_LOG_LEVEL": "debug",
        "WALKEEP_LOG_FORMAT": "json",
    }
    metrics_port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "worker", "--metrics-port", str(metrics_port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    assert proc.stderr is not None
    deadline = time.monotonic() + 60
    jobs_seen: set[str] = set()
    while time.monotonic() < deadline and len(jobs_seen) < 8:
        line = proc.stderr.readline()
        if not line:
            break
        lines.append(line)
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("msg") in ("job done", "job idle"):
            jobs_seen.add(record["job"])
    assert jobs_seen == {
        "complete_writes",
        "renew",
        "reconcile_renewals",
        "sweep",
        "reconcile_payments",
        "deliver_alerts",
        "reindex",
        "auto_top_up",
    }, lines
    # Regression (issue 13): the worker's metrics were never served.
    scraped = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10)
    assert scraped.status_code == 200
    assert 'walkeep_job_runs_total{job="renew",outcome="ok"}' in scraped.text
    assert "process_cpu_seconds_total" in scraped.text and "python_info" in scraped.text
    if settings.db_url.startswith("sqlite"):  # a second worker on SQLite refuses to start
        second = subprocess.run(
            [sys.executable, "-m", "worker"], env=env, capture_output=True, text=True, timeout=60
        )
        assert (
            second.returncode != 0 and "another Walkeep worker is already running" in second.stderr
        )
    proc.send_signal(signal.SIGTERM)
    _, rest = proc.communicate(timeout=60)
    assert proc.returncode == 0, rest
    assert "worker stopped" in rest


def test_readme_mcp_snippets_match_what_walkeep_serves() -> None:
    """The README's client configs are the ones `walkeep serve` prints, for its default URL."""
    import re

    from walkeep.onboarding import client_configs

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    key = "wk_live_…"
    printed = client_configs("http://127.0.0.1:8080/mcp", key)
    claude = re.search(r"^claude mcp add .*$", readme, re.M)
    assert claude is not None and claude.group(0) in printed
    blocks = [json.loads(b) for b in re.findall(r"```json\n(.*?)```", readme, re.S)]
    http = next(b for b in blocks if "url" in b["mcpServers"]["walkeep"])
    stdio = next(b for b in blocks if "command" in b["mcpServers"]["walkeep"])
    assert http["mcpServers"]["walkeep"] == {
        "url": "http://127.0.0.1:8080/mcp",
        "headers": {"Authorization": f"Bearer {key}"},
    }
    assert stdio["mcpServers"]["walkeep"]["args"] == ["mcp"]
    assert stdio["mcpServers"]["walkeep"]["env"] == {"WALKEEP_API_KEY": key}
    assert Settings.model_fields["public_url"].default + "/mcp" == "http://127.0.0.1:8080/mcp"


def test_restarting_with_another_epoch_length_keeps_every_memory_alive(
    settings: Settings,
    clock,  # type: ignore[no-untyped-def]
    db,  # type: ignore[no-untyped-def]
) -> None:
    """Regression (issue 13): restarting `walkeep serve` with a shorter
    WALKEEP_LOCAL_EPOCH_SECONDS jumped the epoch and expired every memory at once."""
    from tests.helpers import account, land_all
    from walkeep.service.tools import runway, store

    rt = build_runtime(settings, clock=clock, database=db, with_completer=False)
    a = account(rt)
    mid = store.store(rt, a, content="keep me through a restart", request_id="r1").memory_id
    land_all(rt)
    before = runway.check_runway(rt, a, mid).memories[0]
    rt.extras["localnet"].close()

    clock.advance(1800)  # half way through an hour-long epoch
    fast = settings.model_copy(update={"local_epoch_seconds": 60})
    rt2 = build_runtime(
        fast, clock=clock, database=db, with_completer=False, configure_network=True
    )
    after = runway.check_runway(rt2, a, mid).memories[0]
    assert after.status == "active"
    assert (after.current_epoch, after.runway_epochs) == (before.current_epoch, 5)
    assert rt2.chain.epoch_info().duration_seconds == 60
    rt2.extras["localnet"].close()


def test_doctor_and_smoke_never_rewrite_the_running_networks_epoch_length(
    settings: Settings,
    clock,  # type: ignore[no-untyped-def]
) -> None:
    """Regression (issue 13): `walkeep doctor` in another shell without the server's
    WALKEEP_LOCAL_EPOCH_SECONDS froze the running server's epoch."""
    from walkeep.backends.localnet.engine import LocalNetwork
    from walkeep.db import migrate

    migrate.upgrade(settings.db_url)
    server = LocalNetwork(settings.localnet_dir, clock, epoch_seconds=60, configure=True)
    try:
        other = settings.model_copy(update={"local_epoch_seconds": 3600})
        report = doctor(other)
        assert report.ok
        chain = next(c for c in report.checks if c.name == "chain")
        assert "epoch length 60 s (set by the server" in chain.detail
        smoke(other, say=lambda _m: None, clock=clock, timeout_seconds=30)
        assert server.epoch_seconds == 60
        before = server.current_epoch()
        clock.advance(60)
        assert server.current_epoch() == before + 1
    finally:
        server.close()


def test_metrics_include_process_and_platform_collectors() -> None:
    """Regression (issue 13): the registry had only Walkeep's own metrics."""
    from prometheus_client import generate_latest

    from walkeep import metrics

    text = generate_latest(metrics.REGISTRY).decode()
    assert "process_resident_memory_bytes" in text
    assert "python_info{" in text and "python_gc_objects_collected_total" in text


def test_a_second_serve_on_a_port_in_use_fails_first_and_changes_nothing(
    settings: Settings,
    clock,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    """Regression (issue 30): a second `walkeep serve` on a port already in use migrated,
    rewrote server.json and the running network's epoch length (60 s → 3600 s) before
    uvicorn found the port taken."""
    import socket

    from tests.live_serve import walkeep_env
    from walkeep.backends.localnet.engine import LocalNetwork
    from walkeep.ops import SERVER_FILE, record_server

    server = LocalNetwork(settings.localnet_dir, clock, epoch_seconds=60, configure=True)
    running = settings.model_copy(update={"public_url": "http://127.0.0.1:9999"})
    record_server(running)
    recorded = (settings.data_dir / SERVER_FILE).read_text()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = subprocess.run(
            [sys.executable, "-m", "walkeep.cli", "serve", "--port", str(port)],
            # An explicit, different epoch length: even that must not apply.
            env=walkeep_env(settings.data_dir, settings.db_url, WALKEEP_LOCAL_EPOCH_SECONDS="3600"),
            capture_output=True,
            text=True,
            timeout=120,
        )
    try:
        assert out.returncode == 1
        assert out.stderr.startswith("walkeep: error: ") and "already in use" in out.stderr
        assert "Traceback" not in out.stderr and len(out.stderr.splitlines()) == 1
        assert (settings.data_dir / SERVER_FILE).read_text() == recorded
        assert server.epoch_seconds == 60
        before = server.current_epoch()
        clock.advance(60)
        assert server.current_epoch() == before + 1  # still ticking at 60 s
    finally:
        server.close()


def test_devnet_without_an_epoch_setting_keeps_the_running_networks_length(
    settings: Settings,
    clock,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    """Regression (issue 30): `walkeep devnet` without WALKEEP_LOCAL_EPOCH_SECONDS
    rewrote a running 60 s network to the 3600 s default and froze its epoch."""
    from tests.live_serve import free_port, walkeep_env
    from walkeep.backends.localnet.engine import LocalNetwork

    LocalNetwork(settings.localnet_dir, clock, epoch_seconds=60, configure=True).close()
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "walkeep.cli", "devnet", "--port", str(port)],
        env=walkeep_env(settings.data_dir, settings.db_url),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, "walkeep devnet exited"
            try:
                info = httpx.get(f"http://127.0.0.1:{port}/local/v1/epoch", timeout=2).json()
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, "walkeep devnet did not answer"
                time.sleep(0.1)
        assert info["epoch_seconds"] == 60
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    reopened = LocalNetwork(settings.localnet_dir, clock)
    try:
        assert reopened.epoch_seconds == 60
    finally:
        reopened.close()
