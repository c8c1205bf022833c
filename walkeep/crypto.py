"""Encryption before anything leaves our infrastructure.

Two layers of keys:

* the **master key** (32 bytes) belongs to the deployment: ``WALKEEP_MASTER_KEY``
  (base64) or, in the embedded default, ``<data_dir>/master.key`` generated on
  first use. It never encrypts content; it only wraps data keys.
* one **data key** (DEK, 256 random bits) per account, stored in ``data_keys``
  wrapped with AES key wrap (RFC 3394) under the master key. Rotating the master
  key therefore means re-wrapping one small row per account, not re-encrypting
  any blob on Walrus.

Content is sealed with AES-SIV (RFC 5297), a *deterministic* authenticated
cipher: see :class:`Keyring` for why, and for exactly what that reveals.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import hmac
import json
import logging
import os
import secrets
import stat
import threading
import time
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM, AESSIV
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.keywrap import (
    InvalidUnwrap,
    aes_key_unwrap,
    aes_key_wrap,
)
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from walkeep import nowait
from walkeep.config import Settings
from walkeep.db import Database, insert_if_absent
from walkeep.db.models import DataKey, table
from walkeep.errors import ConfigurationError, NotFound

log = logging.getLogger(__name__)

MASTER_KEY_BYTES = 32
DEK_BYTES = 32
MASTER_KEY_FILENAME = "master.key"

MAGIC = b"WK1"
FORMAT_VERSION = 1
# The data-key generation a blob was sealed with. ``data_keys`` holds one key per
# account today, so this is always 1; a rotation scheme that keeps old DEKs
# readable would bump it (and needs a versioned data_keys row).
KEY_VERSION = 1
HEADER = MAGIC + bytes([FORMAT_VERSION, KEY_VERSION])
HEADER_LEN = len(HEADER)
SIV_TAG_BYTES = 16

_HKDF_INFO = b"walkeep/v1/aes-siv-512/content"
# The lexical index's term MAC key (walkeep/index/terms.py): derived from the same
# data key with another label, so it is per account and never the content key.
_TERMS_INFO = b"walkeep/v1/blake2b-64/terms"
_KEY_ID_DOMAIN = b"walkeep master key id v1\x00"
# How long a reader waits for a concurrent creator to finish writing master.key
# (only on filesystems without hard links, where creation is not atomic).
_MASTER_KEY_WAIT_SECONDS = 2.0


class DecryptionError(Exception):
    """A blob could not be opened: wrong account, wrong key, or tampered bytes.

    Deliberately not a WalkeepError: it signals corruption or a mix-up inside
    Walkeep, which transports report as INTERNAL, never with details.
    """


# --- master key --------------------------------------------------------------------


def _decode_master_key(value: str, source: str) -> bytes:
    text = "".join(value.split())  # tolerate line breaks / trailing newline
    try:
        raw = text.encode("ascii")
        if b"-" in raw or b"_" in raw:  # URL-safe alphabet
            key = base64.b64decode(raw, altchars=b"-_", validate=True)
        else:
            key = base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError, UnicodeEncodeError):
        raise ConfigurationError(
            f"{source} is not valid base64 (expected base64 of {MASTER_KEY_BYTES} random bytes)"
        ) from None
    if len(key) != MASTER_KEY_BYTES:
        raise ConfigurationError(
            f"{source} decodes to {len(key)} bytes; it must be base64 of exactly "
            f"{MASTER_KEY_BYTES} bytes (e.g. `openssl rand -base64 32`)"
        )
    return key


def _read_master_key_file(path: Path) -> bytes:
    """Read an existing key file, waiting briefly if a creator is mid-write."""
    deadline = time.monotonic() + _MASTER_KEY_WAIT_SECONDS
    while True:
        content = path.read_text(encoding="ascii", errors="replace")
        if content.strip() or time.monotonic() >= deadline:
            break
        time.sleep(0.01)
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        log.warning("master key file %s is readable by others (mode %o); chmod 600 it", path, mode)
    return _decode_master_key(content, f"master key file {path}")


def _create_master_key_file(path: Path) -> None:
    """Create ``path`` with a fresh key, atomically, mode 0600.

    The key is written to a private temporary file (O_CREAT|O_EXCL, 0600) and
    published with ``link()``, which fails if ``path`` exists: a reader never
    sees a half-written file and exactly one of several concurrent creators
    wins. Raises FileExistsError when someone else won.
    """
    encoded = base64.b64encode(secrets.token_bytes(MASTER_KEY_BYTES)) + b"\n"
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(6)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.fchmod(fd, 0o600)  # whatever the umask
        os.write(fd, encoded)
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise
    except OSError:
        # Filesystem without hard links: fall back to exclusive create in place
        # (readers wait for the content, see _read_master_key_file).
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.fchmod(fd, 0o600)
            os.write(fd, encoded)
            os.fsync(fd)
        finally:
            os.close(fd)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    # Make the new directory entry durable: losing this file after data was
    # encrypted under it would make that data unreadable forever.
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    log.info("generated a new master key at %s (back it up: without it nothing decrypts)", path)


def load_master_key(settings: Settings) -> bytes:
    """The deployment's 32-byte master key.

    ``WALKEEP_MASTER_KEY`` (base64 of 32 bytes) wins; otherwise
    ``<data_dir>/master.key`` is used, generated on first use. A malformed key
    is a ConfigurationError with a one-line reason: starting with a wrong key
    would make every stored memory unreadable.
    """
    if settings.master_key is not None:
        return _decode_master_key(settings.master_key, "WALKEEP_MASTER_KEY")
    data_dir = Path(settings.data_dir).expanduser()
    data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = data_dir / MASTER_KEY_FILENAME
    if not path.exists():
        with contextlib.suppress(FileExistsError):
            _create_master_key_file(path)
    return _read_master_key_file(path)


def master_key_id(key: bytes) -> str:
    """A short, non-secret fingerprint of a master key (16 hex chars).

    Stored next to each wrapped DEK so a process holding a different master key
    fails with a clear message instead of an opaque unwrap error.
    """
    return hashlib.sha256(_KEY_ID_DOMAIN + key).hexdigest()[:16]


# --- small secrets at rest (alert signing secrets) ---------------------------------------

_SECRET_INFO = b"walkeep/secrets-at-rest/v1"
SEALED_PREFIX = "enc1:"


def _secret_cipher(master_key: bytes) -> AESSIV:
    key = HKDF(algorithm=hashes.SHA256(), length=64, salt=None, info=_SECRET_INFO).derive(
        master_key
    )
    return AESSIV(key)


def seal_secret(master_key: bytes, secret: str, *, context: str) -> str:
    """``secret`` encrypted under the master key, bound to ``context`` (e.g. the account
    id, so a sealed value copied to another row does not open there). Short enough for a
    100-character column when the secret is ~50 characters.

    Why: a signing secret kept in clear lets whoever reads a database dump forge the
    webhooks receivers trust; content keys were already wrapped, these were not.
    """
    sealed = _secret_cipher(master_key).encrypt(secret.encode(), [context.encode()])
    return SEALED_PREFIX + base64.urlsafe_b64encode(sealed).decode().rstrip("=")


def open_secret(master_key: bytes, stored: str, *, context: str) -> str:
    """The secret :func:`seal_secret` sealed; a value stored before sealing (no prefix)
    is returned as it is, so existing webhooks keep working until they are set again."""
    if not stored.startswith(SEALED_PREFIX):
        return stored
    raw = stored[len(SEALED_PREFIX) :]
    try:
        data = base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4))
        return _secret_cipher(master_key).decrypt(data, [context.encode()]).decode()
    except (InvalidTag, ValueError, binascii.Error) as exc:
        raise DecryptionError(
            "a stored secret does not open with this master key (was WALKEEP_MASTER_KEY "
            "changed, or is it different in this process?)"
        ) from exc


_DIGEST_INFO = b"walkeep/v1/hmac-sha256/digests\x00"
# A keyed digest is this letter and 63 hex digits; a bare SHA-256 in hex never starts with it.
KEYED_DIGEST_PREFIX = "k"


def digest_key(master_key: bytes, account_id: str) -> bytes:
    """The account's key for digests of its data at rest (content hashes, request
    fingerprints). Derived from the master key and the account id, not from the data key:
    digests are taken on every store before any data key is loaded, and by the MemWal
    relayer's deployments, which hold no data keys."""
    info = _DIGEST_INFO + account_id.encode("utf-8")
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(master_key)


def keyed_digest(key: bytes, label: bytes, sha256: bytes) -> str:
    """HMAC-SHA256 over ``label`` and a SHA-256 of the data, as stored (64 characters).

    Taken over the data's SHA-256 (not the data) so a row stored with the bare SHA-256
    can be rewritten without its plaintext, which the database never held."""
    mac = hmac.new(key, label + b"\x00" + sha256, hashlib.sha256).hexdigest()
    return KEYED_DIGEST_PREFIX + mac[:63]


_SEAL_INFO = b"walkeep/v1/aes-siv-512/fields\x00"
_VECTOR_INFO = b"walkeep/v1/aes-gcm-256/vectors\x00"
# A sealed field is this prefix and URL-safe base64 (no padding) of AES-SIV's output.
SEALED_FIELD_PREFIX = "s1:"
VECTOR_NONCE_BYTES = 12
VECTOR_OVERHEAD = VECTOR_NONCE_BYTES + 16  # nonce + GCM tag


def keyed_token(key: bytes, label: bytes, data: bytes) -> str:
    """A short keyed digest (``k`` and 31 hex digits, 124 bits) for values that are matched
    on every query and indexed (namespaces): equal inside one account, unrelated across
    accounts, and no guess confirmable without the key."""
    mac = hmac.new(key, label + b"\x00" + data, hashlib.sha256).hexdigest()
    return KEYED_DIGEST_PREFIX + mac[:31]


def metadata_tag(key: bytes, name: str, value: str) -> str:
    """The keyed token a metadata pair is matched by (``key`` is the account's digest key):
    recall and export filter on ``name=value`` through these, never through the sealed
    map. JSON keeps the pair unambiguous whatever characters either part holds."""
    pair = json.dumps([name, value], ensure_ascii=False, separators=(",", ":"))
    return keyed_token(key, b"metadata-tag", pair.encode("utf-8"))


def field_cipher(master_key: bytes, account_id: str) -> AESSIV:
    """The account's cipher for small fields kept in the database (metadata, namespace
    names). Derived from the master key and the account id, like :func:`digest_key`: a
    store seals them before any data key is loaded."""
    info = _SEAL_INFO + account_id.encode("utf-8")
    key = HKDF(algorithm=hashes.SHA256(), length=64, salt=None, info=info).derive(master_key)
    return AESSIV(key)


def seal_field(cipher: AESSIV, data: bytes, *, context: bytes) -> str:
    """``data`` sealed (AES-SIV, bound to ``context``), as text for a string or JSON column.

    Deterministic, like content: equal values of one account seal alike (they are
    linkable inside the account, as equal content is); nothing else is revealed."""
    sealed = cipher.encrypt(data, [context])
    return SEALED_FIELD_PREFIX + base64.urlsafe_b64encode(sealed).decode().rstrip("=")


def open_field(cipher: AESSIV, stored: str, *, context: bytes) -> bytes:
    raw = stored[len(SEALED_FIELD_PREFIX) :]
    try:
        data = base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4))
        return cipher.decrypt(data, [context])
    except (InvalidTag, ValueError, binascii.Error) as exc:
        raise DecryptionError(
            "a sealed field does not open with this master key (was WALKEEP_MASTER_KEY "
            "changed, or is it different in this process?)"
        ) from exc


def vector_cipher(master_key: bytes, account_id: str) -> AESGCM:
    """The account's cipher for index vectors at rest (``embeddings.vector``).

    A plain vector confirms a guess: embed the guessed text with the public model and
    compare. Sealed with AES-GCM under a fresh nonce per row, a copy of the database holds
    nothing to compare with, and no two rows (a namespace's copy of a blob's rows) match.
    Only the index builder opens them; the index files it writes are the documented
    exception (docs/security.md)."""
    info = _VECTOR_INFO + account_id.encode("utf-8")
    key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(master_key)
    return AESGCM(key)


def seal_vector(cipher: AESGCM, data: bytes, account_id: str) -> bytes:
    nonce = secrets.token_bytes(VECTOR_NONCE_BYTES)
    return nonce + cipher.encrypt(nonce, data, account_id.encode("utf-8"))


def open_vector(cipher: AESGCM, stored: bytes, account_id: str) -> bytes:
    nonce, body = stored[:VECTOR_NONCE_BYTES], stored[VECTOR_NONCE_BYTES:]
    try:
        return cipher.decrypt(nonce, body, account_id.encode("utf-8"))
    except InvalidTag as exc:
        raise DecryptionError("an index vector does not open with this master key") from exc


# --- per-account data keys -----------------------------------------------------------


def _terms_key_for(dek: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_TERMS_INFO).derive(dek)


def _siv_for(dek: bytes) -> AESSIV:
    # AES-SIV-256 needs a 512-bit key (two AES-256 keys); DEKs stay 256-bit and
    # the SIV key is derived, so the stored key size is independent of the mode.
    siv_key = HKDF(algorithm=hashes.SHA256(), length=64, salt=None, info=_HKDF_INFO).derive(dek)
    return AESSIV(siv_key)


class Keyring:
    """Per-account data keys and the content cipher.

    **Deterministic encryption, on purpose.** ``encrypt`` is AES-SIV with no
    nonce: the same plaintext in the same account always gives the same
    ciphertext, hence the same Walrus blob_id, so identical memories dedupe to
    one blob and share one renewal. The trade-off: someone who can see the
    stored blobs learns *which blobs of one account have equal content* — that
    and nothing else beyond what any cipher shows (the length): no content, and
    no cross-account equality, because every account has its own key and its id
    is bound in as associated data, so two accounts never share a ciphertext.

    Data keys are created on first use. Two processes creating the same
    account's key at once are arbitrated by the ``data_keys`` primary key: the
    loser's insert does nothing (ON CONFLICT) and it re-reads the winner's key. Unwrapped keys are
    cached in memory for the life of the Keyring.
    """

    def __init__(self, db: Database, master_key: bytes) -> None:
        if len(master_key) != MASTER_KEY_BYTES:
            raise ConfigurationError(f"master key must be {MASTER_KEY_BYTES} bytes")
        self._db = db
        self._master = master_key
        self.master_key_id = master_key_id(master_key)
        self._ciphers: dict[str, AESSIV] = {}
        self._terms_keys: dict[str, bytes] = {}
        self._vector_ciphers: dict[str, AESGCM] = {}
        self._lock = threading.Lock()
        self._account_locks: dict[str, threading.Lock] = {}

    # -- public API ----------------------------------------------------------------

    def encrypt(self, account_id: str, plaintext: bytes) -> bytes:
        """Seal ``plaintext`` for ``account_id``: ``WK1 | version | key version | SIV tag | ct``."""
        cipher = self._cipher(account_id, create=True)
        assert cipher is not None
        return HEADER + cipher.encrypt(plaintext, [HEADER, account_id.encode("utf-8")])

    def decrypt(self, account_id: str, blob: bytes) -> bytes:
        """Open a blob sealed by :meth:`encrypt` for the same account.

        Raises DecryptionError for a foreign format, an unknown key version, a
        wrong account, a wrong master key or any modified byte.
        """
        if len(blob) < HEADER_LEN + SIV_TAG_BYTES or blob[:3] != MAGIC:
            raise DecryptionError("not a Walkeep-encrypted blob (bad header)")
        if blob[3] != FORMAT_VERSION:
            raise DecryptionError(f"unsupported blob format version {blob[3]}")
        if blob[4] != KEY_VERSION:
            raise DecryptionError(f"unknown data-key version {blob[4]}")
        cipher = self._cipher(account_id, create=False)
        if cipher is None:
            raise DecryptionError("no data key for this account: blob belongs elsewhere")
        try:
            return cipher.decrypt(
                blob[HEADER_LEN:], [blob[:HEADER_LEN], account_id.encode("utf-8")]
            )
        except InvalidTag:
            raise DecryptionError(
                "authentication failed: wrong account or tampered ciphertext"
            ) from None

    def terms_key(self, account_id: str) -> bytes | None:
        """The account's key for hashing index terms; None if it has no data key yet
        (then it has no content either, so nothing to search)."""
        with self._lock:
            key = self._terms_keys.get(account_id)
        if key is None and self._cipher(account_id, create=False) is not None:
            with self._lock:
                key = self._terms_keys.get(account_id)
        return key

    def vector_cipher(self, account_id: str) -> AESGCM:
        """The account's cipher for index vectors at rest (:func:`vector_cipher`)."""
        with self._lock:
            cipher = self._vector_ciphers.get(account_id)
            if cipher is None:
                cipher = self._vector_ciphers[account_id] = vector_cipher(self._master, account_id)
            return cipher

    def forget_cache(self) -> None:
        """Drop unwrapped keys from memory (they are re-read on next use)."""
        with self._lock:
            self._ciphers.clear()
            self._terms_keys.clear()

    # -- internals -----------------------------------------------------------------

    def _new_dek(self) -> bytes:
        """A fresh random data key (a method so tests can force creation races)."""
        return secrets.token_bytes(DEK_BYTES)

    def _cipher(self, account_id: str, *, create: bool) -> AESSIV | None:
        with self._lock:
            cipher = self._ciphers.get(account_id)
            if cipher is not None:
                return cipher
            account_lock = self._account_locks.setdefault(account_id, threading.Lock())
        # Loading (or creating) the key reads the database while holding the account's
        # lock. On an event loop (walkeep/nowait.py) that read is awaited on the loop
        # itself (PostgreSQL's Database.on_loop), so a second call for the same account
        # waiting for the lock there would stop the loop the first one needs to finish:
        # the whole process would hang (an account's first two stores, in parallel). So
        # the first use of an account's key in a process goes to a thread.
        nowait.refuse("the account's data key is not loaded yet")
        # One loader per account in this process; other accounts aren't blocked.
        with account_lock:
            with self._lock:
                cipher = self._ciphers.get(account_id)
            if cipher is not None:
                return cipher
            dek = self._load_dek(account_id)
            if dek is None:
                if not create:
                    return None
                dek = self._create_dek(account_id)
            cipher = _siv_for(dek)
            terms_key = _terms_key_for(dek)
            with self._lock:
                self._ciphers[account_id] = cipher
                self._terms_keys[account_id] = terms_key
            return cipher

    def _load_dek(self, account_id: str) -> bytes | None:
        with self._db.read() as s:
            row = s.execute(
                select(DataKey.wrapped, DataKey.master_key_id).where(
                    DataKey.account_id == account_id
                )
            ).first()
        if row is None:
            return None
        wrapped, stored_id = row
        if stored_id != self.master_key_id:
            raise DecryptionError(
                f"account data key is wrapped by master key {stored_id}, "
                f"but this process has master key {self.master_key_id}"
            )
        try:
            return aes_key_unwrap(self._master, bytes(wrapped))
        except InvalidUnwrap:
            raise DecryptionError("account data key does not unwrap with this master key") from None

    def _create_dek(self, account_id: str) -> bytes:
        dek = self._new_dek()
        wrapped = aes_key_wrap(self._master, dek)
        try:
            with self._db.begin() as s:
                # ON CONFLICT DO NOTHING: a creator in another process that got there first
                # wins without a unique-key violation (PostgreSQL logged one per race, and
                # aborted the loser's transaction); the loser re-reads the winner's key.
                # On SQLite, BEGIN IMMEDIATE serialises creators before they conflict.
                row = {
                    "account_id": account_id,
                    "wrapped": wrapped,
                    "master_key_id": self.master_key_id,
                    "created_at": self._db.clock.now(),
                }
                if insert_if_absent(s, table(DataKey), row, ["account_id"]) is not None:
                    return dek
        except IntegrityError:
            pass  # no such account (the foreign key): the re-read below says so
        existing = self._load_dek(account_id)
        if existing is None:
            raise NotFound("unknown account", {"account_id": account_id})
        return existing


__all__ = [
    "DecryptionError",
    "Keyring",
    "load_master_key",
    "master_key_id",
]
