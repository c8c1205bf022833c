"""Small helpers shared by service-level tests."""

from __future__ import annotations

import functools
import itertools
import os
import shutil
import subprocess
from datetime import UTC, datetime
from pathlib import Path

from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from sqlalchemy.engine import make_url

from walkeep import crypto
from walkeep.service.jobs import completion
from walkeep.service.operators import accounts
from walkeep.service.runtime import Runtime

_n = itertools.count()


def account(rt: Runtime, credits: int = 100, name: str | None = None) -> str:
    return accounts.create_account(
        rt.db, name or f"acct-{next(_n)}", credits_mc=credits * 1000
    ).account_id


def land_all(rt: Runtime) -> completion.CompleteReport:
    """What the worker's complete_writes does after accept: settle every in-flight store."""
    return completion.complete_writes(rt)


def epoch_seconds(rt: Runtime) -> int:
    return rt.chain.epoch_info().duration_seconds


def console_sign_in(http, credential: str) -> None:  # type: ignore[no-untyped-def]
    """Sign an httpx client in to the operator console with a key (or the admin token),
    as an operator does in a browser. The session cookie is then sent on plain http too
    (tests serve http while their public URL may be https)."""
    import re

    from walkeep.api.console import COOKIE

    page = http.get("/console/login")
    csrf = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert csrf is not None, page.text
    anon = page.cookies.get(COOKIE)
    if anon:
        http.cookies.set(COOKIE, anon)
    done = http.post(
        "/console/login",
        data={"credential": credential, "csrf": csrf.group(1)},
        follow_redirects=False,
    )
    assert done.status_code == 303, done.text
    http.cookies.set(COOKIE, done.cookies[COOKIE])


def writes_in_order(rt: Runtime, run) -> list[str]:  # type: ignore[no-untyped-def]
    """The tables ``run()`` UPDATEs, in the order it sends them: for lock-order tests."""
    from sqlalchemy import event

    seen: list[str] = []

    def note(_conn, _cursor, statement: str, *_args) -> None:  # type: ignore[no-untyped-def]
        words = statement.split()
        if words[:1] == ["UPDATE"]:
            seen.append(words[1])

    event.listen(rt.db.engine, "before_cursor_execute", note)
    try:
        run()
    finally:
        event.remove(rt.db.engine, "before_cursor_execute", note)
    return seen


def write_job_row(account_id: str, job_id: str) -> dict[str, object]:
    """A ``write_jobs`` row with every column set: a statement to insert, not a store."""
    now = datetime(2026, 12, 1, tzinfo=UTC)
    return {
        "id": job_id,
        "account_id": account_id,
        "namespace": "default",
        "idempotency_key": f"k-{job_id}",
        "ciphertext": b"\x00\x01",
        "size_bytes": 2,
        "epochs": 3,
        "status": "pending",
        "not_before": now,
        "created_at": now,
        "updated_at": now,
    }


def database_bytes(rt: Runtime) -> bytes:
    """Every byte a copy of the database holds: the SQLite file with its WAL, or a
    `pg_dump --data-only`."""
    url = make_url(rt.db.url)
    if url.get_backend_name() == "sqlite":
        rt.db.dispose()
        path = Path(url.database or "")
        return b"".join(p.read_bytes() for p in path.parent.glob(path.name + "*"))
    assert shutil.which("pg_dump"), "pg_dump is needed to inspect the PostgreSQL database"
    env = {**os.environ, "PGPASSWORD": url.password or ""}
    out = subprocess.run(
        [
            "pg_dump",
            "--data-only",
            "-h",
            url.host or "127.0.0.1",
            "-p",
            str(url.port or 5432),
            "-U",
            url.username or "postgres",
            url.database or "",
        ],
        check=True,
        capture_output=True,
        env=env,
    )
    return out.stdout


@functools.cache
def vector_cipher(account_id: str) -> AESGCM:
    """A fixed-key vector cipher for search indexes built by hand in tests."""
    return crypto.vector_cipher(b"\x07" * 32, account_id)
