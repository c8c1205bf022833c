"""Automatic top-up's rule, alone (walkeep/topup_rule.py): pure arithmetic, no database."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest

from walkeep import topup_rule
from walkeep.topup_rule import Inputs, decide


def _in(**over: int) -> Inputs:
    values = {
        "available_mc": 0,
        "pending_mc": 0,
        "burn_mc_per_epoch": 10_000,  # 10 credits an epoch
        "below_runway_epochs": 4,
        "to_runway_epochs": 12,
        "monthly_cap_cents": 2_000,
        "charged_this_month_cents": 0,
        "shortfall_mc": 0,
    }
    values.update(over)
    return Inputs(**values)


def test_charges_enough_to_reach_the_target_runway() -> None:
    d = decide(_in(available_mc=35_000))  # 3 epochs funded < 4
    assert d.action == "charge" and d.funded_runway_epochs == 3
    # 12 epochs cost 120,000 mc; 35,000 are there: 85,000 mc = 85 cents.
    assert d.amount_cents == 85


def test_no_charge_at_or_above_the_threshold() -> None:
    d = decide(_in(available_mc=40_000))  # exactly 4 epochs
    assert (d.action, d.amount_cents, d.funded_runway_epochs) == ("none", 0, 4)


def test_a_pending_charge_counts_as_funded() -> None:
    assert decide(_in(available_mc=10_000, pending_mc=90_000)).action == "none"
    d = decide(_in(available_mc=10_000, pending_mc=20_000))  # 3 epochs with the pending one
    assert d.action == "charge" and d.amount_cents == 90


def test_at_least_fifty_cents_and_rounded_up_to_the_cent() -> None:
    assert decide(_in(burn_mc_per_epoch=100, available_mc=0)).amount_cents == 50
    d = decide(_in(burn_mc_per_epoch=10_001, available_mc=0, below_runway_epochs=1))
    assert d.amount_cents == 121  # 120,012 mc → 120.012 cents → 121


def test_at_most_what_is_left_of_the_monthly_cap() -> None:
    d = decide(_in(charged_this_month_cents=1_930))  # 70 cents left, 120 needed
    assert d.action == "charge" and d.amount_cents == 70


def test_under_fifty_cents_left_is_cap_reached_and_no_charge() -> None:
    d = decide(_in(charged_this_month_cents=1_951))
    assert (d.action, d.amount_cents) == ("cap_reached", 0)
    assert decide(_in(charged_this_month_cents=1_950)).amount_cents == 50  # exactly 50 left


def test_nothing_to_renew_is_never_charged() -> None:
    d = decide(_in(burn_mc_per_epoch=0, shortfall_mc=10_000))
    assert (d.action, d.funded_runway_epochs) == ("none", None)


def test_a_renewal_shortfall_triggers_and_sizes_the_charge() -> None:
    # Funded runway is fine (5 epochs), but the renewal pass needs 300,000 mc now.
    d = decide(_in(available_mc=50_000, shortfall_mc=300_000))
    assert d.action == "charge" and d.amount_cents == 300
    # Covered by a pending charge: no second one.
    assert decide(_in(available_mc=50_000, shortfall_mc=300_000, pending_mc=300_000)).action == (
        "none"
    )


def test_after_the_charge_the_rule_is_satisfied() -> None:
    """A charge of the decided size never triggers again at once (one per crossing)."""
    for available in range(0, 40_000, 997):
        for burn in (1, 63, 999, 10_000, 123_457):
            i = _in(available_mc=available, burn_mc_per_epoch=burn, monthly_cap_cents=10**6)
            d = decide(i)
            if d.action != "charge":
                continue
            after = decide(replace(i, available_mc=available + d.amount_cents * 1000))
            assert after.action == "none", (available, burn, d)


def test_failures_by_class() -> None:
    f = topup_rule.after_failure
    assert f("declined", 0, 3600) == topup_rule.AfterFailure("active", 1, 3600, False)
    assert f("declined", 1, 3600) == topup_rule.AfterFailure("active", 2, 7200, False)
    assert f("declined", 2, 3600) == topup_rule.AfterFailure("disabled", 3, None, False)
    assert f("hard_declined", 0, 3600) == topup_rule.AfterFailure("disabled", 1, None, True)
    sca = f("authentication_required", 1, 3600)
    assert (sca.status, sca.retry_after_seconds, sca.clear_card) == ("action_required", None, False)


def test_retry_delays_double() -> None:
    assert [topup_rule.retry_delay_seconds(n, 60) for n in (1, 2, 3, 4)] == [60, 120, 240, 480]


def test_months_are_utc_calendar_months() -> None:
    late = datetime(2026, 1, 31, 23, 59, tzinfo=UTC)
    assert topup_rule.month_of(late) == "2026-01"
    assert topup_rule.month_start(late) == datetime(2026, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    ("below", "to", "cap", "problem"),
    [
        (0, 5, 1000, "below_runway_epochs must be between"),
        (4, 4, 1000, "to_runway_epochs must be larger"),
        (4, 12, 49, "monthly_cap_usd must be between"),
        (True, 12, 1000, "below_runway_epochs must be a whole number"),
        (4, 12, 1_000_001, "monthly_cap_usd must be between"),
    ],
)
def test_rules_an_operator_cannot_set(below: object, to: object, cap: object, problem: str) -> None:
    problems = topup_rule.validate_rule(below, to, cap)
    assert any(problem in p for p in problems), problems
    assert topup_rule.validate_rule(4, 12, 1000) == []
