"""Automatic top-up on the embedded default (local network, TEST MODE payments).

The promises of walkeep/service/autocharge.py and autotopup.py, each shown failing the
way it would without its mechanism: never on by default and only an operator turns it
on; one pending charge per account (the UNIQUE constraint itself); a charge claimed and
then made unnecessary by a manual top-up is never sent; a lost answer is settled by
asking again, not by charging again; declines back off and disable at the third; an
authentication the card holder must complete yields a working link; each state change
is one alert; and the renewal pass asks before it pauses anything.
"""

from __future__ import annotations

import json
import re
from datetime import timedelta
from decimal import Decimal

import httpx
import pytest
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from tests.helpers import account, epoch_seconds, land_all
from tests.test_mcp_e2e import Server
from walkeep import ledger
from walkeep.db.models import AlertEvent, AutoCharge, AutoTopUp, LedgerEntry, Memory
from walkeep.errors import NotFound, PaymentsUnavailable, ValidationError
from walkeep.lifecycle import MemoryStatus
from walkeep.service import alerts, autocharge
from walkeep.service.jobs import autotopup as job
from walkeep.service.jobs import renew
from walkeep.service.operators import accounts
from walkeep.service.operators import autotopup as ops
from walkeep.service.runtime import Runtime
from walkeep.service.tools import balance, store, topup

AUTO_KEYS = {
    "status",
    "below_runway_epochs",
    "to_runway_epochs",
    "monthly_cap_usd",
    "charged_this_month_usd",
    "card",
    "last_attempt",
    "action_url",
    "reason",
}


# --- harness -----------------------------------------------------------------------------


def _kept(rt: Runtime, credits: int = 1, memories: int = 1, name: str | None = None) -> str:
    """An account with landed memories (something to renew) and ``credits`` left over."""
    a = account(rt, credits=1000, name=name)
    for i in range(memories):
        store.store(rt, a, content=f"fact {i} worth keeping", request_id=f"{a}-{i}")
    land_all(rt)
    with rt.db.begin() as s:  # leave exactly `credits` credits available
        avail = ledger.balance(s, a).available_mc
        if avail > credits * 1000:
            ledger.debit(s, a, avail - credits * 1000, ref="test:drain")
    return a


def _webhook(rt: Runtime, a: str) -> None:
    alerts.set_alert_webhook(rt, a, "http://127.0.0.1:9/hook")


def _events(rt: Runtime, a: str) -> list[tuple[str, dict]]:  # type: ignore[type-arg]
    with rt.db.read() as s:
        rows = s.execute(
            select(AlertEvent.type, AlertEvent.body)
            .where(AlertEvent.account_id == a)
            .order_by(AlertEvent.created_at, AlertEvent.id)
        ).all()
    return [(t, json.loads(b)["data"]) for t, b in rows]


def _types(rt: Runtime, a: str, prefix: str = "auto_top_up.") -> list[str]:
    return sorted(t for t, _ in _events(rt, a) if t.startswith(prefix))


def _charges(rt: Runtime, a: str) -> list[AutoCharge]:
    with rt.db.read() as s:
        return list(
            s.scalars(
                select(AutoCharge)
                .where(AutoCharge.account_id == a)
                .order_by(AutoCharge.created_at, AutoCharge.id)
            )
        )


def _auto_credits(rt: Runtime, a: str) -> list[int]:
    with rt.db.read() as s:
        assert ledger.recompute(s, a) == ledger.balance(s, a)
        return list(
            s.scalars(
                select(LedgerEntry.amount_mc)
                .where(LedgerEntry.account_id == a, LedgerEntry.kind == "auto_topup")
                .order_by(LedgerEntry.id)
            )
        )


def _enable(rt: Runtime, a: str, card: str = "succeeds", **over: object) -> None:
    rule: dict[str, object] = {
        "below_runway_epochs": 4,
        "to_runway_epochs": 12,
        "monthly_cap_usd": "20",
        "test_card_behaviour": card,
    }
    rule.update(over)
    ops.set_rule(rt, a, **rule)  # type: ignore[arg-type]


@pytest.fixture
def live(settings, clock, db):  # type: ignore[no-untyped-def]
    with Server(settings, clock, db) as srv:
        yield srv


# --- consent: never on by default, only an operator turns it on ---------------------------


def test_off_by_default_and_check_balance_names_exactly_the_fields(rt: Runtime) -> None:
    a = _kept(rt)
    view = balance.check_balance(rt, a).model_dump(mode="json")["auto_top_up"]
    assert set(view) == AUTO_KEYS
    assert view == {
        "status": "off",
        "below_runway_epochs": None,
        "to_runway_epochs": None,
        "monthly_cap_usd": None,
        "charged_this_month_usd": 0.0,
        "card": None,
        "last_attempt": None,
        "action_url": None,
        "reason": None,
    }
    assert job.auto_top_up(rt).charged == 0


def test_enabling_needs_a_saved_card_and_a_refusal_changes_nothing(rt: Runtime) -> None:
    a = _kept(rt)
    with pytest.raises(ValidationError, match="save a card first"):
        ops.set_rule(rt, a, below_runway_epochs=4, to_runway_epochs=12, monthly_cap_usd="20")
    with pytest.raises(ValidationError, match="to_runway_epochs must be larger"):
        _enable(rt, a, to_runway_epochs=4)
    with pytest.raises(ValidationError, match="--test-card must be one of"):
        _enable(rt, a, card="sometimes")
    with pytest.raises(ValidationError, match="whole cents"):
        _enable(rt, a, monthly_cap_usd="10.001")
    with rt.db.read() as s:  # nothing was written by any refusal
        assert s.get(AutoTopUp, a) is None


def test_saving_a_card_through_a_checkout_never_turns_it_on(rt: Runtime) -> None:
    """What an agent can do (top_up with save_card) saves a card; only set_rule enables."""
    a = _kept(rt)
    url = topup.top_up(rt, a, "5.00", "save-1", save_card=True).checkout_url
    cid = url.rsplit("/", 1)[1]
    token = topup.issue_pay_token(rt, cid)
    with pytest.raises(ValidationError, match="choose how the saved TEST MODE card behaves"):
        topup.pay_local(rt, cid, token)
    token = topup.issue_pay_token(rt, cid)
    assert topup.pay_local(rt, cid, token, "succeeds") is True
    view = balance.auto_top_up_view(rt, a)
    assert view.status == "off" and view.card == "visa •••• 4242"
    with rt.db.read() as s:
        row = s.get(AutoTopUp, a)
        assert row is not None and row.consent_at is not None
        assert row.consent_source == f"checkout {cid}" and row.consent_version
    # A replay with a different save_card is refused (the row fixes it).
    with pytest.raises(ValidationError, match="save_card differs"):
        topup.top_up(rt, a, "5.00", "save-1", save_card=False)
    # The operator turns it on with the saved card: no --test-card needed.
    ops.set_rule(rt, a, below_runway_epochs=4, to_runway_epochs=12, monthly_cap_usd="20")
    assert balance.auto_top_up_view(rt, a).status == "active"


def test_a_test_card_is_refused_when_stripe_is_configured(rt: Runtime) -> None:
    a = _kept(rt)

    class _Stripe:
        provider = "stripe"

    real, rt.payments = rt.payments, _Stripe()  # type: ignore[assignment]
    try:
        with pytest.raises(ValidationError, match="TEST MODE only"):
            _enable(rt, a)
    finally:
        rt.payments = real
    with rt.db.read() as s:
        assert s.get(AutoTopUp, a) is None


# --- the rule, a charge, credited once -------------------------------------------------------


def test_a_charge_below_the_threshold_is_credited_once_and_alerted(rt: Runtime) -> None:
    a = _kept(rt, credits=0)
    _webhook(rt, a)
    _enable(rt, a)
    report = job.auto_top_up(rt)
    assert (report.charged, report.succeeded) == (1, 1)
    (ch,) = _charges(rt, a)
    assert ch.status == "succeeded" and ch.pending_account_id is None
    assert ch.amount_cents == 50  # a tiny memory's 12 epochs cost far less than $0.50
    assert ch.inputs["funded_runway_epochs"] == 0 and ch.inputs["burn_mc_per_epoch"] > 0
    assert _auto_credits(rt, a) == [50_000]
    # Settling the same answer again (a webhook, the reconciler) credits nothing more.
    result = rt.payments.retrieve_charge(ch.payment_intent_id or "")
    assert autocharge.settle(rt, ch.id, result, source="again") == "succeeded"
    assert _auto_credits(rt, a) == [50_000]
    assert _types(rt, a) == ["auto_top_up.enabled", "auto_top_up.succeeded"]
    view = balance.auto_top_up_view(rt, a)
    assert view.charged_this_month_usd == 0.5 and view.last_attempt is not None
    assert view.last_attempt.outcome == "succeeded" and view.last_attempt.amount_usd == 0.5
    # Funded above the threshold now: the next run charges nothing.
    rt.clock.advance(7200)  # type: ignore[attr-defined]
    assert job.auto_top_up(rt).charged == 0


def test_at_most_one_charge_per_min_interval(rt: Runtime) -> None:
    a = _kept(rt, credits=0)
    _enable(rt, a)
    assert job.auto_top_up(rt).succeeded == 1
    with rt.db.begin() as s:  # spend it all again at once
        ledger.debit(s, a, ledger.balance(s, a).available_mc, ref="test:spend")
    assert job.auto_top_up(rt).waiting == 1
    rt.clock.advance(rt.settings.auto_top_up_min_interval_seconds)  # type: ignore[attr-defined]
    assert job.auto_top_up(rt).succeeded == 1
    assert len(_auto_credits(rt, a)) == 2


def test_one_pending_charge_per_account_is_the_databases_rule(rt: Runtime) -> None:
    """The UNIQUE pending_account_id refuses a second pending charge on both databases."""
    a = _kept(rt)
    now = rt.clock.now()

    def charge(cid: str, pending: str | None) -> AutoCharge:
        return AutoCharge(
            id=cid,
            account_id=a,
            pending_account_id=pending,
            amount_cents=50,
            currency="usd",
            provider="local",
            customer_id="c",
            payment_method_id="p",
            idempotency_key=f"k-{cid}",
            status="pending" if pending else "succeeded",
            trigger="schedule",
            inputs={},
            created_at=now,
            updated_at=now,
        )

    with rt.db.begin() as s:
        s.add_all([charge("atu_1", a), charge("atu_2", None), charge("atu_3", None)])
    with pytest.raises(IntegrityError), rt.db.begin() as s:
        s.add(charge("atu_4", a))


def test_a_manual_top_up_between_claim_and_send_cancels_the_charge(rt: Runtime) -> None:
    a = _kept(rt, credits=0)
    _enable(rt, a)
    burn = 63  # anything: the claim's own decision is what matters
    claimed = autocharge._claim(rt, a, "schedule", burn, 0)
    assert claimed.action == "charged" and claimed.charge_id
    # The human pays a checkout meanwhile.
    accounts.grant(rt.db, a, 5_000_000, reason="manual top-up")
    assert autocharge.submit(rt, claimed.charge_id) == "canceled"
    (ch,) = _charges(rt, a)
    assert ch.status == "canceled" and ch.submitted_at is None and ch.pending_account_id is None
    assert _auto_credits(rt, a) == []
    assert balance.auto_top_up_view(rt, a).last_attempt is None  # never sent: not an attempt


def test_turned_off_between_claim_and_send_is_never_sent(rt: Runtime) -> None:
    a = _kept(rt, credits=0)
    _enable(rt, a)
    claimed = autocharge._claim(rt, a, "schedule", 63, 0)
    ops.turn_off(rt, a)
    sent: list[str] = []
    rt.extras["autocharge_hooks"] = {"before_charge": sent.append}
    assert claimed.charge_id and autocharge.submit(rt, claimed.charge_id) == "canceled"
    assert sent == []


def test_an_unknown_outcome_is_settled_by_asking_again_not_by_charging_again(
    rt: Runtime,
) -> None:
    a = _kept(rt, credits=0)
    _enable(rt, a)
    calls: list[str] = []
    real = rt.payments.charge

    def lost(req):  # type: ignore[no-untyped-def]
        calls.append(req.idempotency_key)
        real(req)  # the provider charged…
        raise PaymentsUnavailable("the answer was lost", {"retry": True})  # …we never heard

    rt.payments.charge = lost  # type: ignore[method-assign]
    report = job.auto_top_up(rt)
    assert report.charged == 1 and report.pending == 1
    (ch,) = _charges(rt, a)
    assert ch.status == "pending" and ch.submitted_at is not None
    rt.payments.charge = real  # type: ignore[method-assign]
    # Another run inside the grace period: still pending, and no second charge is claimed.
    assert job.auto_top_up(rt).charged == 0
    rt.clock.advance(autocharge.GRACE_SECONDS)  # type: ignore[attr-defined]
    report = job.auto_top_up(rt)
    assert report.settled == 1 and report.charged == 0
    (ch,) = _charges(rt, a)
    assert ch.status == "succeeded" and _auto_credits(rt, a) == [50_000]
    assert calls == [ch.idempotency_key]


def test_a_claim_whose_worker_died_before_sending_is_sent_by_reconcile(rt: Runtime) -> None:
    a = _kept(rt, credits=0)
    _enable(rt, a)
    claimed = autocharge._claim(rt, a, "schedule", 63, 0)  # …and the worker died here
    assert job.auto_top_up(rt).pending == 1  # too young to touch; and blocks a second claim
    rt.clock.advance(autocharge.GRACE_SECONDS)  # type: ignore[attr-defined]
    assert job.auto_top_up(rt).settled == 1
    (ch,) = _charges(rt, a)
    assert ch.id == claimed.charge_id and ch.status == "succeeded"
    assert _auto_credits(rt, a) == [50_000]


# --- failures by class ------------------------------------------------------------------------


def test_declines_back_off_doubling_and_disable_at_the_third(rt: Runtime) -> None:
    # Short waits, so the memory is still paid for when the back-off is over.
    rt.settings.auto_top_up_retry_seconds = 60
    rt.settings.auto_top_up_min_interval_seconds = 60
    a = _kept(rt, credits=0)
    _webhook(rt, a)
    _enable(rt, a, card="declines")
    retry = rt.settings.auto_top_up_retry_seconds
    assert job.auto_top_up(rt).declined == 1
    assert _types(rt, a) == ["auto_top_up.enabled", "auto_top_up.failed"]
    # Inside the back-off: no attempt (even after the minimum interval).
    rt.clock.advance(retry - 1)  # type: ignore[attr-defined]
    assert job.auto_top_up(rt).charged == 0
    rt.clock.advance(1)  # type: ignore[attr-defined]
    assert job.auto_top_up(rt).declined == 1
    rt.clock.advance(2 * retry - 1)  # type: ignore[attr-defined]  # doubled
    assert job.auto_top_up(rt).charged == 0
    rt.clock.advance(1)  # type: ignore[attr-defined]
    assert job.auto_top_up(rt).declined == 1
    view = balance.auto_top_up_view(rt, a)
    assert view.status == "disabled" and "3 declines in a row" in (view.reason or "")
    assert view.last_attempt is not None and view.last_attempt.outcome == "declined"
    assert view.card == "visa •••• 0002"  # a soft decline keeps the card
    assert _types(rt, a) == [
        "auto_top_up.disabled",
        "auto_top_up.enabled",
        "auto_top_up.failed",
        "auto_top_up.failed",
    ]
    rt.clock.advance(10 * retry)  # type: ignore[attr-defined]
    assert job.auto_top_up(rt).charged == 0 and len(_charges(rt, a)) == 3
    # The operator turns it on again: the count starts over.
    _enable(rt, a, card="succeeds")
    assert job.auto_top_up(rt).succeeded == 1


def test_authentication_required_asks_the_card_holder_with_a_working_link(
    rt: Runtime,
) -> None:
    a = _kept(rt, credits=0)
    _webhook(rt, a)
    _enable(rt, a, card="authentication_required")
    assert job.auto_top_up(rt).action_required == 1
    view = balance.check_balance(rt, a).auto_top_up
    assert view.status == "action_required"
    assert view.last_attempt is not None and view.last_attempt.outcome == "authentication_required"
    assert view.action_url and view.action_url.startswith(rt.settings.public_url)
    (ch,) = _charges(rt, a)
    assert view.action_url.endswith(f"/topup/action/{ch.id}")
    events = [d for t, d in _events(rt, a) if t == "auto_top_up.action_required"]
    assert len(events) == 1 and events[0]["action_url"] == view.action_url
    # No retries while the holder has not acted.
    rt.clock.advance(10 * rt.settings.auto_top_up_retry_seconds)  # type: ignore[attr-defined]
    assert job.auto_top_up(rt).charged == 0
    # The link: a save_card checkout for the same amount; opening it twice, the same one.
    url = topup.action_checkout(rt, ch.id)
    assert topup.action_checkout(rt, ch.id) == url
    cid = url.rsplit("/", 1)[1]
    st = topup.checkout_status(rt, cid)
    assert st.save_card and st.amount_cents == ch.amount_cents and st.account_id == a
    # Paying it (saving a card that works) credits it and turns automatic top-up back on.
    assert topup.pay_local(rt, cid, topup.issue_pay_token(rt, cid), "succeeds")
    view = balance.auto_top_up_view(rt, a)
    assert view.status == "active" and view.action_url is None and view.card == "visa •••• 4242"
    assert _types(rt, a) == [
        "auto_top_up.action_required",
        "auto_top_up.enabled",
        "auto_top_up.enabled",
    ]
    with pytest.raises(NotFound):  # a succeeded charge has no action link
        topup.action_checkout(rt, "atu_nonesuch")


def test_the_monthly_cap_stops_charges_and_says_so_once_a_month(rt: Runtime) -> None:
    # An hour before the month ends (UTC), ten minutes between charges.
    rt.clock.set(rt.clock.now().replace(day=30, hour=23, minute=0))  # type: ignore[attr-defined]
    rt.settings.auto_top_up_min_interval_seconds = 600
    a = _kept(rt, credits=0)
    _webhook(rt, a)
    _enable(rt, a, monthly_cap_usd="1.00")
    step = 600
    charged = []
    for _ in range(5):
        with rt.db.begin() as s:  # spend everything, so the rule always wants a charge
            avail = ledger.balance(s, a).available_mc
            if avail:
                ledger.debit(s, a, avail, ref=f"test:spend:{rt.clock.now().isoformat()}")
        report = job.auto_top_up(rt)
        charged.append((report.succeeded, report.cap_reached))
        rt.clock.advance(step)  # type: ignore[attr-defined]
    assert sum(c.amount_cents for c in _charges(rt, a)) <= 100
    assert [c for c, _ in charged].count(1) == 2  # 50¢ twice, then the cap
    assert _types(rt, a).count("auto_top_up.cap_reached") == 1
    # A new month (UTC): charges resume.
    rt.clock.set(rt.clock.now().replace(month=12, day=1, hour=0, minute=0))  # type: ignore[attr-defined]
    assert job.auto_top_up(rt).succeeded == 1
    assert balance.auto_top_up_view(rt, a).charged_this_month_usd == 0.5


# --- the renewal pass asks before it pauses ----------------------------------------------


def _due(rt: Runtime) -> None:
    rt.clock.advance(epoch_seconds(rt) * 3)  # type: ignore[attr-defined]  # runway 2: due


def test_the_renewal_pass_charges_instead_of_pausing(rt: Runtime) -> None:
    a = _kept(rt, credits=0)
    b = _kept(rt, credits=0)  # no automatic top-up: pauses as today
    _webhook(rt, a)
    _enable(rt, a, below_runway_epochs=1, to_runway_epochs=2)
    _due(rt)
    report = renew.renew(rt)
    with rt.db.read() as s:
        status = dict(s.execute(select(Memory.account_id, Memory.status)).all())
    assert status[a] == MemoryStatus.ACTIVE and status[b] == MemoryStatus.PAUSED
    assert report.paused_memories == 1
    (ch,) = _charges(rt, a)
    assert ch.trigger == "renewal" and ch.status == "succeeded"
    assert ch.inputs["shortfall_mc"] > 0
    assert "memories.paused" not in [t for t, _ in _events(rt, a)]
    # The next pass renews it with the credits the charge brought.
    assert renew.renew(rt).transactions == 1
    with rt.db.read() as s:
        assert s.scalar(select(Memory.status).where(Memory.account_id == a)) == "active"


def test_a_disabled_or_capped_auto_top_up_lets_the_pass_pause(rt: Runtime) -> None:
    a = _kept(rt, credits=0)
    _webhook(rt, a)
    _enable(rt, a, card="declines", monthly_cap_usd="0.50")
    with rt.db.begin() as s:  # the month's cap is already spent
        now = rt.clock.now()
        s.add(
            AutoCharge(
                id="atu_earlier",
                account_id=a,
                amount_cents=50,
                currency="usd",
                provider="local",
                customer_id="c",
                payment_method_id="p",
                idempotency_key="k-earlier",
                status="succeeded",
                trigger="schedule",
                inputs={},
                created_at=now - timedelta(days=2) if now.day > 2 else now,
                updated_at=now,
            )
        )
    _due(rt)
    report = renew.renew(rt)
    assert report.paused_memories == 1
    assert _types(rt, a) == ["auto_top_up.cap_reached", "auto_top_up.enabled"]


def test_pending_counts_as_funded_for_the_pass(rt: Runtime) -> None:
    """A charge whose answer is still out keeps the pass from pausing (and from
    charging a second time)."""
    a = _kept(rt, credits=0)
    _enable(rt, a, below_runway_epochs=1, to_runway_epochs=2)
    autocharge._claim(rt, a, "schedule", 63, 0)  # pending, not yet sent
    _due(rt)
    report = renew.renew(rt)
    assert report.paused_memories == 0 and report.transactions == 0
    assert len(_charges(rt, a)) == 1


# --- operators: the CLI and the console page's service --------------------------------------


def test_cli_set_show_off_and_show_json_is_check_balances_object(
    rt: Runtime, settings, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    from typer.testing import CliRunner

    from walkeep.cli import app

    a = _kept(rt, name="cli-acct")
    monkeypatch.setenv("WALKEEP_DATA_DIR", str(settings.data_dir))
    monkeypatch.setenv("WALKEEP_DATABASE_URL", settings.db_url)
    monkeypatch.setenv("WALKEEP_MASTER_KEY", settings.master_key)
    for var in ("STRIPE_SECRET_KEY", "WALKEEP_STRIPE_SECRET_KEY"):
        monkeypatch.delenv(var, raising=False)
    runner = CliRunner()
    out = runner.invoke(app, ["auto-top-up", "show", "--account", "cli-acct", "--json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["status"] == "off"
    out = runner.invoke(
        app,
        [
            "auto-top-up",
            "set",
            "--account",
            "cli-acct",
            "--below-runway-epochs",
            "3",
            "--to-runway-epochs",
            "9",
            "--monthly-cap-usd",
            "12.50",
            "--test-card",
            "authentication_required",
        ],
    )
    assert out.exit_code == 0, out.output
    assert "automatic top-up: active" in out.output and "visa •••• 3184" in out.output
    out = runner.invoke(app, ["auto-top-up", "show", "--account", a, "--json"])
    shown = json.loads(out.output)
    expected = balance.check_balance(rt, a).model_dump(mode="json")["auto_top_up"]
    assert shown == expected and set(shown) == AUTO_KEYS
    assert (shown["below_runway_epochs"], shown["to_runway_epochs"], shown["monthly_cap_usd"]) == (
        3,
        9,
        12.5,
    )
    out = runner.invoke(app, ["auto-top-up", "off", "--account", "cli-acct"])
    assert out.exit_code == 0 and "automatic top-up: off" in out.output
    bad = runner.invoke(
        app,
        [
            "auto-top-up",
            "set",
            "--account",
            "cli-acct",
            "--below-runway-epochs",
            "9",
            "--to-runway-epochs",
            "3",
            "--monthly-cap-usd",
            "5",
        ],
    )
    assert bad.exit_code != 0


def test_statement_shows_automatic_charges_as_their_own_kind(rt: Runtime) -> None:
    from walkeep.service.operators import statements

    a = _kept(rt, credits=0)
    _enable(rt, a)
    job.auto_top_up(rt)
    (ch,) = _charges(rt, a)
    day = rt.clock.now().date()
    csv_text = statements.to_csv(rt.db, a, day, day)
    line = next(row for row in csv_text.splitlines() if row.split(",")[1:2] == ["auto_topup"])
    assert f"autotopup:{ch.id}" in line and ch.payment_intent_id in line  # type: ignore[operator]
    assert ",50.000,+50.000," in line  # 50 credits = $0.50
    assert "reconciled" in csv_text.splitlines()[-1]


def test_the_local_checkout_page_lets_the_operator_pick_the_test_card(live) -> None:  # type: ignore[no-untyped-def]
    """TEST MODE: a save_card link's page states the consent and offers the behaviours."""
    from tests.helpers import console_sign_in

    rt = live.rt
    created = accounts.create_account(rt.db, "pagey", credits_mc=0)
    url = topup.top_up(rt, created.account_id, "2.00", "page-1", save_card=True).checkout_url
    with httpx.Client(base_url=live.url, timeout=10) as h:
        console_sign_in(h, created.api_key)
        page = h.get(url.removeprefix(live.url)).text
        assert "authorise Walkeep to charge it later" in page
        assert re.findall(r'<option value="([a-z_]+)"', page) == [
            "succeeds",
            "declines",
            "authentication_required",
        ]
        token = re.search(r'name="pay_token" value="([^"]+)"', page)
        assert token is not None
        done = h.post(
            url.removeprefix(live.url) + "/pay",
            data={"pay_token": token.group(1), "test_card": "declines"},
        )
        assert done.status_code == 200 and 'data-testid="card-saved"' in done.text
    view = balance.auto_top_up_view(rt, created.account_id)
    assert view.card == "visa •••• 0002" and view.status == "off"
    assert Decimal(str(balance.check_balance(rt, created.account_id).balance_usd)) == Decimal("2")


def test_the_action_link_redirects_to_a_fresh_checkout(live) -> None:  # type: ignore[no-untyped-def]
    rt = live.rt
    a = accounts.create_account(rt.db, "sca", credits_mc=0).account_id
    _enable(rt, a, card="authentication_required")
    with rt.db.begin() as s:
        now = rt.clock.now()
        s.add(
            AutoCharge(
                id="atu_sca0000000000000000000",
                account_id=a,
                amount_cents=700,
                currency="usd",
                provider="local",
                customer_id="c",
                payment_method_id="p",
                idempotency_key="k-sca",
                status="authentication_required",
                trigger="schedule",
                inputs={},
                created_at=now,
                updated_at=now,
            )
        )
    with httpx.Client(base_url=live.url, timeout=10) as h:
        r = h.get("/topup/action/atu_sca0000000000000000000", follow_redirects=False)
        assert r.status_code == 303 and "/checkout/tu_" in r.headers["location"]
        st = topup.checkout_status(rt, r.headers["location"].rsplit("/", 1)[1])
        assert st.amount_cents == 700 and st.save_card
        missing = h.get("/topup/action/atu_nope", follow_redirects=False)
        assert missing.status_code == 404


def test_mcp_rest_and_the_client_carry_save_card_and_auto_top_up(live) -> None:  # type: ignore[no-untyped-def]
    import asyncio

    from tests.test_mcp_e2e import call_ok, mcp_client
    from walkeep.client import WalkeepClient

    created = accounts.create_account(live.rt.db, "wired", credits_mc=0)

    async def via_mcp() -> tuple[dict, dict]:  # type: ignore[type-arg]
        async with mcp_client(live, created.api_key) as c:
            tools = {t.name: t for t in (await c.list_tools()).tools}
            top_up = tools["top_up"]
            assert top_up.input_schema["properties"]["save_card"]["type"] == "boolean"
            assert "save_card" in (top_up.description or "")
            assert "auto_top_up" in (tools["check_balance"].description or "")
            defs = tools["check_balance"].output_schema["$defs"]
            assert set(defs["AutoTopUpView"]["properties"]) == AUTO_KEYS
            link = await call_ok(
                c, "top_up", {"amount_usd": 5, "request_id": "m-1", "save_card": True}
            )
            return link, await call_ok(c, "check_balance")

    link, bal = asyncio.run(via_mcp())
    assert topup.checkout_status(live.rt, link["checkout_url"].rsplit("/", 1)[1]).save_card
    assert set(bal["auto_top_up"]) == AUTO_KEYS and bal["auto_top_up"]["status"] == "off"
    with WalkeepClient(live.url, api_key=created.api_key) as wk:
        again = wk.top_up("5.00", request_id="c-1", save_card=True)
        assert topup.checkout_status(live.rt, again.checkout_url.rsplit("/", 1)[1]).save_card
        plain = wk.top_up("5.00", request_id="c-2")
        assert not topup.checkout_status(live.rt, plain.checkout_url.rsplit("/", 1)[1]).save_card
        assert wk.check_balance().auto_top_up.status == "off"
    with httpx.Client(base_url=live.url, timeout=10) as h:
        r = h.post(
            "/v1/top_up",
            json={"amount_usd": "5.00", "request_id": "m-1", "save_card": False},
            headers={"Authorization": f"Bearer {created.api_key}"},
        )
        assert r.status_code == 422 and "save_card differs" in r.json()["message"]
