"""The worker's promise: nothing lapses silently, nothing is paid or billed twice."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import func, insert, select, text, update

from tests.conftest import ON_PG
from tests.helpers import account, epoch_seconds, land_all, writes_in_order
from walkeep import ledger, pricing
from walkeep.db import Prepared
from walkeep.db.models import Account, Blob, LedgerEntry, Memory, Renewal, RenewalItem
from walkeep.errors import ConfigurationError
from walkeep.lifecycle import BlobStatus, MemoryStatus
from walkeep.service.jobs import reconcile, renew, sweep
from walkeep.service.jobs.renew import CrashForTest
from walkeep.service.operators import accounts
from walkeep.service.pipeline import upsert_blob
from walkeep.service.runtime import Runtime
from walkeep.service.tools import runway, store


def _store(rt: Runtime, a: str, content: str, rid: str) -> str:
    mid = store.store(rt, a, content=content, request_id=rid).memory_id
    land_all(rt)
    return mid


def _advance_epochs(rt: Runtime, clock, n: int) -> None:  # type: ignore[no-untyped-def]
    clock.advance(epoch_seconds(rt) * n)


def _view(rt: Runtime, a: str, mid: str):  # type: ignore[no-untyped-def]
    return runway.check_runway(rt, a, mid).memories[0]


def _renewal_price(rt: Runtime, storage_size: int, k: int) -> int:
    return pricing.renewal_cost_mc(storage_size, k, rt.settings.renewal_price_mc_per_unit_epoch)


def test_renews_early_at_the_threshold_and_bills_once(rt: Runtime, clock) -> None:  # type: ignore[no-untyped-def]
    a = account(rt, credits=10)
    mid = _store(rt, a, "Renew me early.", "r1")
    start = _view(rt, a, mid)
    assert start.runway_epochs == 5 and start.next_renewal_epoch == start.end_epoch - 2

    _advance_epochs(rt, clock, 2)  # runway 3: not yet due
    assert renew.renew(rt).transactions == 0
    _advance_epochs(rt, clock, 1)  # runway 2 == threshold: due now, not at the last epoch
    with rt.db.read() as s:
        before = ledger.balance(s, a)
        storage_size = s.scalar(select(Blob.storage_size))
    report = renew.renew(rt)
    assert report.transactions == 1 and report.blobs_renewed == 1

    v = _view(rt, a, mid)
    assert v.renewals_performed == 1
    assert v.end_epoch == start.end_epoch + 3 and v.runway_epochs == 5
    assert (
        v.last_renewal_tx and v.last_renewal_url and v.last_renewal_url.endswith(v.last_renewal_tx)
    )
    tx = rt.chain.get_transaction(v.last_renewal_tx)
    assert tx is not None and tx.success
    with rt.db.read() as s:  # the renewal record carries the URL an auditor opens
        assert s.scalar(select(Renewal.explorer_url)) == v.last_renewal_url
    assert [(e.old_end_epoch, e.new_end_epoch) for e in tx.extensions] == [
        (start.end_epoch, v.end_epoch)
    ]
    # The chain agrees with the registry.
    obj = rt.chain.get_blob(runway_blob_object(rt, mid))
    assert obj is not None and obj.end_epoch == v.end_epoch
    # Debited the renewal price exactly once.
    price = _renewal_price(rt, storage_size, 3)
    with rt.db.read() as s:
        after = ledger.balance(s, a)
        assert ledger.recompute(s, a) == after
    assert before.balance_mc - after.balance_mc == price and after.held_mc == 0
    assert renew.renew(rt).transactions == 0  # nothing due any more


def runway_blob_object(rt: Runtime, mid: str) -> str:
    with rt.db.read() as s:
        return s.scalar(
            select(Blob.blob_object_id)
            .join(Memory, Memory.blob_pk == Blob.id)
            .where(Memory.id == mid)
        )  # type: ignore[return-value]


def test_out_of_credits_pauses_then_a_top_up_resumes_without_anyone_acting(
    rt: Runtime, clock
) -> None:  # type: ignore[no-untyped-def]
    a = account(rt, credits=1)
    mid = _store(rt, a, "Keep me if you can.", "r1")  # spends the only credit
    _advance_epochs(rt, clock, 3)
    report = renew.renew(rt)
    assert report.transactions == 0 and report.paused_memories == 1
    v = _view(rt, a, mid)
    assert v.status == "paused" and v.runway_epochs == 2
    _advance_epochs(rt, clock, 1)
    assert _view(rt, a, mid).runway_epochs == 1  # paid runway keeps counting down, visibly
    summary = runway.check_runway(rt, a).account
    assert summary is not None and summary.paused == 1

    # credit → resume
    accounts.grant(
        rt.db, a, 100_000, reason="operator top-up", current_epoch=rt.chain.current_epoch()
    )
    assert _view(rt, a, mid).status == "active"
    assert renew.renew(rt).transactions == 1
    v = _view(rt, a, mid)
    assert v.status == "active" and v.renewals_performed == 1 and v.runway_epochs == 5


def test_resume_happens_in_the_renew_pass_too(rt: Runtime, clock) -> None:  # type: ignore[no-untyped-def]
    a = account(rt, credits=1)
    mid = _store(rt, a, "paused then funded", "r1")
    _advance_epochs(rt, clock, 3)
    renew.renew(rt)
    assert _view(rt, a, mid).status == "paused"
    # Credit arrives by a path that doesn't resume (e.g. a direct ledger credit).
    with rt.db.begin() as s:
        ledger.credit(s, a, 50_000, ref="manual-adjustment", kind=ledger.Kind.ADJUSTMENT)
    report = renew.renew(rt)
    assert report.resumed_memories == 1 and report.transactions == 1
    assert _view(rt, a, mid).status == "active"


def test_partial_funding_renews_what_it_can(rt: Runtime, clock) -> None:  # type: ignore[no-untyped-def]
    a = account(rt, credits=5)
    m1 = _store(rt, a, "first", "r1")
    m2 = _store(rt, a, "second", "r2")
    with rt.db.begin() as s:  # leave exactly one renewal's worth
        size = s.scalar(select(Blob.storage_size).limit(1))
        bal = ledger.balance(s, a).available_mc
        ledger.debit(s, a, bal - _renewal_price(rt, size, 3), ref="drain")
    _advance_epochs(rt, clock, 3)
    report = renew.renew(rt)
    assert report.blobs_renewed == 1 and report.paused_memories == 1
    assert sorted([_view(rt, a, m1).status, _view(rt, a, m2).status]) == ["active", "paused"]
    with rt.db.read() as s:
        assert ledger.balance(s, a).available_mc == 0


def test_forgotten_and_expired_blobs_are_never_renewed(rt: Runtime, clock) -> None:  # type: ignore[no-untyped-def]
    from walkeep.service.tools import forget

    a = account(rt, credits=10)
    mid = _store(rt, a, "forget me", "r1")
    forget.forget(rt, a, memory_id=mid, request_id="f1")
    _advance_epochs(rt, clock, 3)
    assert renew.renew(rt).transactions == 0
    _advance_epochs(rt, clock, 2)  # past end_epoch: lapsed
    report = sweep.sweep(rt)
    assert report.expired_memories == 1 and report.expired_blobs == 1
    assert _view(rt, a, mid).status == "expired"


def test_crash_between_submit_and_record_is_reconciled_once(rt: Runtime, clock) -> None:  # type: ignore[no-untyped-def]
    a = account(rt, credits=10)
    mid = _store(rt, a, "crash test", "r1")
    _advance_epochs(rt, clock, 3)
    end0 = _view(rt, a, mid).end_epoch

    def crash(_claim) -> None:  # type: ignore[no-untyped-def]
        raise CrashForTest("process died after the chain accepted the transaction")

    rt.extras["renew_hooks"] = {"after_submit": crash}
    with pytest.raises(CrashForTest):
        renew.renew(rt)
    rt.extras["renew_hooks"] = {}
    # The chain applied it; the registry doesn't know yet; the hold is still open.
    obj = rt.chain.get_blob(runway_blob_object(rt, mid))
    assert obj is not None and obj.end_epoch == end0 + 3
    assert _view(rt, a, mid).renewals_performed == 0
    assert (
        renew.renew(rt).transactions == 0
    )  # the blob is leased by the intent: no second extension

    assert reconcile.reconcile_renewals(rt).confirmed == 0  # still within the grace period
    clock.advance(reconcile.INTENT_GRACE_SECONDS + 1)
    assert reconcile.reconcile_renewals(rt).confirmed == 1
    assert reconcile.reconcile_renewals(rt).confirmed == 0  # exactly once
    v = _view(rt, a, mid)
    assert v.renewals_performed == 1 and v.end_epoch == end0 + 3
    assert rt.chain.get_blob(runway_blob_object(rt, mid)).end_epoch == end0 + 3  # type: ignore[union-attr]
    with rt.db.read() as s:
        captures = s.scalar(
            select(func.count())
            .select_from(LedgerEntry)
            .where(LedgerEntry.ref.like("renewal:%:capture"))
        )
        assert captures == 1
        assert ledger.balance(s, a).held_mc == 0
        assert ledger.recompute(s, a) == ledger.balance(s, a)


def test_crash_before_submit_releases_and_renews_later(rt: Runtime, clock) -> None:  # type: ignore[no-untyped-def]
    a = account(rt, credits=10)
    mid = _store(rt, a, "crash before submit", "r1")
    _advance_epochs(rt, clock, 3)
    end0 = _view(rt, a, mid).end_epoch
    with rt.db.read() as s:
        bal0 = ledger.balance(s, a)

    def crash(_claim) -> None:  # type: ignore[no-untyped-def]
        raise CrashForTest("process died before submitting")

    rt.extras["renew_hooks"] = {"before_submit": crash}
    with pytest.raises(CrashForTest):
        renew.renew(rt)
    rt.extras["renew_hooks"] = {}
    clock.advance(reconcile.INTENT_GRACE_SECONDS + 1)
    rep = reconcile.reconcile_renewals(rt)
    assert rep.abandoned == 1 and rep.confirmed == 0
    with rt.db.read() as s:
        assert ledger.balance(s, a) == bal0  # never billed for an extension that didn't happen
    assert rt.chain.get_blob(runway_blob_object(rt, mid)).end_epoch == end0  # type: ignore[union-attr]
    assert renew.renew(rt).transactions == 1
    assert _view(rt, a, mid).end_epoch == end0 + 3


def test_a_refused_transaction_releases_holds_and_backs_off(rt: Runtime, clock) -> None:  # type: ignore[no-untyped-def]
    a = account(rt, credits=10)
    mid = _store(rt, a, "refused once", "r1")
    _advance_epochs(rt, clock, 3)
    with rt.db.read() as s:
        bal0 = ledger.balance(s, a)
    rt.extras["faults"].fail_next_extends = 1
    report = renew.renew(rt)
    assert report.failed_transactions == 1 and report.transactions == 0
    with rt.db.read() as s:
        assert ledger.balance(s, a) == bal0
        assert s.scalar(select(Renewal.status)) == "failed"
    assert renew.renew(rt).transactions == 0  # backing off
    clock.advance(3600)
    assert renew.renew(rt).transactions == 1
    assert _view(rt, a, mid).renewals_performed == 1


def test_stale_holds_are_released_and_reported(rt: Runtime, clock) -> None:  # type: ignore[no-untyped-def]
    a = account(rt, credits=10)
    with rt.db.begin() as s:
        ledger.hold(s, a, 500, ref="store:mem_ghost:1")  # a hold whose store vanished
    clock.advance(rt.settings.stale_hold_seconds + 1)
    report = sweep.sweep(rt)
    assert report.stale_holds_released == 1 and report.stale_hold_refs == ["store:mem_ghost:1"]
    with rt.db.read() as s:
        assert ledger.balance(s, a).held_mc == 0


def _seed_due_blobs(rt: Runtime, n: int, accounts_n: int = 5, credits: int = 10_000) -> list[str]:
    """n live blobs on the local chain (end_epoch = current + 2) each held by one active
    memory, registered directly — this tests renewal, not the store path."""
    network = rt.extras["localnet"]
    owner = rt.chain.owner_address()
    now = rt.clock.now()
    accts = [account(rt, credits=credits) for _ in range(accounts_n)]
    with rt.db.begin() as s:
        for i in range(n):
            stored = network.store_blob(f"seed blob {i}".encode(), epochs=2, owner=owner)
            obj = stored.blob
            a = accts[i % accounts_n]
            blob = Blob(
                account_id=a,
                blob_id=obj.blob_id,
                blob_object_id=obj.blob_object_id,
                size_bytes=obj.size,
                storage_size=obj.storage_size,
                registered_epoch=obj.registered_epoch,
                end_epoch=obj.end_epoch,
                status=BlobStatus.LIVE,
                created_at=now,
                updated_at=now,
            )
            s.add(blob)
            s.flush()
            s.add(
                Memory(
                    id=f"mem_seed{i:06d}",
                    account_id=a,
                    namespace="default",
                    metadata_={},
                    size_bytes=obj.size,
                    content_hash=f"{i:064d}",
                    status=MemoryStatus.ACTIVE,
                    blob_pk=blob.id,
                    cost_mc=1000,
                    accepted_at=now,
                    deadline_at=now + timedelta(hours=1),
                    stored_at=now,
                    status_changed_at=now,
                )
            )
    return accts


WORKER_PROCESS = """
import json, os, sys
from datetime import datetime
from walkeep.bootstrap import build_runtime
from walkeep.clock import ManualClock
from walkeep.config import Settings
from walkeep.service.jobs import renew
rt = build_runtime(Settings(), clock=ManualClock(datetime.fromisoformat(os.environ["AT"])),
                   with_completer=False)
print("ready", flush=True)
sys.stdin.readline()  # start together
r = renew.renew(rt, worker=os.environ["WORKER"])
print(json.dumps({"transactions": r.transactions, "blobs": r.blobs_renewed}), flush=True)
"""


@pytest.mark.postgres
def test_two_worker_processes_on_postgres_renew_each_blob_exactly_once(
    rt: Runtime, settings, clock, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    import json
    import os
    import subprocess
    import sys

    accts = _seed_due_blobs(rt, 1000)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("WALKEEP_", "STRIPE_"))},
        "HOME": str(tmp_path),
        "WALKEEP_DATA_DIR": str(settings.data_dir),
        "WALKEEP_DATABASE_URL": settings.db_url,
        "WALKEEP_MASTER_KEY": settings.master_key,
        "WALKEEP_EMBEDDER": "hash",
        "WALKEEP_RENEW_BATCH": "50",
        "AT": clock.now().isoformat(),
    }
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER_PROCESS],
            env={**env, "WORKER": f"w{i}"},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    for p in procs:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    for p in procs:  # the barrier: both begin at once
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    reports = []
    for p in procs:
        out, _ = p.communicate(timeout=300)
        assert p.returncode == 0
        reports.append(json.loads(out.strip().splitlines()[-1]))
    assert all(r["transactions"] > 0 for r in reports), f"both workers took part: {reports}"
    total_blobs = sum(r["blobs"] for r in reports)
    total_txs = sum(r["transactions"] for r in reports)
    assert total_blobs == 1000
    assert 20 <= total_txs <= 22  # ceil(1000 / 50), give or take a short batch each

    with rt.db.read() as s:
        per_blob = list(
            s.execute(select(RenewalItem.blob_pk, func.count()).group_by(RenewalItem.blob_pk))
        )
        assert len(per_blob) == 1000 and {c for _, c in per_blob} == {1}
        assert s.scalar(select(func.min(Blob.renewals_performed))) == 1
        assert s.scalar(select(func.max(Blob.renewals_performed))) == 1
        captured = (
            s.scalar(select(func.sum(LedgerEntry.amount_mc)).where(LedgerEntry.kind == "capture"))
            or 0
        )
        billed = s.scalar(select(func.sum(Renewal.cost_mc)).where(Renewal.status == "confirmed"))
        digests = list(s.scalars(select(Renewal.digest).where(Renewal.status == "confirmed")))
        for a in accts:
            assert ledger.recompute(s, a) == ledger.balance(s, a)
        assert s.scalar(select(func.sum(Account.held_mc))) == 0
    # Ledger totals match the chain's effects.
    chain_blobs = 0
    chain_priced = 0
    for d in digests:
        tx = rt.chain.get_transaction(d)
        assert tx is not None and tx.success
        chain_blobs += len(tx.extensions)
        for e in tx.extensions:
            assert e.new_end_epoch - e.old_end_epoch == 3
            obj = rt.chain.get_blob(e.blob_object_id)
            assert obj is not None
            chain_priced += _renewal_price(rt, obj.storage_size, e.epochs)
    assert chain_blobs == 1000
    assert captured == billed == chain_priced


def test_sqlite_refuses_a_second_worker(rt: Runtime) -> None:
    from walkeep.scheduler.jobs import acquire_worker_lock

    if ON_PG:
        # PostgreSQL needs no process lock: workers claim rows with SKIP LOCKED.
        assert acquire_worker_lock(rt) is None
        return

    first = acquire_worker_lock(rt)
    assert first is not None
    try:
        with pytest.raises(ConfigurationError, match="another Walkeep worker is already running"):
            acquire_worker_lock(rt)
    finally:
        first.release()
    again = acquire_worker_lock(rt)
    assert again is not None
    again.release()


def test_reconcile_waits_while_a_lost_transaction_could_still_land(
    rt: Runtime, clock, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    a = account(rt, credits=10)
    _store(rt, a, "signed but lost", "r1")
    _advance_epochs(rt, clock, 3)

    def crash(_claim) -> None:  # type: ignore[no-untyped-def]
        raise CrashForTest("died before submitting")

    rt.extras["renew_hooks"] = {"before_submit": crash}
    with pytest.raises(CrashForTest):
        renew.renew(rt)
    rt.extras["renew_hooks"] = {}
    clock.advance(reconcile.INTENT_GRACE_SECONDS + 1)
    # Like a Sui transaction before its expiration epoch: it might still execute.
    monkeypatch.setattr(rt.chain, "can_still_land", lambda _tx: True)
    rep = reconcile.reconcile_renewals(rt)
    assert (rep.abandoned, rep.waiting) == (0, 1)
    with rt.db.read() as s:
        assert ledger.balance(s, a).held_mc > 0  # the hold stays until we know
    monkeypatch.setattr(rt.chain, "can_still_land", lambda _tx: False)
    assert reconcile.reconcile_renewals(rt).abandoned == 1
    with rt.db.read() as s:
        assert ledger.balance(s, a).held_mc == 0


@pytest.mark.postgres
def test_one_renewal_pass_per_wallet_where_the_chain_requires_it(
    rt: Runtime, clock, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    from sqlalchemy import text

    a = account(rt, credits=10)
    _store(rt, a, "single submitter", "r1")
    _advance_epochs(rt, clock, 3)
    monkeypatch.setattr(rt.chain, "single_submitter", True, raising=False)
    key = renew._wallet_lock_key(rt)
    with rt.db.engine.connect() as other:  # another worker is mid-pass
        assert other.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": key}).scalar()
        assert renew.renew(rt).transactions == 0
        other.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": key})
        other.commit()
    assert renew.renew(rt).transactions == 1


def test_a_second_process_renewing_with_the_same_wallet_waits_for_the_first(
    rt: Runtime, settings, clock, db
) -> None:  # type: ignore[no-untyped-def]
    """Issue 29: `walkeep smoke` beside a running server renews with the local network's
    one wallet too. Its batch was prepared against the gas coin version the server's
    batch was about to spend, and one of the two renewals was refused. Now each batch's
    prepare → execute holds the wallet's submitter lock, so the other pass waits."""
    import threading

    from walkeep.bootstrap import build_runtime

    a = account(rt, credits=10)
    b = account(rt, credits=10)
    _store(rt, a, "the server's tenant", "r1")
    _store(rt, b, "the smoke test's memory", "r2")
    _advance_epochs(rt, clock, 3)
    rt.settings.renew_batch = 1  # one blob per transaction: two batches to interleave
    smoke_rt = build_runtime(settings, clock=clock, database=db, with_completer=False)
    smoke_prepared = threading.Event()
    reports: list[renew.RenewReport] = []

    def smoke_hook(_claim) -> None:  # type: ignore[no-untyped-def]
        smoke_prepared.set()

    smoke_rt.extras["renew_hooks"] = {"before_submit": smoke_hook}
    smoke = threading.Thread(target=lambda: reports.append(renew.renew(smoke_rt)))

    def server_hook(_claim) -> None:  # type: ignore[no-untyped-def]
        if not smoke.is_alive() and not reports:
            smoke.start()
            # Without the lock the smoke pass prepares its batch at once (same gas
            # version); with it, it cannot until this batch has executed.
            smoke_prepared.wait(timeout=0.5)

    rt.extras["renew_hooks"] = {"before_submit": server_hook}
    server = renew.renew(rt)
    smoke.join(timeout=60)
    (smoke_report,) = reports
    assert server.failed_transactions == 0 and smoke_report.failed_transactions == 0
    assert server.blobs_renewed + smoke_report.blobs_renewed == 2
    with rt.db.read() as s:
        assert (
            s.scalar(select(func.count()).select_from(Renewal).where(Renewal.status == "confirmed"))
            == 2
        )


def test_paused_memories_do_not_flap_without_credits(rt: Runtime, clock) -> None:  # type: ignore[no-untyped-def]
    """Issue 29: memories.paused/memories.resumed flipped six times in 40 s with no
    top-up. Resuming took the *cheapest* paused blob as the bar, and a lapsed one (not
    swept yet) counted as one epoch: every pass resumed everything, and the claim paused
    the unaffordable blob again. Now a pass resumes only what the credits cover in full."""
    from walkeep.db.models import AlertEvent
    from walkeep.service import alerts

    a = accounts.create_account(rt.db, "flappy", credits_mc=2000 + 100).account_id
    alerts.set_alert_webhook(rt, a, "http://127.0.0.1:9/hook")
    _store(rt, a, "first, lapses while paused", "r1")
    _advance_epochs(rt, clock, 1)
    _store(rt, a, "second, due and unaffordable", "r2")
    _advance_epochs(rt, clock, 2)  # the first is due (runway 2): 189 mc > 100 available
    assert renew.renew(rt).paused_memories == 1
    _advance_epochs(rt, clock, 2)  # the first has lapsed, the second is due
    assert renew.renew(rt).paused_memories == 1
    for _ in range(4):  # passes with no credits arriving
        clock.advance(60)
        report = renew.renew(rt)
        assert (report.resumed_memories, report.paused_memories) == (0, 0)
    with rt.db.read() as s:
        events = s.scalars(select(AlertEvent.type).order_by(AlertEvent.created_at)).all()
    assert list(events) == ["memories.paused", "memories.paused"]
    # Credits arriving resume them at once (the other half of the rule).
    accounts.grant(
        rt.db, a, 50_000, reason="top up", ref="flap-grant", current_epoch=rt.chain.current_epoch()
    )
    with rt.db.read() as s:
        assert "memories.resumed" in s.scalars(select(AlertEvent.type)).all()


@pytest.mark.postgres
def test_a_sweep_racing_a_registration_is_conflict_free(
    rt: Runtime, settings, clock, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    """Issue 29: two web processes and two workers on PostgreSQL logged unique-key
    violations in completion and sweep. The sweep checked that an owned object was
    unknown, then inserted it as an orphan; a web process registering the same landed
    write in between made the sweep's transaction fail. Both now insert ON CONFLICT DO
    NOTHING (PostgreSQL only: SQLite has one writer, so the two cannot interleave)."""
    from walkeep import lifecycle
    from walkeep.db import Database
    from walkeep.service.jobs import completion

    a = account(rt, credits=10)
    net = rt.extras["localnet"]
    landed = net.store_blob(b"landing meanwhile", epochs=5, owner=net.server_address).blob
    real_row = lifecycle.blob_row
    raced: list[int] = []
    other = Database(settings.db_url, clock=clock)

    def registration_meanwhile(obj, *args, **kwargs):  # type: ignore[no-untyped-def]
        if not raced and obj.blob_object_id == landed.blob_object_id:
            raced.append(1)  # another process registers the write now, and commits
            with other.begin() as s:
                raced.append(completion.upsert_blob(s, a, obj, clock.now(), 2, live=True))
        return real_row(obj, *args, **kwargs)

    assert sweep.sweep(rt).orphans == 0  # first sighting: unknown, not yet an orphan
    clock.advance(sweep.ORPHAN_GRACE.total_seconds())
    monkeypatch.setattr(lifecycle, "blob_row", registration_meanwhile)
    try:
        report = sweep.sweep(rt)
    finally:
        other.dispose()
    assert len(raced) == 2 and report.orphans == 0
    with rt.db.read() as s:
        row = s.execute(
            select(Blob.account_id, Blob.status).where(Blob.blob_object_id == landed.blob_object_id)
        ).one()
    assert tuple(row) == (a, BlobStatus.LIVE)  # the registration's row, not an orphan


def test_a_write_landing_during_a_sweep_is_not_reported_as_an_orphan(
    rt: Runtime, clock, caplog
) -> None:  # type: ignore[no-untyped-def]
    """Issue 29: the sweep recorded a just-uploaded, not yet registered blob as an
    orphan (warning "recorded 1 orphan blobs") that its registration then adopted.
    An unknown object is recorded only once it stayed unknown for ORPHAN_GRACE."""
    import logging

    net = rt.extras["localnet"]
    landing = net.store_blob(b"landing now", epochs=5, owner=net.server_address).blob
    lost = net.store_blob(b"never registered", epochs=5, owner=net.server_address).blob
    with caplog.at_level(logging.WARNING, logger="walkeep.service.jobs.sweep"):
        assert sweep.sweep(rt).orphans == 0
    assert "orphan" not in caplog.text
    a = account(rt, credits=10)
    with rt.db.begin() as s:  # the landing write is registered a moment later
        upsert_blob(s, a, landing, clock.now(), 2, live=True)
    clock.advance(sweep.ORPHAN_GRACE.total_seconds() - 1)
    assert sweep.sweep(rt).orphans == 0  # not yet: the other one may still be landing
    clock.advance(1)
    assert sweep.sweep(rt).orphans == 1  # unknown for the whole grace: an orphan
    with rt.db.read() as s:
        rows = {o: st for o, st in s.execute(select(Blob.blob_object_id, Blob.status))}
    assert rows[landing.blob_object_id] == BlobStatus.LIVE
    assert rows[lost.blob_object_id] == BlobStatus.ORPHAN


def test_a_sweep_locks_lapsing_memories_before_their_accounts(rt: Runtime, clock) -> None:  # type: ignore[no-untyped-def]
    """Registration updates memories (and, by trigger, the account's memory_counts row)
    before it captures on the account row; renewal pauses before it holds. A sweep must
    take the same order, or a sweep and a registration for one account can deadlock on
    PostgreSQL. It used to release the account's bytes first."""
    from walkeep.service.tools import forget

    a = account(rt, credits=10)
    mid = _store(rt, a, "lapses unrenewed", "r1")
    forget.forget(rt, a, memory_id=mid, request_id="f1")  # still counts until it lapses
    _advance_epochs(rt, clock, 5)  # past end_epoch: lapsed
    reports: list[sweep.SweepReport] = []
    updated = writes_in_order(rt, lambda: reports.append(sweep.sweep(rt)))
    (report,) = reports
    assert report.expired_memories == 1
    assert "memories" in updated and "accounts" in updated, updated
    assert updated.index("memories") < updated.index("accounts"), updated
    with rt.db.read() as s:  # and the bytes were released all the same
        assert s.scalar(select(Account.usage_bytes).where(Account.id == a)) == 0


@pytest.mark.postgres
def test_the_due_scan_reads_blobs_alone_whatever_the_statistics(rt: Runtime, clock) -> None:  # type: ignore[no-untyped-def]
    """PostgreSQL: "does this blob hold an active memory?" is the blob's own count, so
    the due scan never touches memories, even when the planner's statistics predate a
    burst of inserts. As EXISTS it became a semi-join over every active memory, once per
    blob (auto_explain during bench/renew.py: 16-50 ms per batch, growing with the
    pass). And the count is right: the blobs are due, one without an active memory is
    not."""
    a = account(rt, credits=10)
    now = clock.now()
    with rt.db.begin() as s:
        s.execute(text("ANALYZE memories"))  # statistics of an (almost) empty table
        pks = s.scalars(
            insert(Blob).returning(Blob.id),
            [
                {
                    "account_id": a,
                    "blob_id": f"blob{i}",
                    "blob_object_id": f"0x{i:064x}",
                    "size_bytes": 10,
                    "storage_size": 1000,
                    "registered_epoch": 0,
                    "end_epoch": 2,
                    "status": BlobStatus.LIVE,
                    "created_at": now,
                    "updated_at": now,
                }
                for i in range(3000)
            ],
        ).all()
        s.execute(
            insert(Memory),
            [
                {
                    "id": f"mem_stats{i:05d}",
                    "account_id": a,
                    "namespace": "default",
                    "metadata_": {},
                    "size_bytes": 10,
                    "content_hash": f"{i:064d}",
                    "status": MemoryStatus.ACTIVE,
                    "blob_pk": pk,
                    "cost_mc": 1,
                    "attempt": 1,
                    "accepted_at": now,
                    "deadline_at": now,
                    "stored_at": now,
                    "status_changed_at": now,
                }
                for i, pk in enumerate(pks)
            ],
        )
    with rt.db.read() as s:
        conn = s.connection()
        sql, values = Prepared(renew._due_query(rt, 1, now, None)).bind(conn.dialect, {})
        (plan,) = conn.exec_driver_sql("EXPLAIN (FORMAT JSON) " + sql, values).scalar_one()

    def nodes(node: dict) -> list[dict]:  # type: ignore[type-arg]
        return [node, *(n for child in node.get("Plans", []) for n in nodes(child))]

    relations = {n["Relation Name"] for n in nodes(plan["Plan"]) if "Relation Name" in n}
    assert relations == {"blobs"}, plan

    with rt.db.begin() as s:
        s.execute(update(Memory).where(Memory.blob_pk == pks[0]).values(status=MemoryStatus.PAUSED))
    with rt.db.begin() as s:
        due = s.execute(renew._due_query(rt, 1, now, None)).all()
    assert len(due) == renew.batch_size(rt) and pks[0] not in {row.id for row in due}


def test_a_failed_record_stops_the_pass_before_the_next_batch_reaches_the_chain(
    rt: Runtime, clock, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    """Batch N is recorded on a thread while batch N+1 is claimed. If that record fails,
    the error surfaces before N+1 is submitted: N+1 is left an unsubmitted intent, as a
    crash before submit leaves one, and reconcile settles both — N (on chain) recorded
    and billed once, N+1 (never sent) released."""
    (a,) = _seed_due_blobs(rt, 4, accounts_n=1)
    monkeypatch.setattr(rt.settings, "renew_batch", 2)
    with rt.db.read() as s:
        before = ledger.balance(s, a)

    def lost_database(*_args, **_kwargs) -> bool:  # type: ignore[no-untyped-def]
        raise RuntimeError("the database went away mid-record")

    real_record = renew.record
    monkeypatch.setattr(renew, "record", lost_database)
    with pytest.raises(RuntimeError, match="mid-record"):
        renew.renew(rt)
    monkeypatch.setattr(renew, "record", real_record)

    with rt.db.read() as s:
        intents = s.execute(
            select(Renewal.digest, Renewal.cost_mc)
            .where(Renewal.status == "intent")
            .order_by(Renewal.id)
        ).all()
    assert len(intents) == 2
    first, second = intents
    assert rt.chain.get_transaction(first.digest) is not None  # batch 1 went to the chain
    assert rt.chain.get_transaction(second.digest) is None  # batch 2 never did

    clock.advance(reconcile.INTENT_GRACE_SECONDS + 1)
    rep = reconcile.reconcile_renewals(rt)
    assert (rep.confirmed, rep.abandoned) == (1, 1)
    with rt.db.read() as s:
        after = ledger.balance(s, a)
        assert after.held_mc == 0
        assert after.balance_mc == before.balance_mc - first.cost_mc  # batch 1, once
        assert ledger.recompute(s, a) == after
    assert renew.renew(rt).blobs_renewed == 2  # batch 2's blobs, on the next pass


@pytest.mark.postgres
def test_multi_account_holds_and_captures_lock_accounts_in_id_order(rt: Runtime) -> None:
    """A renewal batch's capture runs while the next batch's claim locks its accounts in
    id order: the capture must take the same order whatever plan PostgreSQL picks, or
    each could hold an account the other waits for. Here the second account's row comes
    first in the table and the planner may only scan it in table order; another
    transaction holds the first account. The capture must wait on the first account
    holding nothing, so that the other transaction can still lock the second."""
    import threading
    import time

    from sqlalchemy.exc import OperationalError

    a, b = sorted(account(rt, credits=10) for _ in range(2))
    with rt.db.begin() as s:
        for ref, acct in (("h:a", a), ("h:b", b)):
            ledger.hold(s, acct, 100, ref=ref)
        s.execute(update(Account).where(Account.id == a).values(name=Account.name))  # moves a's row
    done: list[object] = []

    def capture() -> None:
        try:
            with rt.db.begin() as s:
                s.execute(text("SET LOCAL enable_indexscan = off"))
                s.execute(text("SET LOCAL enable_bitmapscan = off"))
                done.extend(ledger.capture_many(s, [(a, "h:a"), (b, "h:b")]))
        except Exception as exc:  # reported by the assertion below
            done.append(exc)

    with rt.db.engine.connect() as other:
        other.execute(text("SELECT id FROM accounts WHERE id = :a FOR NO KEY UPDATE"), {"a": a})
        worker = threading.Thread(target=capture)
        worker.start()
        waiting = text(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        deadline = time.monotonic() + 30
        while not other.execute(waiting).scalar():  # until the capture waits on us
            assert worker.is_alive() and time.monotonic() < deadline, done
            other.execute(text("SELECT pg_stat_clear_snapshot()"))  # a fresh look each time
        try:
            other.execute(text("SET LOCAL lock_timeout = '5s'"))
            other.execute(text("SELECT id FROM accounts WHERE id = :b FOR NO KEY UPDATE"), {"b": b})
        except OperationalError as exc:
            pytest.fail(f"the capture held the second account while waiting: {exc}")
        finally:
            other.rollback()
        worker.join(30)
    assert len(done) == 2 and all(isinstance(e, ledger.Entry) for e in done), done


def test_a_pass_that_fails_mid_claim_still_waits_for_the_batch_being_recorded(
    rt: Runtime, monkeypatch, caplog
) -> None:  # type: ignore[no-untyped-def]
    """The next claim fails while batch 1 is being recorded: the pass ends with the
    claim's error, after the record — and a record that failed too is logged, not lost
    with its thread."""
    import logging

    _seed_due_blobs(rt, 4, accounts_n=1)
    monkeypatch.setattr(rt.settings, "renew_batch", 2)
    real_claim = renew._claim_batch
    claims: list[int] = []

    def second_claim_fails(*args, **kwargs):  # type: ignore[no-untyped-def]
        claims.append(1)
        if len(claims) == 2:
            raise RuntimeError("claim failed")
        return real_claim(*args, **kwargs)

    def record_fails(*_args, **_kwargs) -> bool:  # type: ignore[no-untyped-def]
        raise RuntimeError("record failed")

    monkeypatch.setattr(renew, "_claim_batch", second_claim_fails)
    monkeypatch.setattr(renew, "record", record_fails)
    with (
        caplog.at_level(logging.ERROR, logger="walkeep.service.jobs.renew"),
        pytest.raises(RuntimeError, match="claim failed"),
    ):
        renew.renew(rt)
    assert any("was not recorded" in r.getMessage() for r in caplog.records), caplog.text
