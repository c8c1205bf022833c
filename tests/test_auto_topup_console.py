"""The console's "Automatic top-up" card in a real headless Chromium (TEST MODE).

An operator signs in, is refused turning it on without a card, adds a card through the
TEST MODE setup checkout (the page states the consent and lets them pick how the test
card behaves), turns it on with a rule and a cap, sees an automatic charge with its
payment id, follows the "Confirm the payment" link a card needing authentication gives,
and turns it off. Set ``WALKEEP_SCREENSHOTS=<dir>`` to keep the screenshots.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.test_console_browser import (  # noqa: F401
    SHOTS,
    _no_sideways_scroll,
    _shot,
    _sign_in,
    browser,
    page,
)
from tests.test_mcp_e2e import Server
from walkeep.db.models import AutoCharge
from walkeep.service.jobs import autotopup as job
from walkeep.service.operators import accounts
from walkeep.service.tools import balance, store


@pytest.fixture
def live(settings, clock, db) -> Iterator[Server]:  # type: ignore[no-untyped-def]
    with Server(settings, clock, db) as srv:
        yield srv


def _account(srv: Server) -> tuple[str, str]:
    rt = srv.rt
    created = accounts.create_account(rt.db, "autumn", credits_mc=200_000)
    for i in range(3):
        store.store(rt, created.account_id, content=f"autumn fact {i}", request_id=f"a-{i}")
    assert rt.completer is not None and rt.completer.wait_idle(30)
    from walkeep import ledger

    with rt.db.begin() as s:
        ledger.debit(
            s, created.account_id, ledger.balance(s, created.account_id).available_mc, ref="t"
        )
    return created.account_id, created.api_key


def _card(pg: Any) -> Any:
    return pg.locator("#auto-top-up")


def _card_shot(pg: Any, name: str) -> None:
    if SHOTS:
        _card(pg).screenshot(path=str(Path(SHOTS) / name))


def test_the_automatic_top_up_card(live: Server, page: Any) -> None:  # noqa: F811
    account_id, key = _account(live)
    _sign_in(page, live, key)
    card = _card(page)
    assert card.is_visible()
    assert card.locator("[data-testid=auto-status]").inner_text() == "off"
    assert card.locator("[data-testid=auto-card]").inner_text() == "none saved"
    assert "authorise Walkeep to charge it later" in card.inner_text()

    # Turning it on without a card is refused, with the reason, and nothing changes.
    card.get_by_role("button", name="Turn on").click()
    page.wait_for_load_state()
    assert "save a card first" in page.inner_text("[role=alert]")
    assert balance.auto_top_up_view(live.rt, account_id).status == "off"

    # Add a card: a TEST MODE setup checkout that states the consent.
    _card(page).get_by_role("button", name="Add a card").click()
    page.wait_for_url("**/checkout/**")
    assert "Save a card" in page.inner_text("body")
    assert "authorise Walkeep to charge it later" in page.inner_text("[data-testid=consent]")
    _shot(page, "auto-top-up-save-card.png")
    page.select_option("#test_card", "authentication_required")
    page.get_by_role("button", name="Save test card (TEST MODE)").click()
    page.wait_for_load_state()
    assert page.inner_text("h1") == "Card saved"
    page.get_by_role("link", name=re.compile("Back to the console")).click()
    page.wait_for_url("**/console/account")
    card = _card(page)
    assert card.locator("[data-testid=auto-card]").inner_text() == "visa •••• 3184"

    # Turn it on with a rule.
    card.locator("#auto-below").fill("4")
    card.locator("#auto-to").fill("12")
    card.locator("#auto-cap").fill("15")
    card.get_by_role("button", name="Turn on").click()
    page.wait_for_url("**/console/account#auto-top-up")
    card = _card(page)
    assert card.locator("[data-testid=auto-status]").inner_text() == "active"
    assert "$0.00 of a $15.00 cap" in card.locator("[data-testid=auto-month]").inner_text()

    # The worker charges the card; this one needs its holder: the card says so, with a link.
    assert job.auto_top_up(live.rt).action_required == 1
    page.reload()
    card = _card(page)
    assert card.locator("[data-testid=auto-status]").inner_text() == "action required"
    notice = card.locator("[data-testid=auto-action]")
    assert "confirm a $0.50 charge" in notice.inner_text()
    _card_shot(page, "auto-top-up-action-required.png")
    notice.get_by_role("link", name="Confirm the payment").click()
    page.wait_for_url("**/checkout/**")
    assert "$0.50" in page.inner_text(".amount")
    page.select_option("#test_card", "succeeds")
    page.get_by_role("button", name=re.compile("Pay")).click()
    page.wait_for_load_state()
    assert page.inner_text("h1") == "Credits added"
    assert page.locator("[data-testid=card-saved]").is_visible()
    page.goto(f"{live.url}/console/account")
    card = _card(page)
    assert card.locator("[data-testid=auto-status]").inner_text() == "active"
    assert card.locator("[data-testid=auto-card]").inner_text() == "visa •••• 4242"

    # The next automatic charge succeeds and is listed with its payment id.
    from walkeep import ledger

    with live.rt.db.begin() as s:
        ledger.debit(s, account_id, ledger.balance(s, account_id).available_mc, ref="t2")
    live.rt.clock.advance(live.rt.settings.auto_top_up_min_interval_seconds)  # type: ignore[attr-defined]
    assert job.auto_top_up(live.rt).succeeded == 1
    page.reload()
    rows = _card(page).locator("tbody tr")
    assert rows.count() == 2
    with live.rt.db.read() as s:
        paid = s.query(AutoCharge).filter(AutoCharge.status == "succeeded").one()
    assert paid.payment_intent_id and paid.payment_intent_id in rows.first.inner_text()
    assert "succeeded" in rows.first.inner_text()
    assert "authentication required" in rows.nth(1).inner_text()
    _card_shot(page, "auto-top-up-active.png")
    # Phone width: the card (its table too) never scrolls sideways.
    page.set_viewport_size({"width": 390, "height": 844})
    page.reload()
    assert _no_sideways_scroll(page)
    _card(page).scroll_into_view_if_needed()
    _shot(page, "auto-top-up-phone.png", full_page=False)
    page.set_viewport_size({"width": 1280, "height": 900})

    # Turn it off.
    _card(page).get_by_role("button", name="Turn off").click()
    page.wait_for_url("**/console/account#auto-top-up")
    assert _card(page).locator("[data-testid=auto-status]").inner_text() == "off"
    assert balance.auto_top_up_view(live.rt, account_id).status == "off"
