"""The real Sui chain adapter (``walkeep.backends.sui``), offline.

No Sui node is reachable here, so ``SuiChain`` runs pysui's real
``GrpcProtocolClient`` against ``tests/fakes/sui_stub.FakeSuiNode`` through a
fake grpclib channel (protobuf bytes on the "wire"). The node checks the
transaction independently of pysui's BCS code (its own decoder, Ed25519
verification with ``cryptography``), so these tests check bytes, not mocks.
"""

from __future__ import annotations

import base64
import hashlib
import threading
from collections.abc import Iterator
from typing import Any

import base58
import pydantic
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from fakes.sui_stub import (
    FakeChannel,
    FakeSuiNode,
    MergeCoinsCmd,
    MoveCallCmd,
    OwnedInput,
    PureInput,
    SharedInput,
    decode_transaction_data,
    norm,
    random_digest,
    random_id,
)
from grpclib.const import Status
from pysui.sui.sui_common.txn_base import _SuiTransactionBase
from pysui.sui.sui_common.txn_pure import PureInput as PysuiPure
from pysui.sui.sui_crypto import keypair_from_keystring
from sqlalchemy import select

from tests.helpers import account, land_all
from walkeep import ledger
from walkeep.backends.base import Chain, ChainRejected, ChainUnavailable, PreparedTx
from walkeep.backends.sui import (
    HARD_MAX_BATCH,
    SUI_PRESETS,
    Coin,
    ExtendCall,
    ObjectRef,
    SharedRef,
    SuiChain,
    SuiExecutionFailed,
    SuiPreconditionFailed,
    blob_id_from_u256,
    build_extend_tx,
    decode_extend_tx,
    df_id_u64,
    load_keypair,
    pure_u32,
    select_coins,
    split_batches,
    tx_digest,
    u256_from_blob_id,
)
from walkeep.clock import ManualClock
from walkeep.config import Settings
from walkeep.db.models import Blob, Renewal
from walkeep.errors import ConfigurationError
from walkeep.pricing import renewal_cost_mc
from walkeep.protocol.walrus import walrus_storage_cost_frost
from walkeep.service.jobs import reconcile, renew
from walkeep.service.runtime import Runtime
from walkeep.service.tools import store

# notes §3.2: 32 × 0x41 as a Sui bech32 private key, and its address.
KEY = "suiprivkey1qpq5zs2pg9q5zs2pg9q5zs2pg9q5zs2pg9q5zs2pg9q5zs2pg9q5z5u89z0"
ADDRESS = "0x558ecf01f277d0a73b17cf091c7f89b8cbe86c9bbec6d5127e592926dcae65ca"
TESTNET = SUI_PRESETS["testnet"]
WAL = 1_000_000_000  # FROST per WAL
SUI = 1_000_000_000  # MIST per SUI
SIZE_63 = 66_034_000  # encoded size of a tiny blob: 63 MiB units


def sui_settings(**kw: object) -> Settings:
    base: dict[str, object] = {"network": "testnet", "sui_private_key": KEY}
    base.update(kw)
    return Settings(**base)  # type: ignore[arg-type]


@pytest.fixture
def node() -> FakeSuiNode:
    n = FakeSuiNode(
        system_id=TESTNET.system_object_id,
        type_origin=TESTNET.walrus_type_origin,
        wal_coin_type=TESTNET.wal_coin_type,
        walrus_epoch=100,
        storage_price=11_000,
        sui_epoch=700,
        gas_price=1_000,
    )
    n.add_coin(ADDRESS, 50 * WAL)
    n.add_sui(ADDRESS, 3 * SUI)
    return n


def connect(chain: SuiChain, node: FakeSuiNode) -> SuiChain:
    """Build the real pysui gRPC client on the adapter's loop, then point it at the fake node."""
    client = chain._run(chain._get_client())
    client._channel.close()  # the real channel never connected; swap in the fake one
    client._channel = FakeChannel(node)
    return chain


@pytest.fixture
def make_chain(node: FakeSuiNode, clock: ManualClock) -> Iterator:
    made: list[SuiChain] = []

    def _make(target: FakeSuiNode | None = None, **kw: object) -> SuiChain:
        kw.setdefault("rpc_timeout", 5.0)
        kw.setdefault("clock", clock)
        chain = SuiChain(sui_settings(), **kw)  # type: ignore[arg-type]
        made.append(chain)
        return connect(chain, target or node)

    yield _make
    for chain in made:
        chain.close()


@pytest.fixture
def chain(make_chain) -> SuiChain:  # type: ignore[no-untyped-def]
    return make_chain()


def blob_ref(node: FakeSuiNode, oid: str) -> tuple[int, str]:
    obj = node.objects[norm(oid)]
    return obj.version, obj.digest


# --- keys, ids, vectors ------------------------------------------------------------------------


def test_key_vector_gives_the_documented_address() -> None:
    kp, address = load_keypair(KEY)
    assert address == ADDRESS
    assert kp.to_bech32() == KEY
    # the base64 keystore form of the same key loads to the same address
    assert load_keypair(kp.serialize())[1] == ADDRESS
    assert SuiChain(sui_settings()).owner_address() == ADDRESS


@pytest.mark.parametrize(
    "bad", [None, "", "   ", "suiprivkey1qqqqqq", "bm90IGEga2V5", "0x" + "41" * 32]
)
def test_missing_or_invalid_key_is_a_one_line_configuration_error(bad: str | None) -> None:
    with pytest.raises(ConfigurationError) as info:
        SuiChain(sui_settings(sui_private_key=bad))
    message = str(info.value)
    assert "WALKEEP_SUI_PRIVATE_KEY" in message
    assert "\n" not in message
    if bad and bad.strip():
        assert bad.strip() not in message  # never echo key material


def test_local_network_is_not_a_sui_network() -> None:
    with pytest.raises(ConfigurationError, match="testnet or mainnet"):
        SuiChain(sui_settings(network="local"))


def test_adapter_satisfies_the_chain_protocol_and_is_lazy() -> None:
    chain = SuiChain(sui_settings())
    assert isinstance(chain, Chain)
    assert chain.network == "testnet"
    assert chain._client is None  # no node contacted until first use
    chain.close()


def test_dynamic_field_id_matches_the_testnet_vector() -> None:
    assert (
        df_id_u64(TESTNET.system_object_id, 3)
        == "0x7fb94d17d38b895b1aaa25319343970b04b3cebfba7940ceddff8dfcedade095"
    )
    assert df_id_u64("0x6c2547cbbc38025cf3adac45f63cb0a8d12ecf777cdc75a4971612bf97fdf6af", 4) != (
        df_id_u64(TESTNET.system_object_id, 3)
    )


def test_blob_id_and_u256_round_trip_with_the_notes_vector() -> None:
    n = 33029388974007764889800497995325165905902854956237990162315138693239164143667
    s = "M4hsZGQ1oCktdzegB6HnI6Mi28S2nqOPHxK-W7_4BUk"
    assert blob_id_from_u256(n) == s
    assert u256_from_blob_id(s) == n
    assert blob_id_from_u256(0) == "A" * 43
    with pytest.raises(ValueError):
        u256_from_blob_id("AAAA")
    with pytest.raises(ValueError):
        blob_id_from_u256(1 << 256)


def test_digest_matches_pysui_and_the_formula() -> None:
    raw = bytes(range(200))
    expected = base58.b58encode(
        hashlib.blake2b(b"TransactionData::" + raw, digest_size=32).digest()
    ).decode()
    assert tx_digest(raw) == expected == _SuiTransactionBase.digest_from_bytes(raw)


@pytest.mark.parametrize(
    ("k", "encoded"),
    [(5, "05000000"), (0, "00000000"), (1, "01000000"), (53, "35000000"), (2**32 - 1, "ffffffff")],
)
def test_u32_is_always_four_bytes_little_endian(k: int, encoded: str) -> None:
    assert pure_u32(k).hex() == encoded


def test_the_pysui_minimal_width_pitfall_is_real_and_the_node_catches_it(
    node: FakeSuiNode,
) -> None:
    # Why pure_u32 exists: pysui's raw builder encodes a bare int minimally...
    minimal = list(PysuiPure.pure(5))
    assert len(minimal) != 4
    for bad in (-1, 2**32, True, 1.0):
        with pytest.raises(ValueError):
            pure_u32(bad)  # type: ignore[arg-type]
    # ...and a transaction built that way fails on chain (InvalidBCSBytes for the u32).
    blob = node.add_blob(ADDRESS, end_epoch=102)
    wal = next(o for o in node.objects.values() if "wal::WAL" in o.object_type)
    gas = next(o for o in node.objects.values() if o.object_type.endswith("sui::SUI>"))
    good = build_extend_tx(
        sender=ADDRESS,
        package_id=node.package_id,
        system=SharedRef(node.system_id, node.system_shared_version, True),
        calls=[ExtendCall(ObjectRef(blob.object_id, blob.version, blob.digest), 5)],
        wal_coins=[ObjectRef(wal.object_id, wal.version, wal.digest)],
        gas_payment=[ObjectRef(gas.object_id, gas.version, gas.digest)],
        gas_price=1_000,
        gas_budget=SUI,
        expiration_epoch=None,
    )
    pitfall = good.replace(bytes([0, 4]) + pure_u32(5), bytes([0, len(minimal)]) + bytes(minimal))
    assert len(pitfall) == len(good) - 3
    assert node.run(good, signatures=None, commit=False).effects.status.success
    failed = node.run(pitfall, signatures=None, commit=False).effects.status
    assert not failed.success and "u32" in (failed.error.description or "")


def test_presets_overrides_and_explorer_urls() -> None:
    chain = SuiChain(sui_settings())
    digest = "5ueHiZ9t5u47qX6WAsfwrLsTZP2TRy1LJAjEhNPKv4gh"
    assert chain.preset.grpc_url == "fullnode.testnet.sui.io:443"
    assert chain.explorer_tx_url(digest) == f"https://suiscan.xyz/testnet/tx/{digest}"
    assert (
        chain.explorer_object_url("0x2") == "https://suiscan.xyz/testnet/object/0x" + "0" * 63 + "2"
    )
    assert chain.suivision_tx_url(digest) == f"https://testnet.suivision.xyz/txblock/{digest}"
    assert chain.preset.blob_type.endswith("::blob::Blob")
    assert chain.preset.epoch_duration_seconds == 86_400

    main = SuiChain(sui_settings(network="mainnet"))
    assert main.preset.grpc_url == "fullnode.mainnet.sui.io:443"
    assert main.explorer_tx_url(digest) == f"https://suiscan.xyz/mainnet/tx/{digest}"
    assert main.suivision_tx_url(digest) == f"https://suivision.xyz/txblock/{digest}"
    assert main.preset.epoch_duration_seconds == 14 * 86_400
    assert main.preset.walrus_type_origin.startswith("0xfdc88f7d7cf30afab2f82e8380d11ee8")

    custom = SuiChain(
        sui_settings(
            sui_grpc_url="my-node.example:443",
            sui_system_object_id="0xABC",
            sui_wal_coin_type="0x1234::wal::WAL",
        )
    )
    assert custom.preset.grpc_url == "my-node.example:443"
    assert custom.preset.system_object_id == "0x" + "0" * 61 + "abc"
    assert custom.preset.wal_coin_type == "0x" + "0" * 60 + "1234::wal::WAL"
    for c in (chain, main, custom):
        c.close()


# --- reads ---------------------------------------------------------------------------------------


def test_walrus_epoch_price_and_epoch_info_come_from_the_system_state(
    chain: SuiChain, node: FakeSuiNode
) -> None:
    assert chain.current_epoch() == 100
    assert chain.storage_price_frost() == 11_000
    info = chain.epoch_info()
    assert (info.epoch, info.started_at, info.duration_seconds) == (100, None, 86_400)
    state = chain.walrus_state()
    assert state.package_id == norm(node.package_id)
    assert state.system == SharedRef(TESTNET.system_object_id, node.system_shared_version, True)
    assert state.max_epochs_ahead == 53
    node.walrus_epoch, node.storage_price = 101, 12_345
    assert (chain.current_epoch(), chain.storage_price_frost()) == (101, 12_345)


@pytest.mark.parametrize("u64_as_number", [False, True])
def test_get_blob_parses_the_blob_json(make_chain, node: FakeSuiNode, u64_as_number: bool) -> None:  # type: ignore[no-untyped-def]
    node.u64_as_number = u64_as_number
    chain = make_chain()
    n = 33029388974007764889800497995325165905902854956237990162315138693239164143667
    obj = node.add_blob(ADDRESS, end_epoch=105, blob_id=n, size=17, storage_size=SIZE_63)
    blob = chain.get_blob(obj.object_id.upper().replace("0X", "0x"))
    assert blob is not None
    assert blob.blob_id == "M4hsZGQ1oCktdzegB6HnI6Mi28S2nqOPHxK-W7_4BUk"
    assert blob.blob_object_id == obj.object_id
    assert (blob.size, blob.storage_size, blob.end_epoch) == (17, SIZE_63, 105)
    assert (blob.registered_epoch, blob.certified_epoch, blob.deletable) == (90, 90, True)
    assert blob.owner == ADDRESS
    uncertified = node.add_blob(ADDRESS, end_epoch=105, certified=False)
    assert chain.get_blob(uncertified.object_id).certified_epoch is None  # type: ignore[union-attr]


def test_get_blob_is_none_for_unknown_or_foreign_objects(
    chain: SuiChain, node: FakeSuiNode
) -> None:
    assert chain.get_blob(random_id()) is None
    assert chain.get_blob("not-an-id") is None
    coin = node.add_coin(ADDRESS, 5)
    assert chain.get_blob(coin.object_id) is None
    fake = node.add_blob(ADDRESS, end_epoch=105, object_type=f"{random_id()}::blob::Blob")
    assert chain.get_blob(fake.object_id) is None


def test_owned_blobs_pages_through_every_blob(chain: SuiChain, node: FakeSuiNode) -> None:
    node.page_size = 50
    mine = {node.add_blob(ADDRESS, end_epoch=100 + i % 20).object_id for i in range(120)}
    node.add_blob(random_id(), end_epoch=110)  # someone else's
    node.add_coin(ADDRESS, 7)  # not a blob
    node.calls.clear()
    seen = [b.blob_object_id for b in chain.owned_blobs()]
    assert sorted(seen) == sorted(mine)
    assert node.count("ListOwnedObjects") == 3


def test_reads_from_many_threads_share_one_loop(chain: SuiChain) -> None:
    results: list[int] = []
    errors: list[BaseException] = []

    def read() -> None:
        try:
            results.append(chain.current_epoch())
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=read) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert errors == [] and results == [100] * 8


# --- building the transaction ---------------------------------------------------------------------


def _check_signature(tx: PreparedTx) -> None:
    raw = base64.b64decode(tx.tx_bytes)
    sig = base64.b64decode(tx.payload)  # type: ignore[arg-type]
    assert len(sig) == 97 and sig[0] == 0
    pub = sig[65:]
    assert "0x" + hashlib.blake2b(b"\x00" + pub, digest_size=32).hexdigest() == ADDRESS
    message = hashlib.blake2b(bytes([0, 0, 0]) + raw, digest_size=32).digest()
    Ed25519PublicKey.from_public_bytes(pub).verify(sig[1:65], message)  # raises if invalid


def test_prepare_builds_one_ptb_with_fixed_width_u32s(chain: SuiChain, node: FakeSuiNode) -> None:
    a = node.add_blob(ADDRESS, end_epoch=101, storage_size=SIZE_63)
    b = node.add_blob(ADDRESS, end_epoch=102, storage_size=72_040_000)
    c = node.add_blob(ADDRESS, end_epoch=150, storage_size=SIZE_63)
    wal_coin = next(o for o in node.objects.values() if "wal::WAL" in o.object_type)
    gas_coin = next(o for o in node.objects.values() if o.object_type.endswith("sui::SUI>"))
    items = [(a.object_id, 5), (b.object_id, 5), (c.object_id, 3)]

    tx = chain.prepare_extend(items)

    raw = base64.b64decode(tx.tx_bytes)
    assert (
        tx.digest
        == base58.b58encode(
            hashlib.blake2b(b"TransactionData::" + raw, digest_size=32).digest()
        ).decode()
    )
    assert tx.items == tuple(items) and tx.epoch == 100
    _check_signature(tx)

    d = decode_transaction_data(raw)
    assert d.sender == ADDRESS and d.gas_owner == ADDRESS
    assert d.expiration_epoch == 701  # Sui epoch 700 + 1
    assert d.gas_price == 1_000
    assert [(g.object_id, g.version, g.digest) for g in d.gas_payment] == [
        (gas_coin.object_id, gas_coin.version, gas_coin.digest)
    ]
    # inputs: the System (shared, mutable, right initial version), the WAL coin, the blobs, the k's
    assert d.inputs[0] == SharedInput(TESTNET.system_object_id, node.system_shared_version, True)
    assert d.inputs[1] == OwnedInput(wal_coin.object_id, wal_coin.version, wal_coin.digest)
    owned = [i for i in d.inputs if isinstance(i, OwnedInput)]
    for blob in (a, b, c):
        assert OwnedInput(blob.object_id, blob.version, blob.digest) in owned
    pures = [i for i in d.inputs if isinstance(i, PureInput)]
    assert pures and all(len(p.value) == 4 for p in pures)
    # one MoveCall per blob, all on the same System and WAL coin
    assert len(d.commands) == 3
    for cmd, (oid, k) in zip(d.commands, items, strict=True):
        assert isinstance(cmd, MoveCallCmd)
        assert (cmd.package, cmd.module, cmd.function) == (
            norm(node.package_id),
            "system",
            "extend_blob",
        )
        system_arg, blob_arg, k_arg, coin_arg = cmd.args
        assert system_arg.index == 0 and coin_arg.index == 1
        assert d.inputs[blob_arg.index] == OwnedInput(oid, *blob_ref(node, oid))
        assert d.inputs[k_arg.index] == PureInput(k.to_bytes(4, "little"))
    assert d.inputs[d.commands[0].args[2].index].value.hex() == "05000000"
    # the budget is what the dry run measured plus the SDK's overhead
    n = 3
    computation = 1_000 * (1_000 + node.computation_units_per_call * n)
    storage, rebate = 988_000 * n + 1_976_000, 978_120 * n + 1_956_240
    assert d.gas_budget == computation + 1_000 * 1_000 + storage - rebate
    # pysui's own decoder agrees with ours
    decoded = decode_extend_tx(tx.tx_bytes)
    assert decoded.items == tx.items and decoded.expiration_epoch == 701
    assert node.count("ExecuteTransaction") == 0  # prepare never submits


def test_build_is_deterministic_and_800_calls_fit_in_a_transaction() -> None:
    def ref() -> ObjectRef:
        return ObjectRef(random_id(), 7, random_digest())

    system = SharedRef(TESTNET.system_object_id, 1, True)
    calls = [ExtendCall(ref(), 1 + i % 53) for i in range(HARD_MAX_BATCH)]
    args = {
        "sender": ADDRESS,
        "package_id": random_id(),
        "system": system,
        "calls": calls,
        "wal_coins": [ref(), ref()],
        "gas_payment": [ref()],
        "gas_price": 1_000,
        "gas_budget": 10**9,
        "expiration_epoch": 9,
    }
    raw = build_extend_tx(**args)  # type: ignore[arg-type]
    assert raw == build_extend_tx(**args)  # type: ignore[arg-type]
    # Sui caps a signed transaction at 128 KiB; leave room for the 97-byte signature.
    assert len(raw) < 128 * 1024 - 1024
    d = decode_transaction_data(raw)
    assert isinstance(d.commands[0], MergeCoinsCmd)
    assert len(d.commands) == HARD_MAX_BATCH + 1
    assert len([i for i in d.inputs if isinstance(i, PureInput)]) == 53  # k's are shared


def test_split_batches_keeps_order_and_prepare_refuses_oversized_batches(
    make_chain, node: FakeSuiNode
) -> None:  # type: ignore[no-untyped-def]
    items = [(f"0x{i:x}", 1) for i in range(450)]
    batches = split_batches(items, 200)
    assert [len(b) for b in batches] == [200, 200, 50]
    assert [x for b in batches for x in b] == items
    assert SuiChain.split_batches(items, 449)[1] == [items[-1]]
    with pytest.raises(ValueError):
        split_batches(items, 0)
    chain = make_chain(max_batch=10)
    node.calls.clear()
    with pytest.raises(ChainRejected, match="max_batch=10"):
        chain.prepare_extend(items[:11])
    assert node.calls == []
    assert SuiChain(sui_settings(renew_batch=300)).max_batch == 300
    assert SuiChain(sui_settings(renew_batch=800)).max_batch == HARD_MAX_BATCH
    # Settings refuse a batch no Sui transaction could carry (128 KiB limit).
    with pytest.raises(pydantic.ValidationError):
        sui_settings(renew_batch=1000)


# --- preconditions ---------------------------------------------------------------------------------


def test_bad_blobs_are_refused_before_anything_is_signed(
    chain: SuiChain, node: FakeSuiNode
) -> None:
    ok = node.add_blob(ADDRESS, end_epoch=105)
    expired = node.add_blob(ADDRESS, end_epoch=100)  # current epoch 100: end is exclusive
    near_cap = node.add_blob(ADDRESS, end_epoch=150)  # 50 ahead; +4 > 53
    foreign = node.add_blob(random_id(), end_epoch=105)
    uncertified = node.add_blob(ADDRESS, end_epoch=105, certified=False)
    not_blob = node.add_coin(ADDRESS, 5)
    unknown = random_id()
    node.calls.clear()
    with pytest.raises(SuiPreconditionFailed) as info:
        chain.prepare_extend(
            [
                (ok.object_id, 2),
                (expired.object_id, 1),
                (near_cap.object_id, 4),
                (foreign.object_id, 1),
                (uncertified.object_id, 1),
                (not_blob.object_id, 1),
                (unknown, 1),
            ]
        )
    problems = info.value.problems
    assert set(problems) == {
        expired.object_id,
        near_cap.object_id,
        foreign.object_id,
        uncertified.object_id,
        not_blob.object_id,
        unknown,
    }
    assert "expired" in problems[expired.object_id]
    assert "53-epoch cap" in problems[near_cap.object_id]
    assert "not the server wallet" in problems[foreign.object_id]
    assert "not certified" in problems[uncertified.object_id]
    assert "not a Walrus Blob" in problems[not_blob.object_id]
    assert "no such object" in problems[unknown]
    assert isinstance(info.value, ChainRejected)
    assert node.count("SimulateTransaction") == 0 and node.count("ExecuteTransaction") == 0
    # exactly at the cap is fine
    assert chain.prepare_extend([(near_cap.object_id, 3)]).digest
    # the cap is read from the chain (future_accounting.length), not hard-coded
    node.max_epochs_ahead = 10
    with pytest.raises(SuiPreconditionFailed, match="10-epoch cap"):
        chain.prepare_extend([(ok.object_id, 6)])


@pytest.mark.parametrize(
    ("k", "why"),
    [(0, "between 1 and"), (-1, "between 1 and"), (True, "must be an int"), (2**32, "a u32")],
)
def test_bad_epoch_counts_and_duplicates_are_refused_without_rpc(
    chain: SuiChain, node: FakeSuiNode, k: int, why: str
) -> None:
    blob = node.add_blob(ADDRESS, end_epoch=105)
    node.calls.clear()
    with pytest.raises(SuiPreconditionFailed, match=why):
        chain.prepare_extend([(blob.object_id, k)])
    with pytest.raises(SuiPreconditionFailed, match="twice"):
        chain.prepare_extend([(blob.object_id, 1), (blob.object_id.upper().replace("0X", "0x"), 2)])
    with pytest.raises(ChainRejected, match="nothing"):
        chain.prepare_extend([])
    assert node.calls == []


# --- coins ------------------------------------------------------------------------------------------


def test_select_coins_prefers_one_coin_then_the_largest() -> None:
    def coin(balance: int, oid: str) -> Coin:
        return Coin(ObjectRef(oid, 1, random_digest()), balance)

    coins = [coin(5, "0x1"), coin(30, "0x2"), coin(20, "0x3"), coin(0, "0x4")]
    assert [c.ref.object_id for c in select_coins(coins, need=25, want=28, max_count=5)] == ["0x2"]
    assert [c.ref.object_id for c in select_coins(coins, need=40, want=44, max_count=5)] == [
        "0x2",
        "0x3",
    ]
    # the buffer is nice to have, the need is not
    assert len(select_coins(coins, need=55, want=60, max_count=5)) == 3
    assert select_coins(coins, need=56, want=60, max_count=5) == []
    assert select_coins(coins, need=50, want=50, max_count=1) == []


def test_short_wal_coins_are_merged_in_the_same_ptb(make_chain) -> None:  # type: ignore[no-untyped-def]
    node = FakeSuiNode(
        system_id=TESTNET.system_object_id,
        type_origin=TESTNET.walrus_type_origin,
        wal_coin_type=TESTNET.wal_coin_type,
    )
    node.add_sui(ADDRESS, 3 * SUI)
    blobs = [node.add_blob(ADDRESS, end_epoch=102) for _ in range(4)]
    cost = sum(walrus_storage_cost_frost(SIZE_63, 5, 11_000) for _ in blobs)  # 4 × 3,465,000
    small = [node.add_coin(ADDRESS, cost * 2 // 5) for _ in range(3)]  # each too small
    dust = node.add_coin(ADDRESS, 1)
    chain = make_chain(node)

    tx = chain.prepare_extend([(b.object_id, 5) for b in blobs])
    d = decode_transaction_data(base64.b64decode(tx.tx_bytes))
    merge = d.commands[0]
    assert isinstance(merge, MergeCoinsCmd)
    dest = d.inputs[merge.destination.index]
    sources = [d.inputs[s.index] for s in merge.sources]
    assert {dest.object_id, *(s.object_id for s in sources)} == {c.object_id for c in small}  # type: ignore[union-attr]
    assert dust.object_id not in {getattr(i, "object_id", None) for i in d.inputs}
    assert all(
        isinstance(c, MoveCallCmd) and c.args[3] == merge.destination for c in d.commands[1:]
    )

    effects = chain.execute(tx)
    assert effects.success and effects.wal_cost_frost == cost
    remaining = [o for o in node.objects.values() if "wal::WAL" in o.object_type]
    assert sum(o.balance or 0 for o in remaining) == 3 * (cost * 2 // 5) + 1 - cost
    assert len(remaining) == 2  # merged sources are gone; dust untouched


def test_not_enough_wal_or_sui_is_refused(make_chain) -> None:  # type: ignore[no-untyped-def]
    node = FakeSuiNode(
        system_id=TESTNET.system_object_id,
        type_origin=TESTNET.walrus_type_origin,
        wal_coin_type=TESTNET.wal_coin_type,
    )
    blob = node.add_blob(ADDRESS, end_epoch=102)
    node.add_coin(ADDRESS, 1_000)
    node.add_sui(ADDRESS, 3 * SUI)
    chain = make_chain(node)
    with pytest.raises(ChainRejected, match="insufficient WAL: need 3465000 FROST"):
        chain.prepare_extend([(blob.object_id, 5)])

    poor = FakeSuiNode(
        system_id=TESTNET.system_object_id,
        type_origin=TESTNET.walrus_type_origin,
        wal_coin_type=TESTNET.wal_coin_type,
    )
    blob = poor.add_blob(ADDRESS, end_epoch=102)
    poor.add_coin(ADDRESS, 10 * WAL)
    poor.add_sui(ADDRESS, 500)  # less than the gas price itself
    with pytest.raises(ChainRejected, match="insufficient SUI"):
        make_chain(poor).prepare_extend([(blob.object_id, 5)])
    assert poor.count("ExecuteTransaction") == 0


# --- executing --------------------------------------------------------------------------------------


def test_execute_extends_and_reports_effects(make_chain, node: FakeSuiNode) -> None:  # type: ignore[no-untyped-def]
    chain = make_chain()
    a = node.add_blob(ADDRESS, end_epoch=101, blob_id=5)
    b = node.add_blob(ADDRESS, end_epoch=103, storage_size=72_040_000, blob_id=6)
    tx = chain.prepare_extend([(a.object_id, 5), (b.object_id, 2)])

    effects = chain.execute(tx)

    assert effects.success and effects.digest == tx.digest and effects.network == "testnet"
    assert effects.sender == ADDRESS and effects.epoch == 100
    assert {
        (e.blob_object_id, e.old_end_epoch, e.new_end_epoch, e.epochs) for e in effects.extensions
    } == {
        (a.object_id, 101, 106, 5),
        (b.object_id, 103, 105, 2),
    }
    assert {e.blob_id for e in effects.extensions} == {blob_id_from_u256(5), blob_id_from_u256(6)}
    expected_wal = walrus_storage_cost_frost(SIZE_63, 5, 11_000) + walrus_storage_cost_frost(
        72_040_000, 2, 11_000
    )
    assert effects.wal_cost_frost == expected_wal
    assert effects.gas_used is not None and effects.gas_used > 0
    assert effects.checkpoint == node.checkpoint and effects.timestamp == node.timestamp
    # the chain really changed
    assert chain.get_blob(a.object_id).end_epoch == 106  # type: ignore[union-attr]
    assert chain.get_blob(b.object_id).end_epoch == 105  # type: ignore[union-attr]
    # a second adapter (e.g. the reconciler after a restart) sees the same story by digest
    other = make_chain()
    looked_up = other.get_transaction(tx.digest)
    assert looked_up is not None
    assert (looked_up.success, looked_up.digest, looked_up.wal_cost_frost) == (
        True,
        tx.digest,
        expected_wal,
    )
    assert set(looked_up.extensions) == set(effects.extensions)
    assert other.get_transaction(random_digest()) is None
    # executing the same bytes again is idempotent (Sui answers with the recorded effects)
    assert chain.execute(tx).extensions == effects.extensions
    assert chain.get_blob(a.object_id).end_epoch == 106  # type: ignore[union-attr]


def test_effects_without_bcs_events_or_balance_changes(make_chain, node: FakeSuiNode) -> None:  # type: ignore[no-untyped-def]
    """Answers shaped differently: structured transaction, no events, no balance changes."""
    node.tx_bcs = False
    chain = make_chain()
    a = node.add_blob(ADDRESS, end_epoch=101, blob_id=7)
    tx = chain.prepare_extend([(a.object_id, 4)])
    effects = chain.execute(tx)
    expected = walrus_storage_cost_frost(SIZE_63, 4, 11_000)
    assert [(e.old_end_epoch, e.new_end_epoch) for e in effects.extensions] == [(101, 105)]
    # the structured transaction is enough to know what was asked, from another process too
    looked_up = make_chain().get_transaction(tx.digest)
    assert looked_up is not None
    assert [(e.blob_object_id, e.epochs, e.new_end_epoch) for e in looked_up.extensions] == [
        (a.object_id, 4, 105)
    ]
    assert looked_up.wal_cost_frost == expected

    node.emit_events = False
    node.report_balance_changes = False
    b = node.add_blob(ADDRESS, end_epoch=102, blob_id=8)
    tx = chain.prepare_extend([(b.object_id, 2)])
    effects = chain.execute(tx)
    # from what was read at prepare time: old end + k, and units × price × k
    assert [(e.blob_id, e.old_end_epoch, e.new_end_epoch) for e in effects.extensions] == [
        (blob_id_from_u256(8), 102, 104)
    ]
    assert effects.wal_cost_frost == walrus_storage_cost_frost(SIZE_63, 2, 11_000)
    # a process that did not prepare it cannot know the numbers: it says so rather than guess
    looked_up = make_chain().get_transaction(tx.digest)
    assert looked_up is not None and looked_up.success
    assert looked_up.extensions == () and looked_up.wal_cost_frost is None


def test_direct_bcs_writer_and_reader_match_pysui_byte_for_byte() -> None:
    """build_extend_tx writes BCS directly (pysui's canoser types are ~25x slower); over
    varied shapes it must equal pysui's builder, and both decoders must agree."""
    import random

    from walkeep.backends.sui import ptb

    rng = random.Random(12)

    def ref() -> ObjectRef:
        return ObjectRef(
            "0x" + rng.randbytes(32).hex(),
            rng.randint(1, 10**12),
            base58.b58encode(rng.randbytes(32)).decode(),
        )

    for _ in range(60):
        blobs = [ref() for _ in range(rng.randint(1, 12))]
        kw: dict[str, Any] = dict(
            sender="0x" + rng.randbytes(32).hex(),
            package_id="0x" + rng.randbytes(rng.randint(1, 32)).hex(),
            system=SharedRef(
                "0x" + rng.randbytes(32).hex(), rng.randint(1, 999), rng.random() < 0.8
            ),
            calls=[
                ExtendCall(rng.choice(blobs), rng.choice([1, 2, 5, 53, 4_000_000_000]))
                for _ in range(rng.randint(1, 30))
            ],
            wal_coins=[ref() for _ in range(rng.randint(1, 4))],
            gas_payment=[ref() for _ in range(rng.randint(1, 3))],
            gas_price=rng.randint(1, 10**6),
            gas_budget=rng.randint(1, 10**12),
            expiration_epoch=rng.choice([None, rng.randint(0, 10**9)]),
        )
        raw = ptb.build_extend_tx(**kw)
        assert raw == ptb.build_extend_tx_pysui(**kw)
        assert ptb._read_fast(raw) == ptb._read_pysui(raw)
    # Shapes the direct reader does not cover still decode, through pysui.
    with pytest.raises(ptb._Unsupported):
        ptb._read_fast(raw + b"\x00")
    with pytest.raises(ValueError):
        decode_extend_tx(raw + b"\x00")


def test_transaction_bytes_come_from_the_node_for_audits(make_chain, node: FakeSuiNode) -> None:  # type: ignore[no-untyped-def]
    """walkeep verify reads the node's BCS: the digest recomputes, the calls decode; a node
    that answers without BCS is an error, never a silent fallback to Walkeep's own copy."""
    chain = make_chain()
    a = node.add_blob(ADDRESS, end_epoch=101, blob_id=9)
    tx = chain.prepare_extend([(a.object_id, 3)])
    chain.execute(tx)
    raw = base64.b64decode(make_chain().get_transaction_bytes(tx.digest))
    assert tx_digest(raw) == tx.digest and raw == base64.b64decode(tx.tx_bytes)
    decoded = decode_extend_tx(raw)
    assert [(c.blob_object_id, c.epochs, c.function) for c in decoded.calls] == [
        (a.object_id, 3, "extend_blob")
    ]
    system_id, packages = chain.walrus_targets()
    assert decoded.calls[0].system_object_id == system_id and decoded.calls[0].system_mutable
    assert decoded.calls[0].package_id in packages
    assert chain.get_transaction_bytes(random_digest()) is None
    node.tx_bcs = False  # this node now answers with structured transactions only
    b = node.add_blob(ADDRESS, end_epoch=102, blob_id=10)
    structured = chain.prepare_extend([(b.object_id, 2)])
    chain.execute(structured)
    with pytest.raises(ChainUnavailable, match="BCS"):
        chain.get_transaction_bytes(structured.digest)


def test_a_move_abort_is_rejected_and_applies_nothing(chain: SuiChain, node: FakeSuiNode) -> None:
    blob = node.add_blob(ADDRESS, end_epoch=101)
    other = node.add_blob(ADDRESS, end_epoch=104)
    tx = chain.prepare_extend([(other.object_id, 1), (blob.object_id, 1)])
    wal_before = {
        o.object_id: o.balance for o in node.objects.values() if "wal::WAL" in o.object_type
    }
    node.walrus_epoch = 101  # the epoch turns between prepare and execute: `blob` lapses

    with pytest.raises(SuiExecutionFailed) as info:
        chain.execute(tx)

    assert isinstance(info.value, ChainRejected)
    assert "expired" in str(info.value) and "blob" in str(info.value)
    failed = info.value.effects
    assert not failed.success and failed.extensions == () and failed.wal_cost_frost is None
    assert failed.digest == tx.digest and failed.gas_used  # gas was paid
    assert node.objects[other.object_id].fields["storage"]["end_epoch"] == 104  # nothing applied
    assert node.objects[blob.object_id].fields["storage"]["end_epoch"] == 101
    assert {
        o.object_id: o.balance for o in node.objects.values() if "wal::WAL" in o.object_type
    } == wal_before
    looked_up = chain.get_transaction(tx.digest)
    assert (
        looked_up is not None
        and not looked_up.success
        and "EResourceBounds" in (looked_up.error or "")
    )


def test_a_transport_error_is_unavailable_and_settles_by_digest(
    chain: SuiChain, node: FakeSuiNode
) -> None:
    blob = node.add_blob(ADDRESS, end_epoch=102)
    tx = chain.prepare_extend([(blob.object_id, 3)])
    node.inject("ExecuteTransaction", error=ConnectionResetError("peer reset"))
    with pytest.raises(ChainUnavailable, match="ConnectionResetError"):
        chain.execute(tx)
    assert node.objects[blob.object_id].fields["storage"]["end_epoch"] == 102
    assert chain.get_transaction(tx.digest) is None  # never reached the node

    # now the node executes it but the answer is lost: outcome unknown, then found
    node.inject("ExecuteTransaction", error=ConnectionResetError("lost reply"), after=True)
    with pytest.raises(ChainUnavailable):
        chain.execute(tx)
    assert node.objects[blob.object_id].fields["storage"]["end_epoch"] == 105
    effects = chain.get_transaction(tx.digest)
    assert effects is not None and effects.success
    assert [(e.old_end_epoch, e.new_end_epoch) for e in effects.extensions] == [(102, 105)]


def test_a_hung_node_times_out_as_unavailable(make_chain, node: FakeSuiNode) -> None:  # type: ignore[no-untyped-def]
    chain = make_chain(rpc_timeout=0.2, execute_timeout=0.2)
    blob = node.add_blob(ADDRESS, end_epoch=102)
    tx = chain.prepare_extend([(blob.object_id, 1)])
    node.inject("ExecuteTransaction", action="hang")
    with pytest.raises(ChainUnavailable):
        chain.execute(tx)
    node.inject("GetObject", action="hang")
    with pytest.raises(ChainUnavailable):
        chain.current_epoch()
    node.inject("GetObject", action="status", status=Status.UNAVAILABLE, message="overloaded")
    with pytest.raises(ChainUnavailable, match="UNAVAILABLE"):
        chain.current_epoch()
    assert chain.current_epoch() == 100  # and it recovers


def test_the_whole_operation_has_a_deadline_too(make_chain, node: FakeSuiNode) -> None:  # type: ignore[no-untyped-def]
    # even if a call ignored its own gRPC deadline, the caller's thread is released
    chain = make_chain(rpc_timeout=30.0, operation_timeout=0.3)
    node.inject("GetObject", action="hang")
    with pytest.raises(ChainUnavailable, match="no answer within"):
        chain.current_epoch()
    assert chain.current_epoch() == 100  # the hung call was cancelled, the loop is fine


def test_a_refused_transaction_is_rejected(chain: SuiChain, node: FakeSuiNode) -> None:
    blob = node.add_blob(ADDRESS, end_epoch=102)
    tx = chain.prepare_extend([(blob.object_id, 1)])
    node.inject(
        "ExecuteTransaction", action="status", status=Status.INVALID_ARGUMENT, message="nope"
    )
    with pytest.raises(ChainRejected, match="nope"):
        chain.execute(tx)
    assert node.count("GetTransaction") == 1  # it made sure the digest is unknown first
    # a stale object version (someone spent the coin) is refused by the node itself
    tx2 = chain.prepare_extend([(blob.object_id, 1)])
    wal = next(o for o in node.objects.values() if "wal::WAL" in o.object_type)
    wal.version, wal.digest = wal.version + 1, random_digest()
    with pytest.raises(ChainRejected, match="ObjectVersionUnavailable"):
        chain.execute(tx2)
    assert node.objects[blob.object_id].fields["storage"]["end_epoch"] == 102


def test_execute_checks_the_digest_and_can_resign(chain: SuiChain, node: FakeSuiNode) -> None:
    blob = node.add_blob(ADDRESS, end_epoch=102)
    tx = chain.prepare_extend([(blob.object_id, 1)])
    node.calls.clear()
    forged = PreparedTx(random_digest(), tx.tx_bytes, tx.items, tx.epoch, tx.payload)
    with pytest.raises(ChainRejected, match="does not match"):
        chain.execute(forged)
    assert node.calls == []
    # a PreparedTx rebuilt from storage (no signature kept) is signed again, identically
    bare = PreparedTx(tx.digest, tx.tx_bytes, tx.items, tx.epoch, None)
    assert keypair_from_keystring(KEY).new_sign_secure(tx.tx_bytes) == tx.payload
    assert chain.execute(bare).success


def test_unsettled_transactions_hold_their_objects(
    make_chain, node: FakeSuiNode, clock: ManualClock
) -> None:  # type: ignore[no-untyped-def]
    chain = make_chain(in_flight_hold_seconds=60)
    node.add_coin(ADDRESS, 50 * WAL)  # a second WAL coin
    node.add_sui(ADDRESS, 3 * SUI)
    a = node.add_blob(ADDRESS, end_epoch=102)
    b = node.add_blob(ADDRESS, end_epoch=102)
    tx_a = chain.prepare_extend([(a.object_id, 1)])
    tx_b_same_coins = chain.prepare_extend([(b.object_id, 1)])  # prepared: holds nothing
    node.inject("ExecuteTransaction", error=ConnectionResetError("lost reply"))
    with pytest.raises(ChainUnavailable):
        chain.execute(tx_a)  # outcome unknown: tx_a's coins and blob stay held
    with pytest.raises(ChainRejected, match="unsettled"):
        chain.execute(tx_b_same_coins)  # would spend the same coin versions: not submitted
    with pytest.raises(ChainUnavailable, match="unsettled renewal"):
        chain.prepare_extend([(a.object_id, 1)])
    tx_b = chain.prepare_extend([(b.object_id, 1)])  # picks the other coins
    used = set(decode_extend_tx(tx_b.tx_bytes).owned_objects) | set(
        decode_extend_tx(tx_b.tx_bytes).gas_coins
    )
    held = set(decode_extend_tx(tx_a.tx_bytes).owned_objects) | set(
        decode_extend_tx(tx_a.tx_bytes).gas_coins
    )
    assert not used & held
    assert chain.execute(tx_b).success
    clock.advance(seconds=61)  # the hold lapses
    assert chain.prepare_extend([(a.object_id, 1)]).digest
    # resubmitting the very same transaction is never blocked by its own hold
    node.inject("ExecuteTransaction", error=ConnectionResetError("lost reply"))
    tx_c = chain.prepare_extend([(a.object_id, 2)])
    with pytest.raises(ChainUnavailable):
        chain.execute(tx_c)
    assert chain.execute(tx_c).success


def test_expiration_bounds_when_a_lost_transaction_can_land(
    chain: SuiChain, node: FakeSuiNode
) -> None:
    blob = node.add_blob(ADDRESS, end_epoch=102)
    tx = chain.prepare_extend([(blob.object_id, 1)])
    assert chain.sui_epoch() == 700 and not chain.is_expired(tx)
    node.sui_epoch = 701
    assert not chain.is_expired(tx)
    node.sui_epoch = 702
    assert chain.is_expired(tx) and chain.is_expired(tx.tx_bytes)
    with pytest.raises(ChainRejected, match="TransactionExpired"):
        chain.execute(tx)
    assert chain.get_transaction(tx.digest) is None


def test_pending_upgrade_falls_back_to_the_announced_package(
    chain: SuiChain, node: FakeSuiNode
) -> None:
    old = node.package_id
    node.packages[old] = node.system_version - 1  # the named package no longer matches
    node.new_package_id = random_id()
    node.packages[node.new_package_id] = node.system_version
    blob = node.add_blob(ADDRESS, end_epoch=102)
    tx = chain.prepare_extend([(blob.object_id, 2)])
    assert decode_extend_tx(tx.tx_bytes).package_ids == (norm(node.new_package_id),)
    assert chain.execute(tx).success
    node.new_package_id = None
    with pytest.raises(ChainRejected, match="dry run failed"):
        chain.prepare_extend([(blob.object_id, 1)])


def test_without_dry_run_the_nominal_budget_is_used(make_chain, node: FakeSuiNode) -> None:  # type: ignore[no-untyped-def]
    chain = make_chain(
        simulate=False, gas_budget_base_mist=30_000_000, gas_budget_per_call_mist=1_000_000
    )
    blobs = [node.add_blob(ADDRESS, end_epoch=102) for _ in range(3)]
    tx = chain.prepare_extend([(b.object_id, 1) for b in blobs])
    assert decode_extend_tx(tx.tx_bytes).gas_budget == 33_000_000
    assert node.count("SimulateTransaction") == 0
    assert chain.execute(tx).success


def test_close_stops_the_loop_thread(node: FakeSuiNode) -> None:
    chain = connect(SuiChain(sui_settings(), rpc_timeout=5.0), node)
    assert chain.current_epoch() == 100
    thread = chain._loop._thread
    assert thread is not None and thread.is_alive()
    chain.close()
    thread.join(5)
    assert not thread.is_alive()
    chain.close()  # idempotent


# --- the renewal worker on this adapter --------------------------------------------------------


def test_the_renewal_pass_and_reconciliation_run_on_the_sui_adapter(  # type: ignore[no-untyped-def]
    rt: Runtime, clock: ManualClock, node: FakeSuiNode, make_chain
) -> None:
    """walkeep.service.jobs.renew, unchanged, driving SuiChain: an on-chain abort releases the
    hold; intent → submit → record; a lost reply is settled later by digest. Billed once."""
    acct = account(rt, credits=10)
    store.store(rt, acct, content="Renew me on Sui.", request_id="sui-1")
    land_all(rt)
    with rt.db.read() as s:
        row = s.scalars(select(Blob)).one()
        oid, end, size = row.blob_object_id, row.end_epoch, row.storage_size
        before = ledger.balance(s, acct).balance_mc
    # The same Blob on the (fake) Sui network, owned by the server wallet, due for renewal.
    node.add_blob(ADDRESS, end_epoch=end, storage_size=size, object_id=oid)
    node.walrus_epoch = end - rt.settings.renew_threshold_epochs
    rt.chain = make_chain()
    k = rt.settings.target_runway_epochs - rt.settings.renew_threshold_epochs

    # The Walrus epoch turns between prepare and submit and the blob lapses: Move aborts.
    due_epoch = node.walrus_epoch

    def lapse() -> None:
        node.walrus_epoch = end

    node.inject("ExecuteTransaction", action="call", callback=lapse)
    report = renew.renew(rt)
    assert (report.transactions, report.failed_transactions) == (0, 1)
    failed_digest = next(iter(node.transactions))
    assert not node.transactions[failed_digest].effects.status.success
    assert node.objects[oid].fields["storage"]["end_epoch"] == end
    with rt.db.read() as s:
        assert s.scalars(select(Blob)).one().end_epoch == end
        failed = s.scalars(select(Renewal)).one()
        assert (failed.digest, failed.status) == (failed_digest, "failed")
        assert "expired" in (failed.error or "")
        assert ledger.balance(s, acct).balance_mc == before  # nothing billed
        assert ledger.balance(s, acct).held_mc == 0  # hold released
    node.walrus_epoch = due_epoch  # (in this fake the epoch can go back; retry after backoff)
    clock.advance(seconds=3600)

    report = renew.renew(rt)

    assert (report.transactions, report.blobs_renewed, report.unknown_outcome) == (1, 1, 0)
    digest = report.digests[0]
    assert node.transactions[digest].effects.status.success
    assert node.objects[oid].fields["storage"]["end_epoch"] == end + k
    with rt.db.read() as s:
        blob = s.scalars(select(Blob)).one()
        renewal = s.scalars(select(Renewal).where(Renewal.digest == digest)).one()
        assert (blob.end_epoch, blob.last_renewal_tx) == (end + k, digest)
        assert (renewal.digest, renewal.network, renewal.status) == (digest, "testnet", "confirmed")
        assert renewal.wal_cost_frost == walrus_storage_cost_frost(size, k, node.storage_price)
        price = renewal_cost_mc(size, k, rt.settings.renewal_price_mc_per_unit_epoch)
        assert before - ledger.balance(s, acct).balance_mc == price

    # Next time the reply is lost after the node executed it: outcome unknown, then settled.
    node.walrus_epoch = end + k - rt.settings.renew_threshold_epochs
    node.inject("ExecuteTransaction", error=ConnectionResetError("lost reply"), after=True)
    report = renew.renew(rt)
    assert (report.transactions, report.unknown_outcome) == (0, 1)
    assert node.objects[oid].fields["storage"]["end_epoch"] == end + 2 * k  # it did happen
    clock.advance(seconds=reconcile.INTENT_GRACE_SECONDS + 1)
    assert reconcile.reconcile_renewals(rt).confirmed == 1
    with rt.db.read() as s:
        assert s.scalars(select(Blob)).one().end_epoch == end + 2 * k
        statuses = sorted(r.status for r in s.scalars(select(Renewal)))
        assert statuses == ["confirmed", "confirmed", "failed"]
        assert before - ledger.balance(s, acct).balance_mc == 2 * price
        assert ledger.balance(s, acct).held_mc == 0
    assert renew.renew(rt).transactions == 0  # nothing due, nothing paid twice
