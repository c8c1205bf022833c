"""Store throughput through MCP over HTTP, against the ceiling of our own stack, in one run.

Measures, on this machine:

1. **the embedder's own batch rate**: the model Walkeep embeds with, on one thread
   as the completer runs it, over texts like the ones stored — the limit of
   sustained completion, since every landed memory is embedded once;
2. **the ceiling** — ``bench/ceiling.py``'s do-nothing ``store`` on the same MCP SDK,
   transport and uvicorn settings — and **Walkeep** (``walkeep serve``, in-process
   worker; SQLite, or PostgreSQL with ``--pg-server``), driven by the same load
   generator (``bench/load.py``) for the same time, in alternating rounds with the
   other server stopped (``load.alternate``: the machine's speed drifts within
   minutes, and both should see the same drift);
3. the wait until every accepted write has landed and been billed. Completion steps
   aside while the burst saturates the server (walkeep/pressure.py), so sustained
   throughput is what lands after the burst, over the time from its end to the last
   landing.

and prints accepts/s and latency next to the ceiling, and sustained landed+billed
per second next to the embedder's rate, with the ratios and the issue's targets
(≥ 0.5× the ceiling on SQLite, ≥ 0.4× on PostgreSQL, p99 < 150 ms, sustained ≥ 0.8×
the embedder).

    python bench/store.py [--clients 16] [--seconds 15] [--rounds 3] [--accounts 1]
                          [--client wire|sdk] [--era 2025-11-25|2026-07-28]
                          [--pg-server URL] [--workers N]

``--client wire`` (the default) is a lean JSON-RPC client, so the ceiling is as high as
this machine lets a Python client drive it; ``sdk`` is the official MCP client, which
tops out lower on its own CPU cost. Absolute numbers on this shared 2-core machine
swing by 30 %; the ratios, measured in one run, are what to compare.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

from sqlalchemy import Engine, create_engine, text

sys.path.insert(0, str(Path(__file__).resolve().parent))

import ceiling
from load import alternate, content, scratch_database, start_walkeep

TARGET_RATIO = {"sqlite": 0.5, "postgresql": 0.4}
TARGET_P99_MS = 150.0
TARGET_SUSTAINED = 0.8


def embedder_rate(seconds: float = 5.0) -> float:
    """Texts per second the completer's embedder manages in batches, on one thread."""
    from walkeep.config import Settings
    from walkeep.index.embedder import BATCH_SIZE, load_embedder

    embedder = load_embedder(Settings())
    texts = [content("embedder", c, i) for c in range(16) for i in range(64)]  # as stored
    embedder.embed(texts[:BATCH_SIZE])  # load the model, untimed
    done = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        for i in range(0, len(texts), BATCH_SIZE):
            embedder.embed(texts[i : i + BATCH_SIZE])
            done += len(texts[i : i + BATCH_SIZE])
    return done / (time.perf_counter() - start)


class Landings(threading.Thread):
    """Polls how many memories have landed, twice a second, remembering when the last
    landed and how many had landed when the burst ended (``mark``)."""

    def __init__(self, db_url: str) -> None:
        super().__init__(daemon=True)
        self.db_url = db_url
        self.done = 0
        self.last = 0.0
        self.at_mark = 0
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            self._poll()
            self._halt.wait(0.5)

    def _poll(self) -> None:
        n = landed(self.db_url)
        if n > self.done:
            self.done, self.last = n, time.monotonic()

    def mark(self) -> None:
        """The burst is over: count what has landed by now (read here, not at the next
        poll, so nothing that lands afterwards is taken for the burst's)."""
        self.at_mark = landed(self.db_url)

    def until(self, count: int, *, timeout: float) -> None:
        """Wait until ``count`` have landed (or ``timeout``), then stop polling."""
        deadline = time.monotonic() + timeout
        while self.done < count and time.monotonic() < deadline:
            time.sleep(0.2)
        self._halt.set()
        self.join()


def landed(db_url: str) -> int:
    """Memories landed and billed (active), read from the database by this process, so
    watching costs the server nothing (check_runway would run on its GIL)."""
    return _count(db_url, "SELECT count(*) FROM memories WHERE status = 'active'")


def accepted(db_url: str) -> int:
    """Every store accepted so far: each has its memory row from the moment it is."""
    return _count(db_url, "SELECT count(*) FROM memories")


def _count(db_url: str, sql: str) -> int:
    engine = _engines.get(db_url)
    if engine is None:
        engine = _engines[db_url] = create_engine(db_url)
    with engine.connect() as c:
        return int(c.execute(text(sql)).scalar_one())


_engines: dict[str, Engine] = {}


def main() -> None:
    ap = argparse.ArgumentParser()
    ceiling.add_load_args(ap)
    ap.set_defaults(client="wire")
    args = ap.parse_args()
    load = {"clients": args.clients, "kind": args.client, "era": args.era}
    db = "postgresql" if args.pg_server else "sqlite"

    embed_rate = embedder_rate()
    roof = ceiling.start(args.accounts)
    try:
        with scratch_database(args.pg_server) as db_url:
            server = start_walkeep(
                db_url, accounts=args.accounts, args=ceiling.worker_args(args.workers)
            )
            try:
                watch = Landings(server.db_url)
                watch.start()
                top, burst = alternate(
                    [roof, server], rounds=args.rounds, seconds=args.seconds, **load
                )
                burst_end = time.monotonic()
                roof.pause()  # idle from here on: nothing of it runs beside the drain
                watch.mark()
                # Every accepted store (the warm-ups' too) has its memory row by now.
                watch.until(accepted(server.db_url), timeout=600)
            finally:
                server.stop()
    finally:
        roof.stop()

    done, last = watch.done, watch.last
    drain = last - burst_end
    sustained = (done - watch.at_mark) / drain if drain > 0 else float("nan")
    ratio = burst.rate / top.rate
    p99 = burst.pct(0.99)
    print(
        f"load: {args.clients} clients over {args.accounts} account(s), client={args.client}, "
        f"{args.seconds:.0f} s each in {args.rounds} alternating rounds; walkeep on {db}, "
        f"{args.workers} web process(es)"
    )
    print(f"ceiling (do-nothing store, same stack): {top.line()}")
    print(f"walkeep store accepts:                  {burst.line()}")
    print(
        f"  ratio {ratio:.2f} of the ceiling (target >= {TARGET_RATIO[db]}): "
        f"{'PASS' if ratio >= TARGET_RATIO[db] else 'MISS'}; "
        f"p99 {p99:.0f} ms (target < {TARGET_P99_MS:.0f}): "
        f"{'PASS' if p99 < TARGET_P99_MS else 'MISS'}"
    )
    print(f"embedder alone, batches on one thread:  {embed_rate:.0f} texts/s")
    print(
        f"walkeep sustained: {done} landed and billed (with the warm-ups'); "
        f"{watch.at_mark} during the burst, {done - watch.at_mark} in the "
        f"{drain:.1f} s after it: {sustained:.0f}/s"
    )
    print(
        f"  ratio {sustained / embed_rate:.2f} of the embedder (target >= {TARGET_SUSTAINED}): "
        f"{'PASS' if sustained >= TARGET_SUSTAINED * embed_rate else 'MISS'}"
    )


if __name__ == "__main__":
    main()
