"""The local network: a simulated Walrus + Sui that behaves like the real thing.

Why a model and not a stub: Walkeep's money and lifecycle rules only mean
something against a chain that enforces Walrus's rules, so the local network
enforces them (notes/walrus-sui.md §2.2):

- epochs advance on a clock (``floor((now - genesis) / epoch_seconds)``);
- a blob is readable while ``current_epoch < end_epoch`` (``end_epoch`` is
  exclusive) and gone afterwards;
- ``extend_blob`` refuses an expired blob, ``k <= 0`` and anything that would
  put ``end_epoch`` more than 53 epochs ahead; a transaction extending many
  blobs applies all of its calls or none;
- storage is priced like Walrus: ``ceil(encoded_size / 1 MiB) × price × epochs``
  with the real RS2 encoded size (~63 MiB units for a tiny blob);
- transaction digests are computed the way Sui computes them,
  ``base58(blake2b256(b"TransactionData::" ‖ tx_bytes))``, so a digest is
  known before submission and can be re-derived by anyone holding the bytes;
  re-executing a digest returns the recorded effects and changes nothing;
- a renewal's bytes are real Sui ``TransactionData`` (a PTB of
  ``<local package>::system::extend_blob`` calls) built and decoded by the Sui
  adapter's own code (``walkeep.backends.sui.ptb``), so ``walkeep verify``
  audits local and Sui renewals with one decoder. Store transactions keep a
  compact local encoding (``encode_tx``): they are not audited as renewals;
- like Sui, a transaction names the *version* of every owned object it
  mutates, so a prepared transaction that went stale (the blob was extended
  by another transaction in between) is refused instead of applied twice;
- and the version of the wallet's gas coin: every executed renewal bumps it, so
  two renewals of one wallet prepared at the same time cannot both execute (a Sui
  node locks the gas object and refuses the second). Submitters of one wallet
  serialise prepare → execute with :meth:`LocalNetwork.wallet_lock`, as a real
  wallet's single submitter must.

Deliberate simplifications (documented, not hidden):

- Blob ids use Walrus's layout ``blake2b256(u8 RS2=1 ‖ u64le size ‖ root)``
  but ``root`` is ``blake2b256(data)``; real Walrus hashes the RedStuff
  Merkle root of the encoded slivers, which needs the RedStuff encoder. Same
  shape (32 bytes, URL-safe base64 without padding, 43 chars), different value.
- A store is one local transaction (reserve + register + certify [+ transfer]);
  on Walrus these are two Sui transactions. No write fee, no gas coin (only
  renewals spend gas), no signatures (the local node trusts its in-process callers).
- Object ids are derived like Sui's (``blake2b256(0xf1 ‖ tx digest ‖ u64le n)``).

How it names things and writes its transactions (ids, digests, transaction bytes) is
``codec.py``; what its state looks like (records, rows, the file's schema) is
``records.py``; this module keeps the state and enforces the rules.

State lives in one SQLite file under ``state_dir`` (WAL mode, busy timeout,
``BEGIN IMMEDIATE`` for writes, short transactions) so the Walkeep service
and a ``walkeep devnet`` process can share it, and it survives restarts. Each
thread gets its own connection; SQLite serialises the writers.

Why one file: one simulated chain's state and every rule it enforces on it (storing,
extending, expiry, transactions, epochs) in one SQLite schema, so each rule is read
beside the state it guards; quilts (quilts.py), transaction bytes (codec.py) and records
(records.py) are apart.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import json
import logging
import os
import secrets
import sqlite3
import threading
import weakref
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from walkeep.backends.base import (
    BlobObject,
    ChainRejected,
    ChainUnavailable,
    EpochInfo,
    Faults,
    PreparedTx,
    StoredBlob,
    StoredQuilt,
    TxEffects,
)
from walkeep.backends.localnet.codec import (
    EXTEND_FUNCTION,
    GAS_BASE_MIST,
    GAS_PER_CALL_MIST,
    LOCAL_PACKAGE_ID,
    LOCAL_SYSTEM_OBJECT_ID,
    MAX_CALLS_PER_TX,
    DecodedTx,
    ExtendCall,
    TxKind,
    blake2b256,
    blob_id_for,
    build_local_extend_tx,
    decode_local_extend_tx,
    derive_object_id_raw,
    encode_tx,
    from_us,
    normalize_address,
    now_us,
    sui_address,
    tx_digest,
)
from walkeep.backends.localnet.quilts import LocalPatch, QuiltStore
from walkeep.backends.localnet.records import (
    KEPT_COLUMNS,
    KEPT_PIECES,
    KEPT_ROWS,
    NETWORK,
    OBJECT_COLS,
    SCHEMA,
    TX_COLS,
    AddressTx,
    ObjectExtension,
    ObjectRecord,
    TxRecord,
    object_from_row,
    object_params,
    read_pieces,
    tx_from_row,
    write_pieces,
)
from walkeep.clock import Clock
from walkeep.errors import NotFound, RelayerUnavailable, ValidationError
from walkeep.protocol import quilt
from walkeep.protocol.b58 import b58encode
from walkeep.protocol.walrus import MAX_EPOCHS_AHEAD, encoded_blob_length, walrus_storage_cost_frost

log = logging.getLogger(__name__)

DB_FILE = "network.sqlite3"
KEY_FILE = "wallet.key"
# What a new network starts with when its first opener brings no value of its own.
DEFAULT_EPOCH_SECONDS = 3600
DEFAULT_STORAGE_PRICE_FROST = 11_000
_SCHEMA_VERSION = "1"
_PAGE = 500  # rows per page when listing
_IN_CHUNK = 500  # ids per IN (...) query


@dataclass(frozen=True, slots=True)
class _Schedule:
    """Epoch schedule: epoch = anchor_epoch + (now - anchor) // seconds."""

    genesis_us: int
    anchor_us: int
    anchor_epoch: int
    seconds: int

    def epoch_at(self, now_us: int) -> int:
        return max(0, self.anchor_epoch + (now_us - self.anchor_us) // (self.seconds * 1_000_000))

    def start_of(self, epoch: int) -> int:
        return self.anchor_us + (epoch - self.anchor_epoch) * self.seconds * 1_000_000

    def to_json(self) -> str:
        return json.dumps(
            {
                "genesis_us": self.genesis_us,
                "anchor_us": self.anchor_us,
                "anchor_epoch": self.anchor_epoch,
                "seconds": self.seconds,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> _Schedule:
        d = json.loads(text)
        return cls(d["genesis_us"], d["anchor_us"], d["anchor_epoch"], d["seconds"])


def _blob_bytes(c: sqlite3.Connection, blob_id: str, data: bytes, kept: int) -> bytes:
    """A blob's bytes from its ``contents`` row (``data``, ``columns``): a quilt may be
    kept column by column, in the row or in pieces (``records.KEPT_*``)."""
    if kept == KEPT_PIECES:
        return quilt.from_columns(read_pieces(c, blob_id))
    return quilt.from_columns(bytes(data)) if kept == KEPT_COLUMNS else bytes(data)


def _gas_key(sender: str) -> str:
    return "gas_version:" + normalize_address(sender)


class _Handle:
    """Owns one thread's connection; closes it when the thread (and its local) goes away."""

    __slots__ = ("__weakref__", "conn")

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def close(self) -> None:
        self.conn.close()

    def __del__(self) -> None:
        self.conn.close()


class LocalNetwork:
    """The simulated Walrus + Sui network, persisted under ``state_dir``.

    Configuration (``epoch_seconds``, ``storage_price_frost``) is a property of
    the network, shared by every process that opens the directory. Only an
    opener that *runs* the network (``walkeep serve``, ``worker``, ``devnet``)
    passes ``configure=True`` and writes its values; every other opener
    (``doctor``, ``smoke``, tests, tools) reads the network as it is, so a
    command run in another shell without the same environment can never
    change a running server's epoch length. Any opener initialises a network
    that does not exist yet.

    Changing ``epoch_seconds`` keeps time continuous: the schedule is
    re-anchored at *now* with the current epoch number, so the current epoch
    neither jumps forward (which would expire every blob at once) nor goes
    backwards; later epochs last the new length.
    """

    network = NETWORK
    package_id = LOCAL_PACKAGE_ID
    system_object_id = LOCAL_SYSTEM_OBJECT_ID

    def __init__(
        self,
        state_dir: Path,
        clock: Clock,
        *,
        epoch_seconds: int | None = DEFAULT_EPOCH_SECONDS,
        storage_price_frost: int | None = DEFAULT_STORAGE_PRICE_FROST,
        faults: Faults | None = None,
        configure: bool = False,
    ) -> None:
        if epoch_seconds is not None and epoch_seconds < 1:
            raise ValueError("epoch_seconds must be >= 1")
        if storage_price_frost is not None and storage_price_frost < 0:
            raise ValueError("storage_price_frost must be >= 0")
        self.state_dir = Path(state_dir)
        self.clock = clock
        self.faults = faults if faults is not None else Faults()
        self._fault_lock = threading.Lock()
        self._local = threading.local()
        # One connection per thread; a thread's connection closes when the thread ends.
        self._handles: weakref.WeakSet[_Handle] = weakref.WeakSet()
        self._conns_lock = threading.Lock()
        self._closed = False
        self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.db_path = self.state_dir / DB_FILE
        self.quilts = QuiltStore(self)
        self._init_state(epoch_seconds, storage_price_frost, configure=configure)

    # --- quilts (walkeep/backends/localnet/quilts.py does the work) ----------------------

    def store_quilt(
        self,
        patches: Sequence[tuple[str, bytes]],
        *,
        epochs: int,
        owner: str,
        force: bool = True,
        permanent: bool = False,
        tags: Mapping[str, Mapping[str, str]] | None = None,
    ) -> StoredQuilt:
        """Store ``(identifier, bytes)`` patches as one quilt blob (``QuiltStore.store_quilt``)."""
        return self.quilts.store_quilt(
            patches, epochs=epochs, owner=owner, force=force, permanent=permanent, tags=tags
        )

    def read_patch_entry(self, patch_id: str) -> tuple[LocalPatch, bytes]:
        """A patch and its bytes by patch id; NotFound if malformed, unknown or lapsed."""
        return self.quilts.read_patch_entry(patch_id)

    def read_patch(self, patch_id: str) -> bytes:
        """A patch's bytes; NotFound if the id is malformed, unknown, or its quilt lapsed."""
        return self.quilts.read_patch(patch_id)

    def read_quilt_patch_by_identifier(
        self, quilt_id: str, identifier: str
    ) -> tuple[LocalPatch, bytes]:
        """The patch called ``identifier`` in quilt ``quilt_id``, and its bytes; else NotFound."""
        return self.quilts.read_quilt_patch_by_identifier(quilt_id, identifier)

    def list_quilt_patches(self, quilt_id: str) -> list[LocalPatch]:
        """Every patch of a live quilt, in column order; NotFound if unknown or lapsed."""
        return self.quilts.list_quilt_patches(quilt_id)

    def quilt_patch_count(self, blob_id: str) -> int | None:
        """How many patches the blob holds if it is a quilt, else None (explorer view)."""
        return self.quilts.quilt_patch_count(blob_id)

    # --- plumbing ------------------------------------------------------------------------

    def _conn(self) -> sqlite3.Connection:
        handle: _Handle | None = getattr(self._local, "handle", None)
        if handle is None:
            if self._closed:
                raise RuntimeError("LocalNetwork is closed")
            conn = sqlite3.connect(
                self.db_path, timeout=30.0, isolation_level=None, check_same_thread=False
            )
            conn.execute("PRAGMA busy_timeout = 30000")
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")
            # No memory map: recall reads each hit's content from here, and through a
            # map the kernel made whole large folios resident per read (bench/
            # recall_scale.py at 100,000 memories: +156 MiB resident after 200 recalls
            # mapped, +70 MiB with plain reads through SQLite's small per-connection
            # cache, and no slower).
            conn.execute("PRAGMA mmap_size = 0")
            handle = _Handle(conn)
            self._local.handle = handle
            with self._conns_lock:
                self._handles.add(handle)
        return handle.conn

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One short write transaction; ``BEGIN IMMEDIATE`` takes the write lock up front."""
        conn = self._conn()
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        """A consistent snapshot for multi-statement reads."""
        conn = self._conn()
        conn.execute("BEGIN")
        try:
            yield conn
        finally:
            conn.execute("COMMIT")

    def close(self) -> None:
        """Close every connection this instance still has open (from any thread)."""
        self._closed = True
        with self._conns_lock:
            handles = list(self._handles)
            self._handles.clear()
        for handle in handles:
            handle.close()
        self._local = threading.local()

    def __enter__(self) -> LocalNetwork:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @staticmethod
    def recorded_epoch_seconds(state_dir: Path) -> int | None:
        """The epoch length the network under ``state_dir`` has now, read without
        opening it (None: no network there yet). Opening creates a missing network and
        applies its opener's settings; a start that may still be refused must do
        neither, so it checks its plan against this instead (DESIGN invariant 11)."""
        path = Path(state_dir) / DB_FILE
        if not path.exists():
            return None
        conn = sqlite3.connect(path, timeout=30.0)
        try:
            row = conn.execute("SELECT value FROM meta WHERE key = 'schedule'").fetchone()
        except sqlite3.OperationalError:
            return None  # a file without the schema yet: its first opener makes it
        finally:
            conn.close()
        return _Schedule.from_json(row[0]).seconds if row else None

    def _init_state(self, epoch_seconds: int | None, price: int | None, *, configure: bool) -> None:
        """Create the network if it is new; apply ``epoch_seconds``/``price`` only if
        ``configure`` (see the class docstring). ``None`` is "no value of my own": the
        network keeps its value (a new one takes the default)."""
        with self._write() as c:
            # One statement at a time: executescript() would COMMIT our transaction.
            for stmt in filter(None, (s.strip() for s in SCHEMA.split(";"))):
                c.execute(stmt)
            # Networks made before quilts were kept column by column gain the column
            # (records.KEPT_*); their rows stay as they are, and are read as they are.
            if "columns" not in {r[1] for r in c.execute("PRAGMA table_info(contents)")}:
                c.execute("ALTER TABLE contents ADD COLUMN columns INTEGER NOT NULL DEFAULT 0")
            meta = dict(c.execute("SELECT key, value FROM meta").fetchall())
            now = now_us(self.clock)
            if "schedule" not in meta:
                sched = _Schedule(now, now, 0, epoch_seconds or DEFAULT_EPOCH_SECONDS)
                c.execute("INSERT INTO meta VALUES ('schema_version', ?)", (_SCHEMA_VERSION,))
                c.execute("INSERT INTO meta VALUES ('schedule', ?)", (sched.to_json(),))
                configure = True  # a new network takes this opener's price too
            else:
                sched = _Schedule.from_json(meta["schedule"])
                if epoch_seconds is None or sched.seconds == epoch_seconds:
                    pass
                elif not configure:
                    log.info(
                        "local network: epoch length is %ss (set by the process running it); "
                        "ignoring %ss here",
                        sched.seconds,
                        epoch_seconds,
                    )
                else:
                    # Re-anchor at now, not at the start of the current epoch: under a
                    # shorter length the time already spent in this epoch would count
                    # as many epochs at once and expire every blob.
                    current = sched.epoch_at(now)
                    new = _Schedule(sched.genesis_us, now, current, epoch_seconds)
                    c.execute("UPDATE meta SET value = ? WHERE key = 'schedule'", (new.to_json(),))
                    log.warning(
                        "local network: epoch length changed %ss -> %ss; epoch %s continues "
                        "from now",
                        sched.seconds,
                        epoch_seconds,
                        current,
                    )
            if "storage_price_frost" not in meta and price is None:
                price = DEFAULT_STORAGE_PRICE_FROST
            if price is not None and configure and meta.get("storage_price_frost") != str(price):
                c.execute(
                    "INSERT INTO meta VALUES ('storage_price_frost', ?) "
                    "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                    (str(price),),
                )
            address = meta.get("server_address")
            if address is None:
                address = self._load_or_create_wallet()
                c.execute("INSERT INTO meta VALUES ('server_address', ?)", (address,))
        self._server_address = address

    def _load_or_create_wallet(self) -> str:
        """The publisher/server wallet: an Ed25519 key in Sui keystore format.

        The file holds ``base64(0x00 ‖ 32-byte seed)`` (one entry of a Sui
        ``sui.keystore``), mode 0600. Called under the write lock, so two
        processes opening a fresh directory agree on one wallet.
        """
        path = self.state_dir / KEY_FILE
        if path.exists():
            raw = base64.b64decode(path.read_text().strip())
            if len(raw) != 33 or raw[0] != 0:
                raise ValueError(f"{path} is not an Ed25519 Sui keystore entry")
            seed = raw[1:]
        else:
            seed = secrets.token_bytes(32)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(base64.b64encode(b"\x00" + seed).decode() + "\n")
        public = Ed25519PrivateKey.from_private_bytes(seed).public_key().public_bytes_raw()
        return sui_address(public)

    @staticmethod
    def _gas_version(c: sqlite3.Connection, sender: str) -> int:
        row = c.execute("SELECT value FROM meta WHERE key = ?", (_gas_key(sender),)).fetchone()
        return int(row[0]) if row else 1

    @contextmanager
    def wallet_lock(self, sender: str) -> Iterator[None]:
        """Hold ``sender``'s submitter lock: one prepare → execute at a time per wallet,
        across threads and processes sharing this state directory (``walkeep serve``'s
        worker and a ``walkeep smoke`` beside it). An OS lock, released if the holder dies.
        """
        name = hashlib.blake2b(normalize_address(sender).encode(), digest_size=8).hexdigest()
        path = self.state_dir / f"wallet-{name}.lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def _schedule(self, c: sqlite3.Connection) -> _Schedule:
        row = c.execute("SELECT value FROM meta WHERE key = 'schedule'").fetchone()
        return _Schedule.from_json(row[0])

    def _epoch(self, c: sqlite3.Connection) -> int:
        return self._schedule(c).epoch_at(now_us(self.clock))

    def _price(self, c: sqlite3.Connection) -> int:
        row = c.execute("SELECT value FROM meta WHERE key = 'storage_price_frost'").fetchone()
        return int(row[0])

    def _chain_op(self) -> None:
        if self.faults.unreachable:
            raise ChainUnavailable("local network unreachable (fault injected)")

    def _blob_op(self) -> None:
        if self.faults.unreachable:
            raise RelayerUnavailable(
                "local network unreachable (fault injected)", {"fault": "unreachable"}
            )

    def _take_fault(self, name: Literal["fail_next_writes", "fail_next_extends"]) -> bool:
        with self._fault_lock:
            left = getattr(self.faults, name)
            if left > 0:
                setattr(self.faults, name, left - 1)
                return True
            return False

    # --- network parameters --------------------------------------------------------------

    @property
    def server_address(self) -> str:
        """The publisher's / Walkeep's server wallet (``0x`` + 64 hex)."""
        return self._server_address

    @property
    def epoch_seconds(self) -> int:
        return self._schedule(self._conn()).seconds

    def genesis(self) -> datetime:
        return from_us(self._schedule(self._conn()).genesis_us)

    def storage_price_frost(self) -> int:
        """Storage price per 1 MiB unit per epoch, in FROST."""
        return self._price(self._conn())

    def current_epoch(self) -> int:
        self._chain_op()
        return self._epoch(self._conn())

    def peek_epoch(self) -> int:
        """The current epoch without fault injection (the explorer's own view)."""
        return self._epoch(self._conn())

    def epoch_info(self) -> EpochInfo:
        self._chain_op()
        sched = self._schedule(self._conn())
        epoch = sched.epoch_at(now_us(self.clock))
        return EpochInfo(
            epoch=epoch, started_at=from_us(sched.start_of(epoch)), duration_seconds=sched.seconds
        )

    # --- blobs ---------------------------------------------------------------------------

    def _check_store_args(self, epochs: int, owner: str) -> str:
        if isinstance(epochs, bool) or not isinstance(epochs, int):
            raise ValidationError("epochs must be an integer", {"epochs": epochs})
        if not 1 <= epochs <= MAX_EPOCHS_AHEAD:
            raise ValidationError(
                f"epochs must be between 1 and {MAX_EPOCHS_AHEAD}", {"epochs": epochs}
            )
        try:
            return normalize_address(owner)
        except ValueError as exc:
            raise ValidationError(f"invalid owner address: {exc}", {"owner": owner}) from exc

    def store_blob(
        self,
        data: bytes,
        *,
        epochs: int,
        owner: str,
        force: bool = True,
        permanent: bool = False,
    ) -> StoredBlob:
        """Store ``data`` for ``epochs`` epochs; the new Blob object goes to ``owner``.

        Without ``force``, Walrus answers "already certified" (no new object)
        when the content is already stored for at least the requested
        duration by a blob that cannot vanish under you: a permanent one, or a
        deletable one held by the publisher's own wallet (``routes.rs``
        ``BlobStoreResult::AlreadyCertified``). Otherwise a new Blob object is
        registered, certified and transferred to ``owner``. Raises
        ValidationError (epochs outside 1..53, bad owner), RelayerUnavailable.
        """
        self._blob_op()
        owner = self._check_store_args(epochs, owner)
        if self._take_fault("fail_next_writes"):
            raise RelayerUnavailable(
                "local network write failed (fault injected)", {"fault": "write_failed"}
            )
        data = bytes(data)
        with self._write() as c:
            epoch = self._epoch(c)
            if not force:
                existing = self._already_certified(c, blob_id_for(data), epoch, epochs, permanent)
                if existing is not None:
                    return StoredBlob(blob=existing.to_blob_object(), newly_created=False)
            return self._store_one(c, data, epoch, self._price(c), epochs, owner, permanent)

    def store_blobs(
        self, blobs: Sequence[bytes], *, epochs: int, owner: str, permanent: bool = False
    ) -> list[StoredBlob]:
        """Store many blobs (``force=True`` each) in one database transaction.

        Same outcome as calling :meth:`store_blob` once per item (one local
        store transaction and one Blob object each), only faster: for seeding
        benchmarks and scale tests with tens of thousands of objects. Faults
        apply once to the whole call.
        """
        self._blob_op()
        owner = self._check_store_args(epochs, owner)
        if self._take_fault("fail_next_writes"):
            raise RelayerUnavailable(
                "local network write failed (fault injected)", {"fault": "write_failed"}
            )
        with self._write() as c:
            epoch, price = self._epoch(c), self._price(c)
            return [
                self._store_one(c, bytes(d), epoch, price, epochs, owner, permanent) for d in blobs
            ]

    def _store_one(
        self,
        c: sqlite3.Connection,
        data: bytes,
        epoch: int,
        price: int,
        epochs: int,
        owner: str,
        permanent: bool,
        columns: bytes | None = None,
    ) -> StoredBlob:
        """Register + certify (+ transfer) one new Blob object inside ``c``'s transaction.

        ``columns``: the same bytes column by column (a quilt's, ``quilt.to_columns``),
        kept instead of ``data``, in pieces, so that a patch is read in one short range.
        """
        blob_id = blob_id_for(data)
        deletable = not permanent
        storage_size = encoded_blob_length(len(data))
        cost = walrus_storage_cost_frost(storage_size, epochs, price)
        tx = DecodedTx(
            kind="store",
            sender=self._server_address,
            nonce=secrets.token_bytes(32),
            epoch=epoch,
            package_id=LOCAL_PACKAGE_ID,
            blob_id=blob_id,
            size=len(data),
            epochs=epochs,
            owner=owner,
            deletable=deletable,
        )
        tx_bytes = encode_tx(tx)
        raw_digest = blake2b256(b"TransactionData::" + tx_bytes)
        digest = b58encode(raw_digest)
        object_id = derive_object_id_raw(raw_digest, 0)
        storage_id = derive_object_id_raw(raw_digest, 1)
        end_epoch = epoch + epochs
        calls: list[dict[str, Any]] = [
            {
                "function": f"{LOCAL_PACKAGE_ID}::system::reserve_space",
                "storage_id": storage_id,
                "storage_size": storage_size,
                "epochs_ahead": epochs,
            },
            {
                "function": f"{LOCAL_PACKAGE_ID}::system::register_blob",
                "blob_object_id": object_id,
                "blob_id": blob_id,
                "size": len(data),
                "deletable": deletable,
            },
            {
                "function": f"{LOCAL_PACKAGE_ID}::system::certify_blob",
                "blob_object_id": object_id,
                "blob_id": blob_id,
                "end_epoch": end_epoch,
            },
        ]
        if owner != self._server_address:
            calls.append(
                {
                    "function": "0x2::transfer::public_transfer",
                    "blob_object_id": object_id,
                    "recipient": owner,
                }
            )
        if columns is None:
            c.execute(
                "INSERT OR IGNORE INTO contents (blob_id, size, data, columns) VALUES (?, ?, ?, ?)",
                (blob_id, len(data), data, KEPT_ROWS),
            )
        elif c.execute(
            "INSERT OR IGNORE INTO contents (blob_id, size, data, columns) VALUES (?, ?, ?, ?)",
            (blob_id, len(data), b"", KEPT_PIECES),
        ).rowcount:
            write_pieces(c, blob_id, columns)
        record = ObjectRecord(
            object_id=object_id,
            blob_id=blob_id,
            owner=owner,
            size=len(data),
            storage_size=storage_size,
            storage_id=storage_id,
            registered_epoch=epoch,
            certified_epoch=epoch,
            start_epoch=epoch,
            end_epoch=end_epoch,
            deletable=deletable,
            version=1,
            created_tx=digest,
            last_tx=digest,
        )
        c.execute(
            f"INSERT INTO objects ({OBJECT_COLS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            object_params(record),
        )
        self._record_tx(
            c,
            digest=digest,
            kind="store",
            sender=self._server_address,
            epoch=epoch,
            tx_bytes=tx_bytes,
            calls=calls,
            cost=cost,
            price=price,
            gas=GAS_BASE_MIST + GAS_PER_CALL_MIST * len(calls),
        )
        return StoredBlob(blob=record.to_blob_object(), newly_created=True, cost_frost=cost)

    def _already_certified(
        self, c: sqlite3.Connection, blob_id: str, epoch: int, epochs: int, permanent: bool
    ) -> ObjectRecord | None:
        rows = c.execute(
            f"SELECT {OBJECT_COLS} FROM objects WHERE blob_id = ? AND end_epoch >= ? "
            "ORDER BY end_epoch DESC, object_id",
            (blob_id, epoch + epochs),
        ).fetchall()
        for row in rows:
            rec = object_from_row(row)
            if not rec.deletable or (not permanent and rec.owner == self._server_address):
                return rec
        return None

    def read_blob(self, blob_id: str) -> bytes:
        """The bytes of a blob; NotFound unless some live object holds it."""
        self._blob_op()
        with self._read() as c:
            epoch = self._epoch(c)
            live = c.execute(
                "SELECT 1 FROM objects WHERE blob_id = ? AND end_epoch > ? LIMIT 1",
                (blob_id, epoch),
            ).fetchone()
            row = (
                c.execute(
                    "SELECT data, columns FROM contents WHERE blob_id = ?", (blob_id,)
                ).fetchone()
                if live
                else None
            )
            if row is None:
                raise NotFound("blob not found (never stored, or expired)", {"blob_id": blob_id})
            return _blob_bytes(c, blob_id, *row)

    def read_by_object(self, object_id: str) -> bytes:
        """The bytes behind a Blob object; NotFound if unknown or lapsed."""
        self._blob_op()
        try:
            oid = normalize_address(object_id)
        except ValueError:
            raise NotFound("no such blob object", {"blob_object_id": object_id}) from None
        with self._read() as c:
            epoch = self._epoch(c)
            row = c.execute(
                "SELECT contents.blob_id, contents.data, contents.columns"
                " FROM objects JOIN contents USING (blob_id)"
                " WHERE objects.object_id = ? AND objects.end_epoch > ?",
                (oid, epoch),
            ).fetchone()
            if row is None:
                raise NotFound(
                    "blob object not found (unknown, or expired)", {"blob_object_id": oid}
                )
            return _blob_bytes(c, *row)

    # --- objects -------------------------------------------------------------------------

    def object_record(self, object_id: str) -> ObjectRecord | None:
        """The full record of a Blob object (explorer/devnet view; no fault injection)."""
        try:
            oid = normalize_address(object_id)
        except ValueError:
            return None
        row = (
            self._conn()
            .execute(f"SELECT {OBJECT_COLS} FROM objects WHERE object_id = ?", (oid,))
            .fetchone()
        )
        return object_from_row(row) if row else None

    def get_object(self, object_id: str) -> BlobObject | None:
        self._chain_op()
        rec = self.object_record(object_id)
        return rec.to_blob_object() if rec else None

    def owned_blobs(self, owner: str) -> Iterator[BlobObject]:
        """Every Blob object ``owner`` holds, lapsed ones included (callers decide).

        Pages through the owner index in short read transactions, so a long
        listing never holds a snapshot open.
        """
        self._chain_op()  # eagerly, not on first next()
        try:
            owner = normalize_address(owner)
        except ValueError:
            return iter(())
        return self._owned_pages(owner)

    def _owned_pages(self, owner: str) -> Iterator[BlobObject]:
        after = ""
        while True:
            rows = (
                self._conn()
                .execute(
                    f"SELECT {OBJECT_COLS} FROM objects WHERE owner = ? AND object_id > ? "
                    "ORDER BY object_id LIMIT ?",
                    (owner, after, _PAGE),
                )
                .fetchall()
            )
            for row in rows:
                yield object_from_row(row).to_blob_object()
            if len(rows) < _PAGE:
                return
            after = rows[-1][0]

    def object_extensions(self, object_id: str) -> list[ObjectExtension]:
        """The extend_blob calls that touched this object, oldest first (explorer view)."""
        try:
            oid = normalize_address(object_id)
        except ValueError:
            return []
        rows = (
            self._conn()
            .execute(
                "SELECT t.digest, t.epoch, t.timestamp_us, e.epochs, e.old_end_epoch, "
                "e.new_end_epoch FROM objects o JOIN extensions e ON e.obj_seq = o.seq "
                "JOIN transactions t ON t.seq = e.tx_seq WHERE o.object_id = ? "
                "ORDER BY e.tx_seq, e.idx",
                (oid,),
            )
            .fetchall()
        )
        return [ObjectExtension(r[0], r[1], from_us(r[2]), r[3], r[4], r[5]) for r in rows]

    # --- transactions --------------------------------------------------------------------

    def _load_objects(
        self, c: sqlite3.Connection, ids: Sequence[str], seqs: dict[str, int] | None = None
    ) -> dict[str, ObjectRecord]:
        """The objects among ``ids`` (one IN query per chunk); fills ``seqs`` if given."""
        found: dict[str, ObjectRecord] = {}
        unique = list(dict.fromkeys(ids))
        for i in range(0, len(unique), _IN_CHUNK):
            chunk = unique[i : i + _IN_CHUNK]
            marks = ",".join("?" * len(chunk))
            for row in c.execute(
                f"SELECT {OBJECT_COLS}, seq FROM objects WHERE object_id IN ({marks})", chunk
            ):
                rec = object_from_row(row)
                found[rec.object_id] = rec
                if seqs is not None:
                    seqs[rec.object_id] = row[14]
        return found

    @staticmethod
    def _check_calls(
        sender: str,
        calls: Sequence[ExtendCall],
        objects: dict[str, ObjectRecord],
        epoch: int,
    ) -> list[tuple[ObjectRecord, ExtendCall, int, int]]:
        """Walrus's ``extend_blob`` checks for every call, in order (notes §2.2).

        Returns (object, call, old_end, new_end) per call; raises ChainRejected
        on the first failing call, so a batch is all or nothing. Several calls
        on the same object apply one after another, as in one PTB.
        """
        if not calls:
            raise ChainRejected("a transaction needs at least one extend_blob call")
        if len(calls) > MAX_CALLS_PER_TX:
            raise ChainRejected(f"at most {MAX_CALLS_PER_TX} calls per transaction")
        ends: dict[str, int] = {}
        out: list[tuple[ObjectRecord, ExtendCall, int, int]] = []
        for i, call in enumerate(calls):
            where = f"call {i} ({call.object_id})"
            obj = objects.get(call.object_id)
            if obj is None:
                raise ChainRejected(f"{where}: object not found")
            if obj.owner != sender:
                raise ChainRejected(f"{where}: object is not owned by the sender")
            if obj.version != call.version:
                raise ChainRejected(
                    f"{where}: object version {call.version} is no longer current "
                    f"(now {obj.version}); the transaction is stale"
                )
            if obj.certified_epoch is None:
                raise ChainRejected(f"{where}: blob is not certified (ENotCertified)")
            old = ends.get(call.object_id, obj.end_epoch)
            if not epoch < old:
                raise ChainRejected(
                    f"{where}: blob expired at epoch {old} (current {epoch}); "
                    "an expired blob cannot be renewed (EResourceBounds)"
                )
            if call.epochs <= 0:
                raise ChainRejected(f"{where}: extended_epochs must be > 0 (EInvalidEpochsAhead)")
            if (old - epoch) + call.epochs > MAX_EPOCHS_AHEAD:
                raise ChainRejected(
                    f"{where}: end epoch {old + call.epochs} would be more than "
                    f"{MAX_EPOCHS_AHEAD} epochs ahead of {epoch} (EInvalidEpochsAhead)"
                )
            new = old + call.epochs
            ends[call.object_id] = new
            out.append((obj, call, old, new))
        return out

    def prepare_extend(self, sender: str, items: Sequence[tuple[str, int]]) -> PreparedTx:
        """Build one transaction extending each ``(object_id, epochs)``; not submitted.

        The digest is final. Raises ChainRejected if a call would already fail.
        """
        self._chain_op()
        try:
            sender = normalize_address(sender)
            norm = [(normalize_address(oid), int(k)) for oid, k in items]
        except (ValueError, TypeError) as exc:
            raise ChainRejected(f"malformed transaction: {exc}") from exc
        for _, k in norm:
            if not 0 < k <= MAX_EPOCHS_AHEAD:
                raise ChainRejected(
                    f"extended_epochs must be between 1 and {MAX_EPOCHS_AHEAD}, got {k}"
                )
        with self._read() as c:
            epoch = self._epoch(c)
            objects = self._load_objects(c, [oid for oid, _ in norm])
            gas_version = self._gas_version(c, sender)
        calls = tuple(
            ExtendCall(oid, objects[oid].version if oid in objects else 0, k) for oid, k in norm
        )
        self._check_calls(sender, calls, objects, epoch)
        tx_bytes = build_local_extend_tx(
            sender, calls, nonce=secrets.token_bytes(32), gas_version=gas_version
        )
        return PreparedTx(
            digest=tx_digest(tx_bytes),
            tx_bytes=base64.b64encode(tx_bytes).decode(),
            items=tuple(norm),
            epoch=epoch,
        )

    def execute(self, prepared: PreparedTx) -> TxEffects:
        """Submit a prepared transaction: all calls apply, or none do.

        The transaction bytes are the truth (as on Sui): the digest is
        re-derived from them, and the calls executed are the ones they encode
        (real Sui ``TransactionData``, decoded with the Sui adapter's decoder).
        An already-executed digest returns its recorded effects unchanged.
        """
        self._chain_op()
        if self._take_fault("fail_next_extends"):
            raise ChainRejected("transaction rejected (fault injected)")
        try:
            tx_bytes = base64.b64decode(prepared.tx_bytes, validate=True)
        except ValueError as exc:
            raise ChainRejected(f"malformed transaction bytes: {exc}") from exc
        digest = tx_digest(tx_bytes)
        if digest != prepared.digest:
            raise ChainRejected(
                f"digest mismatch: the bytes hash to {digest}, not {prepared.digest}"
            )
        tx = decode_local_extend_tx(tx_bytes)
        with self._write() as c:
            done = c.execute(f"SELECT {TX_COLS} FROM transactions WHERE digest = ?", (digest,))
            row = done.fetchone()
            if row is not None:
                return self._tx_with_calls(c, row).to_effects()
            epoch = self._epoch(c)
            price = self._price(c)
            gas = self._gas_version(c, tx.sender)
            if tx.gas_version != gas:
                raise ChainRejected(
                    f"gas coin version {tx.gas_version} is no longer current (now {gas}): "
                    "another transaction of this wallet executed since this one was "
                    "prepared; the transaction is stale"
                )
            seqs: dict[str, int] = {}
            objects = self._load_objects(c, [call.object_id for call in tx.calls], seqs)
            checked = self._check_calls(tx.sender, tx.calls, objects, epoch)
            c.execute(
                "INSERT INTO meta VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = ?",
                (_gas_key(tx.sender), str(gas + 1), str(gas + 1)),
            )
            final_end: dict[int, int] = {}
            calls: list[dict[str, Any]] = []
            ext_rows: list[tuple[int, int, int, int, int]] = []
            cost = 0
            for idx, (obj, call, old, new) in enumerate(checked):
                final_end[seqs[obj.object_id]] = new
                cost += walrus_storage_cost_frost(obj.storage_size, call.epochs, price)
                calls.append(
                    {
                        "function": EXTEND_FUNCTION,
                        "blob_object_id": obj.object_id,
                        "blob_id": obj.blob_id,
                        "epochs": call.epochs,
                        "old_end_epoch": old,
                        "new_end_epoch": new,
                    }
                )
                ext_rows.append((idx, seqs[obj.object_id], call.epochs, old, new))
            c.executemany(
                "UPDATE objects SET end_epoch = ?, version = version + 1, last_tx = ? "
                "WHERE seq = ?",
                sorted((end, digest, seq) for seq, end in final_end.items()),
            )
            record = self._record_tx(
                c,
                digest=digest,
                kind="extend",
                sender=tx.sender,
                epoch=epoch,
                tx_bytes=tx_bytes,
                calls=calls,
                cost=cost,
                price=price,
                gas=GAS_BASE_MIST + GAS_PER_CALL_MIST * len(calls),
            )
            c.executemany(
                "INSERT INTO extensions (tx_seq, idx, obj_seq, epochs, old_end_epoch, "
                "new_end_epoch) VALUES (?,?,?,?,?,?)",
                [(record.checkpoint, *r) for r in ext_rows],
            )
        return record.to_effects()

    def _record_tx(
        self,
        c: sqlite3.Connection,
        *,
        digest: str,
        kind: TxKind,
        sender: str,
        epoch: int,
        tx_bytes: bytes,
        calls: list[dict[str, Any]],
        cost: int,
        price: int,
        gas: int,
    ) -> TxRecord:
        now = now_us(self.clock)
        effects: dict[str, Any] = {
            "status": "success",
            "package_id": LOCAL_PACKAGE_ID,
            "price_frost": price,
        }
        if kind != "extend":  # extend calls live in the ``extensions`` table
            effects["calls"] = calls
        cur = c.execute(
            "INSERT INTO transactions (digest, kind, sender, epoch, timestamp_us, tx_bytes, "
            "effects, wal_cost_frost, gas_used, status) VALUES (?,?,?,?,?,?,?,?,?,?)",
            (digest, kind, sender, epoch, now, tx_bytes, json.dumps(effects), cost, gas, "success"),
        )
        return TxRecord(
            digest=digest,
            kind=kind,
            status="success",
            sender=sender,
            epoch=epoch,
            timestamp=from_us(now),
            checkpoint=int(cur.lastrowid or 0),
            calls=tuple(calls),
            wal_cost_frost=cost,
            gas_used=gas,
            package_id=LOCAL_PACKAGE_ID,
            price_frost=price,
            tx_bytes=base64.b64encode(tx_bytes).decode(),
        )

    @staticmethod
    def _tx_with_calls(c: sqlite3.Connection, row: tuple[Any, ...]) -> TxRecord:
        if row[2] != "extend":
            return tx_from_row(row, json.loads(row[7])["calls"])
        calls = [
            {
                "function": EXTEND_FUNCTION,
                "blob_object_id": r[0],
                "blob_id": r[1],
                "epochs": r[2],
                "old_end_epoch": r[3],
                "new_end_epoch": r[4],
            }
            for r in c.execute(
                "SELECT o.object_id, o.blob_id, e.epochs, e.old_end_epoch, e.new_end_epoch "
                "FROM extensions e JOIN objects o ON o.seq = e.obj_seq "
                "WHERE e.tx_seq = ? ORDER BY e.idx",
                (row[0],),
            )
        ]
        return tx_from_row(row, calls)

    def transaction_record(self, digest: str) -> TxRecord | None:
        """The full recorded transaction (explorer view; no fault injection)."""
        with self._read() as c:
            row = c.execute(
                f"SELECT {TX_COLS} FROM transactions WHERE digest = ?", (digest,)
            ).fetchone()
            return self._tx_with_calls(c, row) if row else None

    def get_transaction(self, digest: str) -> TxEffects | None:
        """Effects of an executed transaction (store or extend); None if unknown."""
        self._chain_op()
        rec = self.transaction_record(digest)
        return rec.to_effects() if rec else None

    # --- addresses (the explorer's address page) -------------------------------------------

    def address_renewals(
        self, address: str, *, limit: int, before_seq: int | None = None
    ) -> list[AddressTx]:
        """``address``'s extend_blob transactions, newest first, ``limit`` at a time
        (keyset paging on the transaction sequence: pass the last ``seq`` as ``before_seq``)."""
        try:
            sender = normalize_address(address)
        except ValueError:
            return []
        rows = (
            self._conn()
            .execute(
                "SELECT t.seq, t.digest, t.status, t.epoch, t.timestamp_us, "
                "(SELECT count(*) FROM extensions e WHERE e.tx_seq = t.seq), t.wal_cost_frost "
                "FROM transactions t WHERE t.sender = ? AND t.kind = 'extend' AND t.seq < ? "
                "ORDER BY t.seq DESC LIMIT ?",
                (sender, before_seq if before_seq is not None else 1 << 62, limit),
            )
            .fetchall()
        )
        return [AddressTx(r[0], r[1], r[2], r[3], from_us(r[4]), r[5], r[6]) for r in rows]

    def address_objects(self, address: str, *, limit: int, after: str = "") -> list[ObjectRecord]:
        """Blob objects ``address`` owns, by object id, ``limit`` at a time after ``after``."""
        try:
            owner = normalize_address(address)
        except ValueError:
            return []
        rows = (
            self._conn()
            .execute(
                f"SELECT {OBJECT_COLS} FROM objects WHERE owner = ? AND object_id > ? "
                "ORDER BY object_id LIMIT ?",
                (owner, after, limit),
            )
            .fetchall()
        )
        return [object_from_row(r) for r in rows]

    def get_transaction_bytes(self, digest: str) -> str | None:
        """The recorded transaction bytes (base64) of ``digest``; None if unknown."""
        self._chain_op()
        row = (
            self._conn()
            .execute("SELECT tx_bytes FROM transactions WHERE digest = ?", (digest,))
            .fetchone()
        )
        return base64.b64encode(row[0]).decode() if row else None
