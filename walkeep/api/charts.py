"""Tiny inline-SVG charts for the console: series in, SVG markup out.

Why our own: the console must work offline and without a front-end build or
any JavaScript, and it needs two chart shapes (a line over time, bars per
day). A few dozen lines of tested arithmetic beat a charting dependency.

Coordinates are computed in a fixed ``viewBox`` and the SVG scales to its
container (``width: 100%``), so one drawing fits a phone and a desktop.
Every label is XML-escaped.
"""

from __future__ import annotations

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


def nice_max(v: float) -> float:
    """A round axis maximum ≥ v (1, 2, 2.5 or 5 × 10ⁿ), so tick labels read well."""
    if v <= 0:
        return 1.0
    mag = 10 ** (len(str(int(v))) - 1) if v >= 1 else 1.0
    for step in (1, 2, 2.5, 5, 10):
        if step * mag >= v:
            return float(step * mag)
    return float(10 * mag)


def line_chart(
    series: Sequence[Series],
    *,
    title: str,
    x_ticks: Sequence[tuple[float, str]] = (),
    y_format: Callable[[float], str] = lambda v: _fmt(v),
    markers: Sequence[tuple[float, str]] = (),
) -> str:
    """A line chart; y starts at 0. ``markers`` draw labelled vertical rules at x values."""
    xs = [x for s in series for x, _ in s.points] + [m[0] for m in markers]
    ys = [y for s in series for _, y in s.points]
    if not xs:
        return _empty(title)
    x_lo, x_hi = min(xs), max(xs)
    y_hi = nice_max(max(ys) if ys else 0)
    sx = Scale(x_lo, x_hi, PAD_LEFT, WIDTH - PAD_RIGHT)
    sy = Scale(0, y_hi, HEIGHT - PAD_BOTTOM, PAD_TOP)
    parts = [_open(title), _grid(sy, y_hi, y_format)]
    for x, label in x_ticks:
        px = _fmt(sx(x))
        parts.append(
            f'<text class="tick" x="{px}" y="{HEIGHT - 8}" text-anchor="middle">'
            f"{escape(label)}</text>"
        )
    for x, label in markers:
        px = _fmt(sx(x))
        parts.append(
            f'<line class="marker" x1="{px}" y1="{PAD_TOP}" x2="{px}" y2="{HEIGHT - PAD_BOTTOM}"/>'
            f'<text class="marker-label" x="{px}" y="{PAD_TOP + 10}" text-anchor="end" dx="-3">'
            f"{escape(label)}</text>"
        )
    for s in series:
        if not s.points:
            continue
        dash = ' stroke-dasharray="6 4"' if s.dashed else ""
        parts.append(
            f'<path class="{escape(s.css_class)}" d="{path_d(s.points, sx, sy)}" fill="none"'
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
) -> str:
    """Vertical bars, one per (label, value); every ``label_every``-th label is drawn."""
    if not bars:
        return _empty(title)
    y_hi = nice_max(max(v for _, v in bars))
    sy = Scale(0, y_hi, HEIGHT - PAD_BOTTOM, PAD_TOP)
    slot = (WIDTH - PAD_LEFT - PAD_RIGHT) / len(bars)
    width = max(1.0, slot * 0.7)
    parts = [_open(title), _grid(sy, y_hi, y_format)]
    for i, (label, value) in enumerate(bars):
        x = PAD_LEFT + i * slot + (slot - width) / 2
        top = sy(value)
        h = (HEIGHT - PAD_BOTTOM) - top
        parts.append(
            f'<rect class="{escape(css_class)}" x="{_fmt(x)}" y="{_fmt(top)}" '
            f'width="{_fmt(width)}" height="{_fmt(h)}"><title>{escape(label)}: '
            f"{escape(y_format(value))}</title></rect>"
        )
        if i % label_every == 0 or i == len(bars) - 1:
            parts.append(
                f'<text class="tick" x="{_fmt(x + width / 2)}" y="{HEIGHT - 8}" '
                f'text-anchor="middle">{escape(label)}</text>'
            )
    parts.append("</svg>")
    return "".join(parts)


def _open(title: str) -> str:
    return (
        f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
        f'preserveAspectRatio="xMidYMid meet" xmlns="http://www.w3.org/2000/svg">'
        f"<title>{escape(title)}</title>"
    )


def _grid(sy: Scale, y_hi: float, y_format: Callable[[float], str]) -> str:
    out = []
    for i in range(5):
        v = y_hi * i / 4
        py = _fmt(sy(v))
        out.append(
            f'<line class="grid" x1="{PAD_LEFT}" y1="{py}" x2="{WIDTH - PAD_RIGHT}" y2="{py}"/>'
            f'<text class="tick" x="{PAD_LEFT - 6}" y="{py}" text-anchor="end" '
            f'dominant-baseline="middle">{escape(y_format(v))}</text>'
        )
    return "".join(out)


def _empty(title: str) -> str:
    return (
        _open(title)
        + f'<text class="empty" x="{WIDTH / 2:.0f}" y="{HEIGHT / 2:.0f}" text-anchor="middle">'
        "No data yet</text></svg>"
    )
