"""check_runway's account summary at 1,000,000 memories on PostgreSQL.

Seeds one account with N memories (and 4 other accounts with ``--others``
memories in all, so the account is not the whole table) by COPY, not through
the service: plain blobs and 500-patch quilts; mostly active, 5% paused, 3%
forgotten (no-renew), 0.1% still storing, 40 expired by the sweep and 20
lapsed since the last sweep (kept, on a live blob past its end_epoch), so
the 100 most at-risk reach into the still-paid memories. The count triggers
(``memory_counts`` per account, each blob's own counts) run during the COPY, as
they would in production.
Then, for each layout of the still-paid blobs' end epochs,

- ``spread``: uniform over the next 53 epochs (53 runway buckets of ~18,000);
- ``renewed``: what renewal passes leave: active blobs at current + 5, blobs
  holding paused memories ran down to + 1..2 (buckets of ~15,000 and ~900,000);
- ``tied``: every paid blob at current + 5: one bucket of ~970,000, ties broken
  by memory_id (the hard case for "the 100 most at-risk");
- ``backlog``: ``renewed`` right after an epoch boundary, the sweep not run yet:
  the ~50,000 paused memories' blobs have lapsed and are reported expired,

it times ``check_runway(rt, account)`` (median and max of ``--calls`` calls after
a warm-up) against the 100 ms target, and checks the answer against brute force
in SQL: a COUNT … GROUP BY over the account's memories and their blobs (whose
time is printed as the reference this replaces), the minimum runway, and the
100 most at-risk by ORDER BY over all of them.

    python bench/summary.py [--memories 1000000] [--others 200000] [--calls 20]
                            [--layouts spread,renewed,tied,backlog] [--db-url URL]
                            [--namespaces 50]

The account's memories are spread over ``--namespaces`` namespaces, which the summary
counts one by one (``account.namespaces``); the check also asserts they add up to the
account's totals.

Without ``--db-url`` a scratch database is created on ``--pg-server``
(postgresql+psycopg://postgres@127.0.0.1:5432/test) and dropped afterwards.
Target (issue 14): under 100 ms on PostgreSQL at 1,000,000 memories.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path

from sqlalchemy import text

from walkeep import ids
from walkeep.bootstrap import build_runtime
from walkeep.clock import ManualClock
from walkeep.config import Settings
from walkeep.db import Database
from walkeep.db import migrate as migrations
from walkeep.lifecycle import LISTED, BlobStatus, MemoryStatus
from walkeep.service.operators import accounts
from walkeep.service.runtime import Runtime
from walkeep.service.tools import runway

sys.path.insert(0, str(Path(__file__).resolve().parent))
from load import scratch_database

TARGET_MS = 100.0
QUILT_PATCHES = 500
DEFAULT_SERVER = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
# The account's memories in each state: a share of N, or a count (the rest are active).
MIX: dict[str, float | int] = {
    MemoryStatus.PAUSED: 0.05,
    MemoryStatus.NO_RENEW: 0.03,
    MemoryStatus.STORING: 0.001,
    MemoryStatus.EXPIRED: 40,
    "lapsed": 20,  # kept, on a live blob past its end_epoch: the sweep hasn't run yet
}
LAYOUTS = ("spread", "renewed", "tied", "backlog")


def seed(
    rt: Runtime,
    account_id: str,
    n: int,
    rng: random.Random,
    next_blob: int,
    namespaces: int = 1,
) -> int:
    """COPY ``n`` memories of one account and their blobs, spread over ``namespaces``
    namespaces (Zipf-like: the first holds the most); returns the next free blob id."""
    spaces = [f"ns-{i:04d}" for i in range(namespaces)]
    weights = [1 / (i + 1) for i in range(namespaces)]
    current = rt.chain.current_epoch()
    now = rt.clock.now()
    kinds: list[str] = []
    for state, share in MIX.items():
        kinds += [state] * (share if isinstance(share, int) else int(n * share))
    kinds += [MemoryStatus.ACTIVE] * (n - len(kinds))
    rng.shuffle(kinds)
    blobs: list[tuple[object, ...]] = []
    memories: list[tuple[object, ...]] = []
    quilt: dict[str, tuple[int, int]] = {}  # state -> (blob id, members so far)

    def new_blob(state: str, kind: str, patches: int | None) -> int:
        nonlocal next_blob
        bid = next_blob
        next_blob += 1
        if state == MemoryStatus.EXPIRED:
            end, status = current - rng.randint(1, 20), BlobStatus.EXPIRED
        elif state == "lapsed":
            end, status = current - rng.randint(0, 1), BlobStatus.LIVE
        else:
            end, status = current + rng.randint(1, 53), BlobStatus.LIVE
        blobs.append(
            (
                bid,
                account_id,
                f"{'lapsed' if state == 'lapsed' else 'blob'}{bid:016d}",
                f"0x{bid:064x}",
                1000,
                66_000_000,
                current - 10,
                end,
                status,
                kind,
                patches,
                now,
                now,
            )
        )
        return bid

    for state in kinds:
        mid = ids.new_memory_id()
        if state == MemoryStatus.STORING:
            blob_pk, status = None, MemoryStatus.STORING
        else:
            status = (
                rng.choice([MemoryStatus.ACTIVE, MemoryStatus.PAUSED, MemoryStatus.NO_RENEW])
                if state == "lapsed"
                else state
            )
            if rng.random() < 0.3:  # packed into a quilt shared with same-state memories
                bid, members = quilt.get(state, (0, QUILT_PATCHES))
                if members >= QUILT_PATCHES:
                    bid, members = new_blob(state, "quilt", QUILT_PATCHES), 0
                quilt[state] = (bid, members + 1)
                blob_pk = bid
            else:
                blob_pk = new_blob(state, "blob", None)
        memories.append(
            (
                mid,
                account_id,
                rng.choices(spaces, weights)[0] if namespaces > 1 else "default",
                "{}",
                1000,
                secrets.token_hex(32),
                str(status),
                blob_pk,
                f"blob{blob_pk:016d}" if blob_pk else None,
                1000,
                now,
                now,
                now,
            )
        )
    raw = rt.db.engine.raw_connection()
    try:
        cur = raw.cursor()
        copies = (
            (
                "COPY blobs (id, account_id, blob_id, blob_object_id, size_bytes, storage_size, "
                "registered_epoch, end_epoch, status, kind, patch_count, created_at, updated_at) "
                "FROM STDIN",
                blobs,
            ),
            (
                "COPY memories (id, account_id, namespace, metadata, size_bytes, content_hash, "
                "status, blob_pk, blob_id, cost_mc, accepted_at, deadline_at, status_changed_at) "
                "FROM STDIN",
                memories,
            ),
        )
        for statement, rows in copies:
            with cur.copy(statement) as cp:  # type: ignore[attr-defined]
                for row in rows:
                    cp.write_row(row)
        cur.execute("SELECT setval(pg_get_serial_sequence('blobs', 'id'), %s)", (next_blob,))
        raw.commit()
    finally:
        raw.close()
    return next_blob


def lay_out(rt: Runtime, account_id: str, layout: str) -> None:
    """Move the account's still-paid blobs to ``layout``'s end epochs (see the module doc)."""
    c = rt.chain.current_epoch()
    paused = "EXISTS (SELECT 1 FROM memories m WHERE m.blob_pk = b.id AND m.status = 'paused')"
    new_end = {
        "spread": f"{c} + 1 + (b.id * 7919) % 53",
        "renewed": f"CASE WHEN {paused} THEN {c} + 1 + b.id % 2 ELSE {c} + 5 END",
        "tied": f"{c} + 5",
        "backlog": f"CASE WHEN {paused} THEN {c} ELSE {c} + 5 END",
    }[layout]
    with rt.db.engine.begin() as conn:
        conn.execute(
            text(
                f"UPDATE blobs b SET end_epoch = {new_end} WHERE b.account_id = :a "
                "AND b.status = 'live' AND b.blob_id NOT LIKE 'lapsed%'"
            ),
            {"a": account_id},
        )
    with rt.db.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE blobs"))


def brute_force(
    rt: Runtime, account_id: str
) -> tuple[dict[str, int], int | None, list[str], float]:
    """Counts as check_runway shows them, min runway and the 100 most at-risk ids, by
    reading every memory of the account in SQL; returns them with the COUNT's time."""
    c = rt.chain.current_epoch()
    listed = ", ".join(f"'{s}'" for s in LISTED)
    p = {"a": account_id, "c": c}
    with rt.db.engine.connect() as conn:
        t0 = time.perf_counter()
        counted = conn.execute(
            text(
                "SELECT CASE WHEN m.status IN ('active', 'paused', 'no-renew') "
                "AND b.end_epoch <= :c THEN 'expired' ELSE m.status END AS shown, count(*) "
                "FROM memories m LEFT JOIN blobs b ON b.id = m.blob_pk "
                f"WHERE m.account_id = :a AND m.status IN ({listed}) GROUP BY shown"
            ),
            p,
        ).all()
        count_s = time.perf_counter() - t0
        min_end = conn.scalar(
            text(
                "SELECT min(b.end_epoch) FROM memories m JOIN blobs b ON b.id = m.blob_pk "
                "WHERE m.account_id = :a AND m.status IN ('active', 'paused') "
                "AND b.end_epoch > :c"
            ),
            p,
        )
        top = conn.scalars(
            text(
                "SELECT m.id FROM memories m LEFT JOIN blobs b ON b.id = m.blob_pk "
                f"WHERE m.account_id = :a AND m.status IN ({listed}) "
                "ORDER BY b.id IS NULL, GREATEST(0, b.end_epoch - :c), m.id LIMIT 100"
            ),
            p,
        ).all()
    counts = {str(s): int(k) for s, k in counted}
    return counts, (min_end - c if min_end is not None else None), list(top), count_s


def measure(rt: Runtime, account_id: str, layout: str, calls: int) -> bool:
    lay_out(rt, account_id, layout)
    runway.check_runway(rt, account_id)  # warm-up: plans, caches
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        res = runway.check_runway(rt, account_id)
        times.append((time.perf_counter() - t0) * 1000)
    counts, min_runway, top, count_s = brute_force(rt, account_id)
    acct = res.account
    assert acct is not None
    spaces = acct.namespaces
    ok = (
        acct.more_namespaces == 0
        and sum(ns.total_memories for ns in spaces) == acct.total_memories
        and sum(ns.active for ns in spaces) == acct.active
        and sum(ns.paused for ns in spaces) == acct.paused
        and sum(ns.no_renew for ns in spaces) == acct.no_renew
        and acct.total_memories == sum(counts.values())
        and acct.active == counts.get("active", 0)
        and acct.paused == counts.get("paused", 0)
        and acct.no_renew == counts.get("no-renew", 0)
        and acct.min_runway_epochs == min_runway
        and [m.memory_id for m in res.memories] == top
    )
    median, worst = statistics.median(times), max(times)
    print(
        f"[{layout}] check_runway summary: median {median:.1f} ms, max {worst:.1f} ms "
        f"over {calls} calls (target < {TARGET_MS:.0f} ms: "
        f"{'PASS' if median < TARGET_MS else 'MISS'})"
    )
    print(
        f"[{layout}] brute-force COUNT ... GROUP BY over the account: {count_s * 1000:.0f} ms; "
        f"total={acct.total_memories} active={acct.active} paused={acct.paused} "
        f"no_renew={acct.no_renew} min_runway={acct.min_runway_epochs} "
        f"namespaces={len(spaces)}+{acct.more_namespaces}; "
        "counts, min runway, the 100 most at-risk and the namespaces' sums equal brute "
        f"force: {'OK' if ok else 'MISMATCH'}"
    )
    return ok


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--memories", type=int, default=1_000_000)
    ap.add_argument("--others", type=int, default=200_000, help="memories of 4 other accounts")
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--layouts", default=",".join(LAYOUTS))
    ap.add_argument("--seed", type=int, default=14)
    ap.add_argument(
        "--namespaces", type=int, default=50, help="namespaces the account's memories use"
    )
    ap.add_argument("--db-url", default=None, help="an empty PostgreSQL database to use")
    ap.add_argument("--pg-server", default=DEFAULT_SERVER)
    args = ap.parse_args()
    ctx = contextlib.nullcontext(args.db_url) if args.db_url else scratch_database(args.pg_server)
    with ctx as url:
        if not url.startswith("postgresql"):
            sys.exit("bench/summary.py runs on PostgreSQL (it seeds with COPY)")
        ok = run(args, url)
    sys.exit(0 if ok else 1)


def run(args: argparse.Namespace, url: str) -> bool:
    migrations.upgrade(url)
    data = Path(tempfile.mkdtemp(prefix="walkeep-summary-bench-"))
    settings = Settings(
        data_dir=data,
        database_url=url,
        master_key="AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=",
        embedder="hash",
    )
    clock = ManualClock()
    db = Database(url, clock=clock)
    rt = build_runtime(settings, clock=clock, database=db, with_completer=False)
    clock.advance(100 * settings.local_epoch_seconds)  # room below for expired epochs
    rng = random.Random(args.seed)
    target = accounts.create_account(rt.db, "bench-summary").account_id
    others = [accounts.create_account(rt.db, f"bench-other-{i}").account_id for i in range(4)]

    t0 = time.perf_counter()
    next_blob = 1
    for i, acct in enumerate(others):
        next_blob = seed(rt, acct, args.others // len(others), rng, next_blob)
        if i == 1:  # the target's memories in the middle of the others' in every index
            next_blob = seed(rt, target, args.memories, rng, next_blob, args.namespaces)
    with rt.db.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE"))
    print(
        f"seeded {args.memories:,} memories in the account and {args.others:,} in 4 others "
        f"(count triggers on) in {time.perf_counter() - t0:.0f}s; "
        f"current epoch {rt.chain.current_epoch()}"
    )
    ok = all([measure(rt, target, layout, args.calls) for layout in args.layouts.split(",")])
    db.dispose()
    return ok


if __name__ == "__main__":
    main()
