"""Issue 39, the console and the explorer as a person sees them, in a real Chromium.

Measured in the browser, not read off the HTML: the balance chart's labels ("now",
"renewals stop", the dates) never overlap and the axis is dated where its scale changes;
the explorer's object page fits a 390-px phone; the sign-in hint wraps between words,
never inside an option. Screenshots go to ``tmp_path`` (and ``WALKEEP_SCREENSHOTS``).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.test_console_browser import (  # noqa: F401  (fixtures)
    ADMIN_TOKEN,
    _populate,
    _renew,
    _sign_in,
    browser,
    page,
)
from tests.test_mcp_e2e import Server
from walkeep.api import charts
from walkeep.service.operators import accounts, console

SHOTS = os.environ.get("WALKEEP_SCREENSHOTS", "").strip()
CSS = (Path(charts.__file__).parent / "static" / "console.css").read_text()

# Every text of the charts on the page, with its box in CSS pixels.
TEXT_BOXES = """(root) => [...document.querySelectorAll(root + ' svg text')]
    .filter(t => t.getClientRects().length)
    .map(t => { const r = t.getBoundingClientRect();
                return {text: t.textContent, cls: t.getAttribute('class'),
                        x: t.getAttribute('x'), l: r.left, t: r.top, r: r.right, b: r.bottom}; })"""


@pytest.fixture
def live(settings, clock, db) -> Iterator[Server]:  # type: ignore[no-untyped-def]
    settings.admin_token = ADMIN_TOKEN
    with Server(settings, clock, db) as srv:
        yield srv


def _shot(pg: Any, tmp_path: Path, name: str) -> None:
    pg.screenshot(path=str(tmp_path / name), full_page=True)
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        pg.screenshot(path=str(Path(SHOTS) / name), full_page=True)


def _overlaps(boxes: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [
        (a["text"], b["text"])
        for a, b in itertools.combinations(boxes, 2)
        if a["l"] < b["r"] and b["l"] < a["r"] and a["t"] < b["b"] and b["t"] < a["b"]
    ]


def _fits(pg: Any) -> bool:
    return bool(pg.evaluate("document.documentElement.scrollWidth <= window.innerWidth"))


def test_the_balance_chart_labels_never_overlap_and_the_axis_is_dated_at_now(
    live: Server,
    clock: Any,
    page: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    """Regression: an account whose renewals stop now drew "now" and "renewals stop" on top
    of each other, and the piecewise time axis had no date where its scale changes."""
    key = _populate(live, clock, "tight", 3, 3)  # the stores spend the credits
    _renew(live, clock)  # nothing left to pay renewals: they stop now
    rt = live.rt
    view = console.account_view(rt, accounts.find_account_by_name(rt.db, "tight") or "")
    assert view.funded_until == view.now and view.history
    assert view.now.date() == view.history[0].at.date()
    now_label = view.now.strftime("%H:%M")  # the first tick carries the day

    _sign_in(page, live, key)
    for width, which in ((1280, ".chart-wide"), (390, ".chart-narrow")):
        page.set_viewport_size({"width": width, "height": 900})
        page.reload()
        root = f"#chart {which}"
        boxes = page.evaluate(TEXT_BOXES, root)
        labels = [b["text"] for b in boxes if b["cls"] == "marker-label"]
        assert sorted(labels) == ["now", "renewals stop"], labels
        assert _overlaps(boxes) == [], f"{which} at {width} px"
        # The axis is dated under "now", where history's scale meets the projection's.
        rule = page.locator(f"{root} svg line.marker").first.get_attribute("x1")
        ticks = {b["x"]: b["text"] for b in boxes if b["cls"] == "tick" and b["x"] == rule}
        assert ticks == {rule: now_label}, ticks
        assert "to scale on each side of “now”" in page.inner_text("[data-testid=axis-note]")
        assert _fits(page)
        _shot(page, tmp_path, f"account-{width}.png")
        page.locator("#chart").screenshot(path=str(tmp_path / f"chart-{width}.png"))
    print("screenshots in", tmp_path)


def test_chart_labels_never_overlap_however_close_the_markers_are(
    browser: Any,  # noqa: F811
) -> None:
    """The layout estimates label widths; the browser measures them. Markers from on top of
    each other to far apart, at both sizes the console draws, in the console's CSS."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    pg = context.new_page()
    try:
        for width, height, shown in ((640, 220, 900), (360, 240, 340)):
            for now_at, gap in itertools.product((0.0, 0.4, 0.7, 0.98), (0, 0.01, 0.05, 0.2)):
                stop = min(1.0, now_at + gap)
                day = datetime(2026, 12, 1, tzinfo=UTC).strftime("%b %d %H:%M")
                svg = charts.line_chart(
                    [charts.Series([(0, 5), (now_at, 3), (1, 0)], "line-history", "b")],
                    title="t",
                    x_ticks=[(0, day), (1, day), (now_at, day), (stop, day)],
                    markers=[(now_at, "now"), (stop, "renewals stop")],
                    width=width,
                    height=height,
                )
                pg.set_content(
                    f"<style>{CSS}</style><div id='c' style='width:{shown}px'>{svg}</div>"
                )
                boxes = pg.evaluate(TEXT_BOXES, "#c")
                assert _overlaps(boxes) == [], (width, now_at, gap)
                inside = pg.evaluate("document.querySelector('#c svg').getBoundingClientRect()")
                assert all(inside["left"] <= b["l"] and b["r"] <= inside["right"] for b in boxes)
    finally:
        context.close()


def test_the_explorers_object_page_fits_a_phone(
    live: Server,
    clock: Any,
    browser: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    """Regression: the object page's extensions table (five columns, a digest and a
    timestamp) made the page 507 px wide on a 390-px phone."""
    _populate(live, clock, "explored", 300, 3)
    _renew(live, clock)
    rt = live.rt
    view = console.account_view(rt, accounts.find_account_by_name(rt.db, "explored") or "")
    context = browser.new_context(
        viewport={"width": 390, "height": 844}, is_mobile=True, device_scale_factor=2
    )
    pg = context.new_page()
    try:
        pg.goto(f"{live.url}/explorer/tx/{view.renewals[0].digest}")
        pg.locator("a[href^='/explorer/object/']").first.click()
        pg.wait_for_url("**/explorer/object/**")
        assert pg.locator("text=Extensions").count() == 1
        assert pg.evaluate("document.documentElement.clientWidth") == 390
        width = pg.evaluate("document.documentElement.scrollWidth")
        _shot(pg, tmp_path, "object-phone.png")
        assert width <= 390, f"the object page is {width} px wide"
        # Each extension still says what it is: its cells are labelled on a phone.
        cell = pg.locator("table.stack td[data-label=Time]").first
        assert cell.is_visible() and "Time" in cell.evaluate(
            "el => getComputedStyle(el, '::before').content"
        )
    finally:
        context.close()
    print("screenshots in", tmp_path)


@pytest.mark.parametrize("width", [390, 360, 320])
def test_the_sign_in_hint_wraps_between_words_not_inside_an_option(
    live: Server,
    browser: Any,  # noqa: F811
    tmp_path: Path,
    width: int,
) -> None:
    """Regression: the hint's command broke as "--ac / count" on a 390-px phone."""
    context = browser.new_context(viewport={"width": width, "height": 800})
    pg = context.new_page()
    try:
        pg.goto(f"{live.url}/console/login")
        hint = pg.locator("p", has_text="No key at hand")
        assert "walkeep console-link --account NAME" in " ".join(hint.inner_text().split())
        lines = hint.evaluate(
            """(el, words) => {
                const out = {};
                const walker = document.createTreeWalker(el, NodeFilter.SHOW_TEXT);
                const nodes = [];
                while (walker.nextNode()) nodes.push(walker.currentNode);
                for (const word of words) {
                    for (const node of nodes) {
                        const at = node.data.indexOf(word);
                        if (at < 0) continue;
                        const r = document.createRange();
                        r.setStart(node, at); r.setEnd(node, at + word.length);
                        out[word] = new Set([...r.getClientRects()].map(b => Math.round(b.top))).size;
                        break;
                    }
                }
                return out;
            }""",
            ["walkeep", "console-link", "--account", "NAME", "--admin"],
        )
        _shot(pg, tmp_path, f"login-{width}.png")
        for word in ("walkeep", "console-link", "--account", "NAME", "--admin"):
            assert lines.get(word) == 1, (word, lines)  # found, and on one line
        assert _fits(pg)
    finally:
        context.close()
