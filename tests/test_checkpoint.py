"""SQLite WAL checkpoints happen on the server's own thread, not in a request's commit
(walkeep/db/checkpoint.py)."""

from __future__ import annotations

import os
import sqlite3
import threading
from pathlib import Path

from sqlalchemy import text
from starlette.testclient import TestClient

from walkeep.api.app import create_app
from walkeep.bootstrap import build_runtime
from walkeep.clock import ManualClock
from walkeep.db import Database
from walkeep.db.checkpoint import WalCheckpointer
from walkeep.db.engine import AUTOCHECKPOINT_PAGES, _sqlite_on_connect


def _write_pages(db: Database, pages: int) -> None:
    """About ``pages`` WAL frames: one 4 KiB row per page, ten rows per commit."""
    with db.begin() as s:
        s.execute(text("CREATE TABLE IF NOT EXISTS filler (x BLOB)"))
    for _ in range(pages // 10):
        with db.begin() as s:
            s.execute(
                text("INSERT INTO filler (x) VALUES " + ",".join(["(randomblob(4000))"] * 10))
            )


def test_a_commit_past_sqlites_default_threshold_does_not_checkpoint(sqlite_db: Database) -> None:
    db = sqlite_db
    with db.read() as s:
        assert s.execute(text("PRAGMA wal_autocheckpoint")).scalar() == AUTOCHECKPOINT_PAGES
    _write_pages(db, 1500)  # SQLite's default would have checkpointed at 1,000 pages
    busy, log_frames, moved = WalCheckpointer(db).checkpoint()
    # Every frame written is still in the log: no commit copied it back on its own.
    assert busy == 0 and log_frames >= 1500
    assert moved == log_frames  # and the background pass moved all of them


def test_a_checkpoint_lets_the_log_start_over(sqlite_db: Database) -> None:
    db = sqlite_db
    checkpointer = WalCheckpointer(db)
    _write_pages(db, 200)
    assert checkpointer.checkpoint()[1] >= 200
    _write_pages(db, 20)  # the next writer reuses the log from the start
    busy, log_frames, moved = checkpointer.checkpoint()
    assert busy == 0 and log_frames < 200 and moved == log_frames


def test_the_server_checkpoints_on_its_own_thread_while_it_runs(
    settings, clock: ManualClock, sqlite_db: Database
) -> None:  # type: ignore[no-untyped-def]
    rt = build_runtime(settings, clock=clock, database=sqlite_db, with_completer=False)

    def running() -> bool:
        return any(t.name == "walkeep-checkpoint" for t in threading.enumerate())

    assert not running()
    with TestClient(create_app(rt)) as client:
        assert client.get("/healthz").status_code == 200
        assert running()
    assert not running()


def test_deleted_rows_leave_no_bytes_in_the_file_or_its_wal(sqlite_db: Database) -> None:
    """secure_delete: a deleted row is overwritten, not left in a free page that a copy of
    the file (a backup, a stolen disk) would still hold."""
    db = sqlite_db
    with db.read() as s:
        assert s.execute(text("PRAGMA secure_delete")).scalar() == 1
    # Debian builds SQLite with SECURE_DELETE on by default; others don't: Walkeep turns it
    # on itself on every connection.
    raw = sqlite3.connect(":memory:")
    raw.execute("PRAGMA secure_delete=OFF")
    _sqlite_on_connect(raw, None)
    assert raw.execute("PRAGMA secure_delete").fetchone() == (1,)
    raw.close()
    marker = "zq-forgotten-secret-7f3a"
    with db.begin() as s:
        s.execute(text("CREATE TABLE IF NOT EXISTS shredded (x TEXT)"))
        s.execute(text("INSERT INTO shredded (x) VALUES (:x)"), {"x": marker * 50})
    WalCheckpointer(db).checkpoint()
    with db.begin() as s:
        s.execute(text("DELETE FROM shredded"))
    conn = db.engine.raw_connection()
    try:
        assert conn.cursor().execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0] == 0
    finally:
        conn.close()
    path = db.engine.url.database
    assert path
    files = [Path(p) for p in (path, path + "-wal") if os.path.exists(p)]
    assert all(marker.encode() not in p.read_bytes() for p in files)
