"""The operator CLI: real subprocesses, JSON output, one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


def run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "walkeep.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def env(db_url: str, tmp_path: Path) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith("WALKEEP_")}
    e["WALKEEP_DATA_DIR"] = str(tmp_path / "data")
    e["WALKEEP_DATABASE_URL"] = db_url
    return e


def test_account_create_then_balance(env: dict[str, str]) -> None:
    out = run(["account", "create", "acme", "--credits-usd", "5", "--json"], env)
    assert out.returncode == 0, out.stderr
    created = json.loads(out.stdout)
    assert set(created) == {"account_id", "api_key"}
    assert created["api_key"].startswith("wk_live_")
    bal = run(["balance", "--account", created["account_id"], "--json"], env)
    assert bal.returncode == 0, bal.stderr
    data = json.loads(bal.stdout)
    assert data["balance_credits"] == 500
    assert data["balance_usd"] == "5.00"


def test_grant_key_create_and_revoke(env: dict[str, str]) -> None:
    acct = json.loads(run(["account", "create", "beta", "--json"], env).stdout)["account_id"]
    g = run(
        ["credits", "grant", "--account", "beta", "--usd", "2.50", "--reason", "promo", "--json"],
        env,
    )
    assert g.returncode == 0, g.stderr
    assert json.loads(g.stdout)["balance_credits"] == 250
    k = run(["key", "create", "--account", acct, "--namespace", "work", "--json"], env)
    assert k.returncode == 0, k.stderr
    prefix = json.loads(k.stdout)["prefix"]
    r = run(["key", "revoke", prefix], env)
    assert r.returncode == 0 and prefix in r.stdout


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["balance", "--account", "acct_doesnotexist"], "unknown account"),
        (["balance", "--account", "nobody"], "unknown account"),
        (["account", "create", "x", "--credits-usd", "-3"], "must not be negative"),
        (["account", "create", "x", "--credits-usd", "lots"], "must be a number"),
        (
            ["credits", "grant", "--account", "nobody", "--usd", "1", "--reason", "r"],
            "unknown account",
        ),
        (["key", "revoke", "wk_live_nothere"], "no API key"),
        # Regression (issue 13): `serve --port 99999` printed :99999 and listened elsewhere.
        (["serve", "--port", "99999"], "--port must be a TCP port between 1 and 65535"),
        (["devnet", "--port", "0"], "--port must be a TCP port between 1 and 65535"),
        (["worker", "--metrics-port", "65536"], "--metrics-port must be a TCP port"),
    ],
)
def test_bad_input_is_one_line_not_a_traceback(
    env: dict[str, str], args: list[str], needle: str
) -> None:
    out = run(args, env)
    assert out.returncode != 0
    assert needle in out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_unreachable_database_is_one_line(env: dict[str, str]) -> None:
    env["WALKEEP_DATABASE_URL"] = "postgresql+psycopg://postgres@127.0.0.1:9/nowhere"
    out = run(["balance", "--account", "x"], env)
    assert out.returncode != 0
    assert "database unreachable" in out.stderr and "Traceback" not in out.stderr


def test_embedded_data_dir_and_database_are_private(tmp_path: Path) -> None:
    """Regression (issue 13): walkeep.db was created 0644 in a 0755 directory."""
    import stat

    data = tmp_path / "fresh" / "walkeep"
    env = {k: v for k, v in os.environ.items() if not k.startswith("WALKEEP_")}
    env["WALKEEP_DATA_DIR"] = str(data)
    out = subprocess.run(
        [sys.executable, "-m", "walkeep.cli", "account", "create", "private", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=lambda: os.umask(0o022),  # the usual umask, which gave 0644/0755
    )
    assert out.returncode == 0, out.stderr
    assert stat.S_IMODE(data.stat().st_mode) == 0o700
    files = [p for p in data.iterdir() if p.name.startswith("walkeep.db")]
    assert data / "walkeep.db" in files
    for p in files:
        assert stat.S_IMODE(p.stat().st_mode) == 0o600, p


def test_configuration_errors_name_the_variable_the_value_and_what_is_allowed(
    env: dict[str, str],
) -> None:
    """Regression (issue 13): they said `1 validation error for Settings`."""
    env["WALKEEP_NETWORK"] = "moon"
    env["WALKEEP_LOCAL_EPOCH_SECONDS"] = "soon"
    out = run(["balance", "--account", "x"], env)
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "WALKEEP_NETWORK='moon'" in out.stderr
    assert "'local', 'testnet' or 'mainnet'" in out.stderr
    assert "WALKEEP_LOCAL_EPOCH_SECONDS='soon'" in out.stderr and "integer" in out.stderr
    assert "validation error for Settings" not in out.stderr


def test_configuration_errors_never_echo_secrets() -> None:
    from walkeep.config import load_settings
    from walkeep.errors import ConfigurationError

    with pytest.raises(ConfigurationError) as err:
        load_settings(database_url=["postgresql+psycopg://u:hunter2@db/x"], renew_batch=0)
    text = str(err.value)
    assert "WALKEEP_DATABASE_URL=(hidden)" in text and "hunter2" not in text
    assert "WALKEEP_RENEW_BATCH=0 is invalid: must be greater than or equal to 1" in text


def test_account_show_takes_the_name_as_create_does_or_with_account(env: dict[str, str]) -> None:
    """Issue 30: `account create NAME` is positional, `account show` took only --account."""
    assert run(["account", "create", "acme", "--credits-usd", "2"], env).returncode == 0
    for args in (["acme"], ["--account", "acme"]):
        out = run(["account", "show", *args, "--json"], env)
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout)["name"] == "acme"
    for args in ([], ["acme", "--account", "acme"]):
        bad = run(["account", "show", *args], env)
        assert bad.returncode == 1 and bad.stderr.startswith("walkeep: error: give the account")


def test_doctor_does_not_claim_an_epoch_setting_nobody_made(env: dict[str, str]) -> None:
    """Issue 30: doctor said "WALKEEP_LOCAL_EPOCH_SECONDS=3600 here" when nothing was set."""
    from walkeep.backends.localnet.engine import LocalNetwork
    from walkeep.clock import SystemClock

    LocalNetwork(
        Path(env["WALKEEP_DATA_DIR"]) / "localnet", SystemClock(), epoch_seconds=60, configure=True
    ).close()
    out = run(["doctor"], {**env, "WALKEEP_EMBEDDER": "hash"})
    chain = next(line for line in out.stdout.splitlines() if "] chain:" in line)
    assert "epoch length 60 s" in chain and "WALKEEP_LOCAL_EPOCH_SECONDS not set here" in chain
    assert "=3600" not in chain
