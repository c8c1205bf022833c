"""Encryption before storage: master key loading, per-account data keys, AES-SIV blobs."""

from __future__ import annotations

import base64
import os
import secrets
import stat
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.keywrap import aes_key_unwrap
from sqlalchemy import event, func, select, update

from walkeep.config import Settings
from walkeep.crypto import (
    HEADER_LEN,
    DecryptionError,
    Keyring,
    load_master_key,
    master_key_id,
)
from walkeep.db import Database
from walkeep.db.models import DataKey
from walkeep.errors import ConfigurationError, NotFound
from walkeep.service.operators import accounts


@pytest.fixture
def master() -> bytes:
    return secrets.token_bytes(32)


@pytest.fixture
def acct(db: Database) -> str:
    return accounts.create_account(db, "alice").account_id


@pytest.fixture
def acct2(db: Database) -> str:
    return accounts.create_account(db, "bob").account_id


def _dek_rows(db: Database) -> int:
    with db.read() as s:
        return int(s.scalar(select(func.count()).select_from(DataKey)) or 0)


# --- AES-SIV blobs ----------------------------------------------------------------------


@pytest.mark.parametrize("size", [0, 1, 15, 16, 17, 1000, 256 * 1024])
def test_round_trip(db: Database, master: bytes, acct: str, size: int) -> None:
    ring = Keyring(db, master)
    plaintext = secrets.token_bytes(size)
    blob = ring.encrypt(acct, plaintext)
    assert blob[:5] == b"WK1\x01\x01"
    # Short random plaintexts can occur inside random ciphertext by chance; for
    # 16+ bytes a match would mean the content was not encrypted.
    assert size < 16 or plaintext not in blob[HEADER_LEN:]
    assert len(blob) == HEADER_LEN + 16 + size  # header + SIV tag + ciphertext
    assert ring.decrypt(acct, blob) == plaintext


def test_deterministic_within_account_distinct_across_accounts(
    db: Database, master: bytes, acct: str, acct2: str
) -> None:
    ring = Keyring(db, master)
    content = b"User prefers dark mode in every editor."
    a1, a2 = ring.encrypt(acct, content), ring.encrypt(acct, content)
    b1 = ring.encrypt(acct2, content)
    assert a1 == a2  # same content, same account => same blob (dedupe)
    assert a1 != b1
    assert a1[HEADER_LEN:] != b1[HEADER_LEN:]
    assert ring.encrypt(acct, content + b".") != a1
    assert ring.decrypt(acct2, b1) == content


def test_wrong_account_and_tampering_are_refused(
    db: Database, master: bytes, acct: str, acct2: str
) -> None:
    ring = Keyring(db, master)
    blob = ring.encrypt(acct, b"secret plans for the launch")
    ring.encrypt(acct2, b"bob's own data")  # bob has a key of his own
    with pytest.raises(DecryptionError, match="wrong account or tampered"):
        ring.decrypt(acct2, blob)
    for pos in (HEADER_LEN, HEADER_LEN + 15, HEADER_LEN + 16, len(blob) - 1):
        tampered = bytearray(blob)
        tampered[pos] ^= 0x01
        with pytest.raises(DecryptionError):
            ring.decrypt(acct, bytes(tampered))
    with pytest.raises(DecryptionError, match="bad header"):
        ring.decrypt(acct, b"XX1" + blob[3:])
    with pytest.raises(DecryptionError, match="format version"):
        ring.decrypt(acct, blob[:3] + b"\x09" + blob[4:])
    with pytest.raises(DecryptionError, match="data-key version"):
        ring.decrypt(acct, blob[:4] + b"\x07" + blob[5:])
    with pytest.raises(DecryptionError):
        ring.decrypt(acct, blob[:-1])  # truncated
    with pytest.raises(DecryptionError):
        ring.decrypt(acct, blob[:HEADER_LEN])
    assert ring.decrypt(acct, blob) == b"secret plans for the launch"


def test_decrypt_never_creates_a_key(db: Database, master: bytes, acct: str) -> None:
    ring = Keyring(db, master)
    blob = ring.encrypt(acct, b"x")
    carol = accounts.create_account(db, "carol").account_id
    with pytest.raises(DecryptionError, match="no data key"):
        ring.decrypt(carol, blob)
    assert _dek_rows(db) == 1


def test_unknown_account_is_not_found(db: Database, master: bytes) -> None:
    with pytest.raises(NotFound):
        Keyring(db, master).encrypt("acct_doesnotexist", b"x")
    assert _dek_rows(db) == 0


# --- data keys at rest ---------------------------------------------------------------


def test_dek_is_stored_wrapped(db: Database, master: bytes, acct: str) -> None:
    ring = Keyring(db, master)
    ring.encrypt(acct, b"hello")
    with db.read() as s:
        row = s.get(DataKey, acct)
    assert row is not None
    assert row.master_key_id == master_key_id(master) == ring.master_key_id
    assert len(row.master_key_id) == 16
    assert len(row.wrapped) == 40  # 32-byte DEK + 8-byte AES-KW integrity block
    assert len(aes_key_unwrap(master, row.wrapped)) == 32


def test_second_keyring_with_same_master_decrypts(db: Database, master: bytes, acct: str) -> None:
    blob = Keyring(db, master).encrypt(acct, b"survives a restart")
    fresh_process = Database(db.url, clock=db.clock)
    try:
        ring2 = Keyring(fresh_process, master)
        assert ring2.decrypt(acct, blob) == b"survives a restart"
        assert ring2.encrypt(acct, b"survives a restart") == blob
    finally:
        fresh_process.dispose()
    assert _dek_rows(db) == 1


def test_different_master_key_cannot_unwrap(db: Database, master: bytes, acct: str) -> None:
    blob = Keyring(db, master).encrypt(acct, b"only for the right master key")
    other = Keyring(db, secrets.token_bytes(32))
    with pytest.raises(DecryptionError, match="wrapped by master key"):
        other.decrypt(acct, blob)
    with pytest.raises(DecryptionError):
        other.encrypt(acct, b"must not silently create a second key")
    # Even if the fingerprint were forged to match, AES-KW's integrity check refuses.
    with db.begin() as s:
        s.execute(
            update(DataKey)
            .where(DataKey.account_id == acct)
            .values(master_key_id=other.master_key_id)
        )
    with pytest.raises(DecryptionError, match="does not unwrap"):
        other.decrypt(acct, blob)
    assert _dek_rows(db) == 1


def test_concurrent_first_use_in_one_process(db: Database, master: bytes, acct: str) -> None:
    ring = Keyring(db, master)
    with ThreadPoolExecutor(8) as pool:
        blobs = list(pool.map(lambda _: ring.encrypt(acct, b"same"), range(8)))
    assert len(set(blobs)) == 1
    assert _dek_rows(db) == 1


class _RacingKeyring(Keyring):
    """Holds every creator at a barrier after its read found no key, forcing the race."""

    def __init__(self, db: Database, master: bytes, barrier: threading.Barrier) -> None:
        super().__init__(db, master)
        self._barrier = barrier

    def _new_dek(self) -> bytes:
        self._barrier.wait(timeout=30)
        return super()._new_dek()


def test_concurrent_first_use_by_eight_processes_creates_one_key(
    db: Database, master: bytes, acct: str
) -> None:
    barrier = threading.Barrier(8)
    # Eight Keyrings = eight processes: no shared in-memory cache or lock.
    rings = [_RacingKeyring(db, master, barrier) for _ in range(8)]
    refused: list[BaseException] = []
    event.listen(db.engine, "handle_error", lambda ctx: refused.append(ctx.original_exception))
    with ThreadPoolExecutor(8) as pool:
        blobs = list(pool.map(lambda r: r.encrypt(acct, b"same content"), rings))
    assert _dek_rows(db) == 1
    # The losers' inserts did nothing: no unique-key violation reached the database's log
    # (issue 29: two web processes logged one per account's first store).
    assert refused == []
    assert len(set(blobs)) == 1  # everyone ended up with the winner's key
    for ring in rings:
        assert ring.decrypt(acct, blobs[0]) == b"same content"


# --- master key ----------------------------------------------------------------------


@pytest.fixture
def no_env_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WALKEEP_MASTER_KEY", raising=False)


def test_master_key_file_created_0600_and_reused(tmp_path: Path, no_env_key: None) -> None:
    settings = Settings(data_dir=tmp_path / "state")
    key = load_master_key(settings)
    path = tmp_path / "state" / "master.key"
    assert len(key) == 32
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert base64.b64decode(path.read_text().strip()) == key
    assert load_master_key(Settings(data_dir=tmp_path / "state")) == key
    assert sorted(p.name for p in path.parent.iterdir()) == ["master.key"]


def test_master_key_concurrent_creators_agree(tmp_path: Path, no_env_key: None) -> None:
    settings = Settings(data_dir=tmp_path / "state")
    barrier = threading.Barrier(8)

    def load(_: int) -> bytes:
        barrier.wait(timeout=30)
        return load_master_key(settings)

    with ThreadPoolExecutor(8) as pool:
        keys = set(pool.map(load, range(8)))
    assert len(keys) == 1
    assert sorted(p.name for p in (tmp_path / "state").iterdir()) == ["master.key"]


def test_master_key_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key = os.urandom(32)
    monkeypatch.setenv("WALKEEP_MASTER_KEY", base64.b64encode(key).decode())
    assert load_master_key(Settings(data_dir=tmp_path)) == key
    assert not (tmp_path / "master.key").exists()
    monkeypatch.setenv("WALKEEP_MASTER_KEY", base64.urlsafe_b64encode(key).decode())
    assert load_master_key(Settings(data_dir=tmp_path)) == key


@pytest.mark.parametrize(
    "value",
    [
        "not base64 at all!!",
        base64.b64encode(b"\x01" * 16).decode(),  # AES-128-sized: refused
        base64.b64encode(b"\x01" * 33).decode(),
        "",
    ],
)
def test_bad_master_key_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("WALKEEP_MASTER_KEY", value)
    with pytest.raises(ConfigurationError) as info:
        load_master_key(Settings(data_dir=tmp_path))
    assert "WALKEEP_MASTER_KEY" in str(info.value)
    assert "\n" not in str(info.value)
    assert not (tmp_path / "master.key").exists()


def test_corrupt_master_key_file_is_refused(tmp_path: Path, no_env_key: None) -> None:
    (tmp_path / "master.key").write_text(base64.b64encode(b"short").decode())
    with pytest.raises(ConfigurationError, match="master key file"):
        load_master_key(Settings(data_dir=tmp_path))


def test_keyring_rejects_wrong_size_master(db: Database) -> None:
    with pytest.raises(ConfigurationError):
        Keyring(db, b"\x00" * 16)


def test_a_key_not_loaded_yet_is_never_loaded_by_a_call_that_promised_not_to_wait(
    db: Database, master: bytes, acct: str
) -> None:
    """Loading an account's key holds the account's lock across a database read: on the
    event loop a second caller waiting for that lock would stop the loop the read is
    awaited on. So a no-wait caller is refused, having written nothing, and the key is
    loaded where waiting is harmless; after that, no-wait callers use it."""
    from walkeep import nowait

    ring = Keyring(db, master)
    with nowait.no_wait(), pytest.raises(nowait.WouldWait, match="data key"):
        ring.encrypt(acct, b"first")
    assert _dek_rows(db) == 0  # not even created
    blob = ring.encrypt(acct, b"first")  # on a thread, as the transports retry it
    assert _dek_rows(db) == 1
    with nowait.no_wait():
        assert ring.encrypt(acct, b"first") == blob
        assert ring.decrypt(acct, blob) == b"first"
    other = Keyring(db, master)  # another process: the key exists, but is not loaded here
    with nowait.no_wait(), pytest.raises(nowait.WouldWait):
        other.decrypt(acct, blob)
