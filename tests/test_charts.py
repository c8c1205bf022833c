"""The console's inline-SVG chart helpers: pure arithmetic, checked exactly."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from walkeep.api import charts
from walkeep.api.charts import Scale, Series, bar_chart, line_chart, nice_max, path_d

SVG = "{http://www.w3.org/2000/svg}"


def test_scale_maps_ends_and_middle_and_survives_a_flat_domain() -> None:
    s = Scale(0, 10, 100, 200)
    assert (s(0), s(5), s(10)) == (100, 150, 200)
    inverted = Scale(0, 4, 180, 20)  # SVG y grows downwards
    assert (inverted(0), inverted(4), inverted(1)) == (180, 20, 140)
    assert Scale(3, 3, 0, 100)(3) == 50  # no division by zero


def test_path_d_draws_a_polyline_through_the_points() -> None:
    sx, sy = Scale(0, 2, 0, 200), Scale(0, 10, 100, 0)
    assert path_d([(0, 0), (1, 5), (2, 10)], sx, sy) == "M0 100 L100 50 L200 0"
    assert path_d([(0.5, 3.3)], sx, sy) == "M50 67"
    assert path_d([], sx, sy) == ""


def test_nice_max_rounds_up_to_a_readable_axis() -> None:
    assert [nice_max(v) for v in (0, -1, 0.4, 1, 7, 12, 23, 180, 999, 1000, 1001)] == [
        1,
        1,
        0.5,
        1,
        10,
        20,
        25,
        200,
        1000,
        1000,
        2000,
    ]
    assert nice_max(0.0062) == 0.01 and nice_max(0.00025) == 0.00025  # tiny WAL amounts


def test_line_chart_is_valid_svg_with_a_dashed_projection_and_escaped_labels() -> None:
    svg = line_chart(
        [
            Series([(0, 100), (10, 50)], "line-history", "history"),
            Series([(10, 50), (20, 0)], "line-projection", "proj <b>", dashed=True),
        ],
        title="T & <x>",
        x_ticks=[(0, "Dec 01"), (20, "Dec <21>")],
        markers=[(10, "now")],
    )
    root = ET.fromstring(svg)  # well-formed: escaping worked
    assert root.tag == f"{SVG}svg" and root.get("viewBox") == "0 0 640 220"
    paths = root.findall(f"{SVG}path")
    assert [p.get("class") for p in paths] == ["line-history", "line-projection"]
    assert paths[0].get("stroke-dasharray") is None and paths[1].get("stroke-dasharray")
    # x spans the whole plot: first point at the left pad, last at the right edge.
    left, right = charts.PAD_LEFT, charts.WIDTH - charts.PAD_RIGHT
    assert paths[0].get("d", "").startswith(f"M{left} ")
    assert paths[1].get("d", "").split(" L")[-1].startswith(f"{right} ")
    # y axis from 0 to a nice max of 100: the 100-credit point touches the top pad.
    assert paths[0].get("d", "").split(" L")[0] == f"M{left} {charts.PAD_TOP}"
    texts = [t.text for t in root.iter(f"{SVG}text")]
    assert "Dec <21>" in texts and "now" in texts


def test_single_point_gets_a_dot_and_no_data_says_so() -> None:
    svg = line_chart([Series([(5, 2)], "line-history", "h")], title="one")
    root = ET.fromstring(svg)
    assert root.find(f"{SVG}circle") is not None
    empty = ET.fromstring(line_chart([Series([], "x", "x")], title="none"))
    assert "No data yet" in [t.text for t in empty.iter(f"{SVG}text")]


def test_bar_chart_heights_are_proportional() -> None:
    svg = bar_chart([("a", 0), ("b", 5), ("c", 10)], title="bars", label_every=1)
    rects = ET.fromstring(svg).findall(f"{SVG}rect")
    heights = [float(r.get("height", "nan")) for r in rects]
    plot = charts.HEIGHT - charts.PAD_BOTTOM - charts.PAD_TOP
    assert heights == [0, plot / 2, plot]
    assert ET.fromstring(bar_chart([], title="none")) is not None


def test_bar_chart_labels_the_latest_bar_and_counts_get_whole_number_grid_lines() -> None:
    bars = [(f"d{i}", i % 2) for i in range(10)]
    root = ET.fromstring(bar_chart(bars, title="counts", label_every=4, integer=True))
    labels = [t.text for t in root.iter(f"{SVG}text")]
    assert [x for x in labels if x and x.startswith("d")] == ["d1", "d5", "d9"]
    assert [x for x in labels if x and not x.startswith("d")] == ["0", "1"]  # no 0.25 … 0.75


def test_edge_labels_stay_inside_the_drawing() -> None:
    svg = line_chart(
        [Series([(0, 1), (1, 2)], "l", "l")],
        title="t",
        x_ticks=[(0, "first"), (0.5, "mid"), (1, "last")],
        markers=[(0, "now"), (1, "end")],
    )
    anchors = {t.text: t.get("text-anchor") for t in ET.fromstring(svg).iter(f"{SVG}text")}
    assert (anchors["first"], anchors["mid"], anchors["last"]) == ("start", "middle", "end")
    assert (anchors["now"], anchors["end"]) == ("start", "end")


def test_a_balance_history_is_drawn_as_steps() -> None:
    """Issue 30: a top-up is a jump at an instant; a polyline drew it as a slope from the
    previous ledger entry."""
    from walkeep.api import charts

    assert charts.steps([(0, 1), (5, 1), (6, 9), (8, 4)]) == [
        (0, 1),
        (5, 1),
        (6, 1),
        (6, 9),
        (8, 9),
        (8, 4),
    ]
    svg = charts.line_chart(
        [charts.Series([(0, 1), (10, 9)], "line-history", "balance", step=True)], title="t"
    )
    d = svg.split('class="line-history" d="', 1)[1].split('"', 1)[0]
    assert len(d.split("L")) == 3  # up the jump at x=10, not a diagonal


def test_an_all_zero_bar_chart_says_so() -> None:
    from walkeep.api import charts

    svg = charts.bar_chart([("a", 0), ("b", 0)], title="t", empty_text="No renewals yet")
    assert 'class="empty"' in svg and "No renewals yet" in svg
    assert "No renewals yet" not in charts.bar_chart([("a", 1)], title="t", empty_text="No")
