"""Quilts on the local network: one Blob object, priced from the layout, patches read back."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from walkeep.backends.base import BlobStore, Faults, StoredQuilt
from walkeep.backends.localnet import LocalBlobStore, LocalNetwork
from walkeep.backends.localnet.codec import blob_id_for
from walkeep.backends.localnet.engine import DB_FILE
from walkeep.backends.localnet.records import KEPT_PIECES, PIECE_BYTES
from walkeep.clock import ManualClock
from walkeep.errors import NotFound, RelayerUnavailable, ValidationError
from walkeep.protocol.quilt import (
    column_range,
    decode_patch_id,
    encode_patch_id,
    from_columns,
    parse_index,
    plan_layout,
    to_columns,
)
from walkeep.protocol.walrus import storage_units

EPOCH = 3600
PRICE = 11_000
OTHER = "0x" + "ab" * 32


@pytest.fixture
def net(tmp_path: Path, clock: ManualClock) -> Iterator[LocalNetwork]:
    network = LocalNetwork(tmp_path / "ln", clock, epoch_seconds=EPOCH, storage_price_frost=PRICE)
    yield network
    network.close()


def patches(n: int, size: int = 300) -> list[tuple[str, bytes]]:
    return [(f"mem-{i:03d}", bytes([i % 251]) * (size + i)) for i in range(n)]


def put(net: LocalNetwork, items: list[tuple[str, bytes]], epochs: int = 5) -> StoredQuilt:
    return net.store_quilt(items, epochs=epochs, owner=net.server_address)


def test_a_quilt_is_one_blob_object_priced_from_its_layout(net: LocalNetwork) -> None:
    items = patches(40)
    stored = put(net, items, epochs=3)
    layout = plan_layout([(i, len(d)) for i, d in items])
    blob = stored.blob
    assert stored.newly_created
    assert blob.size == layout.laid_out_size
    assert blob.storage_size == layout.storage_size
    assert stored.cost_frost == storage_units(layout.storage_size) * PRICE * 3
    assert blob.end_epoch == 3 and blob.owner == net.server_address
    assert list(net.owned_blobs(net.server_address)) == [blob]
    assert net.get_object(blob.blob_object_id) == blob
    # One store transaction with the same calls as a blob's.
    db = sqlite3.connect(net.state_dir / DB_FILE)
    try:
        assert db.execute("SELECT COUNT(*) FROM objects").fetchone()[0] == 1
        assert db.execute("SELECT COUNT(*) FROM transactions").fetchone()[0] == 1
    finally:
        db.close()
    rec = net.object_record(blob.blob_object_id)
    assert rec is not None
    tx = net.transaction_record(rec.created_tx)
    assert tx is not None and tx.kind == "store"
    assert [c["function"].rsplit("::", 1)[1] for c in tx.calls] == [
        "reserve_space",
        "register_blob",
        "certify_blob",
    ]
    assert net.quilt_patch_count(blob.blob_id) == 40


def test_patches_come_back_in_request_order_and_read_back(net: LocalNetwork) -> None:
    items = patches(25)[::-1]
    stored = put(net, items)
    assert [p.identifier for p in stored.patches] == [i for i, _ in items]
    for (identifier, data), patch in zip(items, stored.patches, strict=True):
        ref = decode_patch_id(patch.patch_id)
        assert ref.quilt_blob_id == stored.blob.blob_id
        assert net.read_patch(patch.patch_id) == data
        entry, raw = net.read_quilt_patch_by_identifier(stored.blob.blob_id, identifier)
        assert raw == data and entry.patch_id == patch.patch_id
    listed = net.list_quilt_patches(stored.blob.blob_id)
    assert sorted(p.identifier for p in listed) == sorted(i for i, _ in items)
    # The whole quilt is an ordinary blob, and its bytes carry their own index.
    laid = net.read_blob(stored.blob.blob_id)
    assert [s.identifier for s in parse_index(laid).slots] == [i for i, _ in items]


def test_tags_are_kept(net: LocalNetwork) -> None:
    stored = net.store_quilt(
        [("a", b"1"), ("b", b"2")],
        epochs=1,
        owner=net.server_address,
        tags={"a": {"agent": "x"}},
    )
    listed = {p.identifier: p.tags for p in net.list_quilt_patches(stored.blob.blob_id)}
    assert listed == {"a": {"agent": "x"}, "b": {}}


def test_a_lapsed_quilt_serves_nothing(net: LocalNetwork, clock: ManualClock) -> None:
    stored = put(net, patches(3), epochs=2)
    pid = stored.patches[0].patch_id
    clock.advance(EPOCH * 2 - 1)
    assert net.read_patch(pid)
    clock.advance(1)
    with pytest.raises(NotFound):
        net.read_patch(pid)
    with pytest.raises(NotFound):
        net.read_quilt_patch_by_identifier(stored.blob.blob_id, "mem-000")
    with pytest.raises(NotFound):
        net.list_quilt_patches(stored.blob.blob_id)


def test_unknown_and_malformed_patch_ids_are_not_found(net: LocalNetwork) -> None:
    stored = put(net, patches(2))
    quilt = stored.blob.blob_id
    ref = decode_patch_id(stored.patches[1].patch_id)
    for bad in (
        "nope",
        quilt,  # a blob id, not a patch id
        encode_patch_id(quilt, ref.start_col, ref.end_col + 1),  # columns of no patch
        encode_patch_id("A" * 42 + "A", 1, 2),  # unknown quilt
    ):
        with pytest.raises(NotFound):
            net.read_patch(bad)
    with pytest.raises(NotFound):
        net.read_quilt_patch_by_identifier(quilt, "missing")
    with pytest.raises(NotFound):
        net.list_quilt_patches("A" * 43)


def test_extend_works_on_a_quilt(net: LocalNetwork, clock: ManualClock) -> None:
    stored = put(net, patches(5), epochs=1)
    oid = stored.blob.blob_object_id
    fx = net.execute(net.prepare_extend(net.server_address, [(oid, 4)]))
    assert fx.extensions[0].new_end_epoch == 5
    assert fx.wal_cost_frost == storage_units(stored.blob.storage_size) * PRICE * 4
    clock.advance(EPOCH * 4)
    assert net.read_patch(stored.patches[4].patch_id) == patches(5)[4][1]


@pytest.mark.parametrize(
    ("items", "message"),
    [
        ([], "at least one patch"),
        ([("a", b"x"), ("a", b"y")], "duplicate"),
        ([("_metadata", b"x")], "must not start with '_'"),
        ([("", b"x")], "must not be empty"),
        ([(f"m{i}", b"x") for i in range(667)], "at most 666"),
        ([("a", "text")], r"\(identifier, bytes\) pairs"),
    ],
)
def test_bad_quilts_are_validation_errors(
    net: LocalNetwork, items: list[tuple[str, bytes]], message: str
) -> None:
    with pytest.raises(ValidationError, match=message):
        net.store_quilt(items, epochs=1, owner=net.server_address)
    assert list(net.owned_blobs(net.server_address)) == []


def test_666_patches_make_one_quilt(net: LocalNetwork) -> None:
    items = [(f"m{i}", i.to_bytes(2, "little") * 20) for i in range(666)]
    stored = put(net, items)
    assert len(stored.patches) == 666
    assert net.read_patch(stored.patches[665].patch_id) == items[665][1]


def test_force_false_reuses_a_certified_quilt(net: LocalNetwork) -> None:
    items = patches(3)
    first = put(net, items, epochs=5)
    again = net.store_quilt(items, epochs=2, owner=net.server_address, force=False)
    assert not again.newly_created and again.blob == first.blob
    assert again.patches == first.patches


def test_quilt_faults_match_store_blob(tmp_path: Path, clock: ManualClock) -> None:
    faults = Faults(fail_next_writes=1)
    net = LocalNetwork(tmp_path / "ln", clock, faults=faults)
    try:
        with pytest.raises(RelayerUnavailable):
            put(net, patches(2))
        stored = put(net, patches(2))
        faults.unreachable = True
        with pytest.raises(RelayerUnavailable):
            put(net, patches(2))
        with pytest.raises(RelayerUnavailable):
            net.read_patch(stored.patches[0].patch_id)
        faults.unreachable = False
        assert len(list(net.owned_blobs(net.server_address))) == 1
    finally:
        net.close()


def test_local_blobstore_put_quilt_and_get_patch(net: LocalNetwork) -> None:
    store = LocalBlobStore(net)
    assert isinstance(store, BlobStore)
    items = patches(4)
    stored = store.put_quilt(items, epochs=2, owner=OTHER)
    assert stored.newly_created and stored.blob.owner == OTHER
    assert [store.get_patch(p.patch_id) for p in stored.patches] == [d for _, d in items]
    with pytest.raises(NotFound):
        store.get_patch("x" * 50)


def test_quilts_survive_a_restart(tmp_path: Path, clock: ManualClock) -> None:
    with LocalNetwork(tmp_path / "ln", clock) as first:
        stored = put(first, patches(3))
    with LocalNetwork(tmp_path / "ln", clock) as second:
        assert second.read_patch(stored.patches[2].patch_id) == patches(3)[2][1]


def _pieces(db: sqlite3.Connection, blob_id: str) -> list[bytes]:
    return [
        r[0]
        for r in db.execute(
            "SELECT data FROM content_pieces WHERE blob_id = ? ORDER BY seq", (blob_id,)
        )
    ]


def test_a_quilt_is_kept_column_by_column_and_read_back_whole_row_by_row(
    net: LocalNetwork,
) -> None:
    """A patch is one range of the stored bytes; the blob as a whole is still its
    row-by-row bytes, the ones its blob id was computed from."""
    items = patches(30)
    stored = put(net, items)
    db = sqlite3.connect(net.state_dir / DB_FILE)
    try:
        row, columns = db.execute(
            "SELECT data, columns FROM contents WHERE blob_id = ?", (stored.blob.blob_id,)
        ).fetchone()
        pieces = _pieces(db, stored.blob.blob_id)
    finally:
        db.close()
    data = b"".join(pieces)
    laid = net.read_blob(stored.blob.blob_id)
    assert columns == KEPT_PIECES and row == b""
    assert data == to_columns(laid) and data != laid
    assert len(pieces) > 1 and all(len(p) == PIECE_BYTES for p in pieces[:-1])
    assert blob_id_for(laid) == stored.blob.blob_id
    assert net.read_by_object(stored.blob.blob_object_id) == laid
    for (_, want), patch in zip(items, stored.patches, strict=True):
        ref = decode_patch_id(patch.patch_id)
        span = column_range(len(laid), ref.start_col, ref.end_col)
        assert data[span.start : span.start + len(want)] == want
        assert net.read_patch(patch.patch_id) == want


def test_a_patch_is_read_off_its_own_pieces_alone(net: LocalNetwork) -> None:
    """Kept in one row, a quilt's patch near its end was reached by walking the row's
    overflow pages from the start (110 page reads from a cold disk). Here every piece
    but the patch's own is gone, and the patch still reads back whole."""
    items = patches(40, size=700)
    stored = put(net, items)
    laid = net.read_blob(stored.blob.blob_id)
    ref = decode_patch_id(stored.patches[-2].patch_id)
    at = column_range(len(laid), ref.start_col, ref.end_col).start
    first, last = at // PIECE_BYTES, (at + 700 - 1) // PIECE_BYTES
    db = sqlite3.connect(net.state_dir / DB_FILE)
    try:
        gone = db.execute(
            "DELETE FROM content_pieces WHERE blob_id = ? AND seq NOT BETWEEN ? AND ?",
            (stored.blob.blob_id, first, last),
        ).rowcount
        db.commit()
    finally:
        db.close()
    assert first > 0 and gone > 10
    assert net.read_patch(stored.patches[-2].patch_id) == items[-2][1]


@pytest.mark.parametrize("kept", ["rows", "columns in the row"])
def test_a_network_from_before_pieces_is_upgraded_and_still_read(
    tmp_path: Path, clock: ManualClock, kept: str
) -> None:
    """Networks whose quilts were kept in one row each, row by row (their contents
    table has no ``columns``) or column by column (``columns`` = 1, and no pieces
    table): reopened, they read old and new quilts alike."""
    with LocalNetwork(tmp_path / "ln", clock) as first:
        old = put(first, patches(12))
    db = sqlite3.connect(tmp_path / "ln" / DB_FILE)
    try:
        data = b"".join(_pieces(db, old.blob.blob_id))
        if kept == "rows":
            db.execute("UPDATE contents SET data = ?", (from_columns(data),))
            db.execute("ALTER TABLE contents DROP COLUMN columns")
        else:
            db.execute("UPDATE contents SET data = ?, columns = 1", (data,))
        db.execute("DROP TABLE content_pieces")
        db.commit()
    finally:
        db.close()
    with LocalNetwork(tmp_path / "ln", clock) as second:
        new = put(second, patches(7, size=900))
        for stored, items in ((old, patches(12)), (new, patches(7, size=900))):
            for (identifier, want), patch in zip(items, stored.patches, strict=True):
                assert second.read_patch(patch.patch_id) == want
                _, got = second.read_quilt_patch_by_identifier(stored.blob.blob_id, identifier)
                assert got == want
            assert blob_id_for(second.read_blob(stored.blob.blob_id)) == stored.blob.blob_id
            assert second.read_by_object(stored.blob.blob_object_id) == second.read_blob(
                stored.blob.blob_id
            )
