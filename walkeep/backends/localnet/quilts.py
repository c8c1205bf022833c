"""Quilts on the local network: many small patches stored as ONE Blob object.

Why a separate module: a quilt *is* a blob to the chain (one store
transaction with reserve/register/certify, one object, one ``extend_blob``),
so the engine's blob code does the storing; this module only lays the patches
out (``walkeep.protocol.quilt``) and remembers where each patch sits, so extending,
expiry, ``owned_blobs`` and the explorer keep working unchanged. The engine
holds a :class:`QuiltStore` and hands it its blob plumbing (:class:`BlobPlumbing`);
this module never imports the engine.

State: the laid-out quilt bytes are a ``contents`` row like any blob's, but kept
column by column (``quilt.to_columns``), as Walrus storage nodes keep secondary
slivers: a patch is then one contiguous range, where the row-by-row bytes needed
one read per row (334). The columns are kept in 900-byte ``content_pieces``
(``contents.columns`` = 2; ``records.PIECE_BYTES`` says why), so reading a patch
reads one or two pieces. Networks made earlier keep their quilts as they were
(1: the columns in the row; 0: the rows). Whole-blob reads turn columns back
into rows. The
``quilt_patches`` table (created on first use, so the engine's schema stays
untouched) lists each quilt's patches for fast lookups by patch id or
identifier. The bytes alone are enough to recover it (``quilt.parse_index``).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, cast

from walkeep.backends.base import BlobObject, QuiltPatch, StoredBlob, StoredQuilt
from walkeep.backends.localnet.codec import blob_id_for
from walkeep.backends.localnet.records import (
    KEPT_COLUMNS,
    KEPT_PIECES,
    KEPT_ROWS,
    ObjectRecord,
    read_pieces,
)
from walkeep.errors import NotFound, RelayerUnavailable, ValidationError
from walkeep.protocol.quilt import (
    ByteSource,
    PatchSlot,
    QuiltLayout,
    column_range,
    decode_patch_id,
    encode_patch_id,
    layout_bytes,
    plan_layout,
    read_patch,
    source_symbols,
    to_columns,
)

_QUILT_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS quilt_patches ("
    " blob_id TEXT NOT NULL, start_col INTEGER NOT NULL, end_col INTEGER NOT NULL,"
    " identifier TEXT NOT NULL, size INTEGER NOT NULL, tags TEXT NOT NULL,"
    " PRIMARY KEY (blob_id, start_col)) WITHOUT ROWID",
    "CREATE UNIQUE INDEX IF NOT EXISTS quilt_patches_by_identifier"
    " ON quilt_patches (blob_id, identifier)",
)


@dataclass(frozen=True, slots=True)
class LocalPatch:
    """One stored patch, as the devnet and the explorer show it."""

    quilt_blob_id: str
    identifier: str
    patch_id: str
    start_col: int
    end_col: int
    size: int
    tags: dict[str, str] = field(default_factory=dict)


def _patch_from_row(blob_id: str, row: tuple[Any, ...]) -> LocalPatch:
    start, end, identifier, size, tags = row
    return LocalPatch(
        blob_id,
        identifier,
        encode_patch_id(blob_id, start, end),
        start,
        end,
        size,
        json.loads(tags),
    )


def _geometry(n_bytes: int, slot: PatchSlot) -> QuiltLayout:
    """Enough layout to read ``slot`` from a quilt of ``n_bytes`` (symbol size from the length)."""
    rows, cols = source_symbols()
    return QuiltLayout(n_bytes // (rows * cols), rows, cols, 0, (slot,))


class BlobPlumbing(Protocol):
    """What storing and reading quilts needs of the local network's blob code."""

    def _conn(self) -> sqlite3.Connection: ...
    def _write(self) -> AbstractContextManager[sqlite3.Connection]: ...
    def _read(self) -> AbstractContextManager[sqlite3.Connection]: ...
    def _epoch(self, c: sqlite3.Connection) -> int: ...
    def _price(self, c: sqlite3.Connection) -> int: ...
    def _blob_op(self) -> None: ...
    def _take_fault(self, name: Literal["fail_next_writes", "fail_next_extends"]) -> bool: ...
    def _check_store_args(self, epochs: int, owner: str) -> str: ...
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
    ) -> StoredBlob: ...
    def _already_certified(
        self, c: sqlite3.Connection, blob_id: str, epoch: int, epochs: int, permanent: bool
    ) -> ObjectRecord | None: ...


class QuiltStore:
    """Quilts of one local network: laid out here, stored by the network's blob code."""

    def __init__(self, net: BlobPlumbing) -> None:
        self._net = net
        self._quilt_schema_ready = False

    def _quilt_schema(self, c: sqlite3.Connection) -> None:
        for stmt in _QUILT_SCHEMA:
            c.execute(stmt)

    def _ensure_quilt_schema(self) -> None:
        if not self._quilt_schema_ready:
            with self._net._write() as c:
                self._quilt_schema(c)
            self._quilt_schema_ready = True

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
        """Store ``(identifier, bytes)`` patches as one quilt blob for ``epochs`` epochs.

        One local store transaction (reserve + register + certify [+ transfer])
        creates one Blob object whose ``size`` is the laid-out size and whose
        ``storage_size`` follows from it, so its cost is priced like any
        blob's. ``force``/``permanent`` behave as in ``store_blob``. Raises
        ValidationError (bad patches, epochs, owner), RelayerUnavailable
        (faults, same as ``store_blob``).
        """
        self._net._blob_op()
        owner = self._net._check_store_args(epochs, owner)
        items: list[tuple[str, bytes]] = []
        for item in patches:
            if (
                not isinstance(item, tuple | list)
                or len(item) != 2
                or not isinstance(item[1], bytes | bytearray | memoryview)
            ):
                raise ValidationError("quilt patches must be (identifier, bytes) pairs")
            items.append((item[0], bytes(item[1])))
        try:
            layout = plan_layout([(i, len(d)) for i, d in items], tags=tags)
        except ValueError as exc:
            raise ValidationError(f"invalid quilt: {exc}", {"patches": len(items)}) from None
        if self._net._take_fault("fail_next_writes"):
            raise RelayerUnavailable(
                "local network write failed (fault injected)", {"fault": "write_failed"}
            )
        data = layout_bytes(layout, [d for _, d in items])
        with self._net._write() as c:
            self._quilt_schema(c)
            epoch = self._net._epoch(c)
            stored: tuple[BlobObject, bool, int | None] | None = None
            if not force:
                existing = self._net._already_certified(
                    c, blob_id_for(data), epoch, epochs, permanent
                )
                if existing is not None:
                    stored = (existing.to_blob_object(), False, None)
            if stored is None:
                new = self._net._store_one(
                    c,
                    data,
                    epoch,
                    self._net._price(c),
                    epochs,
                    owner,
                    permanent,
                    columns=to_columns(data),
                )
                stored = (new.blob, True, new.cost_frost)
            blob = stored[0]
            c.executemany(
                "INSERT OR IGNORE INTO quilt_patches "
                "(blob_id, start_col, end_col, identifier, size, tags) VALUES (?,?,?,?,?,?)",
                [
                    (
                        blob.blob_id,
                        s.start_col,
                        s.end_col,
                        s.identifier,
                        s.size,
                        json.dumps(dict(s.tags)),
                    )
                    for s in layout.slots
                ],
            )
        self._quilt_schema_ready = True
        return StoredQuilt(
            blob=blob,
            patches=tuple(
                QuiltPatch(s.identifier, encode_patch_id(blob.blob_id, s.start_col, s.end_col))
                for s in layout.slots
            ),
            newly_created=stored[1],
            cost_frost=stored[2],
        )

    def _live_patch(
        self, where: str, params: tuple[Any, ...], not_found: dict[str, str]
    ) -> tuple[LocalPatch, bytes]:
        self._net._blob_op()
        self._ensure_quilt_schema()
        with self._net._read() as c:
            epoch = self._net._epoch(c)
            row = c.execute(
                "SELECT q.start_col, q.end_col, q.identifier, q.size, q.tags,"
                " c.rowid, c.size, c.columns, c.blob_id"
                " FROM quilt_patches AS q JOIN contents AS c ON c.blob_id = q.blob_id"
                f" WHERE {where} AND EXISTS (SELECT 1 FROM objects AS o"
                "  WHERE o.blob_id = q.blob_id AND o.end_epoch > ?)",
                (*params, epoch),
            ).fetchone()
            if row is None:
                raise NotFound("quilt patch not found (never stored, or expired)", not_found)
            patch = _patch_from_row(params[0], row[:5])
            rowid, n_bytes, kept, quilt_id = row[5:]
            # Read only the patch's bytes from the stored quilt, not all of it: one
            # short range of pieces (records.PIECE_BYTES says why), one range of the
            # row if kept column by column in it, else a short range in every row.
            if kept != KEPT_ROWS:
                at = column_range(n_bytes, patch.start_col, patch.end_col).start
            if kept == KEPT_PIECES:
                return patch, read_pieces(c, quilt_id, at, at + patch.size)
            with c.blobopen("contents", "data", rowid, readonly=True) as blob:
                if kept == KEPT_COLUMNS:
                    blob.seek(at)
                    data = blob.read(patch.size)
                else:
                    slot = PatchSlot(patch.identifier, patch.start_col, patch.end_col, patch.size)
                    data = read_patch(
                        cast(ByteSource, blob),
                        _geometry(n_bytes, slot),
                        slot.start_col,
                        slot.end_col,
                    )
        return patch, data

    def read_patch_entry(self, patch_id: str) -> tuple[LocalPatch, bytes]:
        """A patch and its bytes by patch id; NotFound if malformed, unknown or lapsed."""
        try:
            ref = decode_patch_id(patch_id)
        except ValueError as exc:
            raise NotFound(f"not a quilt patch id: {exc}", {"patch_id": str(patch_id)}) from None
        return self._live_patch(
            "q.blob_id = ? AND q.start_col = ? AND q.end_col = ?",
            (ref.quilt_blob_id, ref.start_col, ref.end_col),
            {"patch_id": patch_id},
        )

    def read_patch(self, patch_id: str) -> bytes:
        """A patch's bytes; NotFound if the id is malformed, unknown, or its quilt lapsed."""
        return self.read_patch_entry(patch_id)[1]

    def read_quilt_patch_by_identifier(
        self, quilt_id: str, identifier: str
    ) -> tuple[LocalPatch, bytes]:
        """The patch called ``identifier`` in quilt ``quilt_id``, and its bytes; else NotFound."""
        return self._live_patch(
            "q.blob_id = ? AND q.identifier = ?",
            (quilt_id, identifier),
            {"quilt_id": quilt_id, "identifier": identifier},
        )

    def list_quilt_patches(self, quilt_id: str) -> list[LocalPatch]:
        """Every patch of a live quilt, in column order; NotFound if unknown or lapsed."""
        self._net._blob_op()
        self._ensure_quilt_schema()
        with self._net._read() as c:
            epoch = self._net._epoch(c)
            live = c.execute(
                "SELECT 1 FROM objects WHERE blob_id = ? AND end_epoch > ? LIMIT 1",
                (quilt_id, epoch),
            ).fetchone()
            rows = c.execute(
                "SELECT start_col, end_col, identifier, size, tags FROM quilt_patches "
                "WHERE blob_id = ? ORDER BY start_col",
                (quilt_id,),
            ).fetchall()
        if not live or not rows:
            raise NotFound("quilt not found (never stored, or expired)", {"quilt_id": quilt_id})
        return [_patch_from_row(quilt_id, r) for r in rows]

    def quilt_patch_count(self, blob_id: str) -> int | None:
        """How many patches the blob holds if it is a quilt, else None (explorer view)."""
        self._ensure_quilt_schema()
        row = (
            self._net._conn()
            .execute("SELECT count(*) FROM quilt_patches WHERE blob_id = ?", (blob_id,))
            .fetchone()
        )
        return int(row[0]) or None
