"""Automatic top-up over 90 simulated days, and racing workers on PostgreSQL.

The simulation (injectable clock, 12-hour epochs, no sleeping) runs the worker's two
jobs in turn — ``auto_top_up`` then the renewal pass — twice an epoch, for four
accounts with TEST MODE cards: one that ``succeeds`` with room under its cap, one that
``succeeds`` under a tight cap, one that ``declines`` and one that needs
``authentication_required``. Before every run of the job it works out, from what the
account shows at that moment, what the rule (walkeep/topup_rule.py) must do, and checks
the job did exactly that; every charge's recorded inputs give back its own amount.

The race (PostgreSQL only): two worker processes evaluate every account at once while
manual top-ups are credited concurrently; each crossing gets at most one automatic
charge, every charge is credited exactly once, and the ledger equals the provider's
records.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta

import pytest
from sqlalchemy import func, select

from tests.helpers import land_all
from walkeep import ledger, topup_rule
from walkeep.db.models import AlertEvent, AutoCharge, AutoTopUp, LedgerEntry, Memory
from walkeep.service.jobs import autotopup as job
from walkeep.service.jobs import renew
from walkeep.service.operators import accounts
from walkeep.service.operators import autotopup as ops
from walkeep.service.renewal_price import renewal_burn_mc_per_epoch
from walkeep.service.runtime import Runtime
from walkeep.service.tools import balance, store, topup

EPOCH = 12 * 3600
STEP = EPOCH // 2  # the worker evaluates at least twice an epoch (walkeep/scheduler/jobs.py)
DAYS = 90
RETRY = STEP  # a decline waits one step, then two


@pytest.fixture
def sim(settings, clock, db) -> Iterator[Runtime]:  # type: ignore[no-untyped-def]
    from walkeep.bootstrap import build_runtime

    settings.local_epoch_seconds = EPOCH
    settings.quilts = "off"  # each memory its own blob: burn is easy to reason about
    settings.renewal_price_mc_per_unit_epoch = 80  # ≈ 5,000 mc per tiny memory-epoch
    settings.auto_top_up_retry_seconds = RETRY
    settings.auto_top_up_min_interval_seconds = STEP
    yield build_runtime(settings, clock=clock, database=db, with_completer=False)


def _account(rt: Runtime, name: str, memories: int, credits_usd: int) -> str:
    a = accounts.create_account(rt.db, name, credits_mc=10_000_000).account_id
    for i in range(memories):
        store.store(rt, a, content=f"{name} fact {i}", request_id=f"{name}-{i}")
    land_all(rt)
    with rt.db.begin() as s:
        avail = ledger.balance(s, a).available_mc
        ledger.debit(s, a, avail - credits_usd * 100_000, ref="sim:start")
    from walkeep.service import alerts

    alerts.set_alert_webhook(rt, a, "http://127.0.0.1:9/hook")
    return a


@dataclass
class Expect:
    charge: bool
    amount_cents: int


def _expected(rt: Runtime, a: str) -> Expect:
    """What the rule must do for ``a`` now, worked out from what the account shows."""
    now = rt.clock.now()
    burn, _ = renewal_burn_mc_per_epoch(rt, a)
    with rt.db.read() as s:
        row = s.get(AutoTopUp, a)
        assert row is not None
        if row.status != "active":
            return Expect(False, 0)
        if row.next_attempt_at is not None and now < row.next_attempt_at:
            return Expect(False, 0)
        last = s.scalar(
            select(func.max(AutoCharge.created_at)).where(
                AutoCharge.account_id == a, AutoCharge.status != "canceled"
            )
        )
        if last is not None and now < last + timedelta(seconds=STEP):
            return Expect(False, 0)
        month = sum(
            s.scalars(
                select(AutoCharge.amount_cents).where(
                    AutoCharge.account_id == a,
                    AutoCharge.status.in_(("succeeded", "pending")),
                    AutoCharge.created_at >= topup_rule.month_start(now),
                )
            )
        )
        d = topup_rule.decide(
            topup_rule.Inputs(
                available_mc=ledger.balance(s, a).available_mc,
                pending_mc=0,
                burn_mc_per_epoch=burn,
                below_runway_epochs=row.below_runway_epochs or 0,
                to_runway_epochs=row.to_runway_epochs or 0,
                monthly_cap_cents=row.monthly_cap_cents or 0,
                charged_this_month_cents=month,
            )
        )
    return Expect(d.action == "charge", d.amount_cents)


def _charges(rt: Runtime, a: str) -> list[AutoCharge]:
    with rt.db.read() as s:
        return list(
            s.scalars(
                select(AutoCharge)
                .where(AutoCharge.account_id == a)
                .order_by(AutoCharge.created_at, AutoCharge.id)
            )
        )


def _statuses(rt: Runtime, a: str) -> dict[str, int]:
    return _all_statuses(rt).get(a, {})


def _all_statuses(rt: Runtime) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = defaultdict(dict)
    with rt.db.read() as s:
        for account_id, status, n in s.execute(
            select(Memory.account_id, Memory.status, func.count()).group_by(
                Memory.account_id, Memory.status
            )
        ):
            out[account_id][status] = n
    return out


def _alerts(rt: Runtime, a: str, type_: str) -> list[dict]:  # type: ignore[type-arg]
    with rt.db.read() as s:
        return [
            json.loads(b)["data"]
            for b in s.scalars(
                select(AlertEvent.body)
                .where(AlertEvent.account_id == a, AlertEvent.type == type_)
                .order_by(AlertEvent.created_at)
            )
        ]


def test_ninety_days_of_automatic_top_up(sim: Runtime) -> None:
    rt = sim
    ok = _account(rt, "steady", memories=4, credits_usd=1)
    tight = _account(rt, "tight", memories=4, credits_usd=1)
    declines = _account(rt, "declines", memories=2, credits_usd=1)
    sca = _account(rt, "sca", memories=2, credits_usd=1)
    burn_ok, _ = renewal_burn_mc_per_epoch(rt, ok)
    assert 15_000 < burn_ok < 25_000  # ≈ 20 cents an epoch, ≈ $12 a month
    for a, card, cap in (
        (ok, "succeeds", "20"),
        (tight, "succeeds", "8"),
        (declines, "declines", "20"),
        (sca, "authentication_required", "20"),
    ):
        ops.set_rule(
            rt,
            a,
            below_runway_epochs=4,
            to_runway_epochs=12,
            monthly_cap_usd=cap,
            test_card_behaviour=card,
        )
    watched = (ok, tight)
    checked = defaultdict(int)
    paused_seen: dict[str, int] = defaultdict(int)
    decline_times: list[datetime] = []
    disabled_at: datetime | None = None
    sca_fixed = False
    start = rt.clock.now()
    steps = DAYS * 24 * 3600 // STEP
    for _ in range(steps):
        rt.clock.advance(STEP)  # type: ignore[attr-defined]
        expect = {a: _expected(rt, a) for a in watched}
        before = {a: len(_charges(rt, a)) for a in (*watched, declines)}
        job.auto_top_up(rt)
        for a in watched:
            new = _charges(rt, a)[before[a] :]
            if expect[a].charge:
                assert [(c.amount_cents, c.trigger, c.status) for c in new] == [
                    (expect[a].amount_cents, "schedule", "succeeded")
                ], (rt.clock.now(), a)
                checked[a] += 1
            else:
                assert new == [], (rt.clock.now(), a, new)
        if len(_charges(rt, declines)) > before[declines]:
            decline_times.append(rt.clock.now())
        if disabled_at is None and balance.auto_top_up_view(rt, declines).status == "disabled":
            disabled_at = rt.clock.now()
        view = balance.auto_top_up_view(rt, sca)
        if view.status == "action_required" and not sca_fixed:
            sca_fixed = _complete_action(rt, sca, view.action_url or "")
        renew.renew(rt)
        statuses = _all_statuses(rt)
        for a in (ok, tight, declines):
            paused_seen[a] = max(paused_seen[a], statuses[a].get("paused", 0))
        assert statuses[ok] == {"active": 4}, (rt.clock.now(), statuses[ok])
    assert rt.clock.now() - start >= timedelta(days=DAYS)

    # A `succeeds` card kept every memory of the steady account active, all 90 days.
    assert _statuses(rt, ok) == {"active": 4}
    charges = _charges(rt, ok)
    assert len(charges) >= 15 and checked[ok] >= 15
    # Every charge's recorded inputs give back its own amount (schedule and renewal alike).
    for a in (ok, tight):
        for c in _charges(rt, a):
            inputs = {k: v for k, v in c.inputs.items() if k in topup_rule.Inputs.__slots__}
            again = topup_rule.decide(topup_rule.Inputs(**inputs))
            assert (again.action, again.amount_cents) == ("charge", c.amount_cents)
            assert c.amount_cents >= topup_rule.MIN_CHARGE_CENTS
    # The monthly cap is never exceeded, and cap_reached said so once in each month it bit.
    for a, cap in ((ok, 2000), (tight, 800)):
        per_month: dict[str, int] = defaultdict(int)
        for c in _charges(rt, a):
            if c.status == "succeeded":
                per_month[topup_rule.month_of(c.created_at)] += c.amount_cents
        assert per_month and max(per_month.values()) <= cap, per_month
    capped = _alerts(rt, tight, "auto_top_up.cap_reached")
    assert capped and len({e["month"] for e in capped}) == len(capped)
    assert all(e["charged_this_month_usd"] == "8.00" for e in capped)
    assert _alerts(rt, ok, "auto_top_up.cap_reached") == []
    # Every charge credited exactly once; the ledger matches the charges.
    for a in (ok, tight, sca):
        with rt.db.read() as s:
            credited = list(
                s.scalars(
                    select(LedgerEntry.amount_mc).where(
                        LedgerEntry.account_id == a, LedgerEntry.kind == "auto_topup"
                    )
                )
            )
            assert ledger.recompute(s, a) == ledger.balance(s, a)
        succeeded = [c.amount_cents * 1000 for c in _charges(rt, a) if c.status == "succeeded"]
        assert sorted(credited) == sorted(succeeded)
    # A `declines` card: retried after one wait, then a doubled one, disabled at the third…
    assert len(decline_times) == 3
    assert decline_times[1] - decline_times[0] == timedelta(seconds=RETRY)
    assert decline_times[2] - decline_times[1] == timedelta(seconds=2 * RETRY)
    assert disabled_at == decline_times[2]
    assert len(_charges(rt, declines)) == 3
    assert [e["consecutive_declines"] for e in _alerts(rt, declines, "auto_top_up.failed")] == [
        1,
        2,
    ]
    assert len(_alerts(rt, declines, "auto_top_up.disabled")) == 1
    # …after which its memories paused as they do without automatic top-up.
    assert paused_seen[declines] == 2
    assert _alerts(rt, declines, "memories.paused")
    # `authentication_required`: action_required, whose link worked and turned it back on.
    assert sca_fixed
    assert len(_alerts(rt, sca, "auto_top_up.action_required")) == 1
    assert balance.auto_top_up_view(rt, sca).status == "active"


def _complete_action(rt: Runtime, account_id: str, action_url: str) -> bool:
    """The human opens action_url (a real HTTP request to the app) and pays with a card
    that works; automatic top-up is active again."""
    from fastapi.testclient import TestClient

    from walkeep.api.app import create_app

    path = action_url.removeprefix(rt.settings.public_url.rstrip("/"))
    with TestClient(create_app(rt), base_url=rt.settings.public_url) as http:
        r = http.get(path, follow_redirects=False)
        assert r.status_code == 303, r.text
        checkout = r.headers["location"].rsplit("/", 1)[1]
    st = topup.checkout_status(rt, checkout)
    assert st.save_card and st.account_id == account_id
    token = topup.issue_pay_token(rt, checkout)
    assert topup.pay_local(rt, checkout, token, "succeeds")
    return balance.auto_top_up_view(rt, account_id).status == "active"


# --- the race ----------------------------------------------------------------------------------

WORKER = r"""
import json, os, sys
from datetime import datetime
from walkeep.bootstrap import build_runtime
from walkeep.clock import ManualClock
from walkeep.config import Settings
from walkeep.db import Database
from walkeep.service import autocharge

clock = ManualClock(datetime.fromisoformat(os.environ["AT"]))
settings = Settings()
db = Database(settings.db_url, clock=clock)
rt = build_runtime(settings, clock=clock, database=db, with_completer=False)
accounts = json.loads(os.environ["ACCOUNTS"])
print("ready", flush=True)
sys.stdin.readline()
out = {"charged": 0}
for crossing in range(int(os.environ["CROSSINGS"])):
    for a in accounts:
        ev = autocharge.evaluate(rt, a, trigger="schedule")
        out["charged"] += ev.action == "charged"
    # Wait for the other worker and the manual top-ups before the next crossing.
    print("done", flush=True)
    sys.stdin.readline()
print(json.dumps(out), flush=True)
"""


@pytest.mark.postgres
def test_two_workers_and_manual_top_ups_race_the_trigger(  # type: ignore[no-untyped-def]
    settings, clock, db, tmp_path
) -> None:
    import threading

    from walkeep.bootstrap import build_runtime

    settings.auto_top_up_min_interval_seconds = 0  # every crossing may charge at once
    rt = build_runtime(settings, clock=clock, database=db, with_completer=False)
    accts = []
    for i in range(6):
        a = accounts.create_account(rt.db, f"race-{i}", credits_mc=10_000_000).account_id
        store.store(rt, a, content=f"race fact {i}", request_id=f"race-{i}")
        accts.append(a)
    land_all(rt)
    for a in accts:
        with rt.db.begin() as s:
            ledger.debit(s, a, ledger.balance(s, a).available_mc, ref="race:start")
        ops.set_rule(
            rt,
            a,
            below_runway_epochs=4,
            to_runway_epochs=12,
            monthly_cap_usd="1000",
            test_card_behaviour="succeeds",
        )
    crossings = 4
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("WALKEEP_", "STRIPE_"))},
        "HOME": str(tmp_path),
        "WALKEEP_DATA_DIR": str(settings.data_dir),
        "WALKEEP_DATABASE_URL": settings.db_url,
        "WALKEEP_MASTER_KEY": settings.master_key,
        "WALKEEP_EMBEDDER": "hash",
        "WALKEEP_AUTO_TOP_UP_MIN_INTERVAL_SECONDS": "0",
        "AT": clock.now().isoformat(),
        "ACCOUNTS": json.dumps(accts),
        "CROSSINGS": str(crossings),
    }
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]

    def go() -> None:
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()

    def manual_top_ups(n: int) -> None:
        # A human pays a checkout for each account while the workers evaluate it.
        for a in accts:
            url = topup.top_up(rt, a, "0.50", f"manual-{n}-{a}").checkout_url
            cid = url.rsplit("/", 1)[1]
            topup.pay_local(rt, cid, topup.issue_pay_token(rt, cid))

    for p in procs:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    sent_before = dict.fromkeys(accts, 0)
    for n in range(crossings):
        human = threading.Thread(target=manual_top_ups, args=(n,))
        go()
        human.start()
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "done"
        human.join()
        # This crossing: at most one automatic charge per account, none left pending.
        for a in accts:
            sent = [c for c in _charges(rt, a) if c.status != "canceled"]
            assert len(sent) - sent_before[a] <= 1, (n, a, [c.status for c in sent])
            assert all(c.status == "succeeded" for c in sent)
            sent_before[a] = len(sent)
        # Spend everything: the next round is a new crossing for every account.
        for a in accts:
            with rt.db.begin() as s:
                avail = ledger.balance(s, a).available_mc
                if avail:
                    ledger.debit(s, a, avail, ref=f"race:spend:{n}")
    go()
    reports = []
    for p in procs:
        out, _ = p.communicate(timeout=300)
        assert p.returncode == 0
        reports.append(json.loads(out.strip().splitlines()[-1]))

    with rt.db.read() as s:
        for a in accts:
            charges = list(
                s.scalars(
                    select(AutoCharge)
                    .where(AutoCharge.account_id == a)
                    .order_by(AutoCharge.created_at)
                )
            )
            sent = [c for c in charges if c.status != "canceled"]
            # At most one automatic charge per crossing, none left pending.
            assert len(sent) <= crossings, (a, [(c.status, c.amount_cents) for c in charges])
            assert all(c.pending_account_id is None for c in charges)
            assert all(c.status in ("succeeded", "canceled") for c in charges)
            # Every charge credited exactly once.
            credited = list(
                s.execute(
                    select(LedgerEntry.ref, LedgerEntry.amount_mc).where(
                        LedgerEntry.account_id == a, LedgerEntry.kind == "auto_topup"
                    )
                )
            )
            assert sorted(credited) == sorted(
                (f"autotopup:{c.id}", c.amount_cents * 1000) for c in sent
            )
            # The ledger equals the provider's records (TEST MODE: the outcome of each
            # sent charge, asked again by its payment id).
            for c in sent:
                assert c.payment_intent_id
                assert rt.payments.retrieve_charge(c.payment_intent_id).status == "succeeded"
            assert ledger.recompute(s, a) == ledger.balance(s, a)
            manual = s.scalar(
                select(func.count())
                .select_from(LedgerEntry)
                .where(LedgerEntry.account_id == a, LedgerEntry.kind == "topup")
            )
            assert manual == crossings
    # What the workers say they charged is what the database holds (nothing unrecorded).
    sent_total = sum(1 for a in accts for c in _charges(rt, a) if c.status != "canceled")
    assert sum(r["charged"] for r in reports) == sent_total > 0
