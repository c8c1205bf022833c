"""The local network's ids, digests and transaction bytes: pure functions, no state.

How the local chain names things the way Walrus and Sui do (blob ids, object ids,
addresses, transaction digests: notes/walrus-sui.md), the compact encoding of its store
transactions, and its renewals as real Sui ``TransactionData`` built and decoded with
the Sui adapter's own code — so a digest is known before submission and ``walkeep
verify`` audits local and Sui renewals with one decoder. ``engine.py`` keeps the state.
"""

from __future__ import annotations

import base64
import hashlib
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal

from walkeep.backends.base import ChainRejected
from walkeep.clock import Clock
from walkeep.protocol.b58 import b58decode, b58encode
from walkeep.protocol.bcs import BcsReader, BcsWriter


def _local_id(label: bytes) -> str:
    return "0x" + hashlib.blake2b(label, digest_size=32).hexdigest()


# Fixed ids of the local Walrus deployment (stand-ins for System.package_id and
# the System object; notes §2.3). Fixed so explorer links stay stable.
LOCAL_PACKAGE_ID = _local_id(b"walkeep::localnet::walrus::package")
LOCAL_SYSTEM_OBJECT_ID = _local_id(b"walkeep::localnet::walrus::system")
EXTEND_FUNCTION = f"{LOCAL_PACKAGE_ID}::system::extend_blob"
BLOB_TYPE = f"{LOCAL_PACKAGE_ID}::blob::Blob"


ENCODING_RS2 = 1
# Sui caps a programmable transaction at 1024 commands.
MAX_CALLS_PER_TX = 1024
# Not a model of Sui gas, just plausible MIST figures so effects look real.
GAS_BASE_MIST = 1_000_000
GAS_PER_CALL_MIST = 250_000

TxKind = Literal["store", "extend"]
_KIND_TAG: dict[str, int] = {"store": 0, "extend": 1}
_TAG_KIND: dict[int, TxKind] = {0: "store", 1: "extend"}

_US = timedelta(microseconds=1)
_UNIX = datetime(1970, 1, 1, tzinfo=UTC)


# --- ids, addresses, digests ---------------------------------------------------------------


def blake2b256(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=32).digest()


def blob_id_for(data: bytes) -> str:
    """The local blob id of ``data`` (content-addressed, deterministic).

    Walrus layout ``blake2b256(u8 encoding ‖ u64le unencoded_size ‖ root)``,
    with ``root = blake2b256(data)`` instead of the RedStuff Merkle root.
    """
    raw = blake2b256(bytes([ENCODING_RS2]) + len(data).to_bytes(8, "little") + blake2b256(data))
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def blob_id_bytes(blob_id: str) -> bytes:
    """The 32 raw bytes of a blob id string; ValueError if malformed."""
    if len(blob_id) != 43:
        raise ValueError("a blob id is 43 URL-safe base64 characters")
    raw = base64.urlsafe_b64decode(blob_id + "=")
    if len(raw) != 32 or base64.urlsafe_b64encode(raw).decode().rstrip("=") != blob_id:
        raise ValueError("not a canonical blob id")
    return raw


def blob_id_to_u256(blob_id: str) -> int:
    """How the chain stores a blob id (``u256``, little-endian; explorers show decimal)."""
    return int.from_bytes(blob_id_bytes(blob_id), "little")


def tx_digest(tx_bytes: bytes) -> str:
    """Sui's transaction digest: ``base58(blake2b256(b"TransactionData::" ‖ bytes))``."""
    return b58encode(blake2b256(b"TransactionData::" + tx_bytes))


def sui_address(ed25519_public_key: bytes) -> str:
    """A Sui address: ``blake2b256(flag 0x00 (Ed25519) ‖ public key)``."""
    if len(ed25519_public_key) != 32:
        raise ValueError("an Ed25519 public key is 32 bytes")
    return "0x" + blake2b256(b"\x00" + ed25519_public_key).hex()


def derive_object_id(digest: str, creation_num: int) -> str:
    """Sui's ``ObjectID::derive_id``: ``blake2b256(0xf1 ‖ tx digest ‖ u64le n)``."""
    return derive_object_id_raw(b58decode(digest), creation_num)


def derive_object_id_raw(raw_digest: bytes, creation_num: int) -> str:
    return "0x" + blake2b256(b"\xf1" + raw_digest + creation_num.to_bytes(8, "little")).hex()


def normalize_address(value: str) -> str:
    """``0x`` + 64 lowercase hex (short forms are zero-padded, as Sui does).

    Raises ValueError for anything else.
    """
    if isinstance(value, str) and _FULL_ADDRESS.fullmatch(value):
        return value  # the common case, already canonical
    if not isinstance(value, str) or not _ANY_ADDRESS.fullmatch(value):
        raise ValueError("an address/object id is 0x followed by 1 to 64 hex digits")
    return "0x" + value[2:].lower().rjust(64, "0")


_FULL_ADDRESS = re.compile(r"0x[0-9a-f]{64}")
_ANY_ADDRESS = re.compile(r"0[xX][0-9a-fA-F]{1,64}")


def now_us(clock: Clock) -> int:
    return (clock.now() - _UNIX) // _US


def from_us(us: int) -> datetime:
    return _UNIX + timedelta(microseconds=us)


# --- canonical transaction bytes (BCS-like) --------------------------------------------------


_CALL = struct.Struct("<32sQI")  # object id, version, epochs


@dataclass(frozen=True, slots=True)
class ExtendCall:
    object_id: str
    version: int  # the object version the call was built against (Sui ObjectRef)
    epochs: int


@dataclass(frozen=True, slots=True)
class DecodedTx:
    """A local transaction's data as encoded by :func:`encode_tx`.

    Only *store* transactions use this encoding now; renewals (``extend``)
    are Sui ``TransactionData`` (:func:`build_local_extend_tx`). The extend
    layout below is still decoded so a state directory written before that
    change can be listed by the explorer.

    Layout (``TransactionData``): ``uleb 0 (V1) ‖ uleb kind ‖ sender[32] ‖
    nonce[32] ‖ u32 walrus_epoch ‖ package[32] ‖ payload`` where the extend
    payload is ``uleb n ‖ n × (object_id[32] ‖ u64 version ‖ u32 epochs)`` and
    the store payload ``blob_id[32] ‖ u64 size ‖ u32 epochs ‖ owner[32] ‖ u8
    deletable``. The nonce stands in for the gas object reference, so two
    identical batches still get different digests.
    """

    kind: TxKind
    sender: str
    nonce: bytes
    epoch: int
    package_id: str
    calls: tuple[ExtendCall, ...] = ()
    blob_id: str | None = None
    size: int | None = None
    epochs: int | None = None
    owner: str | None = None
    deletable: bool | None = None


def encode_tx(tx: DecodedTx) -> bytes:
    w = BcsWriter()
    w.uleb(0)
    w.uleb(_KIND_TAG[tx.kind])
    w.address(tx.sender)
    w.raw(tx.nonce)
    w.u32(tx.epoch)
    w.address(tx.package_id)
    if tx.kind == "extend":
        w.uleb(len(tx.calls))
        for call in tx.calls:
            w.raw(_CALL.pack(bytes.fromhex(call.object_id[2:]), call.version, call.epochs))
    else:
        assert tx.blob_id and tx.size is not None and tx.epochs and tx.owner
        w.raw(blob_id_bytes(tx.blob_id))
        w.u64(tx.size)
        w.u32(tx.epochs)
        w.address(tx.owner)
        w.u8(1 if tx.deletable else 0)
    return bytes(w.buf)


def decode_tx(data: bytes) -> DecodedTx:
    """Parse ``tx_bytes``; ValueError if they are not a local transaction."""
    r = BcsReader(data)
    if r.uleb() != 0:
        raise ValueError("unknown TransactionData version")
    tag = r.uleb()
    if tag not in _TAG_KIND:
        raise ValueError("unknown transaction kind")
    kind = _TAG_KIND[tag]
    sender, nonce, epoch, package = r.address(), r.take(32), r.u32(), r.address()
    if kind == "extend":
        n = r.uleb()
        if n > MAX_CALLS_PER_TX:
            raise ValueError("too many calls")
        body = r.take(44 * n)
        calls = tuple(
            ExtendCall("0x" + oid.hex(), version, epochs)
            for oid, version, epochs in _CALL.iter_unpack(body)
        )
        r.done()
        return DecodedTx(kind, sender, nonce, epoch, package, calls=calls)
    raw_id = r.take(32)
    size, epochs, owner, deletable = r.u64(), r.u32(), r.address(), r.u8()
    r.done()
    return DecodedTx(
        kind,
        sender,
        nonce,
        epoch,
        package,
        blob_id=base64.urlsafe_b64encode(raw_id).decode().rstrip("="),
        size=size,
        epochs=epochs,
        owner=owner,
        deletable=bool(deletable),
    )


# --- renewal transactions: real Sui TransactionData ------------------------------------------

# The local System object is shared since the local deployment's first version.
LOCAL_SYSTEM_INITIAL_SHARED_VERSION = 1
# The server wallet's WAL coin and SUI gas coin on the local network. The WAL
# coin's version is not tracked; the gas coin's is (LocalNetwork.execute), so two
# renewals of one wallet prepared at once cannot both execute, as on Sui.
LOCAL_WAL_COIN_ID = _local_id(b"walkeep::localnet::wal-coin")
LOCAL_GAS_COIN_ID = _local_id(b"walkeep::localnet::gas-coin")
LOCAL_GAS_PRICE_MIST = 1_000


def object_digest(object_id: str, version: int) -> str:
    """The local stand-in for a Sui object digest (base58 of 32 bytes) at ``version``.

    Sui hashes the object's contents; the local chain hashes (id, version),
    which is all an ObjectRef needs to pin: a different version, a different
    reference.
    """
    return b58encode(_object_digest_raw(object_id, version))


def _object_digest_raw(object_id: str, version: int) -> bytes:
    return blake2b256(
        b"walkeep::localnet::object" + bytes.fromhex(object_id[2:]) + version.to_bytes(8, "little")
    )


def build_local_extend_tx(
    sender: str, calls: Sequence[ExtendCall], *, nonce: bytes, gas_version: int = 1
) -> bytes:
    """BCS ``TransactionData`` for a local renewal, built by the Sui adapter's builder.

    The same bytes a Sui renewal has (``walkeep.backends.sui.ptb``): the
    local package's ``system::extend_blob`` with the local System as a
    mutable shared object, each Blob as an owned ObjectRef at its current
    version, one WAL coin, and gas data naming the wallet's gas coin at
    ``gas_version`` with ``nonce`` (32 random bytes) as its digest, so two
    identical batches still get different digests. One
    decoder (``decode_extend_tx``) then serves ``walkeep verify`` on every
    network.
    """
    from walkeep.backends.sui.ptb import ExtendCall as SuiCall
    from walkeep.backends.sui.ptb import ObjectRef, SharedRef, build_extend_tx

    if len(nonce) != 32:
        raise ValueError("the gas coin digest is 32 bytes")
    return build_extend_tx(
        sender=sender,
        package_id=LOCAL_PACKAGE_ID,
        system=SharedRef(LOCAL_SYSTEM_OBJECT_ID, LOCAL_SYSTEM_INITIAL_SHARED_VERSION, True),
        calls=[
            SuiCall(
                ObjectRef(c.object_id, c.version, _object_digest_raw(c.object_id, c.version)),
                c.epochs,
            )
            for c in calls
        ],
        wal_coins=[ObjectRef(LOCAL_WAL_COIN_ID, 1, _object_digest_raw(LOCAL_WAL_COIN_ID, 1))],
        gas_payment=[ObjectRef(LOCAL_GAS_COIN_ID, gas_version, nonce)],
        gas_price=LOCAL_GAS_PRICE_MIST,
        gas_budget=GAS_BASE_MIST + GAS_PER_CALL_MIST * len(calls),
        expiration_epoch=None,
    )


@dataclass(frozen=True, slots=True)
class LocalExtendTx:
    sender: str
    calls: tuple[ExtendCall, ...]
    gas_version: int = 1


def decode_local_extend_tx(tx_bytes: bytes) -> LocalExtendTx:
    """Decode renewal bytes with the Sui decoder and check they target this network.

    Raises ChainRejected for anything the local chain cannot execute: not a
    programmable transaction, a command other than ``extend_blob`` (or
    MergeCoins), another package, a System other than the local one, or a
    Blob passed by anything but an owned ObjectRef.
    """
    from walkeep.backends.sui.ptb import decode_extend_tx

    try:
        tx = decode_extend_tx(tx_bytes)
    except ValueError as exc:
        raise ChainRejected(f"malformed transaction bytes: {exc}") from exc
    if tx.other_commands:
        raise ChainRejected("only system::extend_blob calls can be executed on this network")
    if len(tx.calls) > MAX_CALLS_PER_TX:
        raise ChainRejected(f"at most {MAX_CALLS_PER_TX} calls per transaction")
    for i, call in enumerate(tx.calls):
        if call.package_id != LOCAL_PACKAGE_ID:
            raise ChainRejected(
                f"call {i}: package {call.package_id} does not exist on this network"
            )
        if call.system_object_id != LOCAL_SYSTEM_OBJECT_ID or not call.system_mutable:
            raise ChainRejected(f"call {i}: the first argument must be the local System (&mut)")
        if call.blob_version < 0:
            raise ChainRejected(f"call {i}: the Blob must be an owned object reference")
    return LocalExtendTx(
        sender=tx.sender,
        calls=tuple(ExtendCall(c.blob_object_id, c.blob_version, c.epochs) for c in tx.calls),
        gas_version=tx.gas_versions[0] if tx.gas_versions else 1,
    )
