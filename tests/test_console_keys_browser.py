"""The console's API keys card in a real Chromium: an operator makes a key confined to a
namespace through the form, reads it off the page (shown once) and an agent uses it with
the Python client: recall in its namespace works, another namespace is FORBIDDEN. A
confinement without a namespace is refused inline; revoking asks first, then confirms;
revoking the session's own key lands on the sign-in page. The card fits a phone. Screenshots go to ``tmp_path`` (and ``WALKEEP_SCREENSHOTS``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.test_console_browser import (  # noqa: F401  (fixtures)
    ADMIN_TOKEN,
    _populate,
    _sign_in,
    browser,
    page,
)
from tests.test_mcp_e2e import Server
from walkeep import errors
from walkeep.client import WalkeepClient

SHOTS = os.environ.get("WALKEEP_SCREENSHOTS", "").strip()


@pytest.fixture
def live(settings, clock, db) -> Iterator[Server]:  # type: ignore[no-untyped-def]
    settings.admin_token = ADMIN_TOKEN
    with Server(settings, clock, db) as srv:
        yield srv


def _shot(target: Any, tmp_path: Path, name: str) -> None:
    """A screenshot of a page (whole) or of one element."""
    for folder in (tmp_path, Path(SHOTS) if SHOTS else None):
        if folder is None:
            continue
        folder.mkdir(parents=True, exist_ok=True)
        if hasattr(target, "goto"):
            target.screenshot(path=str(folder / name), full_page=True)
        else:
            target.screenshot(path=str(folder / name))


def test_an_operator_makes_a_confined_key_in_the_browser_and_an_agent_uses_it(
    live: Server,
    clock: Any,
    page: Any,  # noqa: F811
    browser: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    key = _populate(live, clock, "acme", 500, 2)  # memories in "default" and "agent-1"
    _sign_in(page, live, key)
    card = page.locator("#keys")
    assert card.locator("tbody tr").count() == 1
    assert "signed in with this key" in card.inner_text()

    # Confining without a namespace is refused inline, and the form keeps what was ticked.
    page.get_by_label("Confine to this namespace").check()
    with page.expect_navigation():
        page.get_by_role("button", name="Create key").click()
    assert page.url.endswith("/console/keys#keys")
    error = card.locator("[data-testid=key-error]")
    assert "needs that namespace" in error.inner_text()
    assert page.get_by_label("Confine to this namespace").is_checked()
    assert page.locator("[data-testid=new-key]").count() == 0
    _shot(card, tmp_path, "console-keys-error.png")

    page.get_by_label("Default namespace").fill("agent-1")
    with page.expect_navigation():
        page.get_by_role("button", name="Create key").click()
    shown = card.locator("[data-testid=new-key]")
    assert "will not be shown again" in shown.inner_text()
    assert "confined to namespace agent-1" in shown.inner_text()
    confined_key = card.locator("[data-testid=new-key-value]").inner_text().strip()
    assert confined_key.startswith("wk_live_") and confined_key != key
    row = card.locator(f"tbody tr[data-prefix='{confined_key[:16]}']")
    assert "only this namespace" in row.inner_text()
    _shot(card, tmp_path, "console-keys-created.png")
    _shot(page, tmp_path, "console-keys-page.png")

    with WalkeepClient(live.url, api_key=confined_key) as agent:
        hits = agent.recall("acme remembers fact number 1")
        assert hits.results and {h.namespace for h in hits.results} == {"agent-1"}
        with pytest.raises(errors.Forbidden) as refused:
            agent.recall("acme remembers fact", namespace="default")
        assert refused.value.data["namespace"] == "agent-1"

    # Shown once: a fresh load of the page lists the key by its prefix only.
    page.goto(f"{live.url}/console/account#keys")
    assert confined_key not in page.content()

    # Revoking asks first (a closed <details>), then says what it did.
    row = card.locator(f"tbody tr[data-prefix='{confined_key[:16]}']")
    button = row.get_by_role("button", name=f"Revoke {confined_key[:16]}")
    assert not button.is_visible()
    row.locator("summary").click()
    assert "Agents using this key stop working" in row.inner_text()
    _shot(card, tmp_path, "console-keys-revoke.png")
    with page.expect_navigation():
        button.click()
    assert "agents using it stop working" in card.locator("[data-testid=key-notice]").inner_text()
    assert "revoked" in card.locator(f"tbody tr[data-prefix='{confined_key[:16]}']").inner_text()
    assert page.url.endswith("/console/keys/revoke#keys")

    # On a phone the card's table becomes labelled rows and nothing scrolls sideways.
    phone = browser.new_context(viewport={"width": 390, "height": 844}, device_scale_factor=2)
    try:
        small = phone.new_page()
        _sign_in(small, live, key)
        small.get_by_label("Default namespace").fill("support")
        small.get_by_label("Confine to this namespace").check()
        with small.expect_navigation():
            small.get_by_role("button", name="Create key").click()
        assert small.locator("[data-testid=new-key-value]").is_visible()
        assert small.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
        _shot(small.locator("#keys"), tmp_path, "console-keys-phone.png")
    finally:
        phone.close()

    # Revoking the key the console session was opened with ends it: the answer is the sign-in page.
    page.goto(f"{live.url}/console/account#keys")
    mine = card.locator(f"tbody tr[data-prefix='{key[:16]}']")
    mine.locator("summary").click()
    assert "this console session ends" in mine.inner_text()
    with page.expect_navigation():
        mine.get_by_role("button", name=f"Revoke {key[:16]}").click()
    assert "Your console session ended with it" in page.inner_text("[data-testid=login-notice]")
    assert page.get_by_role("button", name="Sign in").is_visible()
    _shot(page, tmp_path, "console-keys-signed-out.png")
    page.goto(f"{live.url}/console/account")
    assert page.url.endswith("/console/login")
