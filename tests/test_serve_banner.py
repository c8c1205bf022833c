"""`walkeep serve` prints its banner once it is listening, after the start-up logs,
so a newcomer finds the key and the client configs at the bottom, not between logs."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from tests.live_serve import walkeep_serve
from walkeep import __version__


def test_banner_comes_last_with_the_key_and_configs(tmp_path: Path, db_url: str) -> None:
    with walkeep_serve(tmp_path, db_url) as served:
        # A request after start-up: the banner was printed before the server answered.
        assert httpx.get(f"{served.url}/healthz", timeout=10).status_code == 200
        lines = served.stderr().splitlines()
    starts = [i for i, line in enumerate(lines) if f"Walkeep {__version__} is up on" in line]
    assert len(starts) == 1, lines
    before, banner = lines[: starts[0]], "\n".join(lines[starts[0] :])
    logs_before = [json.loads(line) for line in before if line.startswith('{"ts"')]
    assert logs_before, "start-up logs come first"
    assert not any(line.startswith('{"ts"') for line in lines[starts[0] :]), banner
    assert f"{served.url}/mcp" in banner
    # First run, stderr not a terminal (a log file here): the key stays in the credentials
    # file, and the banner says where it is…
    assert served.api_key not in served.stderr()
    assert "credentials.json" in banner and "not a terminal" in banner
    assert "claude mcp add --transport http walkeep" in banner  # …with ready-to-paste configs
    # The noise that used to bury it is gone.
    noisy = {"apscheduler.scheduler", "alembic.runtime.migration", "alembic.runtime.plugins"}
    assert not [r for r in logs_before if r["logger"] in noisy]


def test_start_up_heap_is_frozen_out_of_the_collectors_sight() -> None:
    """What start-up built is never garbage; without the freeze every full collection
    walked all of it again and stopped every request for ~150 ms (bench/store.py's p99)."""
    import gc

    from walkeep.api.serve import freeze_start_up_heap

    before = gc.get_freeze_count()
    try:
        freeze_start_up_heap()
        assert gc.get_freeze_count() > before
        assert gc.get_count()[0] < 700  # and what was collectable went first
    finally:
        gc.unfreeze()
