"""The operator console in a real headless Chromium (Playwright driving Debian's chromium).

A real server (uvicorn on a free port, create_app, a Runtime on the local
network with a ManualClock) and real clicks: sign in with a key and with a
one-time link, read the balance, the chart and a renewal's explorer link, top
up through the TEST MODE checkout page by pressing its button, see the balance
change; an admin sees every account; a wrong key, a reused link, a missing
CSRF token and a revoked key are refused.

Chromium: ``/usr/bin/chromium`` (``apt-get install chromium``; never
``playwright install``). Without it these tests skip locally and fail in CI.
Set ``WALKEEP_SCREENSHOTS=<dir>`` to save the README's screenshots.
"""

from __future__ import annotations

import csv
import io
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import IN_CI
from tests.test_mcp_e2e import Server
from walkeep.api.console import credits
from walkeep.service.jobs import renew
from walkeep.service.operators import accounts, console
from walkeep.service.tools import store

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
ADMIN_TOKEN = "admin-token-for-tests-0123456789"
SHOTS = os.environ.get("WALKEEP_SCREENSHOTS", "").strip()


def _unavailable(reason: str) -> None:
    if IN_CI:
        pytest.fail(f"browser tests need {reason} (CI installs it: see .ci/run)", pytrace=False)
    pytest.skip(f"browser tests skipped: {reason} (apt-get install chromium)")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("the playwright package")
    if not Path(CHROMIUM).exists():
        _unavailable(CHROMIUM)
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def live(settings, clock, db) -> Iterator[Server]:  # type: ignore[no-untyped-def]
    settings.admin_token = ADMIN_TOKEN
    with Server(settings, clock, db) as srv:
        yield srv


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 900}, accept_downloads=True)
    context.set_default_timeout(20_000)
    pg = context.new_page()
    try:
        yield pg
    finally:
        context.close()


def _populate(srv: Server, clock: Any, name: str, usd_cents: int, n: int) -> str:
    """An account with ``n`` landed memories, renewed once (when its credits allow)."""
    rt = srv.rt
    created = accounts.create_account(rt.db, name, credits_mc=usd_cents * 1000)
    for i in range(n):
        store.store(
            rt,
            created.account_id,
            content=f"{name} remembers fact number {i}",
            request_id=f"{name}-{i}",
            namespace="agent-1" if i % 2 else "default",
        )
    assert rt.completer is not None and rt.completer.wait_idle(30)
    return created.api_key


def _renew(srv: Server, clock: Any) -> None:
    clock.advance(srv.rt.chain.epoch_info().duration_seconds * 3)
    renew.renew(srv.rt)


def _available_mc(srv: Server, name: str) -> int:
    acct_id = accounts.find_account_by_name(srv.rt.db, name)
    assert acct_id is not None
    return accounts.get_account(srv.rt.db, acct_id).available_mc


def _sign_in(page: Any, srv: Server, credential: str) -> Any:
    page.goto(f"{srv.url}/console")
    assert page.url.endswith("/console/login")
    page.fill("#credential", credential)
    with page.expect_navigation():
        page.get_by_role("button", name="Sign in").click()
    return page


def _no_sideways_scroll(page: Any) -> bool:
    return bool(page.evaluate("document.documentElement.scrollWidth <= window.innerWidth"))


def _shot(page: Any, name: str, *, full_page: bool = True) -> None:
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(SHOTS) / name), full_page=full_page)


def test_operator_signs_in_sees_renewals_tops_up_and_downloads_a_statement(
    live: Server, clock: Any, page: Any
) -> None:
    key = _populate(live, clock, "acme", 300, 6)
    _renew(live, clock)
    rt = live.rt
    renewed = console.account_view(rt, accounts.find_account_by_name(rt.db, "acme") or "")
    digest = renewed.renewals[0].digest

    _sign_in(page, live, key)
    assert page.url.endswith("/console/account")
    assert page.inner_text("h1").startswith("acme")
    before = _available_mc(live, "acme")
    assert page.inner_text("[data-testid=balance-credits]") == f"{credits(before)} credits"
    # The chart: a history line and a dashed projection, drawn as inline SVG.
    wide = page.locator("#chart .chart-wide svg")
    assert wide.is_visible() and not page.locator("#chart .chart-narrow svg").is_visible()
    assert wide.locator("path.line-history").count() == 1
    assert wide.locator("path.line-projection").get_attribute("stroke-dasharray")
    assert "now" in wide.locator("text.marker-label").all_text_contents()
    assert "6" in page.inner_text("#memories-summary .big")
    assert page.locator("#memories tbody tr").count() == 6
    _shot(page, "console-account.png")

    # A renewal's digest links to the explorer, whose sender links to the address page.
    link = page.locator(f"#renewals a.tx[href$='{digest}']")
    assert link.count() == 1
    link.click()
    page.wait_for_url(f"**/explorer/tx/{digest}")
    assert "network: local" in page.inner_text(".banner")
    page.locator("a[href^='/explorer/address/']").first.click()
    page.wait_for_url("**/explorer/address/**")
    assert digest in page.content()
    page.go_back()
    page.go_back()
    page.wait_for_url("**/console/account")

    # Top up: the console creates a checkout through top_up; pay by pressing the page's button.
    page.fill("#amount_usd", "5")
    page.get_by_role("button", name="Top up").click()
    page.wait_for_url("**/checkout/**")
    assert "TEST MODE" in page.inner_text("body")
    page.get_by_role("button", name=re.compile("Pay")).click()
    page.wait_for_load_state()
    assert "Credits added" in page.inner_text("h1")
    checkout_url = page.url.removesuffix("/pay")
    # Issue 30: a paid page led nowhere; it links back, and says "Already paid" later.
    page.get_by_role("link", name=re.compile("Back to the console")).click()
    page.wait_for_url("**/console/account")
    page.goto(checkout_url)
    assert page.inner_text("h1") == "Already paid"
    assert page.get_by_role("link", name=re.compile("Back to the console")).is_visible()
    page.goto(f"{live.url}/console")
    after = _available_mc(live, "acme")
    assert after == before + 500_000
    assert page.inner_text("[data-testid=balance-credits]") == f"{credits(after)} credits"
    assert "complete" in page.inner_text("#topups tbody")

    # The statement CSV closes on the balance the page shows.
    with page.expect_download() as dl:
        page.get_by_role("button", name="Download CSV").click()
    text = Path(dl.value.path()).read_text()
    rows = list(csv.DictReader(io.StringIO(text)))
    assert rows[-1]["kind"] == "closing" and rows[-1]["memo"] == "reconciled"
    assert rows[-1]["available_credits"] == f"{after // 1000}.{after % 1000:03d}"
    assert {"grant", "hold", "capture", "topup"} <= {r["kind"] for r in rows}

    # Phone width: readable, nothing scrolls sideways.
    page.set_viewport_size({"width": 390, "height": 844})
    page.reload()
    page.evaluate("window.scrollTo(0, 0)")
    assert _no_sideways_scroll(page)
    assert page.locator("#memories td[data-label=Namespace]").first.is_visible()
    assert page.locator("#chart .chart-narrow svg").is_visible()  # the phone-sized drawing
    _shot(page, "console-account-phone.png", full_page=False)
    page.locator("#memories").scroll_into_view_if_needed()
    _shot(page, "console-account-phone-memories.png", full_page=False)
    page.set_viewport_size({"width": 1280, "height": 900})

    # Sign out ends the session.
    page.get_by_role("button", name="Sign out").click()
    page.wait_for_url("**/console/login")
    page.goto(f"{live.url}/console/account")
    assert page.url.endswith("/console/login")


def test_one_time_links_admin_view_and_refusals(live: Server, clock: Any, page: Any) -> None:
    key = _populate(live, clock, "healthy", 500, 3)
    _populate(live, clock, "broke", 2, 2)  # both credits spent on the stores
    _renew(live, clock)
    rt = live.rt
    healthy = accounts.find_account_by_name(rt.db, "healthy")
    assert healthy is not None

    # A wrong key is refused, with a message and no session.
    _sign_in(page, live, "wk_live_" + "x" * 43)
    assert page.url.endswith("/console/login")
    assert "not recognised" in page.inner_text("[role=alert]")

    # A one-time link signs in once.
    token, _ = console.create_console_link(rt.db, healthy, minutes=15)
    page.goto(f"{live.url}/console/link/{token}")
    page.get_by_role("button", name="Continue to the console").click()
    page.wait_for_url("**/console/account")
    assert page.inner_text("h1").startswith("healthy")
    page.get_by_role("button", name="Sign out").click()
    page.wait_for_url("**/console/login")
    page.goto(f"{live.url}/console/link/{token}")
    with page.expect_response(re.compile(r"/console/link$")) as resp:
        page.get_by_role("button", name="Continue to the console").click()
    assert resp.value.status == 401
    assert "invalid, used or expired" in page.inner_text(".err")
    # Commands in messages show as code, not as literal backticks (issue 30).
    assert "`" not in page.inner_text(".err")
    assert page.locator(".err code", has_text="walkeep console-link").count() == 1

    # A form without its CSRF token is refused and changes nothing.
    _sign_in(page, live, key)
    page.evaluate("document.querySelector('#topup input[name=csrf]').remove()")
    with page.expect_response(re.compile(r"/console/topup$")) as resp:
        page.get_by_role("button", name="Top up").click()
    assert resp.value.status == 403
    assert "security token" in page.inner_text(".err")
    assert console.account_view(rt, healthy).topups == []
    # …and so is a forged token sent with the session cookie.
    forged = page.request.post(
        f"{live.url}/console/topup",
        form={"csrf": "forged", "amount_usd": "5", "request_id": "x"},
        max_redirects=0,
    )
    assert forged.status == 403

    # Revoking the key ends its session on the next page load.
    accounts.revoke_key(rt.db, accounts.create_key(rt.db, healthy).prefix)  # another key: no effect
    page.goto(f"{live.url}/console/account")
    assert page.url.endswith("/console/account")
    prefix = next(p for p in [key[: len("wk_live_") + 8]])
    accounts.revoke_key(rt.db, prefix)
    page.goto(f"{live.url}/console/account")
    assert page.url.endswith("/console/login")

    # An admin (token) sees every account, the paused one first, and the job table.
    from walkeep.scheduler.jobs import run_job

    run_job(rt, "sweep")
    _sign_in(page, live, ADMIN_TOKEN)
    assert page.url.endswith("/console/admin")
    names = page.locator("#accounts tbody tr td[data-label=Account] a").all_inner_texts()
    assert names[0] == "broke" and set(names) == {"broke", "healthy"}
    assert page.locator("#accounts tbody tr.row-warn").count() == 1
    jobs = page.inner_text("#jobs tbody")
    assert "sweep" in jobs and "ok" in jobs and "never" in jobs
    assert page.locator("#renewals-per-day svg rect").count() == console.ADMIN_DAYS
    _shot(page, "console-admin.png")
    page.locator("#accounts a", has_text="healthy").click()
    page.wait_for_url(f"**/console/accounts/{healthy}")
    assert page.locator("#topup").count() == 0  # admins look; operators pay

    # An admin link works too, once.
    page.get_by_role("button", name="Sign out").click()
    admin_link, _ = console.create_console_link(rt.db, None, minutes=15)
    page.goto(f"{live.url}/console/link/{admin_link}")
    page.get_by_role("button", name="Continue to the console").click()
    page.wait_for_url("**/console/admin")


def test_lapsed_memories_are_said_plainly_and_sorted_first(
    live: Server, clock: Any, page: Any, tmp_path: Path
) -> None:
    """Issue 30: paid memories that lapsed get a notice on the account page (desktop and
    phone), and the admin's worst-first table puts that account above a healthy one."""
    rt = live.rt
    _populate(live, clock, "healthy", 500, 2)
    key = _populate(live, clock, "lapsing", 2, 2)  # both credits spent on the stores
    _renew(live, clock)  # healthy renews; lapsing pauses
    clock.advance(rt.chain.epoch_info().duration_seconds * 2)  # lapsing's runway runs out

    from walkeep.service import alerts

    lapsing = accounts.find_account_by_name(rt.db, "lapsing")
    assert lapsing is not None
    alerts.set_alert_webhook(rt, lapsing, "https://ops.example/hooks")

    _sign_in(page, live, key)
    # Not "(ok now)" at 0 credits: nothing is left to renew (issue 30).
    assert "(nothing to renew now)" in page.inner_text("#alerts")
    notice = page.locator("[data-testid=lapsed-notice]")
    assert notice.is_visible()
    assert "2 paid memories lapsed" in notice.inner_text()
    assert "gone from Walrus" in notice.inner_text()
    assert set(page.locator("#memories td[data-label=Status]").all_inner_texts()) == {"expired"}
    assert "An epoch lasts 1 h on this network." in page.inner_text("#runway")
    # Not "no stored memories" beside "expired 2".
    assert "no memory is kept any more" in page.inner_text("#runway")
    page.screenshot(path=str(tmp_path / "lapsed-desktop.png"), full_page=True)
    page.set_viewport_size({"width": 390, "height": 844})
    page.reload()
    assert _no_sideways_scroll(page) and notice.is_visible()
    page.screenshot(path=str(tmp_path / "lapsed-phone.png"))
    page.set_viewport_size({"width": 1280, "height": 900})
    page.get_by_role("button", name="Sign out").click()

    _sign_in(page, live, ADMIN_TOKEN)
    rows = page.locator("#accounts tbody tr")
    assert rows.nth(0).locator("td[data-label=Account]").inner_text() == "lapsing"
    assert rows.nth(0).locator("td[data-label=Lapsed]").inner_text() == "2"
    assert "row-warn" in (rows.nth(0).get_attribute("class") or "")
    assert rows.nth(1).locator("td[data-label=Account]").inner_text() == "healthy"
    page.screenshot(path=str(tmp_path / "lapsed-admin.png"), full_page=True)
    print("screenshots in", tmp_path)


def test_explorer_pages_fit_a_phone(live: Server, clock: Any, browser: Any, tmp_path: Path) -> None:
    """Issue 30: explorer pages had no viewport meta tag (a 980-px layout shrunk onto a
    phone) and the address page's Size column wrapped. A mobile context honours the
    viewport tag as a phone does (a desktop one ignores it)."""
    _populate(live, clock, "explored", 300, 3)
    _renew(live, clock)
    rt = live.rt
    digest = console.account_view(rt, accounts.find_account_by_name(rt.db, "explored") or "")
    tx = digest.renewals[0].digest
    context = browser.new_context(
        viewport={"width": 390, "height": 844}, is_mobile=True, device_scale_factor=2
    )
    page = context.new_page()
    for path in (f"/explorer/tx/{tx}", f"/explorer/address/{rt.chain.owner_address()}"):
        page.goto(f"{live.url}{path}")
        assert page.evaluate("document.documentElement.clientWidth") == 390, path
        page.screenshot(path=str(tmp_path / (path.split("/")[2] + ".png")), full_page=True)
        assert _no_sideways_scroll(page), path
    sizes = page.locator("table.list td.nowrap")
    assert sizes.count() >= 1
    lines = sizes.first.evaluate(
        "el => { const r = document.createRange(); r.selectNodeContents(el);"
        " return new Set([...r.getClientRects()].map(b => Math.round(b.top))).size; }"
    )
    assert lines == 1  # "445556 B" on one line, not wrapped
    context.close()
    print("screenshots in", tmp_path)
