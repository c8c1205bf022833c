"""The local Walrus + Sui model enforces Walrus's rules (notes/walrus-sui.md §1.6, §2, §5)."""

from __future__ import annotations

import base64
import hashlib
import sqlite3
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import base58
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from walkeep.backends.base import (
    BlobStore,
    Chain,
    ChainRejected,
    ChainUnavailable,
    Faults,
    PreparedTx,
)
from walkeep.backends.localnet import LocalBlobStore, LocalChain, LocalNetwork
from walkeep.backends.localnet.codec import (
    EXTEND_FUNCTION,
    LOCAL_PACKAGE_ID,
    LOCAL_SYSTEM_OBJECT_ID,
    ExtendCall,
    blob_id_for,
    blob_id_to_u256,
    build_local_extend_tx,
    sui_address,
    tx_digest,
)
from walkeep.backends.localnet.engine import DB_FILE, KEY_FILE
from walkeep.backends.sui.ptb import decode_extend_tx
from walkeep.clock import ManualClock
from walkeep.errors import NotFound, RelayerUnavailable, ValidationError
from walkeep.protocol.walrus import encoded_blob_length, storage_units

EPOCH = 3600
PRICE = 11_000
OTHER = "0x" + "ab" * 32


@pytest.fixture
def net(tmp_path: Path, clock: ManualClock) -> Iterator[LocalNetwork]:
    network = LocalNetwork(tmp_path / "ln", clock, epoch_seconds=EPOCH, storage_price_frost=PRICE)
    yield network
    network.close()


def advance_epochs(clock: ManualClock, n: int) -> None:
    clock.advance(EPOCH * n)


def store(net: LocalNetwork, data: bytes = b"hello", epochs: int = 5, **kw: object) -> str:
    """Store for the server wallet; returns the blob object id."""
    owner = kw.pop("owner", net.server_address)
    return net.store_blob(data, epochs=epochs, owner=owner, **kw).blob.blob_object_id  # type: ignore[arg-type]


def extend(net: LocalNetwork, items: list[tuple[str, int]]):  # type: ignore[no-untyped-def]
    return net.execute(net.prepare_extend(net.server_address, items))


# --- blob ids, sizes, prices -------------------------------------------------------------


def test_blob_ids_are_deterministic_and_walrus_shaped(net: LocalNetwork) -> None:
    a1 = net.store_blob(b"same bytes", epochs=1, owner=net.server_address).blob
    a2 = net.store_blob(b"same bytes", epochs=3, owner=OTHER).blob
    b = net.store_blob(b"other bytes", epochs=1, owner=net.server_address).blob
    assert a1.blob_id == a2.blob_id == blob_id_for(b"same bytes")
    assert b.blob_id != a1.blob_id
    assert a1.blob_object_id != a2.blob_object_id  # force=True: a new object each time
    # Walrus layout: blake2b256(u8 RS2=1 ‖ u64le size ‖ root), URL-safe base64, no padding.
    data = b"same bytes"
    root = hashlib.blake2b(data, digest_size=32).digest()
    raw = hashlib.blake2b(b"\x01" + len(data).to_bytes(8, "little") + root, digest_size=32)
    assert a1.blob_id == base64.urlsafe_b64encode(raw.digest()).decode().rstrip("=")
    assert len(a1.blob_id) == 43 and "=" not in a1.blob_id
    assert blob_id_to_u256(a1.blob_id) == int.from_bytes(raw.digest(), "little")
    # The empty blob and a one-byte blob differ (length is part of the id).
    assert blob_id_for(b"") != blob_id_for(b"\x00")


def test_content_is_stored_once_per_blob_id(net: LocalNetwork) -> None:
    for owner in (net.server_address, OTHER, net.server_address):
        net.store_blob(b"dedup me", epochs=2, owner=owner)
    db = sqlite3.connect(net.state_dir / DB_FILE)
    try:
        assert db.execute("SELECT COUNT(*) FROM contents").fetchone()[0] == 1
        assert db.execute("SELECT COUNT(*) FROM objects").fetchone()[0] == 3
    finally:
        db.close()


@pytest.mark.parametrize(("size", "storage_size"), [(17, 66_034_000), (1_782_224, 72_040_000)])
def test_storage_size_and_cost_match_walrus_docs(
    net: LocalNetwork, size: int, storage_size: int
) -> None:
    stored = net.store_blob(b"x" * size, epochs=3, owner=net.server_address)
    assert stored.newly_created
    assert stored.blob.size == size
    assert stored.blob.storage_size == storage_size == encoded_blob_length(size)
    assert stored.cost_frost == storage_units(storage_size) * PRICE * 3
    assert storage_units(66_034_000) == 63  # a tiny memory is billed as 63 MiB units


def test_new_blob_object_fields(net: LocalNetwork, clock: ManualClock) -> None:
    advance_epochs(clock, 7)
    blob = net.store_blob(b"fields", epochs=4, owner=OTHER).blob
    assert net.current_epoch() == 7
    assert blob.registered_epoch == blob.certified_epoch == 7
    assert blob.end_epoch == 11
    assert blob.owner == OTHER
    assert blob.deletable is True
    assert blob.blob_object_id.startswith("0x") and len(blob.blob_object_id) == 66
    int(blob.blob_object_id, 16)
    assert net.get_object(blob.blob_object_id) == blob
    assert net.store_blob(b"p", epochs=1, owner=OTHER, permanent=True).blob.deletable is False


@pytest.mark.parametrize("epochs", [0, -1, 54, 1000])
def test_store_epochs_out_of_range_is_a_validation_error(net: LocalNetwork, epochs: int) -> None:
    with pytest.raises(ValidationError):
        net.store_blob(b"x", epochs=epochs, owner=net.server_address)


def test_store_rejects_a_bad_owner_and_pads_short_addresses(net: LocalNetwork) -> None:
    with pytest.raises(ValidationError):
        net.store_blob(b"x", epochs=1, owner="not-an-address")
    blob = net.store_blob(b"x", epochs=1, owner="0x2").blob
    assert blob.owner == "0x" + "0" * 63 + "2"
    blob = net.store_blob(b"x", epochs=1, owner="0x" + "AB" * 32).blob
    assert blob.owner == OTHER


def test_store_53_epochs_is_allowed(net: LocalNetwork) -> None:
    assert net.store_blob(b"max", epochs=53, owner=net.server_address).blob.end_epoch == 53


# --- force=false: alreadyCertified --------------------------------------------------------


def test_force_false_returns_the_existing_certified_blob(net: LocalNetwork) -> None:
    first = net.store_blob(b"known", epochs=10, owner=net.server_address)
    again = net.store_blob(b"known", epochs=5, owner=net.server_address, force=False)
    assert again.newly_created is False
    assert again.blob == first.blob
    assert again.cost_frost is None
    assert sum(1 for _ in net.owned_blobs(net.server_address)) == 1


def test_force_false_stores_anew_when_the_existing_blob_ends_too_soon(net: LocalNetwork) -> None:
    net.store_blob(b"short", epochs=2, owner=net.server_address)
    longer = net.store_blob(b"short", epochs=5, owner=net.server_address, force=False)
    assert longer.newly_created is True
    assert longer.blob.end_epoch == 5


def test_force_false_ignores_deletable_blobs_owned_by_someone_else(net: LocalNetwork) -> None:
    # Another owner may delete their deletable blob at any time: it guarantees nothing.
    net.store_blob(b"theirs", epochs=10, owner=OTHER)
    mine = net.store_blob(b"theirs", epochs=2, owner=net.server_address, force=False)
    assert mine.newly_created is True
    # A permanent blob cannot vanish, whoever owns it.
    perm = net.store_blob(b"perm", epochs=10, owner=OTHER, permanent=True)
    again = net.store_blob(b"perm", epochs=2, owner=net.server_address, force=False)
    assert again.newly_created is False and again.blob == perm.blob


def test_force_false_never_reuses_a_lapsed_blob(net: LocalNetwork, clock: ManualClock) -> None:
    net.store_blob(b"old", epochs=1, owner=net.server_address)
    advance_epochs(clock, 1)
    assert net.store_blob(b"old", epochs=1, owner=net.server_address, force=False).newly_created


# --- epochs and lapsing --------------------------------------------------------------------


def test_epochs_advance_with_the_clock(net: LocalNetwork, clock: ManualClock) -> None:
    genesis = clock.now()
    assert net.current_epoch() == 0
    clock.advance(EPOCH - 1)
    assert net.current_epoch() == 0
    clock.advance(1)
    assert net.current_epoch() == 1
    clock.advance(EPOCH * 10 + 5)
    info = net.epoch_info()
    assert info.epoch == 11
    assert info.started_at == genesis + timedelta(seconds=EPOCH * 11)
    assert info.duration_seconds == EPOCH
    assert net.genesis() == genesis


def test_a_lapsed_blob_cannot_be_read(net: LocalNetwork, clock: ManualClock) -> None:
    stored = net.store_blob(b"fleeting", epochs=2, owner=net.server_address).blob
    advance_epochs(clock, 1)
    assert net.read_blob(stored.blob_id) == b"fleeting"
    assert net.read_by_object(stored.blob_object_id) == b"fleeting"
    advance_epochs(clock, 1)  # current == end_epoch: end_epoch is exclusive
    with pytest.raises(NotFound):
        net.read_blob(stored.blob_id)
    with pytest.raises(NotFound):
        net.read_by_object(stored.blob_object_id)
    # The object still exists on chain, with its end_epoch; it is just lapsed.
    assert net.get_object(stored.blob_object_id) == stored


def test_read_unknown_is_not_found(net: LocalNetwork) -> None:
    with pytest.raises(NotFound):
        net.read_blob(blob_id_for(b"never stored"))
    with pytest.raises(NotFound):
        net.read_by_object("0x" + "00" * 32)
    with pytest.raises(NotFound):
        net.read_by_object("garbage")
    assert net.get_object("0x" + "00" * 32) is None


def test_a_blob_stays_readable_while_any_object_holding_it_lives(
    net: LocalNetwork, clock: ManualClock
) -> None:
    short = net.store_blob(b"shared", epochs=1, owner=net.server_address).blob
    net.store_blob(b"shared", epochs=3, owner=OTHER)
    advance_epochs(clock, 2)
    assert net.read_blob(short.blob_id) == b"shared"
    with pytest.raises(NotFound):
        net.read_by_object(short.blob_object_id)
    advance_epochs(clock, 1)
    with pytest.raises(NotFound):
        net.read_blob(short.blob_id)


# --- extend_blob -----------------------------------------------------------------------------


def test_extend_moves_end_epoch_and_charges_walrus_price(
    net: LocalNetwork, clock: ManualClock
) -> None:
    oid = store(net, b"renew me", epochs=3)
    advance_epochs(clock, 1)
    fx = extend(net, [(oid, 4)])
    assert fx.success and fx.network == "local"
    assert fx.sender == net.server_address
    assert fx.epoch == 1
    assert fx.timestamp == clock.now()
    assert fx.wal_cost_frost == 63 * PRICE * 4
    assert fx.gas_used and fx.gas_used > 0
    assert fx.checkpoint and fx.checkpoint > 0
    (ext,) = fx.extensions
    assert (ext.blob_object_id, ext.epochs, ext.old_end_epoch, ext.new_end_epoch) == (oid, 4, 3, 7)
    assert ext.blob_id == blob_id_for(b"renew me")
    obj = net.get_object(oid)
    assert obj is not None and obj.end_epoch == 7
    assert net.get_transaction(fx.digest) == fx


def test_expired_blob_cannot_be_extended(net: LocalNetwork, clock: ManualClock) -> None:
    oid = store(net, epochs=2)
    prepared = net.prepare_extend(net.server_address, [(oid, 1)])
    advance_epochs(clock, 2)  # now current == end_epoch
    with pytest.raises(ChainRejected, match="expired"):
        net.execute(prepared)
    with pytest.raises(ChainRejected, match="expired"):
        net.prepare_extend(net.server_address, [(oid, 1)])
    obj = net.get_object(oid)
    assert obj is not None and obj.end_epoch == 2
    assert net.get_transaction(prepared.digest) is None


def test_extend_on_the_last_live_epoch_still_works(net: LocalNetwork, clock: ManualClock) -> None:
    oid = store(net, epochs=2)
    advance_epochs(clock, 1)  # current = 1 < end_epoch = 2
    assert extend(net, [(oid, 1)]).extensions[0].new_end_epoch == 3


def test_53_epoch_cap(net: LocalNetwork, clock: ManualClock) -> None:
    oid = store(net, epochs=10)
    advance_epochs(clock, 2)  # remaining = 8
    with pytest.raises(ChainRejected, match="53"):
        net.prepare_extend(net.server_address, [(oid, 46)])  # 8 + 46 = 54
    fx = extend(net, [(oid, 45)])  # 8 + 45 = 53: exactly at the cap
    assert fx.extensions[0].new_end_epoch == 2 + 53
    with pytest.raises(ChainRejected):
        net.prepare_extend(net.server_address, [(oid, 1)])
    # Two calls on one object add up, as two move calls in one PTB would.
    oid2 = store(net, b"two", epochs=50)
    with pytest.raises(ChainRejected, match="53"):
        net.prepare_extend(net.server_address, [(oid2, 2), (oid2, 2)])
    fx = extend(net, [(oid2, 1), (oid2, 2)])
    assert [(e.old_end_epoch, e.new_end_epoch) for e in fx.extensions] == [(52, 53), (53, 55)]


def _crafted(net: LocalNetwork, calls: list[tuple[str, int]]) -> PreparedTx:
    """A transaction built by hand (skipping prepare's checks), digest computed honestly."""
    versions = {oid: rec.version for oid in dict(calls) if (rec := net.object_record(oid))}
    raw = build_local_extend_tx(
        net.server_address,
        [ExtendCall(oid, versions.get(oid, 1), k) for oid, k in calls],
        nonce=b"\x07" * 32,
    )
    return PreparedTx(
        tx_digest(raw), base64.b64encode(raw).decode(), tuple(calls), net.current_epoch()
    )


def test_execute_checks_every_rule_itself(net: LocalNetwork, clock: ManualClock) -> None:
    """Execution does not trust prepare: hand-built bytes get the same checks."""
    ok = store(net, b"ok", epochs=10)
    lapsing = store(net, b"lapsing", epochs=1)
    advance_epochs(clock, 1)
    for calls, reason in [
        ([(ok, 1), (ok, 45)], "53"),
        ([(ok, 0)], "> 0"),
        ([(ok, 1), (lapsing, 1)], "expired"),
        ([(ok, 1), ("0x" + "55" * 32, 1)], "not found"),
    ]:
        with pytest.raises(ChainRejected, match=reason):
            net.execute(_crafted(net, calls))
    obj = net.get_object(ok)
    assert obj is not None and obj.end_epoch == 10
    assert net.execute(_crafted(net, [(ok, 1), (ok, 43)])).extensions[-1].new_end_epoch == 54


def test_two_transactions_prepared_together_cannot_both_apply(net: LocalNetwork) -> None:
    a = store(net, b"a", epochs=40)
    p1 = net.prepare_extend(net.server_address, [(a, 10)])
    p2 = net.prepare_extend(net.server_address, [(a, 10)])
    net.execute(p1)
    with pytest.raises(ChainRejected):
        net.execute(p2)  # stale (object version moved) and over the cap: never applied
    obj = net.get_object(a)
    assert obj is not None and obj.end_epoch == 50


@pytest.mark.parametrize("k", [0, -3, 54])
def test_bad_epoch_counts_are_rejected(net: LocalNetwork, k: int) -> None:
    oid = store(net)
    with pytest.raises(ChainRejected):
        net.prepare_extend(net.server_address, [(oid, k)])


def test_unknown_or_foreign_objects_are_rejected(net: LocalNetwork) -> None:
    theirs = store(net, owner=OTHER)
    with pytest.raises(ChainRejected, match="not found"):
        net.prepare_extend(net.server_address, [("0x" + "12" * 32, 1)])
    with pytest.raises(ChainRejected, match="not owned"):
        net.prepare_extend(net.server_address, [(theirs, 1)])
    with pytest.raises(ChainRejected):
        net.prepare_extend(net.server_address, [])
    with pytest.raises(ChainRejected):
        net.prepare_extend("nope", [(theirs, 1)])
    # The owner can extend its own blob.
    assert net.execute(net.prepare_extend(OTHER, [(theirs, 1)])).sender == OTHER


def test_batch_is_all_or_nothing(net: LocalNetwork, clock: ManualClock) -> None:
    good = [store(net, bytes([i]), epochs=5) for i in range(5)]
    doomed = store(net, b"doomed", epochs=1)
    prepared = net.prepare_extend(net.server_address, [(o, 2) for o in good] + [(doomed, 2)])
    advance_epochs(clock, 1)  # `doomed` lapses between prepare and execute
    with pytest.raises(ChainRejected, match="call 5"):
        net.execute(prepared)
    for o in good:
        obj = net.get_object(o)
        assert obj is not None and obj.end_epoch == 5
    assert net.get_transaction(prepared.digest) is None
    # Without the bad item the batch applies in full.
    fx = extend(net, [(o, 2) for o in good])
    assert [e.new_end_epoch for e in fx.extensions] == [7] * 5
    assert fx.wal_cost_frost == 5 * 63 * PRICE * 2


def test_executing_a_digest_twice_does_not_extend_twice(net: LocalNetwork) -> None:
    oid = store(net, epochs=5)
    prepared = net.prepare_extend(net.server_address, [(oid, 3)])
    first = net.execute(prepared)
    second = net.execute(prepared)
    assert second == first
    obj = net.get_object(oid)
    assert obj is not None and obj.end_epoch == 8
    # Same calls, new transaction: a different digest (the nonce stands in for gas).
    again = net.prepare_extend(net.server_address, [(oid, 3)])
    assert again.digest != prepared.digest


def test_a_stale_prepared_transaction_is_refused(net: LocalNetwork) -> None:
    """Like Sui object versions: once the blob moved on, an old tx can never apply."""
    oid = store(net, epochs=5)
    old = net.prepare_extend(net.server_address, [(oid, 1)])
    net.execute(net.prepare_extend(net.server_address, [(oid, 1)]))
    with pytest.raises(ChainRejected, match="stale"):
        net.execute(old)
    obj = net.get_object(oid)
    assert obj is not None and obj.end_epoch == 6


def test_one_wallet_spends_its_gas_coin_once_per_transaction(net: LocalNetwork) -> None:
    """Issue 29: two renewals of one wallet prepared at the same time (the server's
    worker and `walkeep smoke`) name the same gas coin version; like a Sui node, the
    local network executes one and refuses the other instead of applying both."""
    a, b = store(net, b"a"), store(net, b"b")
    first = net.prepare_extend(net.server_address, [(a, 1)])
    second = net.prepare_extend(net.server_address, [(b, 1)])
    net.execute(first)
    with pytest.raises(ChainRejected, match="gas coin version"):
        net.execute(second)
    obj = net.get_object(b)
    assert obj is not None and obj.end_epoch == 5  # all or nothing
    assert net.execute(first).digest == first.digest  # a replay is still its recorded effects
    extend(net, [(b, 1)])  # prepared after the first ran: fine
    assert decode_extend_tx(base64.b64decode(first.tx_bytes)).gas_versions == (1,)


def test_digest_is_suis_digest_over_the_tx_bytes(net: LocalNetwork) -> None:
    a, b = store(net, b"a"), store(net, b"b")
    prepared = net.prepare_extend(net.server_address, [(a, 2), (b, 3)])
    raw = base58.b58decode(prepared.digest)
    assert len(raw) == 32
    tx_bytes = base64.b64decode(prepared.tx_bytes)
    assert raw == hashlib.blake2b(b"TransactionData::" + tx_bytes, digest_size=32).digest()
    assert tx_digest(tx_bytes) == prepared.digest
    # Cross-check with pysui's own implementation of Sui's digest.
    from pysui.sui.sui_common.txn_base import _SuiTransactionBase

    assert _SuiTransactionBase.digest_from_bytes(tx_bytes) == prepared.digest
    # The bytes are real Sui TransactionData carrying the whole transaction.
    tx = decode_extend_tx(tx_bytes)
    assert tx.sender == net.server_address and tx.package_ids == (LOCAL_PACKAGE_ID,)
    assert tx.items == ((a, 2), (b, 3))
    assert {c.system_object_id for c in tx.calls} == {LOCAL_SYSTEM_OBJECT_ID}
    assert [(c.module, c.function, c.blob_version) for c in tx.calls] == [
        ("system", "extend_blob", 1),
        ("system", "extend_blob", 1),
    ]
    assert prepared.items == ((a, 2), (b, 3))
    assert prepared.epoch == net.current_epoch()


def test_execute_refuses_bytes_that_do_not_match_the_digest(net: LocalNetwork) -> None:
    oid = store(net)
    prepared = net.prepare_extend(net.server_address, [(oid, 1)])
    raw = bytearray(base64.b64decode(prepared.tx_bytes))
    raw[-1] ^= 0x07  # tamper with k
    forged = PreparedTx(
        digest=prepared.digest,
        tx_bytes=base64.b64encode(bytes(raw)).decode(),
        items=prepared.items,
        epoch=prepared.epoch,
    )
    with pytest.raises(ChainRejected, match="digest mismatch"):
        net.execute(forged)
    with pytest.raises(ChainRejected):
        net.execute(PreparedTx("x", "!!not base64!!", (), 0))
    obj = net.get_object(oid)
    assert obj is not None and obj.end_epoch == 5


def test_store_transactions_are_recorded_too(net: LocalNetwork) -> None:
    oid = store(net, b"stored", epochs=2)
    rec = net.object_record(oid)
    assert rec is not None
    fx = net.get_transaction(rec.created_tx)
    assert fx is not None and fx.success and fx.extensions == ()
    assert fx.wal_cost_frost == 63 * PRICE * 2
    assert net.get_transaction("1" * 44) is None


# --- persistence and sharing -------------------------------------------------------------


def test_state_survives_a_restart(tmp_path: Path, clock: ManualClock) -> None:
    state = tmp_path / "ln"
    first = LocalNetwork(state, clock, epoch_seconds=EPOCH)
    oid = store(first, b"durable", epochs=4)
    advance_epochs(clock, 1)
    fx = extend(first, [(oid, 2)])
    address, genesis = first.server_address, first.genesis()
    first.close()

    advance_epochs(clock, 2)
    second = LocalNetwork(state, clock, epoch_seconds=EPOCH)
    try:
        assert second.server_address == address
        assert second.genesis() == genesis
        assert second.current_epoch() == 3
        obj = second.get_object(oid)
        assert obj is not None and obj.end_epoch == 6
        assert second.read_blob(obj.blob_id) == b"durable"
        assert second.get_transaction(fx.digest) == fx
        assert [o.blob_object_id for o in second.owned_blobs(address)] == [oid]
    finally:
        second.close()


def test_changing_epoch_length_never_moves_epochs_backwards(
    tmp_path: Path, clock: ManualClock
) -> None:
    state = tmp_path / "ln"
    LocalNetwork(state, clock, epoch_seconds=100, configure=True).close()
    clock.advance(1050)  # epoch 10, 50 s in
    slower = LocalNetwork(state, clock, epoch_seconds=1000, configure=True)
    try:
        assert slower.current_epoch() == 10
        assert slower.epoch_seconds == 1000
        clock.advance(999)
        assert slower.current_epoch() == 10
        clock.advance(1)  # epoch 10 continues from the change, for the new length
        assert slower.current_epoch() == 11
    finally:
        slower.close()


def test_a_shorter_epoch_length_does_not_jump_epochs(tmp_path: Path, clock: ManualClock) -> None:
    """Regression (issue 13): 3600 s → 1 s half way through an epoch jumped ~1800 epochs,
    expiring every blob at once; a later change back jumped again."""
    state = tmp_path / "ln"
    first = LocalNetwork(state, clock, epoch_seconds=3600, configure=True)
    oid = store(first, b"kept", epochs=5)
    first.close()
    clock.advance(1800)
    fast = LocalNetwork(state, clock, epoch_seconds=1, configure=True)
    try:
        assert fast.current_epoch() == 0
        assert fast.epoch_info().started_at == clock.now()
        obj = fast.get_object(oid)
        assert obj is not None and fast.read_blob(obj.blob_id) == b"kept"
        clock.advance(3)
        assert fast.current_epoch() == 3
    finally:
        fast.close()
    clock.advance(0.5)
    back = LocalNetwork(state, clock, epoch_seconds=3600, configure=True)
    try:
        assert back.current_epoch() == 3
        clock.advance(3599)
        assert back.current_epoch() == 3
        clock.advance(1)
        assert back.current_epoch() == 4
    finally:
        back.close()


def test_only_a_configuring_opener_changes_the_network(tmp_path: Path, clock: ManualClock) -> None:
    """Regression (issue 13): `walkeep doctor`/`smoke` in another shell, without the
    server's WALKEEP_LOCAL_EPOCH_SECONDS, rewrote the running server's epoch length."""
    state = tmp_path / "ln"
    server = LocalNetwork(state, clock, epoch_seconds=60, storage_price_frost=5, configure=True)
    try:
        clock.advance(90)
        other = LocalNetwork(state, clock, epoch_seconds=3600, storage_price_frost=11_000)
        try:
            assert other.epoch_seconds == 60 and other.storage_price_frost() == 5
            assert other.current_epoch() == 1
        finally:
            other.close()
        assert server.epoch_seconds == 60 and server.storage_price_frost() == 5
        clock.advance(60)
        assert server.current_epoch() == 2  # still ticking
    finally:
        server.close()
    # A network that does not exist yet is created by whoever opens it first.
    fresh = LocalNetwork(tmp_path / "new", clock, epoch_seconds=7, storage_price_frost=3)
    try:
        assert fresh.epoch_seconds == 7 and fresh.storage_price_frost() == 3
    finally:
        fresh.close()


def test_two_instances_on_one_directory(tmp_path: Path, clock: ManualClock) -> None:
    state = tmp_path / "ln"
    a = LocalNetwork(state, clock, epoch_seconds=EPOCH)
    b = LocalNetwork(state, clock, epoch_seconds=EPOCH)
    try:
        assert a.server_address == b.server_address
        oid = store(a, b"from a")
        assert b.read_by_object(oid) == b"from a"
        fx = extend(b, [(oid, 1)])
        assert a.get_transaction(fx.digest) == fx
        obj = a.get_object(oid)
        assert obj is not None and obj.end_epoch == 6

        # Concurrent writers through both instances: every write lands, none lost.
        errors: list[BaseException] = []

        def work(net: LocalNetwork, tag: int) -> None:
            try:
                for i in range(25):
                    o = store(net, f"{tag}-{i}".encode(), epochs=3)
                    # One wallet's renewals are serialised, as its gas coin demands.
                    with net.wallet_lock(net.server_address):
                        extend(net, [(o, 1)])
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(n, t)) for t, n in enumerate([a, b, a, b])]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        ends = [o.end_epoch for o in a.owned_blobs(a.server_address)]
        assert len(ends) == 101 and ends.count(4) == 100
    finally:
        a.close()
        b.close()


_CHILD = """
import sys
from datetime import datetime
from pathlib import Path
from walkeep.backends.localnet import LocalNetwork
from walkeep.clock import ManualClock

net = LocalNetwork(Path(sys.argv[1]), ManualClock(datetime.fromisoformat(sys.argv[2])))
for i in range(40):
    oid = net.store_blob(f"child-{i}".encode(), epochs=3, owner=net.server_address)
    oid = oid.blob.blob_object_id
    net.execute(net.prepare_extend(net.server_address, [(oid, 1)]))
print(net.server_address)
net.close()
"""


def test_two_processes_share_one_directory(tmp_path: Path, clock: ManualClock) -> None:
    """The Walkeep service and `walkeep devnet` run as separate OS processes on one state dir."""
    state = tmp_path / "ln"
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(state), clock.now().isoformat()],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    net = LocalNetwork(state, clock)
    try:
        for i in range(40):
            extend(net, [(store(net, f"parent-{i}".encode(), epochs=3), 1)])
        out, err = child.communicate(timeout=120)
        assert child.returncode == 0, err
        assert out.strip() == net.server_address  # one wallet, whoever created the dir
        objects = list(net.owned_blobs(net.server_address))
        assert len(objects) == 80 and {o.end_epoch for o in objects} == {4}
        assert net.read_blob(blob_id_for(b"child-39")) == b"child-39"
    finally:
        if child.poll() is None:
            child.kill()
        net.close()


def test_server_wallet_is_a_sui_ed25519_address(net: LocalNetwork) -> None:
    key_path = net.state_dir / KEY_FILE
    assert stat.S_IMODE(key_path.stat().st_mode) == 0o600
    raw = base64.b64decode(key_path.read_text().strip())
    assert len(raw) == 33 and raw[0] == 0  # Sui keystore entry: flag 0 (Ed25519) ‖ seed
    public = Ed25519PrivateKey.from_private_bytes(raw[1:]).public_key().public_bytes_raw()
    expected = "0x" + hashlib.blake2b(b"\x00" + public, digest_size=32).hexdigest()
    assert net.server_address == expected
    # Known vector (notes §3.2): seed 32×0x41 → this address in pysui and @mysten/sui.
    vector = Ed25519PrivateKey.from_private_bytes(b"A" * 32).public_key().public_bytes_raw()
    assert sui_address(vector) == (
        "0x558ecf01f277d0a73b17cf091c7f89b8cbe86c9bbec6d5127e592926dcae65ca"
    )


# --- owned_blobs ---------------------------------------------------------------------------


def test_owned_blobs_lists_everything_the_owner_holds(
    net: LocalNetwork, clock: ManualClock
) -> None:
    mine = {
        s.blob.blob_object_id
        for s in net.store_blobs(
            [i.to_bytes(4, "little") for i in range(1203)], epochs=1, owner=net.server_address
        )
    }
    theirs = store(net, owner=OTHER)
    advance_epochs(clock, 1)  # all of mine lapse; still listed
    listed = list(net.owned_blobs(net.server_address))
    assert {o.blob_object_id for o in listed} == mine
    assert len(listed) == 1203
    assert all(o.end_epoch == 1 for o in listed)
    assert [o.blob_object_id for o in net.owned_blobs(OTHER)] == [theirs]
    assert list(net.owned_blobs("0x" + "99" * 32)) == []


# --- faults --------------------------------------------------------------------------------


def test_unreachable_fault_raises_typed_errors(tmp_path: Path, clock: ManualClock) -> None:
    faults = Faults()
    net = LocalNetwork(tmp_path / "ln", clock, faults=faults)
    try:
        oid = store(net)
        blob_id = blob_id_for(b"hello")
        prepared = net.prepare_extend(net.server_address, [(oid, 1)])
        faults.unreachable = True
        with pytest.raises(RelayerUnavailable):
            net.store_blob(b"x", epochs=1, owner=net.server_address)
        with pytest.raises(RelayerUnavailable):
            net.read_blob(blob_id)
        with pytest.raises(RelayerUnavailable):
            net.read_by_object(oid)
        for call in (
            net.current_epoch,
            net.epoch_info,
            lambda: net.get_object(oid),
            lambda: net.owned_blobs(net.server_address),  # raises at the call, not on next()
            lambda: net.prepare_extend(net.server_address, [(oid, 1)]),
            lambda: net.execute(prepared),
            lambda: net.get_transaction(prepared.digest),
        ):
            with pytest.raises(ChainUnavailable):
                call()
        faults.unreachable = False
        assert net.execute(prepared).success  # nothing was applied while unreachable
    finally:
        net.close()


def test_fail_next_writes_and_extends(tmp_path: Path, clock: ManualClock) -> None:
    faults = Faults(fail_next_writes=2, fail_next_extends=1)
    net = LocalNetwork(tmp_path / "ln", clock, faults=faults)
    try:
        for _ in range(2):
            with pytest.raises(RelayerUnavailable):
                net.store_blob(b"x", epochs=1, owner=net.server_address)
        assert faults.fail_next_writes == 0
        oid = store(net, b"x", epochs=3)
        prepared = net.prepare_extend(net.server_address, [(oid, 1)])
        with pytest.raises(ChainRejected):
            net.execute(prepared)
        assert faults.fail_next_extends == 0
        obj = net.get_object(oid)
        assert obj is not None and obj.end_epoch == 3
        assert net.get_transaction(prepared.digest) is None
        assert net.execute(prepared).extensions[0].new_end_epoch == 4
    finally:
        net.close()


# --- ports -----------------------------------------------------------------------------------


def test_local_chain_and_blobstore_implement_the_ports(
    net: LocalNetwork, clock: ManualClock
) -> None:
    chain = LocalChain(net, public_url="http://127.0.0.1:8080/")
    blobs = LocalBlobStore(net)
    assert isinstance(chain, Chain) and isinstance(blobs, BlobStore)
    assert chain.network == "local" and blobs.name == "local"
    assert chain.owner_address() == net.server_address
    assert chain.storage_price_frost() == PRICE

    stored = blobs.put(b"via port", epochs=2, owner=chain.owner_address())
    assert stored.newly_created
    again = blobs.put(b"via port", epochs=2, owner=chain.owner_address())
    assert again.newly_created and again.blob.blob_object_id != stored.blob.blob_object_id
    assert blobs.get(stored.blob.blob_id) == b"via port"
    assert chain.get_blob(stored.blob.blob_object_id) == stored.blob
    assert {b.blob_object_id for b in chain.owned_blobs()} == {
        stored.blob.blob_object_id,
        again.blob.blob_object_id,
    }

    advance_epochs(clock, 1)
    assert chain.current_epoch() == 1 and chain.epoch_info().epoch == 1
    prepared = chain.prepare_extend([(stored.blob.blob_object_id, 3)])
    fx = chain.execute(prepared)
    assert fx.network == "local" and fx.digest == prepared.digest
    assert chain.get_transaction(fx.digest) == fx
    assert chain.explorer_tx_url(fx.digest) == f"http://127.0.0.1:8080/explorer/tx/{fx.digest}"
    assert chain.explorer_object_url("0xabc") == "http://127.0.0.1:8080/explorer/object/0xabc"

    assert blobs.health().ok
    net.faults.unreachable = True
    health = blobs.health()
    assert not health.ok and health.writes == "paused"


def test_transaction_record_lists_extend_calls(net: LocalNetwork) -> None:
    a, b = store(net, b"a"), store(net, b"b")
    fx = extend(net, [(a, 1), (b, 2)])
    rec = net.transaction_record(fx.digest)
    assert rec is not None and rec.kind == "extend"
    assert [c["function"] for c in rec.calls] == [EXTEND_FUNCTION] * 2
    assert [(c["blob_object_id"], c["old_end_epoch"], c["new_end_epoch"]) for c in rec.calls] == [
        (a, 5, 6),
        (b, 5, 7),
    ]
    assert [e.digest for e in net.object_extensions(b)] == [fx.digest]


# --- scale -----------------------------------------------------------------------------------


def test_scale_10k_objects_extended_200_per_transaction(net: LocalNetwork) -> None:
    stored = net.store_blobs(
        [i.to_bytes(4, "little") for i in range(10_000)], epochs=5, owner=net.server_address
    )
    ids = [s.blob.blob_object_id for s in stored]
    digests = set()
    for start in range(0, len(ids), 200):
        fx = extend(net, [(oid, 2) for oid in ids[start : start + 200]])
        assert len(fx.extensions) == 200
        digests.add(fx.digest)
    assert len(digests) == 50
    ends = {o.end_epoch for o in net.owned_blobs(net.server_address)}
    assert ends == {7}
