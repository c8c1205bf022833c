"""What storage costs per memory, with quilts and without, on the local network.

Runs the whole product path twice in one process — quilts off, then on: N
accounts store M memories of 100–2,000 bytes through ``store`` (accept, the
write queue, capture on landing) in one burst, so each account's writes are
packed 600 to a quilt; then the clock moves through E epochs with
a renewal pass (and a sweep) at every epoch. Everything paid is read back from
the local chain's own records, not from Walkeep's: every store and extend
transaction's WAL cost, divided by the storage price, is the storage units it
paid for.

Printed, per mode and as ratios (off / on):

- storage units paid per memory-epoch (units × epochs bought, over the epochs
  the memories were kept);
- ``extend_blob`` calls per memory-epoch of renewal;
- chain transactions (stores and renewals).

The ceiling this measures against is Walrus's encoded-length formula itself:
at 1000 shards every blob carries ~61 MiB of metadata, so a small memory alone
costs 63 units while a quilt of 600 costs about the same 63 units in total.

    python bench/cost.py [--accounts 10] [--memories 10000] [--epochs 10]

Target (issue 11): with quilts, ≥ 100× fewer storage units per small
memory-epoch and ≥ 100× fewer extend_blob calls per memory-epoch.
"""

from __future__ import annotations

import argparse
import math
import random
import sqlite3
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from walkeep.bootstrap import build_runtime
from walkeep.clock import ManualClock
from walkeep.config import Settings
from walkeep.db import Database
from walkeep.db import migrate as migrations
from walkeep.service.jobs import completion, renew, sweep
from walkeep.service.operators import accounts
from walkeep.service.tools import store

TEST_MASTER_KEY = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="


@dataclass
class Result:
    mode: str
    memories: int
    store_txs: int
    extend_txs: int
    extend_calls: int
    units_paid: int  # storage units × epochs, over every store and extend transaction
    memory_epochs: int  # epochs the memories were kept (from store to the end of the run)
    renewed_memory_epochs: int  # the part of those bought by renewals
    seconds: float

    @property
    def units_per_memory_epoch(self) -> float:
        return self.units_paid / self.memory_epochs

    @property
    def calls_per_memory_epoch(self) -> float:
        return self.extend_calls / max(1, self.renewed_memory_epochs)


def run(mode: str, n_accounts: int, n_memories: int, n_epochs: int, seed: int) -> Result:
    work = Path(tempfile.mkdtemp(prefix=f"walkeep-cost-{mode}-"))
    url = f"sqlite:///{work / 'walkeep.db'}"
    migrations.upgrade(url)
    clock = ManualClock(datetime(2026, 12, 1, tzinfo=UTC))
    settings = Settings(
        data_dir=work / "data",
        database_url=url,
        master_key=TEST_MASTER_KEY,
        embedder="hash",  # cost does not depend on the embedder; keep the run short
        local_write_latency_ms=0,
        quilts=mode,
        quilt_window_seconds=0,
        max_stores_per_day=10**9,
        max_write_backlog=0,
    )
    rt = build_runtime(
        settings, clock=clock, database=Database(url, clock=clock), with_completer=False
    )
    rng = random.Random(seed)
    accts = [
        accounts.create_account(rt.db, f"cost-{i}", credits_mc=10**12).account_id
        for i in range(n_accounts)
    ]
    started = time.perf_counter()
    for i in range(n_memories):
        size = rng.randint(100, 2000)
        body = f"memory {i}: " + "".join(rng.choice("abcdefghij ") for _ in range(size))
        store.store(rt, accts[i % n_accounts], content=body[:size], request_id=f"r{i}")
    # The stores arrive as one burst (within one quilt window): each account's
    # waiting writes are packed 600 to a quilt, the rest in a last smaller one.
    while completion.complete_writes(rt).landed:
        pass
    start_epoch = rt.chain.current_epoch()
    epoch = rt.chain.epoch_info().duration_seconds
    for _ in range(n_epochs):
        clock.advance(epoch)
        renew.renew(rt)
        sweep.sweep(rt)
    seconds = time.perf_counter() - started
    end_epoch = rt.chain.current_epoch()

    network = rt.extras["localnet"]
    price = network.storage_price_frost()
    with sqlite3.connect(network.db_path) as c:
        txs = c.execute("SELECT kind, wal_cost_frost FROM transactions").fetchall()
        extend_calls = c.execute("SELECT count(*) FROM extensions").fetchone()[0]
    units_paid = sum(cost for _, cost in txs) // price
    kept = n_memories * (end_epoch - start_epoch)
    return Result(
        mode=mode,
        memories=n_memories,
        store_txs=sum(1 for kind, _ in txs if kind == "store"),
        extend_txs=sum(1 for kind, _ in txs if kind == "extend"),
        extend_calls=extend_calls,
        units_paid=units_paid,
        memory_epochs=kept + n_memories * settings.initial_epochs,
        renewed_memory_epochs=kept,
        seconds=seconds,
    )


TARGET_RATIO = 100.0


def verdict(what: str, measured: float, target: float = TARGET_RATIO) -> str:
    """One line: the measured ratio, the target and PASS or FAIL, never at odds.

    The ratio is shown rounded *down* to one decimal: rounded to the nearest, a ratio of
    99.6 printed as "100x … target >= 100x … FAIL".
    """
    shown = math.floor(measured * 10) / 10
    ok = measured >= target
    return f"{what}: measured {shown:.1f}x, target >= {target:g}x: {'PASS' if ok else 'FAIL'}"


def summary(off: Result, on: Result) -> list[str]:
    """The verdict lines: each ratio off/on against its target, and the formula's ceiling."""
    cost_ratio = off.units_per_memory_epoch / on.units_per_memory_epoch
    calls_ratio = off.calls_per_memory_epoch / max(on.calls_per_memory_epoch, 1e-12)
    ceiling = 63 * 600 / 65  # one 63-unit blob per memory vs ~65 units per 600-patch quilt
    return [
        "",
        verdict("storage units per memory-epoch, off/on", cost_ratio),
        verdict("extend_blob calls per memory-epoch, off/on", calls_ratio),
        f"ceiling from the encoded-length formula (full 600-patch quilts): ~{ceiling:.0f}x; "
        f"measured / ceiling = {cost_ratio / ceiling:.2f}",
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--accounts", type=int, default=10)
    ap.add_argument("--memories", type=int, default=10_000)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--seed", type=int, default=7)
    a = ap.parse_args()
    results = [run(m, a.accounts, a.memories, a.epochs, a.seed) for m in ("off", "on")]
    print(
        f"{a.accounts} accounts, {a.memories} memories of 100–2,000 bytes, "
        f"{a.epochs} epochs of renewals (local network)\n"
    )
    print(
        f"{'quilts':<7}{'units/mem-epoch':>17}{'extend calls/mem-epoch':>24}"
        f"{'store txs':>11}{'renewal txs':>13}{'extend calls':>14}{'time':>8}"
    )
    for r in results:
        print(
            f"{r.mode:<7}{r.units_per_memory_epoch:>17.4f}{r.calls_per_memory_epoch:>24.6f}"
            f"{r.store_txs:>11}{r.extend_txs:>13}{r.extend_calls:>14}{r.seconds:>7.1f}s"
        )
    for line in summary(*results):
        print(line)


if __name__ == "__main__":
    main()
