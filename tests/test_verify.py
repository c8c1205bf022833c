"""``walkeep verify``: every renewal the worker made checks out against the chain's own bytes,
and any altered record (or unknown digest) fails, naming the fact."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import select, update

from tests.helpers import account, epoch_seconds, land_all
from walkeep.clock import ManualClock
from walkeep.config import Settings
from walkeep.db.models import Blob, Memory, Renewal, RenewalItem
from walkeep.errors import NotFound
from walkeep.scheduler.jobs import run_job
from walkeep.service.operators import verify
from walkeep.service.runtime import Runtime
from walkeep.service.tools import store


def _renewed_world(rt: Runtime, clock: ManualClock) -> tuple[list[str], list[str]]:
    """Two accounts, a few memories, three renewal rounds by the worker's job."""
    mids = []
    for n, acct in enumerate([account(rt, credits=50), account(rt, credits=50)]):
        for i in range(3):
            mids.append(
                store.store(rt, acct, content=f"memory {n}-{i}", request_id=f"r{n}-{i}").memory_id
            )
    land_all(rt)
    digests: list[str] = []
    for _ in range(3):
        clock.advance(epoch_seconds(rt) * 3)
        digests += run_job(rt, "renew").digests
    assert len(digests) >= 3
    return digests, mids


def _failed(report: verify.VerifyReport) -> list[str]:
    return [f.name for f in report.facts if not f.ok]


def test_every_renewal_the_worker_made_verifies(rt: Runtime, clock: ManualClock) -> None:
    digests, mids = _renewed_world(rt, clock)
    for digest in digests:
        report = verify.verify_digest(rt, digest)
        assert report.ok, [f.line() for f in report.facts if not f.ok]
        names = {f.name for f in report.facts}
        # The facts the brief asks for are all there, per call.
        assert {"digest", "sender", "effects status", "recorded bytes", "call count"} <= names
        for suffix in ("package", "function", "System object", "blob object", "epochs"):
            assert f"call 0 {suffix}" in names
        assert "call 0 end epoch" in names
    for mid in mids:
        report = verify.verify_memory(rt, mid)
        assert report.ok, [f.line() for f in report.facts if not f.ok]
        assert len(report.digests) == 3  # renewed every round
        assert any(f.name.endswith("continuity") for f in report.facts)


def test_altered_records_and_unknown_digests_fail_naming_the_fact(
    rt: Runtime, clock: ManualClock
) -> None:
    digests, _mids = _renewed_world(rt, clock)
    digest = digests[0]
    with rt.db.begin() as s:
        renewal_id = s.scalar(select(Renewal.id).where(Renewal.digest == digest))
        first_item = s.scalar(
            select(RenewalItem.id)
            .where(RenewalItem.renewal_id == renewal_id)
            .order_by(RenewalItem.id)
            .limit(1)
        )
        s.execute(
            update(RenewalItem)
            .where(RenewalItem.id == first_item)
            .values(new_end_epoch=RenewalItem.new_end_epoch + 1)
        )
    assert _failed(verify.verify_digest(rt, digest)) == ["call 0 end epoch"]

    # Point the second item at another blob object: the blob-object fact fails.
    other = digests[1]
    with rt.db.begin() as s:
        rid = s.scalar(select(Renewal.id).where(Renewal.digest == other))
        blob_pks = s.scalars(
            select(RenewalItem.blob_pk)
            .where(RenewalItem.renewal_id == rid)
            .order_by(RenewalItem.id)
        ).all()
        s.execute(
            update(RenewalItem)
            .where(RenewalItem.renewal_id == rid, RenewalItem.blob_pk == blob_pks[1])
            .values(blob_pk=blob_pks[0])
        )
    failed = _failed(verify.verify_digest(rt, other))
    assert "call 1 blob object" in failed

    # The recorded epochs are what the chain was asked for.
    third = digests[-1]
    with rt.db.begin() as s:
        rid = s.scalar(select(Renewal.id).where(Renewal.digest == third))
        s.execute(update(RenewalItem).where(RenewalItem.renewal_id == rid).values(epochs=9))
    assert "call 0 epochs" in _failed(verify.verify_digest(rt, third))

    unknown = verify.verify_digest(rt, "4XQHFa9S324wTzYHF3vsBSwpUZuLpmwTHYMFv9nsttSs")
    assert not unknown.ok and _failed(unknown) == ["renewal record"]

    # A memory whose history contains the altered renewal fails too.
    with rt.db.read() as s:
        blob_pk = s.scalar(select(RenewalItem.blob_pk).where(RenewalItem.id == first_item))
        mid = s.scalar(select(Memory.id).where(Memory.blob_pk == blob_pk).limit(1))
    assert mid is not None and not verify.verify_memory(rt, mid).ok
    with pytest.raises(NotFound):
        verify.verify_memory(rt, "mem_nope")


def test_a_record_whose_blob_end_epoch_was_altered_fails_the_memory_audit(
    rt: Runtime, clock: ManualClock
) -> None:
    _digests, mids = _renewed_world(rt, clock)
    with rt.db.begin() as s:
        blob_pk = s.scalar(select(Memory.blob_pk).where(Memory.id == mids[0]))
        s.execute(update(Blob).where(Blob.id == blob_pk).values(end_epoch=Blob.end_epoch + 5))
    assert _failed(verify.verify_memory(rt, mids[0])) == ["end epoch"]


@pytest.mark.parametrize("which", ["last", "middle"])
def test_a_renewal_item_moved_to_another_blob_fails_both_memory_audits(
    rt: Runtime, clock: ManualClock, which: str
) -> None:
    """Issue 29: ``--memory`` must notice a renewal record moved to another blob. The
    blob row's own count of renewals (what ``check_runway`` reports) and its last renewal
    digest are checked against the renewals recorded for it."""
    _digests, mids = _renewed_world(rt, clock)
    with rt.db.begin() as s:
        mine, theirs = (s.scalar(select(Memory.blob_pk).where(Memory.id == m)) for m in mids[::3])
        assert mine != theirs
        items = s.scalars(
            select(RenewalItem.id).where(RenewalItem.blob_pk == mine).order_by(RenewalItem.id)
        ).all()
        assert len(items) == 3
        moved = items[-1] if which == "last" else items[1]
        s.execute(update(RenewalItem).where(RenewalItem.id == moved).values(blob_pk=theirs))
    assert "renewal count" in _failed(verify.verify_memory(rt, mids[0]))
    assert "renewal count" in _failed(verify.verify_memory(rt, mids[3]))


def _cli(args: list[str], settings: Settings, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("WALKEEP_", "STRIPE_"))},
        "HOME": str(tmp_path),
        "WALKEEP_DATA_DIR": str(settings.data_dir),
        "WALKEEP_DATABASE_URL": settings.db_url,
        "WALKEEP_MASTER_KEY": settings.master_key or "",
        "WALKEEP_EMBEDDER": "hash",
    }
    return subprocess.run(
        [sys.executable, "-m", "walkeep.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_cli_prints_one_line_per_fact_and_exits_non_zero_on_a_mismatch(
    rt: Runtime, clock: ManualClock, settings: Settings, tmp_path: Path
) -> None:
    digests, mids = _renewed_world(rt, clock)
    ok = _cli(["verify", digests[0]], settings, tmp_path)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    lines = ok.stdout.strip().splitlines()
    assert all(line.startswith("PASS ") for line in lines[:-1]) and lines[-1].startswith("OK")
    assert any(line.startswith("PASS digest") for line in lines)

    as_json = _cli(["verify", "--memory", mids[0], "--json"], settings, tmp_path)
    assert as_json.returncode == 0, as_json.stderr
    data = json.loads(as_json.stdout)
    assert data["ok"] is True and data["subject"] == mids[0] and len(data["digests"]) == 3

    with rt.db.begin() as s:
        rid = s.scalar(select(Renewal.id).where(Renewal.digest == digests[0]))
        s.execute(
            update(RenewalItem)
            .where(RenewalItem.renewal_id == rid)
            .values(old_end_epoch=RenewalItem.old_end_epoch - 1)
        )
    bad = _cli(["verify", digests[0]], settings, tmp_path)
    assert bad.returncode == 1
    assert "FAIL call 0 end epoch" in bad.stdout and "MISMATCH" in bad.stdout
    assert "Traceback" not in bad.stderr

    usage = _cli(["verify"], settings, tmp_path)
    assert usage.returncode == 1 and "exactly one of" in usage.stderr


def test_a_memory_audit_shows_its_own_calls_and_counts_the_batchs_others(
    rt: Runtime, clock: ManualClock
) -> None:
    """Issue 30: `verify --memory` printed every call of every batch (~70 lines for one
    memory). Its own blob's calls are listed; the rest of a batch is one counted fact,
    and a failure among them is still listed by name."""
    digests, mids = _renewed_world(rt, clock)
    with rt.db.read() as s:
        object_id = s.scalar(
            select(Blob.blob_object_id)
            .join(Memory, Memory.blob_pk == Blob.id)
            .where(Memory.id == mids[0])
        )
    report = verify.verify_memory(rt, mids[0])
    assert report.ok
    blob_facts = [f for f in report.facts if f.name.endswith(" blob object")]
    assert len(blob_facts) == 3 and all(
        f.detail.startswith(f"chain {object_id},") for f in blob_facts
    )
    others = [f for f in report.facts if f.name.endswith("other calls")]
    assert len(others) == 3 and all("call(s) for other blobs" in f.detail for f in others)
    # A mismatch in another blob's call of the batch still fails the audit, by name.
    with rt.db.begin() as s:
        rid = s.scalar(select(Renewal.id).where(Renewal.digest == digests[0]))
        s.execute(
            update(RenewalItem)
            .where(
                RenewalItem.renewal_id == rid,
                RenewalItem.blob_pk
                != select(Blob.id).where(Blob.blob_object_id == object_id).scalar_subquery(),
            )
            .values(epochs=9)
        )
    failed = _failed(verify.verify_memory(rt, mids[0]))
    assert any(name.endswith("other calls") for name in failed)
    assert any(name.endswith(" epochs") for name in failed)


def test_verify_of_something_that_is_no_digest_says_so(
    rt: Runtime, settings: Settings, tmp_path: Path
) -> None:
    """Issue 30: `walkeep verify hello` printed a FAIL as if Walkeep had lost a renewal."""
    from walkeep.errors import ValidationError

    with pytest.raises(ValidationError, match="not a transaction digest"):
        verify.verify_digest(rt, "hello")
    out = _cli(["verify", "hello"], settings, tmp_path)
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.startswith("walkeep: error: 'hello' is not a transaction digest")


def test_the_money_side_is_verified_too(settings: Settings, clock: ManualClock, db) -> None:  # type: ignore[no-untyped-def]
    """Issue 29: verify checked the chain side only; a renewal billed at the wrong price,
    a wrong blob count or a WAL figure that disagrees with the chain went unnoticed."""
    from walkeep.bootstrap import build_runtime

    settings.quilts = "off"  # a plain blob: its item must cost exactly price × units × epochs
    rt = build_runtime(settings, clock=clock, database=db, with_completer=False)
    acct = account(rt, credits=50)
    store.store(rt, acct, content="alone in its blob", request_id="solo")
    land_all(rt)
    clock.advance(epoch_seconds(rt) * 3)
    (digest,) = run_job(rt, "renew").digests
    report = verify.verify_digest(rt, digest)
    assert report.ok, [f.line() for f in report.facts if not f.ok]
    names = {f.name for f in report.facts}
    assert {"blob count", "billed", "call 0 cost", "WAL cost"} <= names
    with rt.db.read() as s:
        kind = s.scalar(select(Blob.kind).join(Memory, Memory.blob_pk == Blob.id))
    assert kind == "blob"

    with rt.db.begin() as s:
        rid = s.scalar(select(Renewal.id).where(Renewal.digest == digest))
        s.execute(
            update(RenewalItem)
            .where(RenewalItem.renewal_id == rid)
            .values(cost_mc=RenewalItem.cost_mc + 1)
        )
    assert _failed(verify.verify_digest(rt, digest)) == ["billed", "call 0 cost"]
    with rt.db.begin() as s:
        s.execute(
            update(Renewal)
            .where(Renewal.id == rid)
            .values(cost_mc=Renewal.cost_mc + 1, blob_count=2, wal_cost_frost=1)
        )
    assert _failed(verify.verify_digest(rt, digest)) == ["blob count", "call 0 cost", "WAL cost"]


def test_a_quilt_item_billed_above_its_kept_shares_fails(rt: Runtime, clock: ManualClock) -> None:
    digests, _mids = _renewed_world(rt, clock)
    digest = digests[0]
    assert "call 0 cost" in {f.name for f in verify.verify_digest(rt, digest).facts}
    with rt.db.begin() as s:
        rid = s.scalar(select(Renewal.id).where(Renewal.digest == digest))
        s.execute(update(RenewalItem).where(RenewalItem.renewal_id == rid).values(cost_mc=10**9))
    failed = _failed(verify.verify_digest(rt, digest))
    assert "call 0 cost" in failed and "billed" in failed
    with rt.db.begin() as s:
        n = len(s.scalars(select(RenewalItem.id).where(RenewalItem.renewal_id == rid)).all())
        s.execute(update(Renewal).where(Renewal.id == rid).values(cost_mc=10**9 * n))
    failed = _failed(verify.verify_digest(rt, digest))
    assert "billed" not in failed  # the sum agrees again…
    assert [f"call {i} cost" for i in range(n)] == failed  # …each share exceeds its quilt
