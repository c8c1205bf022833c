"""Digests of user data at rest are keyed (walkeep/service/digests.py): a copy of the
database cannot confirm a guessed memory or call, and rows an earlier version stored bare
keep working until the worker rewrites them."""

from __future__ import annotations

import hashlib
import json

import pytest
from sqlalchemy import select, update

from tests.helpers import account, database_bytes, land_all
from walkeep.db.models import Memory, Request
from walkeep.errors import ValidationError
from walkeep.service import digests
from walkeep.service.jobs import reindex
from walkeep.service.runtime import Runtime
from walkeep.service.tools import forget, store


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _store_args(content: str, namespace: str = "default") -> str:
    """The canonical arguments of a store, as an earlier version fingerprinted them."""
    args = {"content": content, "namespace": namespace, "metadata": {}}
    return json.dumps(args, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _rows(rt: Runtime, memory_id: str) -> tuple[str, str]:
    with rt.db.read() as s:
        content_hash = s.scalar(select(Memory.content_hash).where(Memory.id == memory_id))
        fingerprint = s.scalar(select(Request.fingerprint).where(Request.memory_id == memory_id))
    assert content_hash is not None and fingerprint is not None
    return content_hash, fingerprint


def test_no_bare_hash_of_a_memory_or_its_call_is_stored(rt: Runtime) -> None:
    """Regression: hashing "My PIN is 0000" … "9999" found the stored memory in 14 ms."""
    a, b = account(rt), account(rt)
    secret = "My PIN is 4821"
    mine = store.store(rt, a, content=secret, request_id="pin").memory_id
    theirs = store.store(rt, b, content=secret, request_id="pin").memory_id
    land_all(rt)
    content_hash, fingerprint = _rows(rt, mine)
    guesses = {_sha(f"My PIN is {i:04d}") for i in range(10_000)}
    guesses |= {_sha(_store_args(f"My PIN is {i:04d}")) for i in range(10_000)}
    assert content_hash not in guesses and fingerprint not in guesses
    assert digests.is_keyed(content_hash) and digests.is_keyed(fingerprint)
    assert len(content_hash) == len(fingerprint) == 64
    # Equal inside one account (deduplication), unrelated across accounts.
    assert content_hash == digests.content_hash(rt, a, secret)
    assert _rows(rt, theirs)[0] != content_hash


def test_identical_content_still_shares_one_blob(rt: Runtime) -> None:
    a = account(rt)
    first = store.store(rt, a, content="same words", request_id="s1").memory_id
    second = store.store(rt, a, content="same words", request_id="s2").memory_id
    land_all(rt)
    with rt.db.read() as s:
        blobs = {
            m.id: m.blob_id for m in s.scalars(select(Memory).where(Memory.id.in_([first, second])))
        }
    assert blobs[first] == blobs[second] is not None


def test_rows_stored_bare_keep_working_and_are_rewritten_by_the_worker(rt: Runtime) -> None:
    """A database from before keyed digests: replays and refusals answer as before, the
    worker's reindex job rewrites the rows without any plaintext, and identical content
    stored afterwards still finds the old memory's blob."""
    a = account(rt)
    text = "The staging database is on port 5433."
    old = store.store(rt, a, content=text, request_id="old").memory_id
    forgot = store.store(rt, a, content="to forget", request_id="gone").memory_id
    land_all(rt)
    forget.forget(rt, a, memory_id=forgot, request_id="f1")
    with rt.db.begin() as s:  # what the previous release stored
        s.execute(update(Memory).where(Memory.id == old).values(content_hash=_sha(text)))
        s.execute(
            update(Request)
            .where(Request.memory_id == old, Request.tool == "store")
            .values(fingerprint=_sha(_store_args(text)))
        )
        s.execute(
            update(Request)
            .where(Request.tool == "forget")
            .values(fingerprint=_sha(json.dumps({"memory_id": forgot}, separators=(",", ":"))))
        )
    rt.extras.pop("digests_rekeyed", None)
    # Replays of bare rows: the same answer; other arguments: refused.
    assert store.store(rt, a, content=text, request_id="old").memory_id == old
    assert forget.forget(rt, a, memory_id=forgot, request_id="f1").status == "no-renew"
    with pytest.raises(ValidationError):
        store.store(rt, a, content="something else", request_id="old")

    report = reindex.backfill(rt)
    assert report.digests_rekeyed == 3  # one content hash, two fingerprints
    content_hash, fingerprint = _rows(rt, old)
    assert content_hash == digests.content_hash(rt, a, text)
    assert digests.is_keyed(fingerprint)
    with rt.db.read() as s:
        assert all(digests.is_keyed(f) for f in s.scalars(select(Request.fingerprint)))
    assert reindex.backfill(rt).digests_rekeyed == 0  # nothing left, and it stops looking

    assert store.store(rt, a, content=text, request_id="old").memory_id == old
    with pytest.raises(ValidationError):
        store.store(rt, a, content="something else", request_id="old")
    again = store.store(rt, a, content=text, request_id="new").memory_id
    land_all(rt)
    with rt.db.read() as s:
        blob_ids = set(s.scalars(select(Memory.blob_id).where(Memory.id.in_([old, again]))))
    assert len(blob_ids) == 1  # deduplicated against the rewritten row


def _unkeyed(data: bytes) -> set[bytes]:
    """Every common unkeyed hash of ``data``, raw and in hex."""
    out: set[bytes] = set()
    for name in ("sha256", "sha1", "md5", "blake2b", "blake2s", "sha512"):
        digest = hashlib.new(name, data).digest()
        out |= {digest, digest.hex().encode(), digest.hex().upper().encode()}
    return out


def test_a_copy_of_the_database_holds_no_unkeyed_hash_of_a_memory_or_a_call(
    rt: Runtime,
) -> None:
    """The SQLite file and its WAL, or a pg_dump: no unkeyed hash of any stored content or
    of any call's arguments, a forgotten memory's included."""
    a = account(rt)
    secrets_ = ["My PIN is 4821", "Diagnosis: type 2 diabetes", "Door code 7731#"]
    ids = [
        store.store(rt, a, content=text, request_id=f"s{i}").memory_id
        for i, text in enumerate(secrets_)
    ]
    land_all(rt)
    forget.forget(rt, a, memory_id=ids[1], request_id="f1")
    raw = database_bytes(rt)
    assert len(raw) > 10_000
    calls = [_store_args(text) for text in secrets_]
    calls.append(json.dumps({"memory_id": ids[1]}, separators=(",", ":")))
    for data in [t.encode() for t in secrets_] + [c.encode() for c in calls]:
        found = [h for h in _unkeyed(data) if h in raw]
        assert not found, f"an unkeyed hash of {data[:30]!r} is in the database"
