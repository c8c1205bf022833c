"""SQLite WAL checkpoints on a background thread, off the request path.

In WAL mode every commit appends the pages it changed to the ``-wal`` file, and by
default the commit that takes the log past 1,000 pages also copies the log back into
the database file and syncs it: a checkpoint, run by whichever connection happened to
commit. In ``walkeep serve`` that is usually a store on the event loop, where it stalled
every request in flight: a store changes about 25 pages (five tables and their
indexes), so one store in 40 paid for a checkpoint, and stores averaged 2.1 ms instead
of 1.2 ms (3,000 stores in a loop, this machine).

So the server checkpoints on its own thread, twice a second, with ``PASSIVE``: it never
waits for (nor blocks) readers or writers, and the sqlite3 module releases the GIL while
it copies and syncs. Connections keep SQLite's automatic checkpoint as a backstop at a
larger threshold (``AUTOCHECKPOINT_PAGES``, engine.py), so a process without this thread
(the CLI, the worker, tests) still bounds the log.
"""

from __future__ import annotations

import logging
import threading

from walkeep.db.engine import Database

log = logging.getLogger(__name__)


class WalCheckpointer:
    """Runs ``PRAGMA wal_checkpoint(PASSIVE)`` every ``interval`` seconds until stopped."""

    def __init__(self, db: Database, interval: float = 0.5) -> None:
        self.db = db
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="walkeep-checkpoint", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def checkpoint(self) -> tuple[int, int, int]:
        """One pass: (busy, frames in the log, frames checkpointed), as SQLite says.

        Without the process's write lock: a checkpoint is not a write transaction, and
        must not queue behind one."""
        conn = self.db.engine.raw_connection()
        try:
            row = conn.cursor().execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        finally:
            conn.close()
        return int(row[0]), int(row[1]), int(row[2])

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.checkpoint()
            except Exception as exc:  # a locked or vanished file: the backstop still holds
                log.warning("WAL checkpoint failed (SQLite's own will run instead): %s", exc)


def truncate(db: Database) -> bool:
    """Copy the whole log into the database file and cut the log to zero bytes; whether it
    did (False: a reader kept it busy past the busy timeout; the next one will).

    After a purge (walkeep/service/jobs/purge.py): ``secure_delete`` zeroes deleted rows in
    the database file, but the log still holds the pages as they were until it is cut."""
    conn = db.engine.raw_connection()
    try:
        row = conn.cursor().execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    finally:
        conn.close()
    return int(row[0]) == 0
