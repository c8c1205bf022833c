"""`walkeep account list`, `walkeep statement` and `walkeep console-link` as real subprocesses."""

from __future__ import annotations

import csv
import io
import json
from datetime import UTC, datetime

from tests.test_cli import env, run  # noqa: F401
from walkeep.db import Database
from walkeep.service.operators import console


def test_account_list_prints_the_console_summary(env: dict[str, str]) -> None:  # noqa: F811
    assert run(["account", "list"], env).stdout.startswith("no accounts yet")
    for name, usd in (("zeta", "5"), ("alpha", "0")):
        assert run(["account", "create", name, "--credits-usd", usd], env).returncode == 0
    out = run(["account", "list", "--json"], env)
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert [r["name"] for r in rows] == ["alpha", "zeta"]  # least money first
    assert rows[1]["balance_usd"] == "5.00" and rows[1]["memories"] == 0
    assert set(rows[0]) >= {"paused", "min_runway_epochs", "last_renewal_at", "active"}
    table = run(["account", "list"], env).stdout.splitlines()
    assert table[0].split()[:3] == ["ACCOUNT", "BALANCE", "MEMORIES"]
    assert table[2].split()[:2] == ["zeta", "$5.00"]


def test_statement_csv_and_text_reconcile_and_bad_dates_fail_cleanly(env: dict[str, str]) -> None:  # noqa: F811
    assert run(["account", "create", "acme", "--credits-usd", "3"], env).returncode == 0
    g = run(["credits", "grant", "--account", "acme", "--usd", "1.25", "--reason", "x"], env)
    assert g.returncode == 0, g.stderr
    today = datetime.now(UTC).date().isoformat()
    out = run(["statement", "--account", "acme", "--from", today, "--to", today, "--csv"], env)
    assert out.returncode == 0, out.stderr
    rows = list(csv.DictReader(io.StringIO(out.stdout)))
    assert [r["kind"] for r in rows] == ["opening", "grant", "grant", "closing"]
    assert rows[0]["balance_credits"] == "0.000" and rows[-1]["balance_credits"] == "425.000"
    assert rows[-1]["balance_change_credits"] == "+425.000"
    text = run(["statement", "--account", "acme", "--from", today, "--to", today], env)
    assert text.returncode == 0 and "closing balance" in text.stdout and "425.000" in text.stdout
    for args, message in (
        (["--from", "2026-02-30", "--to", today], "--from must be a date"),
        (["--from", "2026-12-02", "--to", "2026-12-01"], "before it starts"),
    ):
        bad = run(["statement", "--account", "acme", *args], env)
        assert bad.returncode == 1 and message in bad.stderr and "Traceback" not in bad.stderr
    missing = run(["statement", "--account", "nobody", "--from", today, "--to", today], env)
    assert missing.returncode == 1 and "unknown account" in missing.stderr


def test_console_link_prints_a_single_use_link(env: dict[str, str]) -> None:  # noqa: F811
    assert run(["account", "create", "acme"], env).returncode == 0
    out = run(["console-link", "--account", "acme", "--json"], env)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["url"].startswith("http://127.0.0.1:8080/console/link/wkc_")
    assert data["admin"] is False and data["account_id"].startswith("acct_")
    token = data["url"].rsplit("/", 1)[-1]
    db = Database(env["WALKEEP_DATABASE_URL"])
    try:
        assert console.redeem_console_link(db, token).account_id == data["account_id"]
    finally:
        db.dispose()
    admin = run(["console-link", "--admin"], env)
    assert admin.returncode == 0 and "/console/link/wkc_" in admin.stdout
    for args in ([], ["--admin", "--account", "acme"]):
        bad = run(["console-link", *args], env)
        assert bad.returncode == 1 and "either --account NAME or --admin" in bad.stderr


def test_console_link_uses_the_address_the_running_server_recorded(env: dict[str, str]) -> None:  # noqa: F811
    """Regression (issue 30): the link went to port 8080 while `walkeep serve` ran on
    another port and had recorded it in <data dir>/server.json (as `smoke` reads it)."""
    from pathlib import Path

    from walkeep.config import Settings
    from walkeep.ops import record_server

    assert run(["account", "create", "acme"], env).returncode == 0
    data_dir = Path(env["WALKEEP_DATA_DIR"])
    # What `walkeep serve --port 8765` records at start.
    record_server(Settings(data_dir=data_dir, public_url="http://127.0.0.1:8765"))
    out = run(["console-link", "--account", "acme", "--json"], env)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["url"].startswith("http://127.0.0.1:8765/console/link/wkc_")
    admin = run(["console-link", "--admin"], env)
    assert admin.stdout.startswith("http://127.0.0.1:8765/console/link/wkc_")
    # An explicit WALKEEP_PUBLIC_URL still wins over the record.
    explicit = run(
        ["console-link", "--admin"], {**env, "WALKEEP_PUBLIC_URL": "https://walkeep.example.com/"}
    )
    assert explicit.stdout.startswith("https://walkeep.example.com/console/link/wkc_")
