"""API keys: hashed at rest, looked up by hash, revocable, with a default namespace."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from tests.conftest import TEST_MASTER_KEY_BYTES
from walkeep import ids
from walkeep.db import Database
from walkeep.db.models import ApiKey
from walkeep.errors import Unauthorized, ValidationError
from walkeep.service.operators import accounts


def test_keys_are_hashed_and_resolve(db: Database) -> None:
    created = accounts.create_account(db, "acme", credits_mc=1000)
    assert created.api_key.startswith("wk_live_") and len(created.api_key) >= 8 + 43
    with db.read() as s:
        row = s.scalar(select(ApiKey))
    assert row is not None
    assert row.key_hash == ids.api_key_hash(created.api_key)
    assert created.api_key not in (row.key_hash, row.prefix)
    assert row.prefix == created.api_key[:16]
    principal = accounts.authenticate(db, created.api_key, TEST_MASTER_KEY_BYTES)
    assert principal.account_id == created.account_id


def test_revoked_and_unknown_keys_are_refused(db: Database) -> None:
    created = accounts.create_account(db, "acme")
    accounts.revoke_key(db, created.key_prefix)
    with pytest.raises(Unauthorized):
        accounts.authenticate(db, created.api_key, TEST_MASTER_KEY_BYTES)
    with pytest.raises(Unauthorized):
        accounts.authenticate(db, "wk_live_" + "x" * 43, TEST_MASTER_KEY_BYTES)
    with pytest.raises(Unauthorized):
        accounts.authenticate(db, "Bearer nonsense", TEST_MASTER_KEY_BYTES)


def test_key_default_namespace(db: Database) -> None:
    created = accounts.create_account(db, "acme")
    key = accounts.create_key(
        db, created.account_id, default_namespace="work", master_key=TEST_MASTER_KEY_BYTES
    )
    assert accounts.authenticate(db, key.api_key, TEST_MASTER_KEY_BYTES).default_namespace == "work"
    with pytest.raises(ValidationError):
        accounts.create_key(
            db, created.account_id, default_namespace="x" * 256, master_key=TEST_MASTER_KEY_BYTES
        )


def test_key_entropy() -> None:
    keys = {ids.new_api_key() for _ in range(1000)}
    assert len(keys) == 1000
    # 32 random bytes, URL-safe base64 → 43 characters after the prefix.
    assert all(len(k) == len("wk_live_") + 43 for k in keys)
