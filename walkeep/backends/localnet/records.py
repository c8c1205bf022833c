"""The local network's records and how they are stored: what the explorer and devnet read.

Blob objects, transactions and extensions as the engine (``engine.py``) keeps them in its
SQLite file, the rows they map to, and that file's schema. The engine enforces the rules;
this module only says what the state looks like.
"""

from __future__ import annotations

import base64
import json
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from walkeep.backends.base import BlobExtension, BlobObject, TxEffects
from walkeep.backends.localnet.codec import TxKind, from_us

NETWORK = "local"


@dataclass(frozen=True, slots=True)
class ObjectRecord:
    """Everything the local chain knows about a Blob object."""

    object_id: str
    blob_id: str
    owner: str
    size: int
    storage_size: int
    storage_id: str
    registered_epoch: int
    certified_epoch: int | None
    start_epoch: int
    end_epoch: int
    deletable: bool
    version: int
    created_tx: str
    last_tx: str

    def to_blob_object(self) -> BlobObject:
        return BlobObject(
            blob_id=self.blob_id,
            blob_object_id=self.object_id,
            size=self.size,
            storage_size=self.storage_size,
            registered_epoch=self.registered_epoch,
            end_epoch=self.end_epoch,
            owner=self.owner,
            certified_epoch=self.certified_epoch,
            deletable=self.deletable,
        )


@dataclass(frozen=True, slots=True)
class TxRecord:
    """A recorded transaction, as an explorer shows it."""

    digest: str
    kind: TxKind
    status: str
    sender: str
    epoch: int
    timestamp: datetime
    checkpoint: int
    calls: tuple[dict[str, Any], ...]
    wal_cost_frost: int
    gas_used: int
    package_id: str
    price_frost: int
    tx_bytes: str  # base64

    def to_effects(self) -> TxEffects:
        extensions = tuple(
            BlobExtension(
                blob_object_id=c["blob_object_id"],
                blob_id=c["blob_id"],
                epochs=c["epochs"],
                old_end_epoch=c["old_end_epoch"],
                new_end_epoch=c["new_end_epoch"],
            )
            for c in self.calls
            if c["function"].endswith("::system::extend_blob")
        )
        return TxEffects(
            digest=self.digest,
            success=self.status == "success",
            sender=self.sender,
            epoch=self.epoch,
            timestamp=self.timestamp,
            extensions=extensions,
            wal_cost_frost=self.wal_cost_frost,
            gas_used=self.gas_used,
            checkpoint=self.checkpoint,
            network=NETWORK,
        )


@dataclass(frozen=True, slots=True)
class ObjectExtension:
    """One extend_blob call on an object (for the explorer's object page)."""

    digest: str
    epoch: int
    timestamp: datetime
    epochs: int
    old_end_epoch: int
    new_end_epoch: int


@dataclass(frozen=True, slots=True)
class AddressTx:
    """One renewal transaction in an address's history (the explorer's address page)."""

    seq: int
    digest: str
    status: str
    epoch: int
    timestamp: datetime
    blobs: int
    wal_cost_frost: int


OBJECT_COLS = (
    "object_id, blob_id, owner, size, storage_size, storage_id, registered_epoch, "
    "certified_epoch, start_epoch, end_epoch, deletable, version, created_tx, last_tx"
)
TX_COLS = (
    "seq, digest, kind, sender, epoch, timestamp_us, tx_bytes, effects, wal_cost_frost, gas_used, "
    "status"
)

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS contents (
    blob_id TEXT PRIMARY KEY, size INTEGER NOT NULL, data BLOB NOT NULL,
    columns INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS content_pieces (
    blob_id TEXT NOT NULL, seq INTEGER NOT NULL, data BLOB NOT NULL,
    PRIMARY KEY (blob_id, seq)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS objects (
    seq INTEGER PRIMARY KEY, object_id TEXT NOT NULL UNIQUE, blob_id TEXT NOT NULL, owner TEXT NOT NULL,
    size INTEGER NOT NULL, storage_size INTEGER NOT NULL, storage_id TEXT NOT NULL,
    registered_epoch INTEGER NOT NULL, certified_epoch INTEGER, start_epoch INTEGER NOT NULL,
    end_epoch INTEGER NOT NULL, deletable INTEGER NOT NULL, version INTEGER NOT NULL,
    created_tx TEXT NOT NULL, last_tx TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS objects_by_blob ON objects (blob_id);
CREATE INDEX IF NOT EXISTS objects_by_owner ON objects (owner, object_id);
CREATE TABLE IF NOT EXISTS transactions (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, digest TEXT NOT NULL UNIQUE, kind TEXT NOT NULL,
    sender TEXT NOT NULL, epoch INTEGER NOT NULL, timestamp_us INTEGER NOT NULL,
    tx_bytes BLOB NOT NULL, effects TEXT NOT NULL, wal_cost_frost INTEGER NOT NULL,
    gas_used INTEGER NOT NULL, status TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS transactions_by_sender ON transactions (sender, kind, seq);
CREATE TABLE IF NOT EXISTS extensions (
    tx_seq INTEGER NOT NULL, idx INTEGER NOT NULL, obj_seq INTEGER NOT NULL,
    epochs INTEGER NOT NULL, old_end_epoch INTEGER NOT NULL, new_end_epoch INTEGER NOT NULL,
    PRIMARY KEY (tx_seq, idx)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS extensions_by_object ON extensions (obj_seq, tx_seq, idx);
"""
# Why these shapes: a renewal batch rewrites ~200 objects. Objects live in a
# rowid table in creation order, and blobs due together were mostly created
# together, so a batch touches few pages; extension rows are small integers,
# appended in transaction order and indexed by the object's creation order
# for the same locality. (Random text keys would dirty a page per row.)


# How a blob's bytes are kept (``contents.columns``): ``data`` row by row as stored;
# ``data`` column by column (``quilt.to_columns``); or column by column in
# ``content_pieces``, ``data`` empty (how quilts are kept now).
KEPT_ROWS, KEPT_COLUMNS, KEPT_PIECES = 0, 1, 2
# Why pieces: in one ``contents`` row a quilt (~450 KB at a million memories) is a
# chain of overflow pages that SQLite walks from its start to reach an offset, so a
# patch read from a cold disk cost 1.0 ms on average (1.7 ms near the quilt's end,
# 0.14 ms at its start). Rows of 900 bytes sit whole in the primary key's leaf pages
# (a 4 KiB page holds up to ~1,000 bytes of a WITHOUT ROWID row), four to a page in
# column order: a patch is one descent to one or two pages wherever it lies (0.4 ms).
PIECE_BYTES = 900


def write_pieces(c: sqlite3.Connection, blob_id: str, data: bytes) -> None:
    """Keep ``data`` as ``blob_id``'s pieces (inside the caller's transaction)."""
    c.executemany(
        "INSERT OR IGNORE INTO content_pieces (blob_id, seq, data) VALUES (?, ?, ?)",
        (
            (blob_id, seq, data[at : at + PIECE_BYTES])
            for seq, at in enumerate(range(0, len(data), PIECE_BYTES))
        ),
    )


def read_pieces(
    c: sqlite3.Connection, blob_id: str, start: int = 0, stop: int | None = None
) -> bytes:
    """Bytes ``[start, stop)`` of what :func:`write_pieces` kept for ``blob_id``."""
    first = start // PIECE_BYTES
    if stop is None:
        rows = c.execute(
            "SELECT data FROM content_pieces WHERE blob_id = ? AND seq >= ? ORDER BY seq",
            (blob_id, first),
        )
    else:
        if stop <= start:
            return b""
        rows = c.execute(
            "SELECT data FROM content_pieces WHERE blob_id = ? AND seq BETWEEN ? AND ?"
            " ORDER BY seq",
            (blob_id, first, (stop - 1) // PIECE_BYTES),
        )
    joined = b"".join(r[0] for r in rows)
    at = start - first * PIECE_BYTES
    return joined[at : None if stop is None else at + (stop - start)]


def object_from_row(row: tuple[Any, ...]) -> ObjectRecord:
    # Positional, in OBJECT_COLS order (hot path: 200+ rows per extend).
    r = row
    return ObjectRecord(
        r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[9], bool(r[10]), r[11], r[12], r[13]
    )


def object_params(r: ObjectRecord) -> tuple[Any, ...]:
    return (
        r.object_id,
        r.blob_id,
        r.owner,
        r.size,
        r.storage_size,
        r.storage_id,
        r.registered_epoch,
        r.certified_epoch,
        r.start_epoch,
        r.end_epoch,
        int(r.deletable),
        r.version,
        r.created_tx,
        r.last_tx,
    )


def tx_from_row(row: tuple[Any, ...], calls: Sequence[dict[str, Any]]) -> TxRecord:
    effects = json.loads(row[7])
    return TxRecord(
        digest=row[1],
        kind=row[2],
        sender=row[3],
        epoch=row[4],
        timestamp=from_us(row[5]),
        checkpoint=row[0],
        status=row[10],
        calls=tuple(calls),
        wal_cost_frost=row[8],
        gas_used=row[9],
        package_id=effects["package_id"],
        price_frost=effects["price_frost"],
        tx_bytes=base64.b64encode(row[6]).decode(),
    )
