"""Exact apportionment of a quilt's cost, and ``walkeep verify`` checking it to the unit.

Issue 39: each member's share was rounded up and the sum rounded up again, so a quilt
whose members were all kept was billed 1 mc above the whole quilt, and ``walkeep verify``
answered MISMATCH on a renewal Walkeep had made itself. Here: the rule's arithmetic
(property-based), the README's scenario, random quilts through the real product on the
local network (verify PASSes every renewal it made, and FAILs each checked number edited
by ±1), and an upgraded deployment (renewals billed by the old rule stay as they were
and verify says what they were).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import func, select, update

from tests.helpers import account, epoch_seconds, land_all
from walkeep import pricing
from walkeep.clock import ManualClock
from walkeep.db import migrate as migrations
from walkeep.db.models import Blob, Memory, Renewal, RenewalItem
from walkeep.index.embedder import HashEmbedder
from walkeep.lifecycle import MemoryStatus
from walkeep.protocol.quilt import quilt_storage_size
from walkeep.protocol.walrus import encoded_blob_length, storage_units
from walkeep.service import digests
from walkeep.service.jobs import renew, sweep
from walkeep.service.operators import verify
from walkeep.service.runtime import Runtime
from walkeep.service.tools import forget, store

M = pricing.MICRO


# --- the rule's arithmetic ----------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=3_000_000), min_size=1, max_size=80))
def test_shares_sum_exactly_to_the_quilt_and_never_exceed_a_memory_alone(sizes: list[int]) -> None:
    storage = quilt_storage_size([max(1, s) for s in sizes])
    whole = storage_units(storage) * M
    shares = pricing.apportion_quilt_shares(storage, sizes)
    assert shares == pricing.apportion_quilt_shares(storage, sizes)  # deterministic
    alone = [storage_units(encoded_blob_length(s)) * M for s in sizes]
    weights = sizes if sum(sizes) else [1] * len(sizes)
    exact = [whole * w / sum(weights) for w in weights]
    uncapped = [min(whole * w // sum(weights) + 1, -(-whole * w // sum(weights))) for w in weights]
    for share, cap, e, most in zip(shares, alone, exact, uncapped, strict=True):
        assert 0 <= share <= cap  # packing never costs more than alone
        assert share <= most and (share == cap or share >= int(e))  # floor or floor + 1
    if all(s < c for s, c in zip(shares, alone, strict=True)):
        assert sum(shares) == whole  # no cap bit: EXACTLY the quilt
    assert sum(shares) <= whole


@settings(max_examples=300, deadline=None)
@given(
    units=st.integers(min_value=1, max_value=400),
    kept=st.lists(st.integers(min_value=0, max_value=10**9), max_size=30),
    epochs=st.integers(min_value=1, max_value=53),
    price=st.integers(min_value=0, max_value=50),
)
def test_a_renewal_bills_at_most_the_kept_part_and_all_kept_is_the_whole(
    units: int, kept: list[int], epochs: int, price: int
) -> None:
    whole = units * M
    total = min(sum(kept), whole)
    billed = pricing.share_renewal_cost_mc(total, epochs, price)
    assert billed * M <= total * epochs * price < (billed + 1) * M  # the exact part, floored
    assert pricing.share_renewal_cost_mc(whole, epochs, price) == units * epochs * price


# --- the README's scenario ------------------------------------------------------------------


def test_a_quilt_kept_whole_is_billed_the_whole_quilt_and_verify_passes(
    rt: Runtime, clock: ManualClock
) -> None:
    """The first renewal of a few small stores: 189 mc for a 63-unit quilt over 3 epochs
    (it was 190), and both audits end in OK."""
    acct = account(rt, credits=50)
    mids = [
        store.store(rt, acct, content=text, request_id=f"r{i}").memory_id
        for i, text in enumerate(["a", "bb two", "ccc three three", "dddd four four four four"])
    ]
    land_all(rt)
    with rt.db.read() as s:
        quilt = s.scalars(select(Blob)).one()
        shares = s.scalars(select(Memory.share_micro)).all()
    clock.advance(epoch_seconds(rt) * 3)
    report = renew.renew(rt)
    (digest,) = report.digests
    price = rt.settings.renewal_price_mc_per_unit_epoch
    full = pricing.renewal_cost_mc(quilt.storage_size, 3, price)
    audit = verify.verify_digest(rt, digest)
    assert audit.ok, [f.line() for f in audit.facts if not f.ok]
    assert report.captured_mc == full == 189
    for mid in mids:
        assert verify.verify_memory(rt, mid).ok
    assert {"call 0 cost", "call 0 shares"} <= {f.name for f in audit.facts}
    assert quilt.kind == "quilt" and sum(x or 0 for x in shares) == 63 * M


# --- random quilts through the product ------------------------------------------------------


def _world(
    rt: Runtime, clock: ManualClock, rng: random.Random, *, compact: bool, capped: bool
) -> None:
    """Stores of random sizes (some identical, some forgotten while storing) packed into
    quilts, forgets between renewal rounds, an account that runs dry so its memories lapse
    (expired); with ``compact`` a mostly-forgotten quilt re-packed, with ``capped`` a lone
    445 KB memory whose quilt (65 units) costs more than it would alone (63): the cap.
    Some memories expire a few epochs on (billed only for the epochs they need; their
    quilt never extended past the last one a live member needs) and some corrections
    supersede a kept memory (it stops renewing when the correction lands)."""
    s = rt.settings
    s.renewal_price_mc_per_unit_epoch = rng.choice([1, 2, 3, 7, 13])
    if compact or capped:
        # Big memories are minutes of MiniLM on a slow core; the hashed embedder is enough.
        rt.relayer.index.embedder = HashEmbedder()  # type: ignore[attr-defined]
    if compact:
        s.initial_epochs, s.renew_threshold_epochs, s.target_runway_epochs = 2, 1, 20
    rich, dry = account(rt, credits=5000), account(rt, credits=1)  # dry: the store alone
    if capped:
        s.max_memory_bytes = 500_000
        store.store(rt, account(rt, credits=100), content="c" * 445_000, request_id="capped")
    texts: list[str] = []
    kept: list[str] = []  # the rich account's memories without an expiry, to correct
    n = 0

    def put(acct: str, size: int) -> str:
        nonlocal n
        n += 1
        if texts and rng.random() < 0.15:
            text = rng.choice(texts)  # identical content: one patch
        else:
            text = f"{n} " + "x" * size
            texts.append(text)
        life: dict[str, Any] = {}
        if rng.random() < 0.3:  # matters only until a few epochs on
            info = rt.chain.epoch_info()
            assert info.started_at is not None
            ahead = rng.randint(0, 9) * info.duration_seconds + rng.randint(1, 3600)
            life["expires_at"] = info.started_at + timedelta(seconds=ahead)
            if life["expires_at"] <= rt.clock.now():
                life["expires_at"] = rt.clock.now() + timedelta(seconds=1)
        if kept and rng.random() < 0.15:  # corrects one of the account's kept memories
            life["supersedes"] = kept.pop(rng.randrange(len(kept)))
        mid = store.store(rt, acct, content=text, request_id=f"s{n}", **life).memory_id
        if acct == rich and "expires_at" not in life:
            kept.append(mid)
        if rng.random() < 0.15:  # forgotten while still storing
            forget.forget(rt, acct, memory_id=mid, request_id=f"fs{n}")
            if mid in kept:
                kept.remove(mid)
        return mid

    def forget_some(p: float) -> None:
        with rt.db.read() as sess:
            rows = sess.execute(
                select(Memory.id, Memory.account_id).where(Memory.status == MemoryStatus.ACTIVE)
            ).all()
        for mid, acct in rows:
            if rng.random() < p:
                forget.forget(rt, acct, memory_id=mid, request_id=f"f-{mid}")
                if mid in kept:
                    kept.remove(mid)

    big = 200_000 if compact else 0
    for _ in range(rng.randint(1, 9) if not compact else 8):
        put(rich, big or rng.randint(1, 3000))
    put(dry, rng.randint(1, 500))
    land_all(rt)
    if compact:
        forget_some(0.9)
    for _round in range(rng.randint(2, 3)):
        forget_some(0.2)
        for _ in range(rng.randint(0, 3)):
            put(rich, rng.randint(1, 3000))
        land_all(rt)
        clock.advance(epoch_seconds(rt) * (s.initial_epochs - s.renew_threshold_epochs))
        renew.renew(rt)
        land_all(rt)  # compaction's moves, if any
        sweep.sweep(rt)


def _numbers(rt: Runtime, digest: str) -> Iterator[tuple[Any, Any, int]]:
    """Every recorded number ``verify_digest`` checks for this renewal: (column, pk)."""
    with rt.db.read() as s:
        rid = s.scalar(select(Renewal.id).where(Renewal.digest == digest))
        yield Renewal.blob_count, Renewal.id, rid
        yield Renewal.cost_mc, Renewal.id, rid
        yield Renewal.wal_cost_frost, Renewal.id, rid
        items = s.execute(
            select(RenewalItem.id, RenewalItem.blob_pk, Blob.kind)
            .join(Blob, Blob.id == RenewalItem.blob_pk)
            .where(RenewalItem.renewal_id == rid)
        ).all()
    for item_id, blob_pk, kind in items:
        for col in (
            RenewalItem.epochs,
            RenewalItem.old_end_epoch,
            RenewalItem.new_end_epoch,
            RenewalItem.cost_mc,
        ):
            yield col, RenewalItem.id, item_id
        if kind == "quilt":
            yield RenewalItem.share_micro, RenewalItem.id, item_id
            yield RenewalItem.unbilled_micro, RenewalItem.id, item_id
            yield Blob.share_micro, Blob.id, blob_pk


@contextmanager
def _edited(rt: Runtime, col: Any, pk_col: Any, pk: int, delta: int) -> Iterator[None]:
    with rt.db.begin() as s:
        s.execute(update(col.table).where(pk_col == pk).values({col.key: col + delta}))
    try:
        yield
    finally:
        with rt.db.begin() as s:
            s.execute(update(col.table).where(pk_col == pk).values({col.key: col - delta}))


@pytest.mark.parametrize("seed", range(8))
def test_verify_passes_every_renewal_of_random_quilts_and_fails_each_edited_number(
    rt: Runtime, clock: ManualClock, seed: int
) -> None:
    rng = random.Random(seed)
    _world(rt, clock, rng, compact=seed == 0, capped=seed == 1)
    with rt.db.read() as s:
        digests = s.scalars(select(Renewal.digest).where(Renewal.status == "confirmed")).all()
        audited = s.scalars(
            select(Memory.id).where(Memory.blob_pk.in_(select(RenewalItem.blob_pk)))
        ).all()
        statuses = set(s.scalars(select(Memory.status)).all())
        quilt_items = s.scalar(
            select(func.count())
            .select_from(RenewalItem)
            .join(Blob, Blob.id == RenewalItem.blob_pk)
            .where(Blob.kind == "quilt")
        )
    assert digests and quilt_items
    if seed == 0:  # the compaction world: a quilt was re-packed and its copy renewed
        with rt.db.read() as s:
            assert s.scalar(select(func.count()).select_from(Blob).where(Blob.kind == "quilt")) > 1
    if seed == 1:  # the cap bit: the quilt's apportioned shares are below its units
        with rt.db.read() as s:
            assert s.scalar(
                select(func.count())
                .select_from(Blob)
                .where(Blob.share_micro < func.ceil(Blob.storage_size / 1048576.0) * M)
            )
    assert MemoryStatus.EXPIRED in statuses or seed == 0  # the dry account's memories lapsed
    for digest in digests:
        audit = verify.verify_digest(rt, digest)
        assert audit.ok, (digest, [f.line() for f in audit.facts if not f.ok])
    for mid in audited:
        audit = verify.verify_memory(rt, mid)
        assert audit.ok, (mid, [f.line() for f in audit.facts if not f.ok])

    # Each number verify checks, edited by one either way, fails the audit.
    for digest in digests:
        for col, pk_col, pk in _numbers(rt, digest):
            for delta in (1, -1):
                with _edited(rt, col, pk_col, pk, delta):
                    failed = [f.line() for f in verify.verify_digest(rt, digest).facts if not f.ok]
                assert failed, f"{col} {delta:+d} on renewal {digest} went unnoticed"
    for mid in audited[:3]:
        with rt.db.read() as s:
            blob_pk = s.scalar(select(Memory.blob_pk).where(Memory.id == mid))
        for col in (Blob.end_epoch, Blob.renewals_performed, Blob.storage_size):
            for delta in (1, -1):
                with _edited(rt, col, Blob.id, blob_pk, delta):
                    assert not verify.verify_memory(rt, mid).ok, f"{col} {delta:+d} unnoticed"


# --- an upgraded deployment ------------------------------------------------------------------


def _old_share(storage: int, payload: int, patch: int) -> int:
    """The rule before exact apportionment: each share rounded up, capped alone."""
    units = storage_units(storage)
    proportional = -(-units * M * patch // max(payload, patch, 1))
    return min(proportional, storage_units(encoded_blob_length(patch)) * M)


def _migrate_again(rt: Runtime) -> None:
    """Down to the revision before exact apportionment and up again: what upgrading a
    deployment that ran the old rule does to its data."""
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(migrations.alembic_config(rt.settings.db_url))
    (mine,) = [r for r in script.walk_revisions() if r.path.endswith("_exact_quilt_shares.py")]
    assert isinstance(mine.down_revision, str)
    rt.db.engine.dispose()  # no pooled connection keeps a plan of the old columns
    key = digests.master_key(rt)  # 0022 opens and seals namespaces and metadata with it
    migrations.downgrade(rt.settings.db_url, mine.down_revision, master_key=key)
    migrations.upgrade(rt.settings.db_url, master_key=key)
    rt.db.engine.dispose()


def test_an_upgrade_keeps_old_renewals_and_verify_says_which_rule_billed_them(
    rt: Runtime, clock: ManualClock
) -> None:
    acct = account(rt, credits=50)
    texts = ["a", "bb two", "ccc three three", "dddd four four four four"]
    mids = [
        store.store(rt, acct, content=t, request_id=f"r{i}").memory_id for i, t in enumerate(texts)
    ]
    land_all(rt)
    clock.advance(epoch_seconds(rt) * 3)
    (old_digest,) = renew.renew(rt).digests
    # Make every figure what the rule before would have recorded: shares rounded up one
    # by one (ciphertext = text + 21 bytes), and the renewal billed their sum rounded up.
    with rt.db.begin() as s:
        quilt = s.scalars(select(Blob)).one()
        rows = {m.id: m for m in s.scalars(select(Memory).where(Memory.id.in_(mids)))}
        sizes = {mid: len(t.encode()) + 21 for mid, t in zip(mids, texts, strict=True)}
        payload = sum(sizes.values())
        old = {mid: _old_share(quilt.storage_size, payload, size) for mid, size in sizes.items()}
        for mid, share in old.items():
            rows[mid].share_micro = share
        item = s.scalars(select(RenewalItem)).one()
        price = rt.settings.renewal_price_mc_per_unit_epoch
        item.cost_mc = -(-sum(old.values()) * item.epochs * price // M)
        s.execute(update(Renewal).values(cost_mc=item.cost_mc))
    assert sum(old.values()) > 63 * M and item.cost_mc == 190  # the bug, as it was

    _migrate_again(rt)
    with rt.db.read() as s:
        new = dict(s.execute(select(Memory.id, Memory.share_micro)).all())
        quilt = s.scalars(select(Blob)).one()
        old_item = s.scalars(select(RenewalItem)).one()
    assert sum(new.values()) == quilt.share_micro == 63 * M  # re-apportioned exactly
    assert all(new[m] <= old[m] for m in mids)  # no share rose
    assert (old_item.cost_mc, old_item.share_micro, old_item.unbilled_micro) == (190, None, None)

    audit = verify.verify_digest(rt, old_digest)
    assert audit.ok, [f.line() for f in audit.facts if not f.ok]
    (cost,) = [f for f in audit.facts if f.name == "call 0 cost"]
    assert "rule before exact apportionment" in cost.detail and "1 mc above it" in cost.detail

    # The first renewal after the upgrade: the whole quilt, exactly, checked to the unit.
    clock.advance(epoch_seconds(rt) * 3)
    (digest,) = renew.renew(rt).digests
    audit = verify.verify_digest(rt, digest)
    assert audit.ok, [f.line() for f in audit.facts if not f.ok]
    with rt.db.read() as s:
        rid = s.scalar(select(Renewal.id).where(Renewal.digest == digest))
        assert s.scalar(select(Renewal.cost_mc).where(Renewal.id == rid)) == 189
    assert verify.verify_digest(rt, old_digest).ok  # still: it came first
    for mid in mids:
        assert verify.verify_memory(rt, mid).ok

    # A renewal recorded without its shares AFTER exact apportionment began is no old
    # renewal: it fails, whatever it billed.
    clock.advance(epoch_seconds(rt) * 3)
    (third,) = renew.renew(rt).digests
    with rt.db.begin() as s:
        s.execute(
            update(RenewalItem)
            .where(
                RenewalItem.renewal_id
                == select(Renewal.id).where(Renewal.digest == third).scalar_subquery()
            )
            .values(share_micro=None, unbilled_micro=None)
        )
    failed = [f for f in verify.verify_digest(rt, third).facts if not f.ok]
    assert [f.name for f in failed] == ["call 0 cost"]
    assert "came after exact apportionment began" in failed[0].detail
    assert verify.verify_digest(rt, digest).ok and verify.verify_digest(rt, old_digest).ok


def test_a_quilt_landed_from_a_write_recorded_before_the_upgrade_bills_the_whole_at_most(
    rt: Runtime, clock: ManualClock
) -> None:
    """A quilt written before the upgrade but registered after it has no apportioned total
    and its members' shares were rounded up (they sum above the quilt): its renewal bills
    at most the whole quilt, exactly, and verifies."""
    acct = account(rt, credits=50)
    texts = ["a", "bb two", "ccc three three", "dddd four four four four"]
    mids = [
        store.store(rt, acct, content=t, request_id=f"r{i}").memory_id for i, t in enumerate(texts)
    ]
    land_all(rt)
    with rt.db.begin() as s:
        quilt = s.scalars(select(Blob)).one()
        quilt.share_micro = None
        sizes = [len(t.encode()) + 21 for t in texts]
        for mid, size in zip(mids, sizes, strict=True):
            s.execute(
                update(Memory)
                .where(Memory.id == mid)
                .values(share_micro=_old_share(quilt.storage_size, sum(sizes), size))
            )
        assert sum(_old_share(quilt.storage_size, sum(sizes), n) for n in sizes) > 63 * M
    clock.advance(epoch_seconds(rt) * 3)
    report = renew.renew(rt)
    assert report.captured_mc == 189  # the whole quilt, not 190
    audit = verify.verify_digest(rt, report.digests[0])
    assert audit.ok, [f.line() for f in audit.facts if not f.ok]
    (shares,) = [f for f in audit.facts if f.name == "call 0 shares"]
    assert "its units stand in" in shares.detail
