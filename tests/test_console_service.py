"""The console's service layer: statements, account summaries, sign-in links, job runs.

Runs on SQLite and, with WALKEEP_TEST_DATABASE_URL, on PostgreSQL.
"""

from __future__ import annotations

import csv
import io
from datetime import date, timedelta
from decimal import Decimal

import pytest
from sqlalchemy import select

from tests.conftest import TEST_MASTER_KEY_BYTES
from tests.helpers import account, epoch_seconds, land_all
from walkeep import ledger
from walkeep.db.models import Account, JobRun
from walkeep.errors import NotFound, Unauthorized, ValidationError
from walkeep.service.jobs import renew
from walkeep.service.operators import accounts, console, statements
from walkeep.service.tools import store, topup


def _balance(rt, account_id: str) -> tuple[int, int]:  # type: ignore[no-untyped-def]
    with rt.db.read() as s:
        a = s.get(Account, account_id)
        assert a is not None
        return a.balance_mc, a.held_mc


def _advance_to_next_day(rt, clock) -> None:  # type: ignore[no-untyped-def]
    now = clock.now()
    nxt = (now + timedelta(days=1)).replace(hour=1, minute=0, second=0, microsecond=0)
    clock.advance((nxt - now).total_seconds())


def test_statement_totals_equal_the_ledger_balance_change(rt, clock) -> None:  # type: ignore[no-untyped-def]
    """Grant, stores (hold + capture), a released hold, a renewal, a quiet day and a
    top-up over four days: each period's opening + Σ changes = closing = the balance the ledger had then."""
    acct = account(rt, credits=50)  # day 1: grant
    day1 = clock.now().date()
    end_of = {day1: _balance(rt, acct)}

    _advance_to_next_day(rt, clock)  # day 2: three stores land, one hold is released
    for i in range(3):
        store.store(rt, acct, content=f"fact {i}", request_id=f"s{i}")
    land_all(rt)
    with rt.db.begin() as s:
        ledger.hold(s, acct, 700, ref="test:hold")
        ledger.release(s, acct, "test:hold")
    clock.advance(epoch_seconds(rt) * 3)  # still day 2: renewals capture credits
    assert renew.renew(rt).transactions >= 1
    end_of[clock.now().date()] = _balance(rt, acct)

    _advance_to_next_day(rt, clock)  # day 3: nothing happens
    end_of[clock.now().date()] = _balance(rt, acct)
    _advance_to_next_day(rt, clock)  # day 4: a paid top-up
    url = topup.top_up(rt, acct, "2.50", "t1").checkout_url
    cid = url.rsplit("/", 1)[-1]
    assert topup.pay_local(rt, cid, topup.issue_pay_token(rt, cid))
    day4 = clock.now().date()
    end_of[day4] = _balance(rt, acct)

    days = sorted(end_of)
    for i, first in enumerate(days):
        for last in days[i:]:
            st = statements.statement(rt.db, acct, first, last)
            prev = [d for d in days if d < first]
            opening = end_of[prev[-1]] if prev else (0, 0)
            assert st.reconciled
            assert (st.opening_balance_mc, st.opening_held_mc) == opening
            assert (st.closing_balance_mc, st.closing_held_mc) == end_of[last]
            assert st.opening_balance_mc + st.net_change_mc == st.closing_balance_mc
            assert sum(st.totals_by_kind.values()) == st.net_change_mc

    whole = statements.statement(rt.db, acct, day1, day4)
    kinds = {line.kind for line in whole.lines}
    assert kinds == {"grant", "hold", "capture", "release", "topup"}
    assert whole.totals_by_kind["topup"] == 250_000 and whole.totals_by_kind["grant"] == 50_000
    assert whole.totals_by_kind["hold"] == 0 and whole.totals_by_kind["release"] == 0
    with rt.db.read() as s:
        assert ledger.recompute(s, acct).balance_mc == whole.closing_balance_mc

    # The CSV carries the same figures, framed by opening and closing rows.
    rows = list(csv.DictReader(io.StringIO(statements.to_csv(rt.db, acct, day1, day4))))
    assert rows[0]["kind"] == "opening" and rows[-1]["kind"] == "closing"
    assert len(rows) == len(whole.lines) + 2
    changes = sum(int(Decimal(r["balance_change_credits"]) * 1000) for r in rows[1:-1])
    assert changes == whole.net_change_mc
    assert rows[-1]["balance_credits"] == statements.credits_str(whole.closing_balance_mc)
    assert rows[-1]["memo"] == "reconciled"

    # A period with no activity: opening = closing, no lines.
    later = statements.statement(rt.db, acct, day4 + timedelta(days=1), day4 + timedelta(days=9))
    assert later.lines == [] and later.opening_balance_mc == later.closing_balance_mc


def test_statement_refuses_bad_dates_and_unknown_accounts(rt) -> None:  # type: ignore[no-untyped-def]
    for bad in ("2026-13-01", "yesterday", "", "2026/12/01"):
        with pytest.raises(ValidationError, match="YYYY-MM-DD"):
            statements.parse_day(bad, "from")
    assert statements.parse_day(" 2026-12-31 ", "to") == date(2026, 12, 31)
    acct = account(rt)
    with pytest.raises(ValidationError, match="before it starts"):
        statements.statement(rt.db, acct, date(2026, 12, 2), date(2026, 12, 1))
    with pytest.raises(NotFound):
        statements.statement(rt.db, "acct_nope", date(2026, 12, 1), date(2026, 12, 1))


def test_csv_cells_never_become_spreadsheet_formulas(rt) -> None:  # type: ignore[no-untyped-def]
    acct = account(rt, credits=0)
    accounts.grant(rt.db, acct, 1000, reason='=HYPERLINK("http://evil")')
    today = rt.clock.now().date()
    text = statements.to_csv(rt.db, acct, today, today)
    row = list(csv.DictReader(io.StringIO(text)))[1]
    assert row["memo"].startswith("'=")


def test_account_summaries_are_worst_first_and_count_by_status(rt, clock) -> None:  # type: ignore[no-untyped-def]
    rich = account(rt, credits=100, name="rich")
    poor = account(rt, credits=2, name="poor")  # two stores, nothing left for renewals
    empty = account(rt, credits=0, name="empty")
    for a in (rich, poor):
        for i in range(2):
            store.store(rt, a, content=f"{a} {i}", request_id=f"{a}-{i}")
    land_all(rt)
    clock.advance(epoch_seconds(rt) * 3)
    renew.renew(rt)
    rows = console.account_summaries(rt)
    assert [r.name for r in rows] == ["poor", "rich", "empty"]
    by_name = {r.name: r for r in rows}
    assert by_name["poor"].paused == 2 and by_name["poor"].memories == 2
    assert by_name["rich"].by_status == {"active": 2}
    assert by_name["rich"].last_renewal_tx and by_name["rich"].last_renewal_at
    assert by_name["poor"].last_renewal_tx is None
    assert by_name["rich"].min_runway_epochs == rt.settings.target_runway_epochs
    assert by_name["empty"].memories == 0 and by_name["empty"].min_runway_epochs is None
    assert [r.account_id for r in console.account_summaries(rt, empty)] == [empty]
    as_json = by_name["rich"].to_json()
    assert as_json["active"] == 2 and as_json["paused"] == 0
    # The runway the summary reports is the one check_runway reports.
    from walkeep.service.tools.runway import check_runway

    summary = check_runway(rt, poor).account
    assert summary is not None
    assert summary.min_runway_epochs == by_name["poor"].min_runway_epochs
    with pytest.raises(NotFound):
        console.account_summaries(rt, "acct_nope")


def test_account_view_pages_memories_and_projects_the_balance(rt, clock) -> None:  # type: ignore[no-untyped-def]
    acct = account(rt, credits=100)
    n = console.MEMORIES_PAGE_SIZE + 3
    for i in range(n):
        store.store(rt, acct, content=f"memory number {i}", request_id=f"m{i}")
    land_all(rt)
    clock.advance(epoch_seconds(rt) * 3)
    renew.renew(rt)
    v = console.account_view(rt, acct)
    assert v.pages == 2 and len(v.memories) == console.MEMORIES_PAGE_SIZE
    assert len(console.account_view(rt, acct, page=2).memories) == 3
    assert console.account_view(rt, acct, page=99).page == 2  # clamped
    assert v.renewals and v.renewals[0].explorer_url.endswith(v.renewals[0].digest)
    assert all(m.last_renewal_url for m in v.memories)
    assert v.burn_mc_per_epoch > 0 and v.funded_epochs is not None
    # The projection falls by the burn per epoch until renewals can no longer be paid.
    start, stop = v.projection[0], v.projection[1]
    assert start.mc == v.summary.available_mc
    assert stop.mc == v.summary.available_mc - v.funded_epochs * v.burn_mc_per_epoch
    assert 0 <= stop.mc < v.burn_mc_per_epoch
    assert v.history[-1].mc == v.summary.available_mc
    assert v.runway_words.startswith("about ")


def test_console_links_are_single_use_expire_and_store_only_a_hash(rt, clock) -> None:  # type: ignore[no-untyped-def]
    acct = account(rt)
    token, expires = console.create_console_link(rt.db, acct, minutes=15)
    assert token.startswith("wkc_") and expires == clock.now() + timedelta(minutes=15)
    from walkeep.db.models import ConsoleLink

    with rt.db.read() as s:
        stored = s.scalars(select(ConsoleLink.token_hash)).all()
    assert token not in stored and len(stored) == 1
    assert console.redeem_console_link(rt.db, token).account_id == acct
    with pytest.raises(Unauthorized):
        console.redeem_console_link(rt.db, token)  # used

    late, _ = console.create_console_link(rt.db, acct, minutes=15)
    clock.advance(15 * 60)
    with pytest.raises(Unauthorized):
        console.redeem_console_link(rt.db, late)  # expired
    admin, _ = console.create_console_link(rt.db, None, minutes=1)
    assert console.redeem_console_link(rt.db, admin).admin
    for bad in ("", "wkc_nope", "x" * 500):
        with pytest.raises(Unauthorized):
            console.redeem_console_link(rt.db, bad)
    with pytest.raises(NotFound):
        console.create_console_link(rt.db, "acct_nope", minutes=5)


def test_a_revoked_key_ends_its_console_sessions(rt) -> None:  # type: ignore[no-untyped-def]
    created = accounts.create_account(rt.db, "ops", credits_mc=0)
    key_id = accounts.authenticate(rt.db, created.api_key, TEST_MASTER_KEY_BYTES).key_id
    by_key = console.open_session(rt.db, created.account_id, hours=12, key_id=key_id)
    other = accounts.create_key(rt.db, created.account_id)
    other_id = accounts.authenticate(rt.db, other.api_key, TEST_MASTER_KEY_BYTES).key_id
    by_other = console.open_session(rt.db, created.account_id, hours=12, key_id=other_id)
    by_link = console.open_session(rt.db, created.account_id, hours=12)
    assert console.session_still_valid(rt.db, created.account_id, key_id, by_key)
    assert console.session_still_valid(rt.db, created.account_id, None, by_link)
    assert not console.session_still_valid(rt.db, created.account_id, None, None)
    accounts.revoke_key(rt.db, created.key_prefix)
    assert not console.session_still_valid(rt.db, created.account_id, key_id, by_key)
    # Issue 29: a session from a sign-in link ends with the account's keys too.
    assert not console.session_still_valid(rt.db, created.account_id, None, by_link)
    assert console.session_still_valid(rt.db, created.account_id, other_id, by_other)
    later = console.open_session(rt.db, created.account_id, hours=12)  # a new link works
    assert console.session_still_valid(rt.db, created.account_id, None, later)
    assert not console.session_still_valid(rt.db, "acct_nope", None, later)


def test_job_runs_are_upserted_by_the_worker_wrapper(rt, clock) -> None:  # type: ignore[no-untyped-def]
    from walkeep.scheduler.jobs import run_job

    run_job(rt, "sweep")
    clock.advance(60)
    run_job(rt, "sweep")
    with rt.db.read() as s:
        rows = s.scalars(select(JobRun)).all()
    assert [(r.name, r.ok, r.finished_at) for r in rows] == [("sweep", True, clock.now())]
    view = console.admin_view(rt, ["renew", "sweep"])
    jobs = {j.name: j for j in view.jobs}
    assert jobs["sweep"].ran and jobs["sweep"].ok and jobs["sweep"].last_ok_at == clock.now()
    assert not jobs["renew"].ran

    def boom(_rt):  # type: ignore[no-untyped-def]
        raise RuntimeError("chain down")

    from walkeep.scheduler import jobs as worker_jobs

    original = worker_jobs.JOBS["sweep"]
    worker_jobs.JOBS["sweep"] = (boom, original[1])
    try:
        clock.advance(60)
        with pytest.raises(RuntimeError):
            run_job(rt, "sweep")
    finally:
        worker_jobs.JOBS["sweep"] = original
    failed = {j.name: j for j in console.admin_view(rt).jobs}["sweep"]
    assert not failed.ok and failed.summary == "RuntimeError"
    assert failed.last_ok_at == clock.now() - timedelta(seconds=60)  # the last success stays


def test_admin_view_counts_renewals_per_day_and_open_holds(rt, clock) -> None:  # type: ignore[no-untyped-def]
    acct = account(rt, credits=100)
    store.store(rt, acct, content="kept", request_id="k1")
    store.store(rt, acct, content="in flight", request_id="k2")  # not landed: an open hold
    land_all(rt)
    store.store(rt, acct, content="still in flight", request_id="k3")
    clock.advance(epoch_seconds(rt) * 3)
    renew.renew(rt)
    v = console.admin_view(rt)
    today = clock.now().date().isoformat()
    assert v.days[-1].day == today and v.days[-1].renewals == 1 and v.days[-1].wal_frost > 0
    assert len(v.days) == console.ADMIN_DAYS
    assert v.open_holds == 1 and v.holds[0].ref.startswith("store:")
    assert [a.account_id for a in v.accounts] == [acct]


def test_worst_first_puts_lapsed_memories_above_a_healthy_account(rt, clock) -> None:  # type: ignore[no-untyped-def]
    """Regression (issue 30): an account whose memories had all lapsed has no runway
    left to compare and sorted below a healthy one. Lapsed (paid-for, not forgotten) and
    paused memories come first, then runway."""
    from walkeep.service.jobs import sweep
    from walkeep.service.tools import forget
    from walkeep.service.tools.runway import check_runway

    healthy = account(rt, credits=100, name="healthy")
    lapsing = account(rt, credits=2, name="lapsing")  # two stores, then nothing for renewals
    tidy = account(rt, credits=100, name="tidy")  # forgets its memory: lapsing is its choice
    for a, n in ((healthy, 2), (lapsing, 2), (tidy, 1)):
        for i in range(n):
            store.store(rt, a, content=f"{a} {i}", request_id=f"{a}-{i}")
    land_all(rt)
    (mid,) = [m.memory_id for m in check_runway(rt, tidy).memories]
    forget.forget(rt, tidy, memory_id=mid, request_id="tidy-forget")
    clock.advance(epoch_seconds(rt) * 3)
    renew.renew(rt)  # healthy renews; lapsing pauses
    clock.advance(epoch_seconds(rt) * 2)  # lapsing's paid runway runs out
    for swept in (False, True):
        if swept:
            sweep.sweep(rt)
        rows = console.account_summaries(rt)
        assert [r.name for r in rows] == ["lapsing", "healthy", "tidy"], swept
        by_name = {r.name: r for r in rows}
        assert by_name["lapsing"].lapsed == 2 and by_name["lapsing"].needs_action
        assert by_name["tidy"].lapsed == 0 and not by_name["tidy"].needs_action
        assert by_name["lapsing"].to_json()["lapsed"] == 2
    # Forgetting a lapsed memory acknowledges it: the account stops asking for action.
    for m in check_runway(rt, lapsing).memories:
        forget.forget(rt, lapsing, memory_id=m.memory_id, request_id=f"ack-{m.memory_id}")
    assert {r.name: r for r in console.account_summaries(rt)}["lapsing"].lapsed == 0


def test_sign_in_attempts_are_counted_across_web_processes(rt, settings, clock) -> None:  # type: ignore[no-untyped-def]
    """Issue 29: the throttle was kept per web process, so N processes allowed N x 10
    guesses a minute. Two Database objects stand for two processes on one database."""
    from walkeep.db import Database
    from walkeep.db.models import SignInAttempts
    from walkeep.service.jobs import sweep

    other = Database(settings.db_url, clock=clock)
    try:
        buckets = ["client:203.0.113.9:admin", "target:admin"]
        waits = []
        for i in range(12):
            db = rt.db if i % 2 else other
            waits.append(console.sign_in_wait(db, buckets[0]))
            if not waits[-1]:
                console.sign_in_failed(db, buckets)
        assert waits[:10] == [0] * 10 and all(w > 0 for w in waits[10:]), waits
        # Only this client is held up, and only for this kind of credential: another
        # client's admin sign-in, or this client's API keys, are not.
        assert console.sign_in_wait(other, "client:198.51.100.7:admin") == 0
        assert console.sign_in_wait(other, "client:203.0.113.9:key") == 0
        assert console.sign_in_failed(other, ["target:admin"]) == [11]  # still counted
        clock.advance(60)  # the next minute starts the counts anew
        assert console.sign_in_wait(rt.db, buckets[0]) == 0
        console.sign_in_failed(rt.db, ["client:198.51.100.8:key"])
    finally:
        other.dispose()
    with rt.db.read() as s:
        stored = s.scalars(select(SignInAttempts.bucket)).all()
    assert stored and not any("203.0.113.9" in b or "admin" in b for b in stored)  # hashed
    assert len(stored) == 3
    clock.advance(3600)  # the first minute's two rows are an hour old; the second's not yet
    assert sweep.sweep(rt).sign_in_rows_pruned == 2
    clock.advance(60)
    assert sweep.sweep(rt).sign_in_rows_pruned == 1
