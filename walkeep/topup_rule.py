"""Automatic top-up's rule: when to charge a saved card, and how much. Pure.

Everything here is arithmetic on integers (millicredits, cents, epochs, seconds) and is
unit-tested without a database; the service layer (``walkeep/service/autocharge.py``)
reads the inputs under a lock, asks :func:`decide`, and records the answer in the
charge row it claims, so an auditor can re-run the rule on what the row says.

The rule (README "Automatic top-up"):

* **Trigger** when the account's *funded runway* — the epochs of renewals its available
  credits pay for, the same figure ``balance.low`` uses — falls below
  ``below_runway_epochs``, counting a charge still pending as funded (it will arrive, or
  it is settled before another is made); or when a renewal pass is about to pause
  memories it cannot fund (``shortfall_mc`` beyond what is pending). Accounts with
  nothing to renew (burn 0) are never charged.
* **Amount**: enough to bring the funded runway to ``to_runway_epochs`` (and to cover the
  shortfall), rounded up to the cent, at least $0.50 (the card networks' minimum) and at
  most what is left of ``monthly_cap_cents`` this calendar month (UTC). When less than
  $0.50 is left, there is no charge: the answer is ``cap_reached``.
* **Failures**: a declined card is retried after ``retry_seconds``, doubling per
  consecutive decline, and automatic top-up is disabled at the third; a hard decline (the
  provider says never to retry: lost, stolen or expired card, card removed) disables it at
  once; a card that needs its holder (authentication) stops retries until the holder acts.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

MIN_CHARGE_CENTS = 50  # the card networks' (and Stripe's) minimum charge in USD
MC_PER_CENT = 1000
MAX_CONSECUTIVE_DECLINES = 3
MAX_RUNWAY_EPOCHS = 1000  # far beyond any sane setting; keeps amounts bounded
MAX_MONTHLY_CAP_CENTS = 1_000_000  # $10,000, the largest single top-up

Status = Literal["off", "active", "action_required", "disabled"]
STATUSES: tuple[Status, ...] = ("off", "active", "action_required", "disabled")
# What an agent reads in ``check_balance.auto_top_up.last_attempt.outcome``.
Outcome = Literal["succeeded", "pending", "declined", "authentication_required"]
# How a provider's refusal is classed (the adapter maps its own codes onto these).
Failure = Literal["declined", "hard_declined", "authentication_required"]

# What the human agrees to when saving a card (shown on the checkout page next to the
# Pay / Save button, and recorded with its version beside the card).
CONSENT_VERSION = "2026-12-a"
CONSENT_TEXT = (
    "By saving this card you authorise Walkeep to charge it later without asking each "
    "time, but only after your operator turns on automatic top-up: when your prepaid "
    "credits would fund fewer renewals than the threshold they set, Walkeep charges "
    "enough to restore the runway they chose — at least $0.50, one charge at a time, "
    "never more in a calendar month (UTC) than the monthly cap they set. Automatic "
    "top-up can be turned off and the card removed at any time in the Walkeep console."
)


@dataclass(frozen=True, slots=True)
class Inputs:
    """What the rule looks at, read together under the account's lock."""

    available_mc: int  # balance − held
    pending_mc: int  # automatic charges claimed but not settled
    burn_mc_per_epoch: int  # renewing every kept blob for one epoch
    below_runway_epochs: int
    to_runway_epochs: int
    monthly_cap_cents: int
    charged_this_month_cents: int  # automatic charges this UTC month, pending included
    shortfall_mc: int = 0  # what a renewal pass cannot fund right now (0: not asked by one)


@dataclass(frozen=True, slots=True)
class Decision:
    action: Literal["charge", "none", "cap_reached"]
    amount_cents: int
    funded_runway_epochs: int | None  # counting pending charges; None: nothing to renew
    reason: str


def funded_runway(available_mc: int, pending_mc: int, burn_mc_per_epoch: int) -> int | None:
    """Epochs of renewals the credits (and pending charges) pay for; None without burn."""
    if burn_mc_per_epoch <= 0:
        return None
    return max(0, available_mc + pending_mc) // burn_mc_per_epoch


def cap_left_cents(monthly_cap_cents: int, charged_this_month_cents: int) -> int:
    return max(0, monthly_cap_cents - charged_this_month_cents)


def decide(i: Inputs) -> Decision:
    """Charge or not, and how much (see the module docstring)."""
    funded = funded_runway(i.available_mc, i.pending_mc, i.burn_mc_per_epoch)
    if funded is None:
        return Decision("none", 0, None, "nothing to renew")
    short = i.shortfall_mc - i.pending_mc
    low = funded < i.below_runway_epochs
    if not low and short <= 0:
        return Decision("none", 0, funded, "funded runway is above the threshold")
    target_mc = i.to_runway_epochs * i.burn_mc_per_epoch
    need_mc = max(target_mc - (i.available_mc + i.pending_mc), short, 1)
    cents = max(MIN_CHARGE_CENTS, -(-need_mc // MC_PER_CENT))
    left = cap_left_cents(i.monthly_cap_cents, i.charged_this_month_cents)
    if left < MIN_CHARGE_CENTS:
        return Decision(
            "cap_reached",
            0,
            funded,
            f"less than $0.50 of the monthly cap is left (${left / 100:.2f})",
        )
    cents = min(cents, left)
    why = (
        f"funded runway {funded} < {i.below_runway_epochs} epochs"
        if low
        else f"a renewal pass needs {short} mc more"
    )
    return Decision("charge", cents, funded, why)


def month_of(at: datetime) -> str:
    """The UTC calendar month a charge counts against, as ``YYYY-MM``."""
    return at.astimezone(UTC).strftime("%Y-%m")


def month_start(at: datetime) -> datetime:
    at = at.astimezone(UTC)
    return datetime(at.year, at.month, 1, tzinfo=UTC)


def retry_delay_seconds(consecutive_declines: int, base_seconds: int) -> int:
    """Wait after the n-th consecutive decline: base, 2×base, 4×base … (n ≥ 1)."""
    n = max(1, consecutive_declines)
    return int(base_seconds * 2 ** min(n - 1, 20))


@dataclass(frozen=True, slots=True)
class AfterFailure:
    status: Status
    consecutive_declines: int
    retry_after_seconds: int | None  # None: no automatic retry
    clear_card: bool  # the card must not be charged again (hard decline)


def after_failure(failure: Failure, consecutive_declines: int, retry_seconds: int) -> AfterFailure:
    """What a refused charge does to automatic top-up (``consecutive_declines`` before it)."""
    if failure == "authentication_required":
        return AfterFailure("action_required", consecutive_declines, None, False)
    if failure == "hard_declined":
        return AfterFailure("disabled", consecutive_declines + 1, None, True)
    n = consecutive_declines + 1
    if n >= MAX_CONSECUTIVE_DECLINES:
        return AfterFailure("disabled", n, None, False)
    return AfterFailure("active", n, retry_delay_seconds(n, retry_seconds), False)


def validate_rule(
    below_runway_epochs: object, to_runway_epochs: object, monthly_cap_cents: object
) -> list[str]:
    """Problems with a rule an operator sets (empty: fine). Messages name the option."""
    problems: list[str] = []
    for name, value in (
        ("below_runway_epochs", below_runway_epochs),
        ("to_runway_epochs", to_runway_epochs),
    ):
        if isinstance(value, bool) or not isinstance(value, int):
            problems.append(f"{name} must be a whole number of epochs")
        elif not 1 <= value <= MAX_RUNWAY_EPOCHS:
            problems.append(f"{name} must be between 1 and {MAX_RUNWAY_EPOCHS}")
    if (
        not problems
        and isinstance(below_runway_epochs, int)
        and isinstance(to_runway_epochs, int)
        and to_runway_epochs <= below_runway_epochs
    ):
        problems.append("to_runway_epochs must be larger than below_runway_epochs")
    if isinstance(monthly_cap_cents, bool) or not isinstance(monthly_cap_cents, int):
        problems.append("monthly_cap_usd must be a number of US dollars")
    elif not MIN_CHARGE_CENTS <= monthly_cap_cents <= MAX_MONTHLY_CAP_CENTS:
        problems.append(
            f"monthly_cap_usd must be between 0.50 and {MAX_MONTHLY_CAP_CENTS // 100} US dollars"
        )
    return problems
