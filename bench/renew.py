"""Renewal throughput on the local network: N due blobs, one worker.

Seeds N live blobs on the local chain (bulk, not timed), each held by one
active memory spread over a few funded accounts, all due (runway = threshold),
then times one renewal pass: claim + hold + intent, chain transaction,
record + capture, batch after batch. Prints the time, the number of chain
transactions, blobs per transaction, and checks the ledger against the chain.

Then, in the same run, the ceiling: the chain part alone. The same batches
(read back from the renewal items) are prepared, submitted and decoded on a
copy of the local network taken right after seeding, with no database work,
so "renewal pass / chain-only" shows what the database costs on top of the
chain, whatever else the (shared) machine is doing.

    python bench/renew.py [--blobs 100000] [--batch 200] [--accounts 10]
                          [--db-url URL | --pg-server URL]

``--pg-server postgresql+psycopg://postgres@127.0.0.1:5432/test`` makes a
scratch database on that server and drops it afterwards; ``--db-url`` uses the
given database as it is; neither: a fresh SQLite file.

Target (issue 14 item 5): 100,000 due blobs renewed on PostgreSQL in under 30 s.
"""

from __future__ import annotations

import argparse
import shutil
import sqlite3
import sys
import tempfile
import time
from datetime import timedelta
from itertools import groupby
from pathlib import Path

from sqlalchemy import func, insert, select
from sqlalchemy.engine import make_url

from walkeep import pricing
from walkeep.backends.localnet.chain import LocalChain
from walkeep.backends.localnet.engine import DB_FILE, KEY_FILE, LocalNetwork
from walkeep.bootstrap import build_runtime
from walkeep.clock import ManualClock
from walkeep.config import Settings
from walkeep.db import Database
from walkeep.db import migrate as migrations
from walkeep.db.models import Account, Blob, LedgerEntry, Memory, Renewal, RenewalItem
from walkeep.lifecycle import BlobStatus, MemoryStatus
from walkeep.protocol import walrus
from walkeep.service.jobs import renew
from walkeep.service.operators import accounts

sys.path.insert(0, str(Path(__file__).resolve().parent))

from load import scratch_database

# Renewal transactions are built with the Sui adapter's builder (pysui): import
# it now, so its one-off import (seconds on a busy machine) counts as the
# process's start-up, not as the first batch of the timed pass.
import walkeep.backends.sui.ptb  # noqa: F401


def seed(rt, n: int, n_accounts: int) -> list[str]:  # type: ignore[no-untyped-def]
    network = rt.extras["localnet"]
    owner = rt.chain.owner_address()
    accts = [
        accounts.create_account(rt.db, f"bench-{i}", credits_mc=10**12).account_id
        for i in range(n_accounts)
    ]
    now = rt.clock.now()
    chunk = 10_000
    for start in range(0, n, chunk):
        datas = [f"bench memory {i}".encode() for i in range(start, min(n, start + chunk))]
        stored = network.store_blobs(datas, epochs=rt.settings.renew_threshold_epochs, owner=owner)
        with rt.db.begin() as s:
            blob_rows = [
                {
                    "account_id": accts[(start + j) % n_accounts],
                    "blob_id": sb.blob.blob_id,
                    "blob_object_id": sb.blob.blob_object_id,
                    "size_bytes": sb.blob.size,
                    "storage_size": sb.blob.storage_size,
                    "registered_epoch": sb.blob.registered_epoch,
                    "end_epoch": sb.blob.end_epoch,
                    "status": BlobStatus.LIVE,
                    "created_at": now,
                    "updated_at": now,
                }
                for j, sb in enumerate(stored)
            ]
            ids = s.execute(insert(Blob).returning(Blob.id), blob_rows).scalars().all()
            s.execute(
                insert(Memory),
                [
                    {
                        "id": f"mem_bench{start + j:09d}",
                        "account_id": blob_rows[j]["account_id"],
                        "namespace": "default",
                        "metadata_": {},
                        "size_bytes": blob_rows[j]["size_bytes"],
                        "content_hash": f"{start + j:064d}",
                        "status": MemoryStatus.ACTIVE,
                        "blob_pk": blob_id,
                        "cost_mc": 1000,
                        "attempt": 1,
                        "accepted_at": now,
                        "deadline_at": now + timedelta(hours=1),
                        "stored_at": now,
                        "status_changed_at": now,
                    }
                    for j, blob_id in enumerate(ids)
                ],
            )
    return accts


def snapshot_network(network: LocalNetwork, into: Path) -> Path:
    """A consistent copy of the local network's state (SQLite backup API + wallet)."""
    into.mkdir(parents=True, mode=0o700)
    src = sqlite3.connect(network.db_path)
    dst = sqlite3.connect(into / DB_FILE)
    try:
        src.backup(dst)
    finally:
        dst.close()
        src.close()
    shutil.copy2(network.state_dir / KEY_FILE, into / KEY_FILE)
    return into


def chain_only(rt, state_dir: Path) -> tuple[float, int]:  # type: ignore[no-untyped-def]
    """Seconds to prepare, submit and decode the pass's batches on the network copy.

    The batches are the confirmed renewals' items, in the order the pass
    submitted them; the copy is the network as seeded, so every call is valid
    exactly as it was in the pass. Per batch, what the pass asks of the chain:
    the current epoch, ``prepare_extend`` (build the Sui TransactionData) and
    ``execute`` (decode and apply it). No database work is timed.
    """
    with rt.db.read() as s:
        rows = s.execute(
            select(RenewalItem.renewal_id, Blob.blob_object_id, RenewalItem.epochs)
            .join(Blob, Blob.id == RenewalItem.blob_pk)
            .join(Renewal, Renewal.id == RenewalItem.renewal_id)
            .where(Renewal.status == "confirmed")
            .order_by(RenewalItem.renewal_id, RenewalItem.id)
        ).all()
    batches = [[(oid, k) for _, oid, k in group] for _, group in groupby(rows, key=lambda r: r[0])]
    network = LocalNetwork(state_dir, rt.clock)
    chain = LocalChain(network, public_url=rt.settings.public_url)
    try:
        t0 = time.perf_counter()
        for items in batches:
            chain.current_epoch()
            chain.execute(chain.prepare_extend(items))
        return time.perf_counter() - t0, len(batches)
    finally:
        network.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--blobs", type=int, default=100_000)
    ap.add_argument("--batch", type=int, default=200)
    ap.add_argument("--accounts", type=int, default=10)
    where = ap.add_mutually_exclusive_group()
    where.add_argument("--db-url", default=None, help="use this database as it is")
    where.add_argument(
        "--pg-server", default=None, help="make (and drop) a scratch database on this server"
    )
    args = ap.parse_args()
    with scratch_database(args.pg_server) as scratch:
        run(args, scratch or args.db_url)


def run(args: argparse.Namespace, db_url: str | None) -> None:
    data = Path(tempfile.mkdtemp(prefix="walkeep-renew-bench-"))
    url = db_url or f"sqlite:///{data / 'walkeep.db'}"
    migrations.upgrade(url)
    settings = Settings(
        data_dir=data,
        database_url=url,
        renew_batch=args.batch,
        master_key="AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=",
        embedder="hash",
    )
    clock = ManualClock()
    db = Database(url, clock=clock)
    rt = build_runtime(settings, clock=clock, database=db, with_completer=False)
    print(f"database: {make_url(url).get_backend_name()}")

    t0 = time.perf_counter()
    accts = seed(rt, args.blobs, args.accounts)
    print(
        f"seeded {args.blobs} due blobs over {len(accts)} accounts in {time.perf_counter() - t0:.1f}s"
    )
    seeded_network = snapshot_network(rt.extras["localnet"], data / "network-as-seeded")

    t0 = time.perf_counter()
    report = renew.renew(rt)
    elapsed = time.perf_counter() - t0

    with rt.db.read() as s:
        renewed = s.scalar(
            select(func.count()).select_from(Blob).where(Blob.renewals_performed == 1)
        )
        txs = s.scalar(
            select(func.count()).select_from(Renewal).where(Renewal.status == "confirmed")
        )
        captured = s.scalar(
            select(func.coalesce(func.sum(LedgerEntry.amount_mc), 0)).where(
                LedgerEntry.kind == "capture"
            )
        )
        held = s.scalar(select(func.sum(Account.held_mc)))
    k = settings.target_runway_epochs - settings.renew_threshold_epochs
    expected = sum(
        pricing.renewal_cost_mc(
            walrus.encoded_blob_length(len(f"bench memory {i}".encode()) + 0),
            k,
            settings.renewal_price_mc_per_unit_epoch,
        )
        for i in range(args.blobs)
    )
    print(f"renewed {renewed} blobs in {elapsed:.1f}s ({renewed / elapsed:,.0f} blobs/s)")
    print(
        f"chain transactions: {txs} (ceil(N/batch) = {-(-args.blobs // args.batch)}), "
        f"{report.blobs_renewed / max(txs, 1):.0f} blobs per transaction"
    )
    print(f"credits captured: {captured} mc (expected {expected}); holds left open: {held} mc")
    print(f"WAL reported by the chain: {report.wal_cost_frost:,} FROST")
    ok = renewed == args.blobs and captured == expected and held == 0
    print(f"consistency: {'OK' if ok else 'MISMATCH'}")

    ceiling, n_batches = chain_only(rt, seeded_network)
    print(
        f"chain only (same {n_batches} batches, no database): {ceiling:.1f}s; "
        f"renewal pass / chain-only = {elapsed / ceiling:.2f}"
    )
    if args.blobs < 100_000:
        verdict = "n/a"
    else:
        verdict = "PASS" if elapsed < 30 else "MISS"
    print(f"target < 30 s for 100,000: {verdict}")
    rt.db.engine.dispose()  # let the scratch database be dropped


if __name__ == "__main__":
    main()
