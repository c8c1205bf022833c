"""check_runway's account summary (issue 14): exact counts kept by database triggers,
and an answer equal to counting and sorting every memory, however the memories are
spread over statuses and runway buckets. Runs on SQLite and PostgreSQL."""

from __future__ import annotations

import random
from collections import Counter
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import delete, insert, select, text, update

from tests.helpers import account, epoch_seconds, land_all
from walkeep.db.models import Blob, Memory, MemoryCounts
from walkeep.lifecycle import LISTED, BlobStatus, MemoryStatus
from walkeep.service import sealed
from walkeep.service.jobs import completion, renew, sweep
from walkeep.service.runtime import Runtime
from walkeep.service.tools import forget, runway, store
from walkeep.service.tools.schemas import NamespaceCounts, RunwayResult, RunwaySummary

COUNTED = {
    MemoryStatus.ACTIVE: "active",
    MemoryStatus.PAUSED: "paused",
    MemoryStatus.NO_RENEW: "no_renew",
    MemoryStatus.EXPIRED: "expired",
}
ID_CHARS = "0123456789abcdefghjkmnpqrstvwxyz"


def recount(rt: Runtime) -> dict[str, dict[str, int]]:
    """Every account's memories per counted status, by counting the rows."""
    out: dict[str, dict[str, int]] = {}
    with rt.db.read() as s:
        for acct, status, n in s.execute(
            select(Memory.account_id, Memory.status, text("count(*)"))
            .where(Memory.status.in_(list(COUNTED)))
            .group_by(Memory.account_id, Memory.status)
        ):
            out.setdefault(acct, {})[COUNTED[MemoryStatus(status)]] = int(n)
    return out


def kept_counts(rt: Runtime) -> dict[str, dict[str, int]]:
    """What the triggers keep in memory_counts (zero columns left out, like recount)."""
    with rt.db.read() as s:
        rows = s.scalars(select(MemoryCounts)).all()
    out = {r.account_id: {c: getattr(r, c) for c in COUNTED.values()} for r in rows}
    return {
        a: {c: n for c, n in cols.items() if n} for a, cols in out.items() if any(cols.values())
    }


BLOB_COLUMNS = {
    MemoryStatus.ACTIVE: "active_memories",
    MemoryStatus.PAUSED: "paused_memories",
    MemoryStatus.NO_RENEW: "no_renew_memories",
}


def blob_recount(rt: Runtime) -> dict[int, dict[str, int]]:
    """Every blob's memories per kept status, by counting the rows."""
    out: dict[int, dict[str, int]] = {}
    with rt.db.read() as s:
        for blob_pk, status, n in s.execute(
            select(Memory.blob_pk, Memory.status, text("count(*)"))
            .where(Memory.blob_pk.is_not(None), Memory.status.in_(list(BLOB_COLUMNS)))
            .group_by(Memory.blob_pk, Memory.status)
        ):
            out.setdefault(blob_pk, {})[BLOB_COLUMNS[MemoryStatus(status)]] = int(n)
    return out


def blob_counts(rt: Runtime) -> dict[int, dict[str, int]]:
    """What the triggers keep on each blob (zero columns left out, like blob_recount)."""
    cols = [getattr(Blob, c) for c in BLOB_COLUMNS.values()]
    with rt.db.read() as s:
        rows = s.execute(select(Blob.id, *cols)).all()
    out = {
        r[0]: {c: n for c, n in zip(BLOB_COLUMNS.values(), r[1:], strict=True) if n} for r in rows
    }
    return {pk: cols for pk, cols in out.items() if cols}


def assert_exact(rt: Runtime) -> None:
    assert kept_counts(rt) == recount(rt)
    assert blob_counts(rt) == blob_recount(rt)


def brute_force(rt: Runtime, account_id: str, only: str | None = None) -> RunwayResult:
    """The summary as check_runway computed it before issue 14: every listed memory of
    the account (of namespace ``only``, given) with its blob, viewed, counted and sorted
    in Python; the namespaces too."""
    current = rt.chain.current_epoch()
    where = [Memory.account_id == account_id, Memory.status.in_(list(LISTED))]
    if only is not None:
        where.append(Memory.namespace == sealed.namespace_token(rt, account_id, only))
    with rt.db.read() as s:
        rows = s.execute(
            select(Memory, Blob).outerjoin(Blob, Blob.id == Memory.blob_pk).where(*where)
        ).all()
    views = [runway._view(rt, m, b, current) for m, b in rows]
    shown = Counter(v.status for v in views)
    names = sealed.namespace_names(rt, account_id, {m.namespace for m, _ in rows})
    per: dict[str, Counter[str]] = {}
    for (m, _), v in zip(rows, views, strict=True):
        per.setdefault(names[m.namespace], Counter())[v.status] += 1
    spaces = sorted(
        (
            NamespaceCounts(
                namespace=name,
                total_memories=c.total(),
                active=c["active"],
                paused=c["paused"],
                no_renew=c["no-renew"],
            )
            for name, c in per.items()
        ),
        key=lambda n: (-n.total_memories, n.namespace),
    )
    alive = [
        v.runway_epochs
        for v in views
        if v.runway_epochs is not None and v.status in ("active", "paused")
    ]
    views.sort(key=lambda v: (v.runway_epochs is None, v.runway_epochs or 0, v.memory_id))
    return RunwayResult(
        current_epoch=current,
        memories=views[: runway.SUMMARY_LIST_MAX],
        account=RunwaySummary(
            total_memories=len(views),
            active=shown["active"],
            paused=shown["paused"],
            no_renew=shown["no-renew"],
            min_runway_epochs=min(alive) if alive else None,
            namespaces=spaces[: runway.NAMESPACES_MAX],
            more_namespaces=max(0, len(spaces) - runway.NAMESPACES_MAX),
        ),
    )


NAMESPACES = ("default", "work", "patient-é")


def _namespaces_add_up(got: RunwayResult) -> None:
    """With no more than NAMESPACES_MAX namespaces, they sum to the account's totals."""
    assert got.account is not None and got.account.more_namespaces == 0
    for field in ("total_memories", "active", "paused", "no_renew"):
        want = getattr(got.account, field)
        assert sum(getattr(n, field) for n in got.account.namespaces) == want, field


def _store(rt: Runtime, a: str, content: str, rid: str) -> str:
    return store.store(rt, a, content=content, request_id=rid).memory_id


# --- the counters, through the service --------------------------------------------------


def test_counts_stay_exact_through_a_memorys_whole_life(rt: Runtime, clock) -> None:  # type: ignore[no-untyped-def]
    """store → land → forget → pause → resume → lapse → sweep, and a failed write
    retried: after every step the kept counts equal a recount, and the summary equals
    brute force (also between the lapse and the sweep)."""
    a, b = account(rt, credits=2), account(rt, credits=100)

    def check() -> None:
        assert_exact(rt)
        for acct in (a, b):
            assert runway.check_runway(rt, acct) == brute_force(rt, acct)

    m1 = _store(rt, a, "first", "r1")
    m2 = _store(rt, a, "second", "r2")
    _store(rt, b, "other account", "r1")
    check()  # storing: not in memory_counts (a store's claim never writes there)
    assert a not in kept_counts(rt)
    land_all(rt)
    check()
    assert kept_counts(rt)[a] == {"active": 2}

    forget.forget(rt, a, memory_id=m1, request_id="f1")
    check()
    assert kept_counts(rt)[a] == {"active": 1, "no_renew": 1}

    rt.relayer.fail_next_jobs = 1  # type: ignore[attr-defined]
    failed = _store(rt, b, "fails once", "r2")
    assert completion.settle(rt, failed) == completion.Outcome.FAILED
    check()
    assert kept_counts(rt)[b] == {"active": 1}  # failed is not counted
    assert _store(rt, b, "fails once", "r2") == failed  # retried: failed → storing
    check()
    assert kept_counts(rt)[b] == {"active": 1}
    land_all(rt)

    # a's credits went on its two stores: at the threshold its active memory pauses.
    clock.advance(epoch_seconds(rt) * 3)
    assert renew.renew(rt).paused_memories == 1
    check()
    assert kept_counts(rt)[a] == {"paused": 1, "no_renew": 1}
    summary = runway.check_runway(rt, a).account
    assert summary is not None and (summary.paused, summary.no_renew) == (1, 1)

    # Past end_epoch, before the sweep: shown expired, counted out of paused/no-renew.
    clock.advance(epoch_seconds(rt) * 3)
    check()
    summary = runway.check_runway(rt, a).account
    assert summary is not None
    assert (summary.total_memories, summary.active, summary.paused, summary.no_renew) == (
        2,
        0,
        0,
        0,
    )
    assert kept_counts(rt)[a] == {"paused": 1, "no_renew": 1}  # the sweep hasn't run
    sweep.sweep(rt)
    check()
    assert kept_counts(rt)[a] == {"expired": 2}
    assert {v.memory_id for v in runway.check_runway(rt, a).memories} == {m1, m2}


# --- the triggers, row by row (paths the service only takes in bulk or not yet) ----------


def _memory_row(
    account_id: str,
    status: str,
    blob_pk: int | None,
    mid: str,
    now: datetime,
    namespace: str = "default",
) -> dict[str, Any]:
    return {
        "id": mid,
        "account_id": account_id,
        "namespace": namespace,
        "metadata_": {},
        "size_bytes": 10,
        "content_hash": mid.ljust(64, "0")[:64],
        "status": status,
        "blob_pk": blob_pk,
        "blob_id": f"b{blob_pk}" if blob_pk else None,
        "cost_mc": 1000,
        "accepted_at": now,
        "deadline_at": now + timedelta(hours=1),
        "status_changed_at": now,
    }


def test_every_trigger_insert_update_delete_keeps_counts_exact(rt: Runtime) -> None:
    """Each trigger on its own (a missing or wrong one fails here): a counted insert,
    a bulk status change across two accounts in ONE statement, an update that leaves
    the status alone, deletes, and a rolled-back change."""
    a, b = account(rt), account(rt)
    rows = [
        _memory_row(acct, status, None, f"mem_t{acct[-6:]}{i:04d}", rt.clock.now())
        for acct in (a, b)
        for i, status in enumerate(
            ["active"] * 3 + ["paused", "no-renew", "expired", "storing", "accepting", "failed"]
        )
    ]
    with rt.db.begin() as s:
        s.execute(insert(Memory), rows)
    assert_exact(rt)
    assert kept_counts(rt)[a] == {
        "active": 3,
        "paused": 1,
        "no_renew": 1,
        "expired": 1,
    }

    with rt.db.begin() as s:  # one statement, both accounts, several transitions
        s.execute(
            update(Memory)
            .where(Memory.status.in_(["active", "accepting", "failed"]))
            .values(status="paused")
        )
    assert_exact(rt)
    assert kept_counts(rt)[a]["paused"] == 6

    with rt.db.begin() as s:  # not a status change: nothing moves
        s.execute(update(Memory).values(namespace="other"))
        s.execute(update(Memory).where(Memory.status == "paused").values(status="paused"))
    assert_exact(rt)

    with rt.db.begin() as s:
        s.execute(delete(Memory).where(Memory.account_id == a, Memory.status == "paused"))
    assert_exact(rt)
    assert "paused" not in kept_counts(rt)[a]

    with pytest.raises(RuntimeError), rt.db.begin() as s:
        s.execute(update(Memory).values(status="expired"))
        s.execute(delete(Memory).where(Memory.account_id == b))
        raise RuntimeError("roll back")
    assert_exact(rt)

    with rt.db.begin() as s:
        s.execute(delete(Memory))
    assert kept_counts(rt) == {} == recount(rt)


def _blobs(rt: Runtime, account_id: str, n: int) -> list[int]:
    now = rt.clock.now()
    with rt.db.begin() as s:
        return list(
            s.scalars(
                insert(Blob).returning(Blob.id, sort_by_parameter_order=True),
                [
                    {
                        "account_id": account_id,
                        "blob_id": f"trig{account_id[-6:]}{i}",
                        "blob_object_id": f"0xtrig{account_id[-6:]}{i}",
                        "size_bytes": 10,
                        "storage_size": 1000,
                        "registered_epoch": 0,
                        "end_epoch": 10,
                        "status": BlobStatus.LIVE,
                        "created_at": now,
                        "updated_at": now,
                    }
                    for i in range(n)
                ],
            )
        )


def test_every_trigger_keeps_each_blobs_counts_exact(rt: Runtime) -> None:
    """The per-blob counts (migration 0013), trigger by trigger: memories inserted onto
    blobs, one statement changing statuses across blobs, memories moved to another
    blob (as compaction re-packs them) and off any blob, an update that changes
    neither, deletes, and a rolled-back change."""
    a = account(rt)
    p1, p2, p3 = _blobs(rt, a, 3)
    now = rt.clock.now()
    plan = [(p1, "active")] * 4 + [(p1, "paused"), (p1, "storing"), (p2, "no-renew")]
    plan += [(p2, "active"), (p2, "expired"), (p3, "failed"), (None, "active")]
    rows = [_memory_row(a, st, pk, f"mem_blob{i:04d}", now) for i, (pk, st) in enumerate(plan)]
    with rt.db.begin() as s:
        s.execute(insert(Memory), rows)
    assert_exact(rt)
    assert blob_counts(rt) == {
        p1: {"active_memories": 4, "paused_memories": 1},
        p2: {"active_memories": 1, "no_renew_memories": 1},
    }

    with rt.db.begin() as s:  # one statement, two blobs, several transitions
        s.execute(
            update(Memory)
            .where(Memory.status.in_(["active", "storing", "failed"]))
            .values(status="paused")
        )
    assert_exact(rt)
    assert blob_counts(rt)[p1] == {"paused_memories": 6}

    with rt.db.begin() as s:  # re-packed: p1's memories move to p3, one leaves any blob
        s.execute(update(Memory).where(Memory.blob_pk == p1).values(blob_pk=p3))
        s.execute(update(Memory).where(Memory.id == "mem_blob0007").values(blob_pk=None))
    assert_exact(rt)
    assert p1 not in blob_counts(rt) and blob_counts(rt)[p3] == {"paused_memories": 7}

    with rt.db.begin() as s:  # status and blob in one change; and a change of neither
        s.execute(
            update(Memory).where(Memory.id == "mem_blob0000").values(blob_pk=p2, status="no-renew")
        )
        s.execute(update(Memory).values(namespace="other"))
    assert_exact(rt)

    with rt.db.begin() as s:
        s.execute(delete(Memory).where(Memory.blob_pk == p3, Memory.status == "paused"))
    assert_exact(rt)

    with pytest.raises(RuntimeError), rt.db.begin() as s:
        s.execute(update(Memory).values(status="active", blob_pk=p1))
        raise RuntimeError("roll back")
    assert_exact(rt)

    with rt.db.begin() as s:
        s.execute(delete(Memory))
    assert blob_counts(rt) == {} == blob_recount(rt)


# --- the summary against brute force, over shapes chosen to take every path ---------------


def _seed(rt: Runtime, account_id: str, plan: list[tuple[str, int | None, str]], seed: int) -> None:
    """Insert memories by (status, end_epoch relative to now or None, blob kind):
    kind "blob" gives each its own blob; any other kind packs the memories sharing
    (kind, end, blob status) into one quilt. A "lapsed" status is a kept memory on a
    live blob past its end_epoch (the sweep not run yet)."""
    rng = random.Random(seed)
    current = rt.chain.current_epoch()
    now = rt.clock.now()
    spaces = [sealed.remember_namespace(rt, account_id, n) for n in NAMESPACES]
    quilts: dict[tuple[str, int | None, str], int] = {}
    memories = []
    with rt.db.begin() as s:
        for status, rel_end, kind in plan:
            mid = "mem_" + "".join(rng.choices(ID_CHARS, k=26))
            blob_pk = None
            if rel_end is not None:
                blob_status = BlobStatus.EXPIRED if status == "expired" else BlobStatus.LIVE
                key = (kind, rel_end, blob_status)
                if kind == "blob" or key not in quilts:
                    blob_pk = s.execute(
                        insert(Blob).returning(Blob.id),
                        {
                            "account_id": account_id,
                            "blob_id": mid,
                            "blob_object_id": "0x" + mid,
                            "size_bytes": 10,
                            "storage_size": 1000,
                            "registered_epoch": current - 5,
                            "end_epoch": current + rel_end,
                            "status": blob_status,
                            "kind": "blob" if kind == "blob" else "quilt",
                            "renewals_performed": rng.randint(0, 3),
                            "created_at": now,
                            "updated_at": now,
                        },
                    ).scalar_one()
                    if kind != "blob":
                        quilts[key] = blob_pk
                blob_pk = quilts.get(key, blob_pk)
            real = rng.choice(["active", "paused", "no-renew"]) if status == "lapsed" else status
            ns = spaces[int(mid[-1], 36) % len(spaces)]  # spread without touching rng
            memories.append(_memory_row(account_id, real, blob_pk, mid, now, ns))
        s.execute(insert(Memory), memories)


def _plan(**groups: int) -> list[tuple[str, int | None, str]]:
    """Shorthand: ``active_3=50`` is 50 active memories on blobs ending in 3 epochs."""
    plan: list[tuple[str, int | None, str]] = []
    for name, n in groups.items():
        status, _, rest = name.partition("_")
        status = {"norenew": "no-renew"}.get(status, status)
        if status == "storing":
            plan += [("storing", None, "blob")] * n
            continue
        end, _, kind = rest.partition("_")
        rel = -int(end[1:]) if end.startswith("m") else int(end)
        plan += [(status, rel, kind or "blob")] * n
    return plan


SHAPES = {
    # few memories: everything fits in the list, with a storing tail
    "small": _plan(active_3=5, paused_1=2, norenew_2=2, storing=3, expired_m2=1, lapsed_0=1),
    # many expired and lapsed: the list is all runway 0, by memory_id
    "history": _plan(expired_m3=150, lapsed_0=40, lapsed_m1_q=30, active_4=60),
    # one huge bucket after a small one: the id-ordered walk fills the list
    "tied": _plan(paused_1=10, active_5=500, active_5_q=300, norenew_5=40, expired_m1=5),
    # the last bucket needed is too small for the walk to fill: it is read whole
    "small-bucket": _plan(active_1=60, active_2=60, active_5=1000, storing=5),
    # small buckets (ties inside quilts), the last one cut, read whole
    "spread": _plan(active_1_q=30, active_2=30, paused_3_q=30, norenew_4=30, active_6=300),
    # a big sweep backlog: its smallest ids found by the walk
    "backlog-big": _plan(lapsed_0=400, lapsed_m2_q=10, active_6=500, expired_m3=3),
    # a small backlog is read whole; the list continues into the paid buckets
    "backlog-small": _plan(lapsed_0=8, expired_m4=12, active_2=200, active_2_q=200, storing=2),
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_summary_equals_brute_force(rt: Runtime, clock, shape: str) -> None:  # type: ignore[no-untyped-def]
    clock.advance(epoch_seconds(rt) * 10)  # room below the current epoch for the past
    a, other = account(rt), account(rt)
    _seed(rt, a, SHAPES[shape], seed=len(shape))
    _seed(rt, other, _plan(active_1=30, lapsed_0=10, expired_m1=10), seed=1)
    assert_exact(rt)
    got, want = runway.check_runway(rt, a), brute_force(rt, a)
    assert got.account == want.account
    assert [m.memory_id for m in got.memories] == [m.memory_id for m in want.memories]
    assert got == want
    assert len(got.memories) == min(runway.SUMMARY_LIST_MAX, len(SHAPES[shape]))
    _namespaces_add_up(got)
    for name in NAMESPACES:  # a key confined to one namespace sees it alone
        assert runway.check_runway(rt, a, confined_to=name) == brute_force(rt, a, only=name)


@pytest.mark.parametrize("seed", range(6))
def test_summary_equals_brute_force_on_random_shapes(
    rt: Runtime,
    clock,  # type: ignore[no-untyped-def]
    seed: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Random mixes with a shorter list, so every group boundary falls somewhere."""
    rng = random.Random(seed)
    monkeypatch.setattr(runway, "SUMMARY_LIST_MAX", rng.choice([7, 20, 50]))
    clock.advance(epoch_seconds(rt) * 10)
    a = account(rt)
    kinds = ["blob", "blob", "q1", "q2"]
    plan: list[tuple[str, int | None, str]] = []
    for _ in range(rng.randint(30, 250)):
        status = rng.choice(["active"] * 6 + ["paused", "no-renew", "expired", "lapsed", "storing"])
        if status == "storing":
            plan.append((status, None, "blob"))
        elif status == "expired":
            plan.append((status, -rng.randint(1, 3), rng.choice(kinds)))
        elif status == "lapsed":
            plan.append((status, -rng.randint(0, 1), rng.choice(kinds)))
        else:
            plan.append((status, rng.choice([1, 2, 2, 5, 5, 5, 9]), rng.choice(kinds)))
    _seed(rt, a, plan, seed=seed)
    got = runway.check_runway(rt, a)
    assert got == brute_force(rt, a)
    _namespaces_add_up(got)
    name = NAMESPACES[seed % len(NAMESPACES)]
    assert runway.check_runway(rt, a, confined_to=name) == brute_force(rt, a, only=name)


def test_unknown_or_empty_account_summary(rt: Runtime) -> None:
    a = account(rt)
    res = runway.check_runway(rt, a)
    assert res == brute_force(rt, a)
    assert res.account == RunwaySummary(
        total_memories=0, active=0, paused=0, no_renew=0, min_runway_epochs=None
    )
    assert runway.check_runway(rt, "acct_nobody") == brute_force(rt, "acct_nobody")


def test_namespaces_largest_first_ties_by_name_and_the_rest_counted(
    rt: Runtime,
    clock,  # type: ignore[no-untyped-def]
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """More namespaces than the list holds: the largest, ties by name, and how many more;
    names shown as stored, never as tokens."""
    monkeypatch.setattr(runway, "NAMESPACES_MAX", 3)
    a = account(rt)
    sizes = {"zeta": 3, "alpha": 2, "beta": 2, "gamma": 2, "delta": 1}
    for name, n in sizes.items():
        for i in range(n):
            store.store(rt, a, content=f"{name} {i}", request_id=f"{name}-{i}", namespace=name)
    land_all(rt)
    summary = runway.check_runway(rt, a).account
    assert summary is not None
    assert [(n.namespace, n.total_memories) for n in summary.namespaces] == [
        ("zeta", 3),
        ("alpha", 2),
        ("beta", 2),
    ]
    assert summary.more_namespaces == 2
    assert runway.check_runway(rt, a) == brute_force(rt, a)
