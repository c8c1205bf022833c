"""QuiltV1 layout math and patch ids (walkeep/protocol/quilt.py), pinned to Walrus's documented figures."""

from __future__ import annotations

import base64
import random

import pytest

from walkeep.protocol.quilt import (
    MAX_PATCHES,
    QUILT_VERSION,
    PatchRef,
    column_range,
    decode_patch_id,
    encode_index,
    encode_patch_id,
    from_columns,
    is_patch_id,
    layout_bytes,
    max_patches,
    parse_index,
    plan_layout,
    quilt_storage_size,
    read_patch,
    single_blob_storage_size,
    source_symbols,
    to_columns,
)
from walkeep.protocol.walrus import encoded_blob_length, storage_units

DOC_QUILT_ID = "6XUOE-Q5-nAXHRifN6n9nomVDtHZQbGuAkW3PjlBuKo"
DOC_PATCH_ID = "6XUOE-Q5-nAXHRifN6n9nomVDtHZQbGuAkW3PjlBuKoBAQDQAA"


def test_geometry_at_1000_shards() -> None:
    assert source_symbols(1000) == (334, 667)
    assert MAX_PATCHES == max_patches(1000) == 666
    assert QUILT_VERSION == 1


def test_documented_two_file_quilt_size_and_storage_size() -> None:
    # Walrus docs: size 1,782,224 (= 334 × 667 × 8), storageSize 72,040,000. A first
    # patch of 207 columns at S = 8 starts at column 1 and ends at 208, like the
    # documented patch id; the second one makes S = 6 too small.
    layout = plan_layout([("walrus.jpg", 553_000), ("another.txt", 1_000_000)])
    assert layout.symbol_size == 8
    assert (layout.n_rows, layout.n_cols, layout.index_cols) == (334, 667, 1)
    assert layout.laid_out_size == 1_782_224 == 222_778 * 8
    assert layout.storage_size == 72_040_000 == encoded_blob_length(1_782_224)
    first = layout.slots[0]
    assert (first.start_col, first.end_col) == (1, 208)
    assert layout.slots[1].start_col == 208


def test_documented_patch_id_decodes() -> None:
    ref = decode_patch_id(DOC_PATCH_ID)
    assert ref == PatchRef(DOC_QUILT_ID, 1, 1, 208)
    assert DOC_PATCH_ID.startswith(ref.quilt_blob_id)
    assert encode_patch_id(DOC_QUILT_ID, 1, 208) == DOC_PATCH_ID
    assert is_patch_id(DOC_PATCH_ID)
    assert not is_patch_id(DOC_QUILT_ID)  # a blob id is not a patch id


def test_symbol_size_is_the_smallest_even_size_that_fits() -> None:
    for sizes in ([1], [668], [669], [5_000, 1, 300_000], [700] * 600, [10] * 666):
        layout = plan_layout([(f"p{i}", s) for i, s in enumerate(sizes)])
        index_len = len(encode_index(layout.slots))

        def fits(symbol: int, sizes: list[int] = sizes, index_len: int = index_len) -> bool:
            col = 334 * symbol
            return -(-index_len // col) + sum(max(1, -(-x // col)) for x in sizes) <= 667

        brute = next(s for s in range(2, 70_000, 2) if fits(s))
        assert layout.symbol_size == brute, sizes


def test_patches_take_contiguous_whole_columns() -> None:
    layout = plan_layout([("a", 0), ("b", 1), ("c", 2 * 334 * 4 + 1), ("d", 10)])
    col = layout.column_bytes
    at = layout.index_cols
    for slot in layout.slots:
        assert slot.start_col == at
        assert slot.end_col - slot.start_col == max(1, -(-slot.size // col))
        at = slot.end_col


def test_666_patches_fit_and_667_are_refused() -> None:
    layout = plan_layout([(f"memory-{i:04d}", 1000) for i in range(666)])
    assert len(layout.slots) == 666
    assert layout.slots[-1].end_col <= 667
    with pytest.raises(ValueError, match="at most 666 patches"):
        plan_layout([(f"memory-{i:04d}", 1000) for i in range(667)])


def test_packing_saves_storage_for_small_memories() -> None:
    # 600 memories of 700 bytes: one quilt costs what ~1 blob costs, not 600 of them.
    quilt = quilt_storage_size([700] * 600)
    single = single_blob_storage_size(700)
    assert single == encoded_blob_length(700) == 66_034_000
    assert quilt < 2 * single
    # Each 700-byte patch needs its own column of 334 × S bytes: S = 4, not 2.
    assert quilt == encoded_blob_length(334 * 667 * 4) == 68_036_000
    assert quilt == plan_layout([(f"p{i}", 700) for i in range(600)]).storage_size


@pytest.mark.parametrize(
    ("patches", "message"),
    [
        ([], "at least one patch"),
        ([("a", 1), ("a", 2)], "duplicate"),
        ([("_metadata", 1)], "must not start with '_'"),
        ([("", 1)], "must not be empty"),
        ([("x" * 65_536, 1)], "at most 65535"),
        ([("a", -1)], "non-negative"),
        ([("a", 10**12)], "too large"),
    ],
)
def test_bad_patches_are_refused_clearly(patches: list[tuple[str, int]], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        plan_layout(patches)


def test_long_identifiers_push_the_index_into_more_columns() -> None:
    long_ids = [("k" * 60_000 + str(i), 10) for i in range(3)]
    layout = plan_layout(long_ids)
    assert layout.index_cols >= 1
    assert len(encode_index(layout.slots)) <= layout.index_cols * layout.column_bytes
    data = [bytes([i]) * 10 for i in range(3)]
    laid = layout_bytes(layout, data)
    assert parse_index(laid) == layout


def test_round_trip_many_sizes() -> None:
    rng = random.Random(11)
    for trial in range(12):
        n = rng.choice([1, 2, 5, 40, 200])
        sizes = [
            rng.choice([0, 1, rng.randrange(2, 5000), rng.randrange(5000, 60_000)])
            for _ in range(n)
        ]
        tags = {f"id-{i}": {"n": str(i)} for i in range(n) if i % 3 == 0}
        layout = plan_layout([(f"id-{i}", s) for i, s in enumerate(sizes)], tags=tags)
        datas = [rng.randbytes(s) for s in sizes]
        laid = layout_bytes(layout, datas)
        assert len(laid) == layout.laid_out_size
        parsed = parse_index(laid)
        assert parsed == layout, trial
        for slot, data in zip(layout.slots, datas, strict=True):
            assert read_patch(laid, layout, slot.start_col, slot.end_col) == data
            assert read_patch(laid, None, slot.start_col, slot.end_col) == data
        assert dict(parsed.slot("id-0").tags) == {"n": "0"}


def test_round_trip_with_a_symbol_larger_than_the_row_count() -> None:
    # S > n_rows takes the per-row copy path; 10 shards keep the matrix small (4 × 7).
    sizes = [3_000, 9_000, 1]
    layout = plan_layout([("small", sizes[0]), ("big", sizes[1]), ("one", 1)], n_shards=10)
    assert (layout.n_rows, layout.n_cols) == (4, 7)
    assert layout.symbol_size > layout.n_rows
    rng = random.Random(3)
    datas = [rng.randbytes(s) for s in sizes]
    laid = layout_bytes(layout, datas)
    assert parse_index(laid, n_shards=10) == layout
    for slot, data in zip(layout.slots, datas, strict=True):
        assert read_patch(laid, layout, slot.start_col, slot.end_col) == data


def test_patch_data_is_written_column_wise_in_a_row_major_matrix() -> None:
    # The first symbol of the first patch column sits in row 0, the next one in row 1.
    layout = plan_layout([("a", 20)])
    s, row_bytes = layout.symbol_size, layout.n_cols * layout.symbol_size
    laid = layout_bytes(layout, [bytes(range(20))])
    col = layout.slots[0].start_col
    assert laid[col * s : col * s + s] == bytes(range(s))
    assert laid[row_bytes + col * s : row_bytes + col * s + s] == bytes(range(s, 2 * s))


def test_read_patch_refuses_columns_that_are_not_a_patch() -> None:
    layout = plan_layout([("a", 5), ("b", 5)])
    laid = layout_bytes(layout, [b"aaaaa", b"bbbbb"])
    with pytest.raises(KeyError):
        read_patch(laid, layout, 1, 3)
    with pytest.raises(ValueError):
        parse_index(b"\0" * 100)
    with pytest.raises(ValueError, match="not a quilt"):
        parse_index(bytes(layout.laid_out_size))  # version byte 0


def test_layout_bytes_checks_sizes() -> None:
    layout = plan_layout([("a", 5)])
    with pytest.raises(ValueError, match="planned at 5 bytes"):
        layout_bytes(layout, [b"abc"])
    with pytest.raises(ValueError, match="1 patches planned"):
        layout_bytes(layout, [b"abcde", b"x"])


def test_patch_ids_round_trip_and_decode_to_their_quilt() -> None:
    blob_id = base64.urlsafe_b64encode(bytes(range(32))).decode().rstrip("=")
    layout = plan_layout([(f"m{i}", 1000 * i) for i in range(50)])
    for slot in layout.slots:
        pid = encode_patch_id(blob_id, slot.start_col, slot.end_col)
        assert len(pid) == 50 and pid.startswith(blob_id)
        ref = decode_patch_id(pid)
        assert (ref.quilt_blob_id, ref.version, ref.start_col, ref.end_col) == (
            blob_id,
            1,
            slot.start_col,
            slot.end_col,
        )


@pytest.mark.parametrize(
    "bad",
    [
        "",
        DOC_QUILT_ID,  # 43 chars: a blob id
        DOC_PATCH_ID[:-1],
        DOC_PATCH_ID + "A",
        DOC_PATCH_ID[:-1] + "!",
        DOC_PATCH_ID[:-1] + "B",  # non-canonical trailing bits
        encode_patch_id(DOC_QUILT_ID, 1, 208, version=2),  # unknown version
        base64.urlsafe_b64encode(bytes(32) + b"\x01\x05\x00\x05\x00").decode().rstrip("="),
    ],
)
def test_malformed_patch_ids_are_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        decode_patch_id(bad)
    assert not is_patch_id(bad)


def test_encode_patch_id_validates() -> None:
    with pytest.raises(ValueError):
        encode_patch_id("short", 1, 2)
    with pytest.raises(ValueError):
        encode_patch_id(DOC_QUILT_ID, 5, 5)
    with pytest.raises(ValueError):
        encode_patch_id(DOC_QUILT_ID, 1, 70_000)
    assert not is_patch_id(None)


class CountingSource:
    """A ByteSource that records how many bytes were read (like an SQLite blob handle)."""

    def __init__(self, data: bytes) -> None:
        self.data, self.read = data, 0

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, key: slice) -> bytes:
        out = self.data[key]
        self.read += len(out)
        return out


def test_reading_a_patch_touches_only_its_columns() -> None:
    sizes = [50_000, 3_000, 200_000]
    layout = plan_layout([(f"p{i}", s) for i, s in enumerate(sizes)])
    datas = [bytes([i + 1]) * s for i, s in enumerate(sizes)]
    laid = layout_bytes(layout, datas)
    for slot, data in zip(layout.slots, datas, strict=True):
        src = CountingSource(laid)
        assert read_patch(src, layout, slot.start_col, slot.end_col) == data
        assert src.read == (slot.end_col - slot.start_col) * layout.column_bytes
        assert src.read < len(laid) / 2


def test_a_full_quilt_lets_the_index_set_the_symbol_size() -> None:
    # The figures quoted in walkeep/protocol/quilt.py's docstring.
    def units(n: int) -> tuple[int, int]:
        layout = plan_layout([(f"mem_{i:08d}", 700) for i in range(n)])
        return layout.symbol_size, storage_units(layout.storage_size)

    assert units(655) == (4, 65)
    assert units(666) == (36, 96)


@pytest.mark.parametrize("sizes", [[50_000, 3_000, 200_000], [700] * 600, [1]])
def test_kept_column_by_column_a_patch_is_one_range(sizes: list[int]) -> None:
    """Small symbols (many rows per symbol byte) and large ones take different copy
    paths; both must round-trip, and a patch's data must open its column range."""
    layout = plan_layout([(f"p{i}", s) for i, s in enumerate(sizes)])
    rng = random.Random(len(sizes))
    datas = [rng.randbytes(s) for s in sizes]
    laid = layout_bytes(layout, datas)
    columns = to_columns(laid)
    assert len(columns) == len(laid) and columns != laid
    assert from_columns(columns) == laid
    for slot, data in zip(layout.slots, datas, strict=True):
        span = column_range(len(laid), slot.start_col, slot.end_col)
        assert span.stop - span.start == (slot.end_col - slot.start_col) * layout.column_bytes
        assert columns[span][: slot.size] == data
        assert read_patch(laid, layout, slot.start_col, slot.end_col) == data


def test_column_functions_refuse_what_is_not_a_quilt() -> None:
    rows, cols = source_symbols()
    with pytest.raises(ValueError, match="not a quilt"):
        to_columns(b"x" * (rows * cols * 2 + 1))
    with pytest.raises(ValueError, match="not a quilt"):
        from_columns(b"x" * (rows * cols))  # odd symbol size
    with pytest.raises(ValueError, match="outside"):
        column_range(rows * cols * 2, 5, cols + 1)
