"""Metadata and namespace names are sealed at rest; namespaces are matched by keyed token.

A copy of the database (a backup, a replica, a curious operator) must not read what an
agent filed its memories under: a namespace such as ``patient-4821`` or a metadata value
such as an email says as much as the content. So:

* a **namespace** is stored, indexed and compared as its *token*: a short keyed digest
  under the account's digest key (``crypto.keyed_token``), equal for equal names inside
  one account, unrelated across accounts. Every tool turns the name it is given into the
  token at its edge; everything below (the memories table, the index rows, the segment
  files, the relayer's jobs) sees only tokens. The name itself is kept once per account
  and token, sealed, in ``namespace_names``, so that the tools can show it again.
* **metadata** is stored as one sealed string (AES-SIV under the account's field key)
  in the ``metadata`` JSON column; readers open it with :func:`open_metadata`. Each
  ``name=value`` pair is also a keyed token in ``memory_tags`` (:func:`metadata_tags`),
  which is what recall's and export's ``metadata`` filter matches.
* an **API key's default namespace**, set by the operator, is sealed the same way
  (:func:`seal_key_namespace`): a key is looked up by its hash, never by its namespace,
  so no token is needed, only the name back when the key authenticates.

Both keys derive from the master key and the account id (like the digest key), so a
store seals before any data key is loaded, on the event loop, without a wait.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable
from typing import Any

from cryptography.hazmat.primitives.ciphers.aead import AESSIV
from sqlalchemy import select

from walkeep import crypto, nowait
from walkeep.db import insert_if_absent
from walkeep.db.models import NamespaceName, table
from walkeep.service import digests
from walkeep.service.runtime import Runtime

NAMESPACE = b"namespace"
_METADATA = b"metadata"
_NAMESPACE_NAME = b"namespace-name"
KEY_NAMESPACE = b"key-namespace"  # api_keys.default_namespace (migration 0025)

_lock = threading.Lock()


def _cache(rt: Runtime, name: str) -> dict[Any, Any]:
    with _lock:
        found = rt.extras.get(name)
        if found is None:
            found = rt.extras[name] = {}
        assert isinstance(found, dict)
        return found


def _cipher(rt: Runtime, account_id: str) -> AESSIV:
    ciphers = _cache(rt, "field_ciphers")
    cipher = ciphers.get(account_id)
    if cipher is None:
        cipher = ciphers[account_id] = crypto.field_cipher(digests.master_key(rt), account_id)
    return cipher


def namespace_token(rt: Runtime, account_id: str, name: str) -> str:
    """The token a namespace is stored and matched as (``name`` already validated)."""
    return digests.token(rt, account_id, NAMESPACE, name.encode("utf-8"))


def remember_namespace(rt: Runtime, account_id: str, name: str) -> str:
    """The namespace's token, after making sure its sealed name is kept (once per account
    and namespace; a process remembers which it has written)."""
    token = namespace_token(rt, account_id, name)
    known = _cache(rt, "namespace_names")
    if (account_id, token) not in known:
        # A write that can wait (on PostgreSQL its foreign key waits for a lock held on the
        # account's row): the first store of a namespace in a process goes to a thread.
        nowait.refuse("the namespace's sealed name is not recorded yet")
        row = {
            "account_id": account_id,
            "token": token,
            "sealed": crypto.seal_field(
                _cipher(rt, account_id), name.encode("utf-8"), context=_NAMESPACE_NAME
            ),
            "created_at": rt.clock.now(),
        }
        with rt.db.begin() as s:
            insert_if_absent(s, table(NamespaceName), row, ["account_id", "token"])
        known[(account_id, token)] = name
    return token


def namespace_names(rt: Runtime, account_id: str, tokens: Iterable[str]) -> dict[str, str]:
    """Each token's namespace name, as the caller named it. A token with no kept name
    (none is expected) is shown as itself rather than failing a read."""
    known = _cache(rt, "namespace_names")
    out: dict[str, str] = {}
    missing: set[str] = set()
    for token in tokens:
        name = known.get((account_id, token))
        if name is None:
            missing.add(token)
        else:
            out[token] = name
    if missing:
        with rt.db.read() as s:
            rows = s.execute(
                select(NamespaceName.token, NamespaceName.sealed).where(
                    NamespaceName.account_id == account_id,
                    NamespaceName.token.in_(sorted(missing)),
                )
            ).all()
        cipher = _cipher(rt, account_id)
        for token, stored in rows:
            name = crypto.open_field(cipher, stored, context=_NAMESPACE_NAME).decode("utf-8")
            out[token] = known[(account_id, token)] = name
        for token in missing - out.keys():
            out[token] = token
    return out


def seal_metadata(rt: Runtime, account_id: str, metadata: dict[str, str]) -> str:
    """What ``memories.metadata`` holds: the map as compact JSON, sealed."""
    data = json.dumps(metadata, ensure_ascii=False, separators=(",", ":"), sort_keys=True)
    return crypto.seal_field(_cipher(rt, account_id), data.encode("utf-8"), context=_METADATA)


def open_metadata(rt: Runtime, account_id: str, stored: object) -> dict[str, str]:
    """The map :func:`seal_metadata` sealed. An empty or missing value is ``{}``; a map
    stored before metadata was sealed (a dict) is returned as it is."""
    if isinstance(stored, dict):
        return {str(k): str(v) for k, v in stored.items()}
    if not isinstance(stored, str) or not stored:
        return {}
    data = crypto.open_field(_cipher(rt, account_id), stored, context=_METADATA)
    loaded = json.loads(data)
    return {str(k): str(v) for k, v in loaded.items()}


def metadata_tags(rt: Runtime, account_id: str, metadata: dict[str, str]) -> list[str]:
    """The keyed token of each ``name=value`` pair (``crypto.metadata_tag``), sorted."""
    key = digests.digest_key_of(rt, account_id)
    return sorted({crypto.metadata_tag(key, k, v) for k, v in metadata.items()})


def seal_key_namespace(master_key: bytes, account_id: str, name: str) -> str:
    """What ``api_keys.default_namespace`` holds: the name (already validated), sealed under
    the account's field key. Takes the master key, not a runtime: keys are created and
    listed by operator commands that hold only a database."""
    cipher = crypto.field_cipher(master_key, account_id)
    return crypto.seal_field(cipher, name.encode("utf-8"), context=KEY_NAMESPACE)


def open_key_namespace(master_key: bytes, account_id: str, stored: str | None) -> str | None:
    """The name :func:`seal_key_namespace` sealed (``None`` stays ``None``)."""
    if stored is None:
        return None
    cipher = crypto.field_cipher(master_key, account_id)
    return crypto.open_field(cipher, stored, context=KEY_NAMESPACE).decode("utf-8")
