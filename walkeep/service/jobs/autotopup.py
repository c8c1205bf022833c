"""The ``auto_top_up`` job: keep accounts that opted in funded, before anything pauses.

Every run first settles automatic charges whose outcome is unknown
(``autocharge.reconcile``), then evaluates the rule for every account whose automatic
top-up is ``active`` (``autocharge.evaluate``: claim, last check, charge, settle). It runs
every ``WALKEEP_AUTO_TOP_UP_INTERVAL_SECONDS`` and at least twice per epoch, like the
renewal pass it keeps fed (``walkeep/scheduler/jobs.py``).

The renewal pass asks too, before it would pause memories for lack of credits
(``before_pausing`` in its own transaction, then ``charge_for_renewal`` once that has
committed): an account whose automatic top-up will fund it is not paused — its due
blobs are simply left for the next pass — and the charge is made at once, sized to
cover what the pass could not fund.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from walkeep.db.models import AutoTopUp
from walkeep.service import autocharge
from walkeep.service.runtime import Runtime

log = logging.getLogger(__name__)


@dataclass
class AutoTopUpReport:
    charged: int = 0  # charges sent to the provider
    succeeded: int = 0
    declined: int = 0
    action_required: int = 0
    canceled: int = 0
    cap_reached: int = 0
    settled: int = 0  # pending charges settled by reconciliation
    errors: int = 0
    pending: int = 0  # (state) charges still waiting for the provider's answer
    waiting: int = 0  # (state) accounts in back-off or inside the minimum interval


def auto_top_up(rt: Runtime) -> AutoTopUpReport:
    report = AutoTopUpReport()
    rec = autocharge.reconcile(rt)
    report.settled += rec.settled
    report.canceled += rec.canceled
    report.errors += rec.errors
    with rt.db.read() as s:
        accounts = list(
            s.scalars(
                select(AutoTopUp.account_id)
                .where(AutoTopUp.status == "active")
                .order_by(AutoTopUp.account_id)
            )
        )
    for account_id in accounts:
        try:
            _count(report, autocharge.evaluate(rt, account_id, trigger="schedule"))
        except Exception:
            log.exception("auto top-up of %s failed", account_id)
            report.errors += 1
    report.pending += rec.pending
    return report


def _count(report: AutoTopUpReport, ev: autocharge.Evaluation) -> None:
    if ev.action == "charged":
        report.charged += 1
        if ev.outcome == "succeeded":
            report.succeeded += 1
        elif ev.outcome == "declined":
            report.declined += 1
        elif ev.outcome == "authentication_required":
            report.action_required += 1
        elif ev.outcome == "pending":
            report.pending += 1
    elif ev.action == "canceled":
        report.canceled += 1
    elif ev.action == "cap_reached":
        report.cap_reached += 1
    elif ev.action == "pending":
        report.pending += 1
    elif ev.action == "waiting":
        report.waiting += 1


def before_pausing(
    rt: Runtime, s: Session, shortfalls: Mapping[str, int]
) -> tuple[set[str], set[str]]:
    """Of the accounts the renewal pass cannot fund (account → mc it lacks): those whose
    automatic top-up will fund them (the pass leaves their memories active), and those
    whose automatic top-up is on at all (asked to charge, or to say the cap is reached,
    once the pass's transaction has committed). Read in the pass's own transaction."""
    active = set(
        s.scalars(
            select(AutoTopUp.account_id).where(
                AutoTopUp.account_id.in_(sorted(shortfalls)), AutoTopUp.status == "active"
            )
        )
    )
    return {a for a in active if autocharge.will_fund(s, rt, a)}, active


def charge_for_renewal(rt: Runtime, shortfalls: Mapping[str, int]) -> AutoTopUpReport:
    """After the renewal pass's claim committed: evaluate each short account now, asking
    for at least what the pass lacked (a cap reached is alerted here, once a month)."""
    report = AutoTopUpReport()
    for account_id, shortfall in sorted(shortfalls.items()):
        try:
            _count(
                report,
                autocharge.evaluate(rt, account_id, trigger="renewal", shortfall_mc=shortfall),
            )
        except Exception:
            log.exception("auto top-up of %s (renewal) failed", account_id)
            report.errors += 1
    return report
