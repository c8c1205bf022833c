"""Prometheus metrics, one registry per process, served at ``/metrics``.

Names are stable API for dashboards; add, don't rename.
"""

from __future__ import annotations

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
)

REGISTRY = CollectorRegistry(auto_describe=True)
# What prometheus-client's default registry exports (process_* CPU, memory, open fds;
# python_info; python_gc_*): without them a dashboard can't tell a leaking or pegged
# worker from an idle one.
for _collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
    REGISTRY.register(_collector)

TOOL_CALLS = Counter(
    "walkeep_tool_calls_total",
    "Tool calls by tool, transport and outcome (ok or an error code).",
    ["tool", "transport", "outcome"],
    registry=REGISTRY,
)
TOOL_LATENCY = Histogram(
    "walkeep_tool_latency_seconds",
    "Tool call latency.",
    ["tool", "transport"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
    registry=REGISTRY,
)
WRITES_IN_FLIGHT = Gauge(
    "walkeep_writes_in_flight",
    "Accepted stores not yet settled (this process's completer).",
    registry=REGISTRY,
)
RENEWAL_TXS = Counter(
    "walkeep_renewal_transactions_total",
    "Renewal transactions by outcome.",
    ["outcome"],
    registry=REGISTRY,
)
RENEWED_BLOBS = Counter("walkeep_renewed_blobs_total", "Blobs extended.", registry=REGISTRY)
BLOBS_PER_TX = Histogram(
    "walkeep_renewal_blobs_per_transaction",
    "Blobs per renewal transaction.",
    buckets=(1, 5, 10, 25, 50, 100, 200, 500, 1000),
    registry=REGISTRY,
)
RENEWAL_WAL_FROST = Counter(
    "walkeep_renewal_wal_cost_frost_total",
    "WAL (in FROST) the chain reported for renewals.",
    registry=REGISTRY,
)
CREDITS_CAPTURED_MC = Counter(
    "walkeep_credits_captured_millicredits_total",
    "Millicredits captured, by reason.",
    ["reason"],
    registry=REGISTRY,
)
PAUSED_MEMORIES = Counter(
    "walkeep_memories_paused_total",
    "Memories paused for lack of credits.",
    registry=REGISTRY,
)
ORPHANS = Counter("walkeep_orphan_blobs_total", "Blobs recorded as orphans.", registry=REGISTRY)
JOB_DURATION = Histogram(
    "walkeep_job_duration_seconds",
    "Worker job run time.",
    ["job"],
    registry=REGISTRY,
)
JOB_RUNS = Counter(
    "walkeep_job_runs_total", "Worker job runs by outcome.", ["job", "outcome"], registry=REGISTRY
)
QUILT_UNBILLED_MC = Counter(
    "walkeep_quilt_unbilled_mc_total",
    "Millicredits of quilt renewals nobody was billed for: the fixed shares of forgotten "
    "members (and rounding), which are Walkeep's cost until compaction re-packs the quilt.",
    registry=REGISTRY,
)
QUILTS_WRITTEN = Counter(
    "walkeep_quilts_written_total",
    "Quilts written, and the patches in them.",
    ["unit"],
    registry=REGISTRY,
)
INDEX_REBUILDS = Counter(
    "walkeep_index_segment_rebuilds_total",
    "Search index segments rebuilt from the database, by why: damaged (a file failed its "
    "checksum or range checks), search_failed (a search raised), contradicted (it answered "
    "nothing where the database has visible memories), stale (another model, analyzer, "
    "format or index generation).",
    ["reason"],
    registry=REGISTRY,
)

STATEMENTS_TOGETHER = Counter(
    "walkeep_db_statements_together_total",
    "Statements (store claims) sent through the event loop's queue, walkeep/db/together.py, "
    "by how they went out: alone (nothing was in flight), pipelined (with those that queued "
    "behind one, in one transaction), rerun (undone -- an error, or a row lock waited on "
    "past LOCK_WAIT_MS -- and run again alone).",
    ["how"],
    registry=REGISTRY,
)


def serve(port: int, host: str = "127.0.0.1") -> int:
    """Serve ``/metrics`` from this process on its own port (``walkeep worker
    --metrics-port``): the worker has no web server, so its job and renewal metrics were
    never scraped. Returns the bound port (``0`` picks a free one)."""
    from prometheus_client import start_http_server

    server, _thread = start_http_server(port, addr=host, registry=REGISTRY)
    return int(server.server_address[1])
