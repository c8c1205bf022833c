"""The README promises that PostgreSQL-only tests skipped on SQLite come "with a note saying
how to run them". The suite runs with ``-q`` (pyproject addopts), which prints "N skipped"
without any reason, so tests/conftest.py adds the note to the summary; this runs pytest
the plain way (SQLite, through xdist as addopts does) on one PostgreSQL-only test.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PG_ONLY = "tests/test_search.py::test_sqlite_and_postgresql_rank_the_same"


def test_a_plain_run_says_how_many_postgresql_tests_it_skipped_and_how_to_run_them() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("WALKEEP_TEST_DATABASE_URL", "CI")}
    out = subprocess.run(
        [sys.executable, "-m", "pytest", PG_ONLY, "-n", "1"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "1 skipped" in out.stdout, out.stdout
    assert (
        "1 PostgreSQL-only test skipped on SQLite: set WALKEEP_TEST_DATABASE_URL="
        "postgresql+psycopg://postgres@127.0.0.1:5432/test to run them"
    ) in out.stdout, out.stdout
