"""Walrus QuiltV1 layout math and quilt patch ids. Pure: no I/O.

Why quilts: Walrus bills every blob for its *encoded* size, and at 1000
shards even a 17-byte blob encodes to ~63 MiB (``walkeep.pricing``). A quilt
packs up to 666 small blobs ("patches") into one blob that is stored, paid
and extended as one (notes/walrus-sui.md §1.4).

The model, as in Walrus's QuiltV1:

- the quilt is a matrix of ``n_rows`` (primary source symbols) ×
  ``n_cols`` (secondary source symbols) symbols of ``S`` bytes; 334 × 667 at
  1000 shards. Its bytes are the matrix row by row, so the laid-out size is
  ``n_rows × n_cols × S`` and encodes to exactly ``encoded_blob_length`` of it;
- data is written *column-wise*: a column is one symbol of every row
  (``n_rows × S`` bytes), filled top to bottom, so one patch lives in a few
  secondary slivers and can be read without the rest;
- columns ``[0, index_cols)`` hold the quilt index; each patch then takes
  whole contiguous columns, ``max(1, ceil(size / (n_rows × S)))`` of them;
- ``S`` is the smallest even symbol size (RS2 alignment) for which the index
  and every patch fit into the ``n_cols`` columns; hence at most
  ``n_cols − 1 = 666`` patches;
- a patch id is ``base64url(quilt blob id[32] ‖ u8 version ‖ u16le start_col ‖
  u16le end_col)`` without padding (50 characters; ``end_col`` exclusive).

Checked against Walrus's documentation (tests): the documented two-file quilt
is 1,782,224 bytes (S = 8) with storage size 72,040,000, and its documented
patch id decodes to columns [1, 208).

What is Walkeep's own (we have no RedStuff encoder to check real bytes
against): the byte encoding *inside* the index columns (a BCS-style record
list, below); patches in request order (Walrus sorts them by identifier)
and without Walrus's small per-patch header (identifier + tags again, so a
real quilt can need a column more for a patch that nearly fills its own);
no cap on the number of index columns (Walrus allows 10). Sizes, columns and
patch ids follow QuiltV1; the exact quilt bytes (and so the blob id) do not.

Cost note: every patch takes at least one whole column (``n_rows × S``
bytes), so 600 patches of 700 bytes need S = 4 and encode to 68,036,000
bytes (65 MiB units), not the 63 units of the bytes' plain sum; still ~580×
cheaper than 600 separate blobs. A *full* quilt is not the cheapest: with
666 patches the index has a single column, so it sets the symbol size (666 ×
700 B with 12-character identifiers: S = 36, 96 units; 655 of them: S = 4,
65 units). Plan with :func:`plan_layout` / :func:`quilt_storage_size`
rather than filling to 666.

Index encoding (deterministic, so a reader lists patches from the bytes
alone): ``u8 version ‖ u32le body_len ‖ body`` where ``body = uleb128 count ‖
count × (uleb128 len ‖ identifier utf-8 ‖ u16le end_col ‖ uleb128 size ‖
uleb128 n_tags ‖ n_tags × (uleb128 len ‖ key ‖ uleb128 len ‖ value))`` with
tags sorted by key; a patch starts where the previous one ended (the first
right after the index). Kept compact on purpose: with 666 patches the whole
index must fit in one column, so every index byte per patch costs ~666 bytes
of symbol matrix — and long identifiers cost the same way (as in Walrus).
"""

from __future__ import annotations

import base64
import binascii
import re
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from walkeep.protocol.bcs import BcsError, BcsReader, BcsWriter
from walkeep.protocol.walrus import N_SHARDS, encoded_blob_length

MAX_PATCHES = 666
QUILT_VERSION = 1
# Identifiers are at most 64 KiB of UTF-8 (Walrus stores their length as a u16).
MAX_IDENTIFIER_BYTES = 0xFFFF
# RS2 symbols are 2-byte aligned and at most u16::MAX bytes: the largest even size.
SYMBOL_ALIGNMENT = 2
MAX_SYMBOL_SIZE = 0xFFFE
BLOB_ID_LENGTH = 43  # base64url, no padding, of 32 bytes
PATCH_ID_LENGTH = 50  # base64url, no padding, of 37 bytes
_INDEX_PREFIX = struct.Struct("<BI")  # version, body length
_B64URL = re.compile(r"^[A-Za-z0-9_-]*$")


# --- geometry ------------------------------------------------------------------------------


def source_symbols(n_shards: int = N_SHARDS) -> tuple[int, int]:
    """(primary, secondary) source symbols: the quilt's rows and columns."""
    if n_shards < 4:
        raise ValueError(f"n_shards must be at least 4, got {n_shards}")
    f = (n_shards - 1) // 3
    return n_shards - 2 * f, n_shards - f


def max_patches(n_shards: int = N_SHARDS) -> int:
    """How many patches one quilt holds: every column but the index's, at most 666."""
    return min(MAX_PATCHES, source_symbols(n_shards)[1] - 1)


def single_blob_storage_size(size: int, n_shards: int = N_SHARDS) -> int:
    """Encoded size of ``size`` bytes stored alone (the "does packing save anything" rule)."""
    return encoded_blob_length(size, n_shards)


@dataclass(frozen=True)
class PatchSlot:
    """Where one patch sits: columns ``[start_col, end_col)``, ``size`` bytes of data."""

    identifier: str
    start_col: int
    end_col: int
    size: int
    tags: tuple[tuple[str, str], ...] = ()  # sorted by key


@dataclass(frozen=True)
class QuiltLayout:
    """A planned quilt: its matrix and where each patch goes (in request order)."""

    symbol_size: int
    n_rows: int
    n_cols: int
    index_cols: int
    slots: tuple[PatchSlot, ...]

    @property
    def n_shards(self) -> int:
        # n_cols = n − f and n_rows = n − 2f, so n = 2·n_cols − n_rows.
        return 2 * self.n_cols - self.n_rows

    @property
    def column_bytes(self) -> int:
        return self.n_rows * self.symbol_size

    @property
    def laid_out_size(self) -> int:
        """The quilt blob's unencoded size (what ``Blob.size`` records)."""
        return self.n_rows * self.n_cols * self.symbol_size

    @property
    def storage_size(self) -> int:
        """The quilt blob's encoded size: what storage is billed on."""
        return encoded_blob_length(self.laid_out_size, self.n_shards)

    def slot(self, identifier: str) -> PatchSlot:
        """The patch called ``identifier``; KeyError if there is none."""
        for s in self.slots:
            if s.identifier == identifier:
                return s
        raise KeyError(identifier)

    def slot_at(self, start_col: int, end_col: int) -> PatchSlot:
        """The patch in columns ``[start_col, end_col)``; KeyError if there is none."""
        for s in self.slots:
            if s.start_col == start_col and s.end_col == end_col:
                return s
        raise KeyError((start_col, end_col))


def _check_identifier(identifier: object) -> bytes:
    if not isinstance(identifier, str):
        raise ValueError(f"patch identifier must be a string, got {type(identifier).__name__}")
    if not identifier:
        raise ValueError("patch identifier must not be empty")
    if identifier.startswith("_"):
        raise ValueError(f"patch identifier must not start with '_' (reserved): {identifier!r}")
    try:
        raw = identifier.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"patch identifier is not valid UTF-8: {exc}") from None
    if len(raw) > MAX_IDENTIFIER_BYTES:
        raise ValueError(
            f"patch identifier is {len(raw)} bytes of UTF-8; at most {MAX_IDENTIFIER_BYTES}"
        )
    return raw


def _norm_tags(tags: Mapping[str, str] | None, identifier: str) -> tuple[tuple[str, str], ...]:
    if not tags:
        return ()
    out = []
    for k, v in tags.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise ValueError(f"tags of {identifier!r} must map strings to strings")
        out.append((k, v))
    return tuple(sorted(out))


def plan_layout(
    patches: Sequence[tuple[str, int]],
    n_shards: int = N_SHARDS,
    *,
    tags: Mapping[str, Mapping[str, str]] | None = None,
) -> QuiltLayout:
    """Plan a quilt for ``(identifier, size)`` patches, in the given order.

    ``tags`` (identifier → {key: value}) are stored in the index. Raises
    ValueError for no patches, more than :func:`max_patches`, duplicate,
    empty, ``_``-prefixed or over-long identifiers, negative sizes, tags for
    unknown identifiers, or a quilt too large for the largest symbol size.
    """
    n_rows, n_cols = source_symbols(n_shards)
    limit = max_patches(n_shards)
    if not patches:
        raise ValueError("a quilt needs at least one patch")
    if len(patches) > limit:
        raise ValueError(f"a quilt holds at most {limit} patches, got {len(patches)}")
    tags = tags or {}
    seen: set[str] = set()
    pending: list[PatchSlot] = []
    for identifier, size in patches:
        _check_identifier(identifier)
        if identifier in seen:
            raise ValueError(f"duplicate patch identifier: {identifier!r}")
        seen.add(identifier)
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ValueError(f"size of patch {identifier!r} must be a non-negative integer")
        pending.append(
            PatchSlot(identifier, 0, 0, size, _norm_tags(tags.get(identifier), identifier))
        )
    unknown = set(tags) - seen
    if unknown:
        raise ValueError(f"tags given for unknown patch identifiers: {sorted(unknown)!r}")
    # The index's length does not depend on where patches go (fixed-width columns).
    index_len = len(encode_index(pending))
    sizes = [p.size for p in pending]

    def columns(symbol: int) -> int:
        col = n_rows * symbol
        return -(-index_len // col) + sum(max(1, -(-s // col)) for s in sizes)

    lo, hi = 1, MAX_SYMBOL_SIZE // SYMBOL_ALIGNMENT  # in units of the alignment
    if columns(hi * SYMBOL_ALIGNMENT) > n_cols:
        raise ValueError(
            f"quilt too large: {sum(sizes)} bytes of patches do not fit {n_cols} columns "
            f"even with the largest symbol size ({MAX_SYMBOL_SIZE}); store fewer or smaller patches"
        )
    while lo < hi:  # smallest fitting size: columns() only shrinks as symbols grow
        mid = (lo + hi) // 2
        if columns(mid * SYMBOL_ALIGNMENT) <= n_cols:
            hi = mid
        else:
            lo = mid + 1
    symbol = lo * SYMBOL_ALIGNMENT
    col_bytes = n_rows * symbol
    index_cols = -(-index_len // col_bytes)
    slots = []
    at = index_cols
    for p in pending:
        width = max(1, -(-p.size // col_bytes))
        slots.append(PatchSlot(p.identifier, at, at + width, p.size, p.tags))
        at += width
    return QuiltLayout(symbol, n_rows, n_cols, index_cols, tuple(slots))


def quilt_storage_size(sizes: Sequence[int], n_shards: int = N_SHARDS) -> int:
    """Encoded size of a quilt of patches of these sizes (short identifiers assumed).

    For cost estimates; the exact figure of a real quilt comes from
    :func:`plan_layout` with its identifiers (long identifiers can need a
    larger symbol size).
    """
    return plan_layout([(f"p{i}", s) for i, s in enumerate(sizes)], n_shards).storage_size


# --- index encoding ------------------------------------------------------------------------


def encode_index(slots: Sequence[PatchSlot]) -> bytes:
    """The index as stored in the first column(s): prefix + body (module docstring)."""
    w = BcsWriter()
    w.uleb(len(slots))
    for s in slots:
        w.string(s.identifier)
        w.u16(s.end_col)
        w.uleb(s.size)
        w.uleb(len(s.tags))
        for k, v in s.tags:
            w.string(k)
            w.string(v)
    return _INDEX_PREFIX.pack(QUILT_VERSION, len(w.buf)) + bytes(w.buf)


def _decode_body(body: bytes, index_cols: int) -> tuple[PatchSlot, ...]:
    r = BcsReader(body)
    slots = []
    start = index_cols  # each patch starts where the previous one ended
    try:
        for _ in range(r.uleb()):
            identifier = r.string()
            end = r.u16()
            size = r.uleb()
            tags = tuple((r.string(), r.string()) for _ in range(r.uleb()))
            slots.append(PatchSlot(identifier, start, end, size, tags))
            start = end
        r.done()
    except BcsError as exc:
        raise ValueError(f"quilt index: {exc}") from None
    return tuple(slots)


# --- bytes: column-wise writes and reads ---------------------------------------------------


def _write_column(buf: bytearray, layout: QuiltLayout, col: int, chunk: bytes) -> None:
    """Write ≤ one column of data at column ``col``, top to bottom."""
    s, rows = layout.symbol_size, layout.n_rows
    row_bytes = layout.n_cols * s
    chunk = chunk.ljust(rows * s, b"\0")
    if s <= rows:  # s strided copies of one byte per row
        end = rows * row_bytes
        for b in range(s):
            buf[col * s + b : end : row_bytes] = chunk[b::s]
    else:  # rows copies of one symbol
        for r in range(rows):
            buf[r * row_bytes + col * s : r * row_bytes + (col + 1) * s] = chunk[
                r * s : (r + 1) * s
            ]


class ByteSource(Protocol):
    """Random access to a quilt's bytes: ``bytes``, or an open SQLite blob handle."""

    def __len__(self) -> int: ...

    def __getitem__(self, key: slice, /) -> bytes: ...


def _read_span(data: ByteSource, layout: QuiltLayout, start_col: int, end_col: int) -> bytes:
    """Columns ``[start_col, end_col)`` in column order, with one read per row.

    A patch's columns are contiguous within each row, so this touches only
    ``n_rows`` short ranges of the quilt, never the whole of it.
    """
    s, rows, width = layout.symbol_size, layout.n_rows, (end_col - start_col) * layout.symbol_size
    row_bytes = layout.n_cols * s
    first = start_col * s
    matrix = b"".join(
        bytes(data[r * row_bytes + first : r * row_bytes + first + width]) for r in range(rows)
    )
    ncols = end_col - start_col
    col_bytes = rows * s
    out = bytearray(ncols * col_bytes)
    if s <= rows:  # s strided copies per column
        for j in range(ncols):
            for b in range(s):
                out[j * col_bytes + b : (j + 1) * col_bytes : s] = matrix[j * s + b :: width]
    else:  # rows copies of one symbol per column
        for j in range(ncols):
            for r in range(rows):
                at = j * col_bytes + r * s
                out[at : at + s] = matrix[r * width + j * s : r * width + (j + 1) * s]
    return bytes(out)


def _write_columns(buf: bytearray, layout: QuiltLayout, start_col: int, data: bytes) -> None:
    step = layout.column_bytes
    for i, off in enumerate(range(0, len(data), step)):
        _write_column(buf, layout, start_col + i, data[off : off + step])


def layout_bytes(layout: QuiltLayout, datas: Sequence[bytes]) -> bytes:
    """The quilt's bytes: the index, then each patch's data in its columns, zero padding."""
    if len(datas) != len(layout.slots):
        raise ValueError(f"{len(layout.slots)} patches planned, {len(datas)} given")
    for slot, data in zip(layout.slots, datas, strict=True):
        if len(data) != slot.size:
            raise ValueError(
                f"patch {slot.identifier!r} was planned at {slot.size} bytes, got {len(data)}"
            )
    buf = bytearray(layout.laid_out_size)
    _write_columns(buf, layout, 0, encode_index(layout.slots))
    for slot, data in zip(layout.slots, datas, strict=True):
        _write_columns(buf, layout, slot.start_col, bytes(data))
    return bytes(buf)


def parse_index(laid_out: ByteSource, n_shards: int = N_SHARDS) -> QuiltLayout:
    """Recover the layout from a quilt's bytes alone; ValueError if they are not a quilt."""
    n_rows, n_cols = source_symbols(n_shards)
    cells = n_rows * n_cols
    if not len(laid_out) or len(laid_out) % cells:
        raise ValueError(f"not a quilt: {len(laid_out)} bytes is not a multiple of {cells}")
    symbol = len(laid_out) // cells
    if symbol % SYMBOL_ALIGNMENT:
        raise ValueError(f"not a quilt: odd symbol size {symbol}")
    probe = QuiltLayout(symbol, n_rows, n_cols, 0, ())
    first = _read_span(laid_out, probe, 0, 1)
    if len(first) < _INDEX_PREFIX.size:
        raise ValueError("not a quilt: column too small for the index prefix")
    version, body_len = _INDEX_PREFIX.unpack_from(first)
    if version != QUILT_VERSION:
        raise ValueError(f"not a quilt: unknown index version {version}")
    total = _INDEX_PREFIX.size + body_len
    index_cols = -(-total // probe.column_bytes)
    if index_cols >= n_cols:
        raise ValueError("not a quilt: index longer than the quilt")
    raw = first if index_cols == 1 else _read_span(laid_out, probe, 0, index_cols)
    slots = _decode_body(raw[_INDEX_PREFIX.size : total], index_cols)
    for s in slots:
        width = max(1, -(-s.size // probe.column_bytes))
        if s.end_col != s.start_col + width:
            raise ValueError(f"not a quilt: patch {s.identifier!r} has inconsistent columns")
    if slots and slots[-1].end_col > n_cols:
        raise ValueError("not a quilt: patches overflow the matrix")
    return QuiltLayout(symbol, n_rows, n_cols, index_cols, slots)


def read_patch(
    laid_out: ByteSource, layout_or_index: QuiltLayout | None, start_col: int, end_col: int
) -> bytes:
    """The data of the patch in columns ``[start_col, end_col)``.

    ``laid_out`` is the quilt's bytes or anything sliceable like them (an
    SQLite blob handle: only the patch's ranges are read). ``layout_or_index``
    is the quilt's layout if known, else None to read the index from the
    bytes. KeyError if no patch occupies exactly those columns; ValueError if
    the bytes are not a quilt.
    """
    layout = layout_or_index if layout_or_index is not None else parse_index(laid_out)
    if len(laid_out) != layout.laid_out_size:
        raise ValueError(f"quilt is {layout.laid_out_size} bytes, got {len(laid_out)}")
    slot = layout.slot_at(start_col, end_col)
    return _read_span(laid_out, layout, start_col, end_col)[: slot.size]


# --- column-major storage (a storage node's view) -------------------------------------------


def _full_layout(n_bytes: int, n_shards: int) -> QuiltLayout:
    n_rows, n_cols = source_symbols(n_shards)
    cells = n_rows * n_cols
    if not n_bytes or n_bytes % cells or (n_bytes // cells) % SYMBOL_ALIGNMENT:
        raise ValueError(f"not a quilt: {n_bytes} bytes is not {n_rows} × {n_cols} even symbols")
    return QuiltLayout(n_bytes // cells, n_rows, n_cols, 0, ())


def to_columns(laid_out: bytes, n_shards: int = N_SHARDS) -> bytes:
    """The quilt's bytes column by column, each column its symbols top to bottom.

    Why: a patch fills whole contiguous columns, so stored this way it is one
    contiguous range (:func:`column_range`), as Walrus storage nodes keep secondary
    slivers, where the row-by-row bytes scatter it over every row (334 reads).
    """
    layout = _full_layout(len(laid_out), n_shards)
    return _read_span(laid_out, layout, 0, layout.n_cols)


def from_columns(columns: bytes, n_shards: int = N_SHARDS) -> bytes:
    """The inverse of :func:`to_columns`: the quilt's bytes, row by row."""
    layout = _full_layout(len(columns), n_shards)
    buf = bytearray(len(columns))
    _write_columns(buf, layout, 0, columns)
    return bytes(buf)


def column_range(n_bytes: int, start_col: int, end_col: int, n_shards: int = N_SHARDS) -> slice:
    """Where columns ``[start_col, end_col)`` lie in :func:`to_columns` of a quilt of
    ``n_bytes``: a patch's data is the start of that range, ``size`` bytes long."""
    layout = _full_layout(n_bytes, n_shards)
    if not 0 <= start_col < end_col <= layout.n_cols:
        raise ValueError(f"columns [{start_col}, {end_col}) outside 0..{layout.n_cols}")
    return slice(start_col * layout.column_bytes, end_col * layout.column_bytes)


# --- patch ids -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PatchRef:
    """A decoded patch id."""

    quilt_blob_id: str
    version: int
    start_col: int
    end_col: int


def _b64decode(text: str) -> bytes:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        raise ValueError("not base64url") from None


def _b64encode(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def encode_patch_id(quilt_blob_id: str, start_col: int, end_col: int, version: int = 1) -> str:
    """``base64url(blob id ‖ u8 version ‖ u16le start ‖ u16le end)``, no padding, 50 chars."""
    if not isinstance(quilt_blob_id, str) or len(quilt_blob_id) != BLOB_ID_LENGTH:
        raise ValueError(f"quilt blob id must be {BLOB_ID_LENGTH} characters: {quilt_blob_id!r}")
    if not _B64URL.match(quilt_blob_id):
        raise ValueError(f"quilt blob id is not base64url: {quilt_blob_id!r}")
    raw = _b64decode(quilt_blob_id)
    if len(raw) != 32 or _b64encode(raw) != quilt_blob_id:
        raise ValueError(f"quilt blob id is not a canonical 32-byte id: {quilt_blob_id!r}")
    if not 0 <= version <= 0xFF:
        raise ValueError(f"version must fit in a byte, got {version}")
    if not 0 <= start_col < end_col <= 0xFFFF:
        raise ValueError(f"need 0 <= start_col < end_col <= 65535, got [{start_col}, {end_col})")
    return _b64encode(raw + struct.pack("<BHH", version, start_col, end_col))


def decode_patch_id(patch_id: str) -> PatchRef:
    """Split a patch id; ValueError unless it is a well-formed QuiltV1 patch id."""
    if not isinstance(patch_id, str) or len(patch_id) != PATCH_ID_LENGTH:
        raise ValueError(f"a quilt patch id is {PATCH_ID_LENGTH} characters")
    if not _B64URL.match(patch_id):
        raise ValueError("a quilt patch id is URL-safe base64")
    raw = _b64decode(patch_id)
    if len(raw) != 37 or _b64encode(raw) != patch_id:
        raise ValueError("not a canonical quilt patch id")
    version, start, end = struct.unpack("<BHH", raw[32:])
    if version != QUILT_VERSION:
        raise ValueError(f"unsupported quilt version {version} (only {QUILT_VERSION})")
    if not start < end:
        raise ValueError(f"empty column range [{start}, {end}) in patch id")
    return PatchRef(_b64encode(raw[:32]), version, start, end)


def is_patch_id(s: object) -> bool:
    """True for a well-formed patch id (a plain blob id is 43 characters, never 50)."""
    try:
        decode_patch_id(s)  # type: ignore[arg-type]
    except ValueError:
        return False
    return True
