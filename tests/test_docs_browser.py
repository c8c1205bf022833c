"""/docs in a real headless Chromium, desktop and a 390-px phone (issue 30).

The bundled Swagger UI 4.15 answered 200 and drew only "Unable to render this
definition": it cannot read the OpenAPI 3.1 document FastAPI publishes. A status code
proves nothing here; the operations must be on the screen. Every request the page
makes is checked to stay on the server (no CDN).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.test_console_browser import browser  # noqa: F401  (fixture)
from tests.test_mcp_e2e import Server

SHOTS = os.environ.get("WALKEEP_SCREENSHOTS", "").strip()


@pytest.fixture
def live(settings, clock, db) -> Iterator[Server]:  # type: ignore[no-untyped-def]
    with Server(settings, clock, db) as srv:
        yield srv


@pytest.mark.parametrize(
    ("width", "height", "name"), [(1280, 900, "docs"), (390, 844, "docs-phone")]
)
def test_docs_render_the_openapi_31_document(
    browser: Any,  # noqa: F811
    live: Server,
    tmp_path: Path,
    width: int,
    height: int,
    name: str,
) -> None:
    context = browser.new_context(viewport={"width": width, "height": height})
    context.set_default_timeout(20_000)
    outside: list[str] = []

    def only_this_server(route: Any) -> None:
        if route.request.url.startswith(live.url):
            route.continue_()
        else:
            outside.append(route.request.url)
            route.abort()

    context.route("**/*", only_this_server)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        page.goto(f"{live.url}/docs")
        page.wait_for_selector(".opblock-summary", state="visible")
        text = page.inner_text("body")
        assert "Unable to render this definition" not in text
        assert "OAS 3.1" in text  # Swagger UI read the document as 3.1
        assert "Memories with on-chain ids, paged" in text  # an operation's summary
        assert page.locator(".opblock").count() >= 7  # the seven tools at least
        # Open one operation: its parameters render from the 3.1 schema.
        page.get_by_text("Memories with on-chain ids, paged").click()
        page.wait_for_selector(".opblock.is-open .parameters")
        assert "cursor" in page.inner_text(".opblock.is-open")
        assert page.evaluate("document.documentElement.scrollWidth") <= width + 1
        shot = Path(SHOTS) / f"{name}.png" if SHOTS else tmp_path / f"{name}.png"
        page.screenshot(path=str(shot), full_page=False)
        assert errors == [] and outside == []
    finally:
        context.close()
