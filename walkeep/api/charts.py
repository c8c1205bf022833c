"""Tiny inline-SVG charts for the console: series in, SVG markup out.

Why our own: the console must work offline and without a front-end build or
any JavaScript, and it needs two chart shapes (a line over time, bars per
day). A few dozen lines of tested arithmetic beat a charting dependency.

Coordinates are computed in a fixed ``viewBox`` and the SVG scales to its
container (``width: 100%``), so one drawing fits a phone and a desktop.
Every label is XML-escaped.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from html import escape

WIDTH = 640
HEIGHT = 220
PAD_LEFT = 56
PAD_RIGHT = 12
PAD_TOP = 12
PAD_BOTTOM = 28


@dataclass(frozen=True, slots=True)
class Series:
    points: Sequence[tuple[float, float]]
    css_class: str
    label: str
    dashed: bool = False
    # A balance changes at instants (a top-up, a capture), not gradually: drawn as steps,
    # a top-up is a vertical jump, not a slope from the previous entry.
    step: bool = False


@dataclass(frozen=True, slots=True)
class Scale:
    """Maps a data interval onto a pixel interval; a zero-width domain maps to the middle."""

    lo: float
    hi: float
    px_lo: float
    px_hi: float

    def __call__(self, v: float) -> float:
        if self.hi == self.lo:
            return (self.px_lo + self.px_hi) / 2
        return self.px_lo + (v - self.lo) / (self.hi - self.lo) * (self.px_hi - self.px_lo)


def _fmt(v: float) -> str:
    """Compact coordinates: at most one decimal, no trailing zeros."""
    text = f"{v:.1f}".rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def path_d(points: Sequence[tuple[float, float]], sx: Scale, sy: Scale) -> str:
    """The ``d`` attribute of a polyline through ``points`` (empty for no points)."""
    return " ".join(
        f"{'M' if i == 0 else 'L'}{_fmt(sx(x))} {_fmt(sy(y))}" for i, (x, y) in enumerate(points)
    )


def steps(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """Points of a step line: each value holds until the next point's x."""
    out: list[tuple[float, float]] = []
    for x, y in points:
        if out and out[-1][1] != y:
            out.append((x, out[-1][1]))
        out.append((x, y))
    return out


def nice_max(v: float) -> float:
    """A round axis maximum ≥ v (1, 2, 2.5 or 5 × 10ⁿ, n may be negative), so tick
    labels read well and a tiny series (a few thousandths of a WAL) still fills the plot."""
    if v <= 0 or not math.isfinite(v):
        return 1.0
    mag = 10.0 ** math.floor(math.log10(v))
    for step in (1, 2, 2.5, 5, 10):
        if step * mag >= v * (1 - 1e-12):
            return float(f"{step * mag:.12g}")
    return float(f"{10 * mag:.12g}")


def _anchor(px: float, width: int) -> str:
    """Keep edge labels inside the drawing."""
    if px < PAD_LEFT + 30:
        return "start"
    if px > width - PAD_RIGHT - 30:
        return "end"
    return "middle"


# Labels are laid out before any browser measures them, so their width is estimated: a
# 12-px label's characters average under 7.6 units (DejaVu Sans, the widest system-ui
# face we meet, draws digits at 7.6), and GAP keeps neighbours visibly apart.
CHAR_W = 7.6
GAP = 6.0
LABEL_ROW = 15  # marker labels that would collide drop to the next row, this far below
MAX_LABEL_ROWS = 4


def _span(px: float, text: str, anchor: str, dx: float = 0.0) -> tuple[float, float]:
    """The estimated horizontal extent of ``text`` drawn at ``px + dx`` with ``anchor``."""
    w = len(text) * CHAR_W
    x = px + dx
    if anchor == "start":
        return x, x + w
    if anchor == "end":
        return x - w, x
    return x - w / 2, x + w / 2


def _clear(span: tuple[float, float], taken: Sequence[tuple[float, float]]) -> bool:
    return all(span[1] + GAP <= a or b + GAP <= span[0] for a, b in taken)


def _marker_labels(
    markers: Sequence[tuple[float, str]], sx: Scale, width: int
) -> list[tuple[float, str, str, int]]:
    """(x, anchor, label, row) for each marker: beside its rule (right of it in the left
    half, left of it in the right half), on the first row where it overlaps no other
    marker's label, else on the other side ("now" and "renewals stop" one pixel apart
    used to print on top of each other)."""
    lo, hi = PAD_LEFT, width - PAD_RIGHT
    rows: list[list[tuple[float, float]]] = [[] for _ in range(MAX_LABEL_ROWS)]
    out = []
    for x, label in markers:
        px = sx(x)
        sides = ["start", "end"] if px < (lo + hi) / 2 else ["end", "start"]
        choice = None
        # Its usual side on any row first: a label that flips side reads as the other rule's.
        for side, row in ((side, row) for side in sides for row in range(MAX_LABEL_ROWS)):
            span = _span(px, label, side, 3 if side == "start" else -3)
            if span[0] >= lo and span[1] <= hi and _clear(span, rows[row]):
                choice = (side, row, span)
                break
        if choice is None:  # no room anywhere: the last row, on the roomier side
            side = "start" if hi - px >= px - lo else "end"
            row = MAX_LABEL_ROWS - 1
            choice = (side, row, _span(px, label, side, 3 if side == "start" else -3))
        side, row, span = choice
        rows[row].append(span)
        out.append((px, side, label, row))
    return out


def _tick_labels(
    ticks: Sequence[tuple[float, str]], sx: Scale, width: int
) -> list[tuple[float, str, str]]:
    """(x, anchor, label) of the x-axis ticks that fit, in the order given (callers list
    the most important first): a tick that would overlap one already placed is left out."""
    placed: list[tuple[float, float]] = []
    out = []
    for x, label in ticks:
        px = sx(x)
        anchor = _anchor(px, width)
        span = _span(px, label, anchor)
        if span[0] < 0 or span[1] > width or not _clear(span, placed):
            continue
        placed.append(span)
        out.append((px, anchor, label))
    return out


def line_chart(
    series: Sequence[Series],
    *,
    title: str,
    x_ticks: Sequence[tuple[float, str]] = (),
    y_format: Callable[[float], str] = lambda v: _fmt(v),
    markers: Sequence[tuple[float, str]] = (),
    width: int = WIDTH,
    height: int = HEIGHT,
) -> str:
    """A line chart; y starts at 0. ``markers`` draw labelled vertical rules at x values.

    No two labels overlap: a marker's label moves to its rule's other side or a lower
    row, and an x tick that would overlap an earlier one in ``x_ticks`` is left out.
    """
    xs = [x for s in series for x, _ in s.points] + [m[0] for m in markers]
    ys = [y for s in series for _, y in s.points]
    if not xs:
        return _empty(title, width, height)
    x_lo, x_hi = min(xs), max(xs)
    y_hi = nice_max(max(ys) if ys else 0)
    sx = Scale(x_lo, x_hi, PAD_LEFT, width - PAD_RIGHT)
    sy = Scale(0, y_hi, height - PAD_BOTTOM, PAD_TOP)
    parts = [_open(title, width, height), _grid(sy, y_hi, y_format, width)]
    for px, anchor, label in _tick_labels(x_ticks, sx, width):
        parts.append(
            f'<text class="tick" x="{_fmt(px)}" y="{height - 8}" '
            f'text-anchor="{anchor}">{escape(label)}</text>'
        )
    for px, side, label, row in _marker_labels(markers, sx, width):
        parts.append(
            f'<line class="marker" x1="{_fmt(px)}" y1="{PAD_TOP}" x2="{_fmt(px)}" '
            f'y2="{height - PAD_BOTTOM}"/><text class="marker-label" x="{_fmt(px)}" '
            f'y="{PAD_TOP + 10 + row * LABEL_ROW}" text-anchor="{side}" '
            f'dx="{3 if side == "start" else -3}">{escape(label)}</text>'
        )
    for s in series:
        if not s.points:
            continue
        dash = ' stroke-dasharray="6 4"' if s.dashed else ""
        drawn = steps(s.points) if s.step else s.points
        parts.append(
            f'<path class="{escape(s.css_class)}" d="{path_d(drawn, sx, sy)}" fill="none"'
            f"{dash}><title>{escape(s.label)}</title></path>"
        )
        if len(s.points) == 1:
            x, y = s.points[0]
            parts.append(
                f'<circle class="{escape(s.css_class)}" cx="{_fmt(sx(x))}" cy="{_fmt(sy(y))}" r="3"/>'
            )
    parts.append("</svg>")
    return "".join(parts)


def bar_chart(
    bars: Sequence[tuple[str, float]],
    *,
    title: str,
    css_class: str = "bar",
    y_format: Callable[[float], str] = lambda v: _fmt(v),
    label_every: int = 7,
    integer: bool = False,
    width: int = WIDTH,
    height: int = HEIGHT,
    empty_text: str | None = None,
) -> str:
    """Vertical bars, one per (label, value). Every ``label_every``-th label is drawn,
    counted from the last bar (the most recent day is always labelled). ``integer``
    draws only whole-number grid lines (counts). ``empty_text`` is written across the
    chart when every value is zero (an empty axis alone reads as broken)."""
    if not bars:
        return _empty(title, width, height)
    y_hi = nice_max(max(v for _, v in bars))
    sy = Scale(0, y_hi, height - PAD_BOTTOM, PAD_TOP)
    slot = (width - PAD_LEFT - PAD_RIGHT) / len(bars)
    bar_w = max(1.0, slot * 0.7)
    parts = [_open(title, width, height), _grid(sy, y_hi, y_format, width, integer=integer)]
    for i, (label, value) in enumerate(bars):
        x = PAD_LEFT + i * slot + (slot - bar_w) / 2
        top = sy(value)
        h = (height - PAD_BOTTOM) - top
        parts.append(
            f'<rect class="{escape(css_class)}" x="{_fmt(x)}" y="{_fmt(top)}" '
            f'width="{_fmt(bar_w)}" height="{_fmt(h)}"><title>{escape(label)}: '
            f"{escape(y_format(value))}</title></rect>"
        )
        if (len(bars) - 1 - i) % label_every == 0:
            px = x + bar_w / 2
            parts.append(
                f'<text class="tick" x="{_fmt(px)}" y="{height - 8}" '
                f'text-anchor="{_anchor(px, width)}">{escape(label)}</text>'
            )
    if empty_text and not any(v for _, v in bars):
        parts.append(
            f'<text class="empty" x="{(PAD_LEFT + width - PAD_RIGHT) / 2:.0f}" '
            f'y="{(height - PAD_BOTTOM + PAD_TOP) / 2:.0f}" text-anchor="middle">'
            f"{escape(empty_text)}</text>"
        )
    parts.append("</svg>")
    return "".join(parts)


def _open(title: str, width: int = WIDTH, height: int = HEIGHT) -> str:
    return (
        f'<svg class="chart" viewBox="0 0 {width} {height}" role="img" '
        f'preserveAspectRatio="xMidYMid meet" xmlns="http://www.w3.org/2000/svg">'
        f"<title>{escape(title)}</title>"
    )


def _grid(
    sy: Scale,
    y_hi: float,
    y_format: Callable[[float], str],
    width: int = WIDTH,
    *,
    integer: bool = False,
) -> str:
    out = []
    for i in range(5):
        v = y_hi * i / 4
        if integer and v != int(v):
            continue
        py = _fmt(sy(v))
        out.append(
            f'<line class="grid" x1="{PAD_LEFT}" y1="{py}" x2="{width - PAD_RIGHT}" y2="{py}"/>'
            f'<text class="tick" x="{PAD_LEFT - 6}" y="{py}" text-anchor="end" '
            f'dominant-baseline="middle">{escape(y_format(v))}</text>'
        )
    return "".join(out)


def _empty(title: str, width: int = WIDTH, height: int = HEIGHT) -> str:
    return (
        _open(title, width, height)
        + f'<text class="empty" x="{width / 2:.0f}" y="{height / 2:.0f}" text-anchor="middle">'
        "No data yet</text></svg>"
    )
