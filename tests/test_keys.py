"""Issue 39, keys: revoke by the whole key or its prefix, `key list` with each key's last
use (to within a minute, never a write per request), `key create` prints the prefix.

On SQLite and PostgreSQL. Time moves with the ManualClock (the database's) and the key
cache's injectable monotonic clock; nothing sleeps.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest
from click.testing import CliRunner
from sqlalchemy import event

from tests.conftest import TEST_MASTER_KEY, TEST_MASTER_KEY_BYTES
from walkeep.api.auth import CACHE_TTL_SECONDS, KeyCache
from walkeep.cli import build_command
from walkeep.cli._common import CliError
from walkeep.clock import ManualClock
from walkeep.db import Database
from walkeep.errors import NotFound, Unauthorized
from walkeep.service.operators import accounts
from walkeep.service.runtime import Runtime


@pytest.fixture
def key_writes(db: Database) -> Iterator[list[str]]:
    """Every UPDATE of ``api_keys`` this database's engine sends."""
    seen: list[str] = []

    def note(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if statement.lstrip().upper().startswith("UPDATE API_KEYS"):
            seen.append(statement)

    event.listen(db.engine, "before_cursor_execute", note)
    yield seen
    event.remove(db.engine, "before_cursor_execute", note)


def _last_used(db: Database, prefix: str) -> Any:
    (view,) = [
        k
        for k in accounts.list_keys(db, _account_of(db, prefix), TEST_MASTER_KEY_BYTES)
        if k.prefix == prefix
    ]
    return view.last_used_at


def _account_of(db: Database, prefix: str) -> str:
    from sqlalchemy import select

    from walkeep.db.models import ApiKey

    with db.read() as s:
        found = s.scalar(select(ApiKey.account_id).where(ApiKey.prefix == prefix))
    assert found is not None
    return found


def test_revoke_takes_the_whole_key_as_well_as_its_prefix(db: Database) -> None:
    """Regression: `key revoke` took only the prefix; an operator pasting the leaked key
    itself was told no such key exists."""
    acme = accounts.create_account(db, "acme")
    other = accounts.create_key(db, acme.account_id)
    revoked = accounts.revoke_key(db, acme.api_key)  # the whole key
    assert (revoked.account_id, revoked.prefix, revoked.already) == (
        acme.account_id,
        acme.key_prefix,
        False,
    )
    with pytest.raises(Unauthorized):
        accounts.authenticate(db, acme.api_key, TEST_MASTER_KEY_BYTES)
    assert (
        accounts.authenticate(db, other.api_key, TEST_MASTER_KEY_BYTES).account_id
        == acme.account_id
    )
    assert accounts.revoke_key(db, f"  {other.prefix} ").prefix == other.prefix  # pasted
    assert accounts.revoke_key(db, other.prefix).already
    # An unknown whole key: the error names its prefix, never the secret part.
    stranger = "wk_live_" + "Q" * 43
    with pytest.raises(NotFound) as info:
        accounts.revoke_key(db, stranger)
    assert stranger not in info.value.message and "wk_live_QQQQQQQQ" in info.value.message
    assert stranger not in json.dumps(info.value.body())


def test_last_use_is_recorded_to_within_a_minute_not_per_request(
    db: Database, clock: ManualClock, key_writes: list[str]
) -> None:
    """Every lookup of a busy key within the minute reads; only a stale time is written."""
    acme = accounts.create_account(db, "acme")
    assert _last_used(db, acme.key_prefix) is None
    started = clock.now()
    accounts.authenticate(db, acme.api_key, TEST_MASTER_KEY_BYTES)
    assert _last_used(db, acme.key_prefix) == started
    assert len(key_writes) == 1
    for _ in range(9):  # a lookup every 5 s (the cache's refresh) for 45 s: no write
        clock.advance(5)
        accounts.authenticate(db, acme.api_key, TEST_MASTER_KEY_BYTES)
    assert len(key_writes) == 1 and _last_used(db, acme.key_prefix) == started
    clock.advance(10)  # 55 s after the last write: older than LAST_USED_EVERY
    accounts.authenticate(db, acme.api_key, TEST_MASTER_KEY_BYTES)
    assert _last_used(db, acme.key_prefix) == started + timedelta(seconds=55)
    assert len(key_writes) == 2
    # Refused keys record nothing.
    accounts.revoke_key(db, acme.key_prefix)
    clock.advance(120)
    with pytest.raises(Unauthorized):
        accounts.authenticate(db, acme.api_key, TEST_MASTER_KEY_BYTES)
    assert _last_used(db, acme.key_prefix) == started + timedelta(seconds=55)


def test_the_http_key_cache_writes_at_most_once_a_minute(
    rt: Runtime, clock: ManualClock, key_writes: list[str]
) -> None:
    """/mcp and /v1 resolve keys through KeyCache: 600 requests in a minute, one write."""
    acme = accounts.create_account(rt.db, "acme")
    now = [1000.0]
    keys = KeyCache(rt, monotonic=lambda: now[0])
    for _ in range(600):  # ten requests a second for a minute
        assert keys.resolve(acme.api_key).account_id == acme.account_id
        now[0] += 0.1
        clock.advance(0.1)
    lookups = 60 / CACHE_TTL_SECONDS
    assert len(key_writes) == 2, (lookups, key_writes)  # at 0 s and once past 50 s
    assert clock.now() - _last_used(rt.db, acme.key_prefix) < timedelta(minutes=1)


def test_the_stdio_server_records_its_key_use(rt: Runtime, clock: ManualClock) -> None:
    """`walkeep mcp` (stdio) checks its key through the same cache, so its use shows too."""
    from mcp import Client

    from walkeep.mcp.stdio import build_stdio_mcp

    acme = accounts.create_account(rt.db, "stdio", credits_mc=5000)
    now = [1000.0]
    server = build_stdio_mcp(rt, acme.api_key, None, keys=KeyCache(rt, monotonic=lambda: now[0]))
    first = _last_used(rt.db, acme.key_prefix)
    assert first == clock.now()
    clock.advance(300)
    now[0] += 300

    async def go() -> None:
        async with Client(server) as c:
            result = await c.call_tool("check_balance", {})
            assert not result.is_error

    anyio.run(go)
    assert _last_used(rt.db, acme.key_prefix) == first + timedelta(seconds=300)


def _cli(db_url: str, tmp_path: Path, *argv: str) -> str:
    result = _run_cli(db_url, tmp_path, *argv)
    assert result.exit_code == 0, result.output
    return result.output


def _run_cli(db_url: str, tmp_path: Path, *argv: str) -> Any:
    env = {
        "WALKEEP_DATA_DIR": str(tmp_path / "data"),
        "WALKEEP_DATABASE_URL": db_url,
        "WALKEEP_MASTER_KEY": TEST_MASTER_KEY,  # keys' namespaces are sealed with it
    }
    return CliRunner().invoke(build_command(), list(argv), env=env, catch_exceptions=False)


def test_cli_key_create_prints_the_prefix_and_key_list_shows_each_key(
    db: Database, db_url: str, tmp_path: Path
) -> None:
    acme = accounts.create_account(db, "acme")
    made = _cli(db_url, tmp_path, "key", "create", "--account", "acme", "--namespace", "work")
    key = made.split("(shown once): ", 1)[1].split()[0]
    prefix = key[: len("wk_live_") + 8]
    assert f"prefix: {prefix}" in made
    accounts.authenticate(db, key, TEST_MASTER_KEY_BYTES)

    listed = _cli(db_url, tmp_path, "key", "list", "--account", "acme")
    lines = listed.splitlines()
    assert "to within a minute" in lines[0]
    assert lines[1].split() == [
        "PREFIX",
        "NAMESPACE",
        "ONLY",
        "CREATED",
        "LAST",
        "USED",
        "STATUS",
    ]
    rows = {line.split()[0]: line.split()[1:] for line in lines[2:]}
    assert set(rows) == {acme.key_prefix, prefix}
    views = {k.prefix: k for k in accounts.list_keys(db, acme.account_id, TEST_MASTER_KEY_BYTES)}

    def minute(at: Any) -> list[str]:
        return at.strftime("%Y-%m-%d %H:%M").split()

    first, second = views[acme.key_prefix], views[prefix]
    assert second.last_used_at is not None  # the authenticate above
    assert rows[acme.key_prefix] == ["-", "-", *minute(first.created_at), "never", "active"]
    assert rows[prefix] == [
        "work",
        "-",
        *minute(second.created_at),
        *minute(second.last_used_at),
        "active",
    ]

    _cli(db_url, tmp_path, "key", "revoke", key)  # the whole key
    data = json.loads(_cli(db_url, tmp_path, "key", "list", "--account", "acme", "--json"))
    by_prefix = {k["prefix"]: k for k in data}
    assert by_prefix[prefix]["revoked_at"] is not None
    assert by_prefix[prefix]["namespace"] == "work" and by_prefix[prefix]["last_used_at"]
    assert by_prefix[acme.key_prefix]["last_used_at"] is None
    assert key not in json.dumps(data)

    usage = _cli(db_url, tmp_path, "key", "list", "--help")
    assert "last used (to within" in " ".join(usage.split())


def test_cli_only_namespace_confines_a_key_and_needs_its_namespace(
    db: Database, db_url: str, tmp_path: Path
) -> None:
    accounts.create_account(db, "acme")
    with pytest.raises(CliError, match=r"--only-namespace .* --namespace NS"):
        _run_cli(db_url, tmp_path, "key", "create", "--account", "acme", "--only-namespace")
    made = _cli(
        db_url,
        tmp_path,
        *("key", "create", "--account", "acme", "--namespace", "work", "--only-namespace"),
    )
    assert "confined to namespace 'work'" in made
    key = made.split("(shown once): ", 1)[1].split()[0]
    principal = accounts.authenticate(db, key, TEST_MASTER_KEY_BYTES)
    assert principal.only_namespace and principal.default_namespace == "work"
    listed = _cli(db_url, tmp_path, "key", "list", "--account", "acme")
    rows = {line.split()[0]: line.split()[1:3] for line in listed.splitlines()[2:]}
    assert rows[key[: len("wk_live_") + 8]] == ["work", "yes"]
    data = json.loads(_cli(db_url, tmp_path, "key", "list", "--account", "acme", "--json"))
    assert sorted(k["only_namespace"] for k in data) == [False, True]
