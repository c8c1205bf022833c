"""Digests of user data at rest are keyed: content hashes and request fingerprints.

A bare SHA-256 of a memory, or of a call's arguments, lets whoever holds a copy of the
database confirm a guess: hashing "My PIN is 0000" … "9999" finds the stored one in
milliseconds. So every such digest is an HMAC under the account's digest key
(:func:`walkeep.crypto.digest_key`, which needs the master key): equal data still gives
equal digests inside one account — deduplication and idempotency work as before — but a
copy of the database alone confirms nothing, and two accounts' digests never match.

Rows written before digests were keyed hold the bare SHA-256 in hex. Idempotency accepts
either form for the row it finds, and :func:`rekey` (run by the worker's ``reindex`` job)
rewrites them, a batch at a time: the MAC is taken over the SHA-256, so no plaintext is
needed.
"""

from __future__ import annotations

import hashlib
import threading

from sqlalchemy import select, update

from walkeep import nowait
from walkeep.crypto import (
    KEYED_DIGEST_PREFIX,
    digest_key,
    keyed_digest,
    keyed_token,
    load_master_key,
)
from walkeep.db.models import Memory, Request
from walkeep.service.runtime import Runtime

CONTENT = b"content"
REQUEST = b"request"
REKEY_BATCH = 1000

_EXTRA = "digest_keys"
_lock = threading.Lock()


def prime(rt: Runtime, master_key: bytes | None = None) -> None:
    """Hold the master key from now on (bootstrap passes the one it read), so that no store
    has to read it: that is a wait, and a store that may run on the event loop would go
    to a thread instead."""
    with _lock:
        if _EXTRA not in rt.extras:
            rt.extras[_EXTRA] = {"": master_key or load_master_key(rt.settings)}


def _key(rt: Runtime, account_id: str) -> bytes:
    keys = rt.extras.get(_EXTRA)
    if keys is None:
        # Not primed (a runtime built by hand): reading the master key is a wait, never
        # taken on an event loop (walkeep/nowait.py).
        nowait.refuse("the master key is not loaded yet")
        prime(rt)
        keys = rt.extras[_EXTRA]
    key = keys.get(account_id)
    if key is None:
        key = keys[account_id] = digest_key(keys[""], account_id)
    assert isinstance(key, bytes)
    return key


def digest_key_of(rt: Runtime, account_id: str) -> bytes:
    """The account's digest key (for tokens computed in bulk: metadata tags)."""
    return _key(rt, account_id)


def master_key(rt: Runtime) -> bytes:
    """The master key this runtime holds (for keys derived from it per account)."""
    return _key(rt, "")  # the "" entry is the master key itself (see ``prime``)


def token(rt: Runtime, account_id: str, label: bytes, data: bytes) -> str:
    """A short keyed digest of ``data`` (``crypto.keyed_token``), for values matched and
    indexed on every query: namespaces."""
    return keyed_token(_key(rt, account_id), label, data)


def bare(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def keyed(rt: Runtime, account_id: str, label: bytes, sha256: bytes) -> str:
    return keyed_digest(_key(rt, account_id), label, sha256)


def content_hash(rt: Runtime, account_id: str, content: str) -> str:
    """What ``memories.content_hash`` holds: equal for identical content in one account."""
    return keyed(rt, account_id, CONTENT, bare(content.encode("utf-8")))


def is_keyed(value: str) -> bool:
    return value.startswith(KEYED_DIGEST_PREFIX)


def rekey(rt: Runtime, *, limit: int = REKEY_BATCH) -> int:
    """Rewrite up to ``limit`` bare digests (from before keying) as keyed ones; how many.

    Once a pass finds none, this process stops looking (new rows are always keyed)."""
    if rt.extras.get("digests_rekeyed"):
        return 0
    done = 0
    for model, column, label in (
        (Memory, Memory.content_hash, CONTENT),
        (Request, Request.fingerprint, REQUEST),
    ):
        with rt.db.begin() as s:
            rows = s.execute(
                select(model.id, model.account_id, column)
                .where(column < KEYED_DIGEST_PREFIX)
                .limit(limit - done)
            ).all()
            for pk, account_id, old in rows:
                new = keyed(rt, account_id, label, bytes.fromhex(old))
                s.execute(update(model).where(model.id == pk, column == old).values({column: new}))
        done += len(rows)
        if done >= limit:
            return done
    if done == 0:
        rt.extras["digests_rekeyed"] = True
    return done
