"""bench/cost.py says the ratio it compares: the number printed, the target and the verdict
agree (issue 39: a ratio of 99.6 printed as "100x   target >= 100x   FAIL").

The benchmark's runs are replaced by fixed results; what is checked is its own output.
"""

from __future__ import annotations

import re
import sys

import pytest

from bench import cost

VERDICT = re.compile(r"measured (\d+(?:\.\d+)?)x, target >= (\d+(?:\.\d+)?)x: (PASS|FAIL)$")


def _result(mode: str, units_paid: int, extend_calls: int) -> cost.Result:
    return cost.Result(
        mode=mode,
        memories=1000,
        store_txs=1,
        extend_txs=1,
        extend_calls=extend_calls,
        units_paid=units_paid,
        memory_epochs=1000,
        renewed_memory_epochs=1000,
        seconds=0.0,
    )


@pytest.mark.parametrize("ratio", [99.6, 99.96, 100.0, 100.04, 477.3, 3.0])
def test_each_verdict_states_the_measured_ratio_the_target_and_agrees_with_them(
    ratio: float, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Quilts off pay `ratio` times what quilts on pay, in units and in extend calls.
    results = {
        "off": _result("off", round(ratio * 10_000), round(ratio * 10_000)),
        "on": _result("on", 10_000, 10_000),
    }
    monkeypatch.setattr(cost, "run", lambda mode, *args: results[mode])
    monkeypatch.setattr(sys, "argv", ["bench/cost.py"])
    cost.main()
    lines = [line for line in capsys.readouterr().out.splitlines() if "target" in line]
    assert len(lines) == 2, lines
    for line in lines:
        found = VERDICT.search(line)
        assert found, f"no 'measured …x, target >= …x: PASS|FAIL' in {line!r}"
        shown, target, said = float(found[1]), float(found[2]), found[3]
        assert said == ("PASS" if ratio >= target else "FAIL"), line
        # The number printed supports the verdict printed beside it.
        assert (shown >= target) == (said == "PASS"), line
        assert abs(shown - ratio) < 0.11, line
