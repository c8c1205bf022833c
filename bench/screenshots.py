"""The console screenshots docs/operators.md shows, taken from the running product.

    python bench/screenshots.py [--out docs/screenshots] [--port 0]

Starts ``walkeep serve`` in a fresh data directory on the local network (short epochs, so a
renewal happens within a minute), creates an account through the CLI, stores memories
through the REST API, waits until they have landed and one has been renewed, then signs in
to ``/console`` in Debian's Chromium (Playwright; never ``playwright install``) with the
account's key and with the admin token, and saves:

- ``console-account.png`` — the account page at desktop width, whole page;
- ``console-account-phone.png`` and ``console-account-phone-memories.png`` — the same page
  on a phone, at its top and at the memory table;
- ``console-admin.png`` — the admin page, whole page.

Everything it shows is what a real deployment shows: no test clock, no fakes. Look at the
pictures before committing them.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"]
ROOT = Path(__file__).resolve().parent.parent
MEMORIES = [
    "(2 Dec 2026) Dana said the staging database moves to eu-west-2 on 9 December.",
    "(2 Dec 2026) The user prefers metric units and ISO dates in reports.",
    "(3 Dec 2026) Ticket K-7731: the nightly export fails when a namespace is empty.",
    "(3 Dec 2026) Priya owns the billing service; escalate invoices to her.",
    "(3 Dec 2026) The customer Globex renews its contract on 1 March 2027.",
    "(4 Dec 2026) Build agents run Debian 12; Python is pinned to 3.11.",
    "(4 Dec 2026) The user's cat is called Oscar; mention him in greetings.",
    "(4 Dec 2026) Deploys freeze from 20 December to 3 January.",
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _walkeep(env: dict[str, str], *args: str) -> str:
    exe = Path(sys.executable).with_name("walkeep")
    done = subprocess.run([str(exe), *args], env=env, capture_output=True, text=True, check=True)
    return done.stdout


def _wait(what: str, check: Any, seconds: float) -> Any:
    """Poll ``check`` until it returns something truthy; a clear error after ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.5)
    raise SystemExit(f"screenshots: gave up waiting for {what} after {seconds:.0f} s")


def _sign_in(page: Any, url: str, credential: str) -> None:
    page.goto(f"{url}/console/login")
    page.fill("#credential", credential)
    with page.expect_navigation():
        page.get_by_role("button", name="Sign in").click()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshots")
    ap.add_argument("--port", type=int, default=0, help="0: a free port")
    args = ap.parse_args(argv)
    import importlib.util

    from walkeep.client import WalkeepClient

    if importlib.util.find_spec("playwright") is None:
        raise SystemExit("screenshots: the playwright package is missing (pip install playwright)")

    if not Path(CHROMIUM).exists():
        raise SystemExit(f"screenshots: {CHROMIUM} is missing (apt-get install chromium)")
    port = args.port or _free_port()
    url = f"http://127.0.0.1:{port}"
    admin = secrets.token_urlsafe(24)
    with tempfile.TemporaryDirectory(prefix="walkeep-shots-") as tmp:
        env = {
            **os.environ,
            "WALKEEP_DATA_DIR": tmp,
            "WALKEEP_DATABASE_URL": "",
            "WALKEEP_ADMIN_TOKEN": admin,
            "WALKEEP_PUBLIC_URL": url,
            "WALKEEP_LOCAL_EPOCH_SECONDS": "4",
            "WALKEEP_RENEW_INTERVAL_SECONDS": "2",
        }
        _walkeep(env, "migrate")
        key = json.loads(
            _walkeep(env, "account", "create", "acme", "--credits-usd", "5", "--json")
        )["api_key"]
        _walkeep(env, "account", "create", "globex", "--credits-usd", "1")
        server = subprocess.Popen(
            [str(Path(sys.executable).with_name("walkeep")), "serve", "--port", str(port)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            with WalkeepClient(url, key) as wk:
                _wait("the server", lambda: _ready(wk), 60)
                for i, text in enumerate(MEMORIES):
                    wk.store(text, request_id=f"shot-{i}", namespace="ops" if i % 3 else None)
                _wait(
                    "a renewal",
                    lambda: any(m.renewals_performed for m in wk.check_runway().memories),
                    120,
                )
            _shoot(url, key, admin, args.out)
        finally:
            server.terminate()
            server.wait(timeout=30)
    print(f"screenshots in {args.out}")
    return 0


def _ready(wk: Any) -> bool:
    import httpx

    try:
        wk.check_balance()
    except httpx.TransportError:  # not listening yet
        return False
    return True


def _shoot(url: str, key: str, admin: str, out: Path) -> None:
    from playwright.sync_api import sync_playwright

    out.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            desk = browser.new_context(viewport={"width": 1280, "height": 900})
            page = desk.new_page()
            _sign_in(page, url, key)
            page.screenshot(path=str(out / "console-account.png"), full_page=True)
            page.get_by_role("button", name="Sign out").click()
            _sign_in(page, url, admin)
            page.screenshot(path=str(out / "console-admin.png"), full_page=True)
            desk.close()
            phone = browser.new_context(
                viewport={"width": 390, "height": 844}, is_mobile=True, device_scale_factor=1
            )
            page = phone.new_page()
            _sign_in(page, url, key)
            page.screenshot(path=str(out / "console-account-phone.png"))
            page.locator("#memories").evaluate("el => el.scrollIntoView({block: 'start'})")
            page.screenshot(path=str(out / "console-account-phone-memories.png"))
            phone.close()
        finally:
            browser.close()


if __name__ == "__main__":
    raise SystemExit(main())
