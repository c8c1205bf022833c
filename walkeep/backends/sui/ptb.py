"""Build the renewal transaction offline, byte for byte (notes §3.3).

The low-level ``ProgrammableTransactionBuilder`` is used on purpose: given the
object references it was handed, the output is fully deterministic, so the
digest is known before submission and tests can check every byte. The
high-level async builder would re-read objects and function signatures over
RPC while building.

Layout of one renewal PTB::

    inputs:   0 System (shared, &mut)   1 WAL coin (owned)   [2.. extra WAL coins]
              then per distinct blob: Blob (owned); per distinct k: Pure u32
    commands: [MergeCoins(WAL, extra…)]  then  MoveCall <pkg>::system::extend_blob
              (System, Blob_i, k_i, WAL) for every blob

One WAL coin is shared by all calls: ``extend_blob`` only splits what it
charges from ``&mut Coin<WAL>`` (notes §2.2), so no SplitCoins/destroy_zero
dance is needed and a price change between read and execution cannot abort
the batch unless the coin really runs short.

Why one file: the encoder and the decoder of one transaction layout mirror each other;
kept side by side so a change to one is made to the other.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass

from pysui.sui.sui_bcs import bcs
from pysui.sui.sui_common.txn_transaction_builder import ProgrammableTransactionBuilder

from walkeep.backends.sui.codec import normalize_address, pure_u32
from walkeep.protocol.b58 import b58decode, b58encode
from walkeep.protocol.bcs import BcsError, BcsReader, BcsWriter

# Sui protocol caps (protocol config): 1024 commands and 2048 input objects per
# PTB, 128 KiB per transaction, at most 256 gas payment coins.
MAX_PTB_COMMANDS = 1024
MAX_MERGE_COINS = 250  # extra WAL coins merged into the primary one
MAX_GAS_COINS = 32


@dataclass(frozen=True, slots=True)
class ObjectRef:
    """An owned object at one exact version (what an ImmOrOwnedObject input pins)."""

    object_id: str
    version: int
    # base58 as Sui prints it, or the 32 raw bytes when the caller has them (the
    # local chain computes its digests: no round trip through base58 per blob).
    digest: str | bytes


@dataclass(frozen=True, slots=True)
class SharedRef:
    object_id: str
    initial_shared_version: int
    mutable: bool = True


@dataclass(frozen=True, slots=True)
class ExtendCall:
    blob: ObjectRef
    epochs: int


def _addr(value: str) -> bcs.Address:
    return bcs.Address.from_str(normalize_address(value))


def _digest58(ref: ObjectRef) -> str:
    return ref.digest if isinstance(ref.digest, str) else b58encode(ref.digest)


def _owned(ref: ObjectRef) -> bcs.ObjectArg:
    return bcs.ObjectArg(
        "ImmOrOwnedObject",
        bcs.ObjectReference(_addr(ref.object_id), ref.version, bcs.Digest.from_str(_digest58(ref))),
    )


def _gas_ref(ref: ObjectRef) -> bcs.ObjectReference:
    return bcs.ObjectReference(
        _addr(ref.object_id), ref.version, bcs.Digest.from_str(_digest58(ref))
    )


def _check_extend_args(calls: Sequence[ExtendCall], wal_coins: Sequence[ObjectRef]) -> None:
    if not calls:
        raise ValueError("no extend calls")
    if not wal_coins:
        raise ValueError("no WAL coin")
    if len(wal_coins) - 1 > MAX_MERGE_COINS:
        raise ValueError(f"at most {MAX_MERGE_COINS} WAL coins can be merged")
    if len(calls) + 1 > MAX_PTB_COMMANDS:
        raise ValueError(f"at most {MAX_PTB_COMMANDS - 1} extend calls per transaction")
    refs: dict[str, ObjectRef] = {}
    for c in calls:
        seen = refs.setdefault(normalize_address(c.blob.object_id), c.blob)
        if seen != c.blob:
            raise ValueError("a blob appears twice in one transaction with different versions")


def build_extend_kind(
    *,
    package_id: str,
    system: SharedRef,
    calls: Sequence[ExtendCall],
    wal_coins: Sequence[ObjectRef],
) -> bcs.TransactionKind:
    """The programmable transaction (no gas, no sender): inputs + commands."""
    _check_extend_args(calls, wal_coins)

    ptb = ProgrammableTransactionBuilder()
    # Each object enters the inputs exactly once (Sui rejects duplicate object
    # inputs); later commands refer to it by Argument.
    system_arg = ptb.input_obj(
        bcs.BuilderArg("Object", _addr(system.object_id)),
        bcs.ObjectArg(
            "SharedObject",
            bcs.SharedObjectReference(
                _addr(system.object_id), system.initial_shared_version, system.mutable
            ),
        ),
    )
    primary, *extra = wal_coins
    coin_arg = ptb.input_obj(bcs.BuilderArg("Object", _addr(primary.object_id)), _owned(primary))
    if extra:
        extra_args = [
            ptb.input_obj(bcs.BuilderArg("Object", _addr(c.object_id)), _owned(c)) for c in extra
        ]
        ptb.command(bcs.Command("MergeCoins", bcs.MergeCoins(coin_arg, extra_args)))

    epochs_args: dict[int, bcs.Argument] = {}
    blob_args: dict[str, bcs.Argument] = {}
    target = _addr(package_id)
    for call in calls:
        # A blob extended by two calls enters the inputs once; both calls use
        # it (Sui refuses duplicate object inputs, not repeated uses).
        key = normalize_address(call.blob.object_id)
        blob_arg = blob_args.get(key)
        if blob_arg is None:
            blob_arg = ptb.input_obj(
                bcs.BuilderArg("Object", _addr(call.blob.object_id)), _owned(call.blob)
            )
            blob_args[key] = blob_arg
        k_arg = epochs_args.get(call.epochs)
        if k_arg is None:
            k_arg = ptb.input_pure(bcs.BuilderArg("Pure", list(pure_u32(call.epochs))))
            epochs_args[call.epochs] = k_arg
        ptb.move_call(
            target=target,
            module="system",
            function="extend_blob",
            arguments=[system_arg, blob_arg, k_arg, coin_arg],
            type_arguments=[],
            res_count=0,
        )
    return ptb.finish_for_inspect()


def build_extend_tx(
    *,
    sender: str,
    package_id: str,
    system: SharedRef,
    calls: Sequence[ExtendCall],
    wal_coins: Sequence[ObjectRef],
    gas_payment: Sequence[ObjectRef],
    gas_price: int,
    gas_budget: int,
    expiration_epoch: int | None,
) -> bytes:
    """BCS ``TransactionData::V1`` for one renewal batch. Deterministic in its arguments.

    ``expiration_epoch`` is a *Sui* epoch: validators refuse the transaction
    once the chain is past it, which bounds how late a signed-but-lost
    transaction could still land.

    Byte-identical to :func:`build_extend_tx_pysui` (pysui's
    ProgrammableTransactionBuilder), written directly because pysui's canoser
    types take ~50 ms for a 200-blob batch, which the local chain pays on
    every renewal too.
    """
    if not gas_payment:
        raise ValueError("no gas coin")
    if len(gas_payment) > MAX_GAS_COINS:
        raise ValueError(f"at most {MAX_GAS_COINS} gas coins")
    _check_extend_args(calls, wal_coins)
    return _write_extend_tx(
        sender=sender,
        package_id=package_id,
        system=system,
        calls=calls,
        wal_coins=wal_coins,
        gas_payment=gas_payment,
        gas_price=gas_price,
        gas_budget=gas_budget,
        expiration_epoch=expiration_epoch,
    )


def build_extend_tx_pysui(
    *,
    sender: str,
    package_id: str,
    system: SharedRef,
    calls: Sequence[ExtendCall],
    wal_coins: Sequence[ObjectRef],
    gas_payment: Sequence[ObjectRef],
    gas_price: int,
    gas_budget: int,
    expiration_epoch: int | None,
) -> bytes:
    """:func:`build_extend_tx` through pysui's builder and BCS types: the reference the
    direct writer is checked against, byte for byte, in the tests."""
    if not gas_payment:
        raise ValueError("no gas coin")
    if len(gas_payment) > MAX_GAS_COINS:
        raise ValueError(f"at most {MAX_GAS_COINS} gas coins")
    kind = build_extend_kind(package_id=package_id, system=system, calls=calls, wal_coins=wal_coins)
    sender_addr = _addr(sender)
    expiration = (
        bcs.TransactionExpiration("None", None)
        if expiration_epoch is None
        else bcs.TransactionExpiration("Epoch", expiration_epoch)
    )
    data = bcs.TransactionData(
        "V1",
        bcs.TransactionDataV1(
            kind,
            sender_addr,
            bcs.GasData([_gas_ref(g) for g in gas_payment], sender_addr, gas_price, gas_budget),
            expiration,
        ),
    )
    return bytes(data.serialize())


# --- reading a transaction back (reconciliation, audits) ----------------------------------


@dataclass(frozen=True, slots=True)
class DecodedCall:
    """One ``extend_blob`` Move call with the object references it pins.

    Kept whole (package, module, function, the System it mutates, the Blob
    at an exact version, ``k`` as a u32) so an executor can apply it and an
    auditor can compare every field with Walkeep's records.
    """

    package_id: str
    module: str
    function: str
    system_object_id: str | None  # the shared System input, None if not a shared object
    system_mutable: bool
    blob_object_id: str
    blob_version: int
    epochs: int
    coin_object_id: str | None


@dataclass(frozen=True, slots=True)
class DecodedExtend:
    """What a renewal transaction asked for, recovered from its BCS bytes."""

    sender: str
    package_ids: tuple[str, ...]
    items: tuple[tuple[str, int], ...]  # (blob_object_id, epochs) per extend_blob call
    expiration_epoch: int | None
    gas_budget: int
    owned_objects: tuple[str, ...]  # every owned input (blobs, WAL coins)
    gas_coins: tuple[str, ...]
    calls: tuple[DecodedCall, ...] = ()  # the extend_blob calls, in order
    gas_versions: tuple[int, ...] = ()  # the version of each gas coin, in order
    # Commands that are neither extend_blob nor MergeCoins (an executor that
    # only knows renewals must refuse a transaction that has any).
    other_commands: int = 0


@dataclass(frozen=True, slots=True)
class _Input:
    kind: str  # Pure | ImmOrOwnedObject | SharedObject | Receiving
    object_id: str | None = None
    version: int = 0
    mutable: bool = False
    pure: bytes = b""


@dataclass(frozen=True, slots=True)
class _Command:
    kind: str  # MoveCall | MergeCoins | anything else (counted, not interpreted)
    package: str = ""
    module: str = ""
    function: str = ""
    args: tuple[tuple[str, int], ...] = ()  # (Argument variant, index)


@dataclass(frozen=True, slots=True)
class _Tx:
    sender: str
    inputs: tuple[_Input, ...]
    commands: tuple[_Command, ...]
    expiration_epoch: int | None
    gas_budget: int
    gas_coins: tuple[str, ...]
    gas_versions: tuple[int, ...] = ()


def decode_extend_tx(tx_bytes: bytes | str) -> DecodedExtend:
    """Parse BCS ``TransactionData`` and list its ``system::extend_blob`` calls.

    Accepts raw bytes or base64. Raises ValueError for anything that is not a
    programmable transaction. Renewal-shaped bytes take a direct BCS reader
    (:func:`_read_fast`, ~25× faster than pysui's canoser types, which cost
    ~50 ms for a 200-blob batch); anything else goes through pysui's
    ``TransactionData`` deserializer. Tests check both agree.
    """
    raw = base64.b64decode(tx_bytes) if isinstance(tx_bytes, str) else bytes(tx_bytes)
    try:
        tx = _read_fast(raw)
    except BcsError:  # not renewal-shaped (or not BCS at all): pysui decides
        tx = _read_pysui(raw)
    return _summarize(tx)


def _read_pysui(raw: bytes) -> _Tx:
    try:
        data = bcs.TransactionData.deserialize(raw)
    except Exception as exc:  # canoser raises a variety of types on bad input
        raise ValueError(f"not a Sui TransactionData: {exc}") from None
    v1 = data.value
    kind = v1.TransactionKind
    if kind.enum_name != "ProgrammableTransaction":
        raise ValueError(f"not a programmable transaction: {kind.enum_name}")
    pt = kind.value
    inputs: list[_Input] = []
    for i in pt.Inputs:
        if i.enum_name == "Pure":
            inputs.append(_Input("Pure", pure=bytes(i.value)))
            continue
        arg = i.value
        ref = arg.value
        oid = normalize_address(ref.ObjectID.to_address_str())
        if arg.enum_name == "SharedObject":
            inputs.append(_Input("SharedObject", oid, int(ref.SequenceNumber), bool(ref.Mutable)))
        else:
            inputs.append(_Input(arg.enum_name, oid, int(ref.SequenceNumber)))
    commands: list[_Command] = []
    for command in pt.Command:
        if command.enum_name != "MoveCall":
            commands.append(_Command(command.enum_name))
            continue
        call = command.value
        commands.append(
            _Command(
                "MoveCall",
                normalize_address(call.Package.to_address_str()),
                str(call.Module),
                str(call.Function),
                tuple(
                    (a.enum_name, int(a.value) if a.enum_name in ("Input", "Result") else -1)
                    for a in call.Arguments
                ),
            )
        )
    expiration = v1.TransactionExpiration
    return _Tx(
        sender=normalize_address(v1.Sender.to_address_str()),
        inputs=tuple(inputs),
        commands=tuple(commands),
        expiration_epoch=int(expiration.value) if expiration.enum_name == "Epoch" else None,
        gas_budget=int(v1.GasData.Budget),
        gas_coins=tuple(normalize_address(g.ObjectID.to_address_str()) for g in v1.GasData.Payment),
        gas_versions=tuple(int(g.SequenceNumber) for g in v1.GasData.Payment),
    )


def _summarize(tx: _Tx) -> DecodedExtend:
    inputs = tx.inputs

    def at(arg: tuple[str, int]) -> _Input | None:
        return inputs[arg[1]] if arg[0] == "Input" and 0 <= arg[1] < len(inputs) else None

    items: list[tuple[str, int]] = []
    packages: list[str] = []
    calls: list[DecodedCall] = []
    other = 0
    for cmd in tx.commands:
        if cmd.kind != "MoveCall":
            other += cmd.kind != "MergeCoins"
            continue
        if cmd.module != "system" or cmd.function != "extend_blob" or len(cmd.args) != 4:
            other += 1
            continue
        sys_arg, blob_arg, k_arg, coin_arg = cmd.args
        if blob_arg[0] != "Input" or k_arg[0] != "Input":
            other += 1
            continue
        blob_in, k_in = at(blob_arg), at(k_arg)
        if blob_in is None or k_in is None:
            raise ValueError("extend_blob refers to an input that does not exist")
        if blob_in.kind == "Pure" or k_in.kind != "Pure":
            other += 1
            continue
        if len(k_in.pure) != 4:
            raise ValueError("extend_blob epochs argument is not a 4-byte u32")
        assert blob_in.object_id is not None
        k = int.from_bytes(k_in.pure, "little")
        items.append((blob_in.object_id, k))
        if cmd.package not in packages:
            packages.append(cmd.package)
        sys_in, coin_in = at(sys_arg), at(coin_arg)
        shared = sys_in is not None and sys_in.kind == "SharedObject"
        calls.append(
            DecodedCall(
                package_id=cmd.package,
                module=cmd.module,
                function=cmd.function,
                system_object_id=sys_in.object_id if shared and sys_in else None,
                system_mutable=bool(shared and sys_in and sys_in.mutable),
                blob_object_id=blob_in.object_id,
                blob_version=blob_in.version if blob_in.kind == "ImmOrOwnedObject" else -1,
                epochs=k,
                coin_object_id=(
                    coin_in.object_id
                    if coin_in is not None and coin_in.kind == "ImmOrOwnedObject"
                    else None
                ),
            )
        )
    return DecodedExtend(
        sender=tx.sender,
        package_ids=tuple(packages),
        items=tuple(items),
        expiration_epoch=tx.expiration_epoch,
        gas_budget=tx.gas_budget,
        owned_objects=tuple(
            i.object_id for i in inputs if i.kind == "ImmOrOwnedObject" and i.object_id
        ),
        gas_coins=tx.gas_coins,
        calls=tuple(calls),
        other_commands=other,
        gas_versions=tx.gas_versions,
    )


# --- direct BCS for the renewal shape (hot path: 200 calls per batch) ----------------------


class _Unsupported(BcsError):
    """Bytes the direct reader does not cover; pysui's deserializer decides."""


_ARGS = ("GasCoin", "Input", "Result", "NestedResult")
_CALL_ARG_OBJECTS = ("ImmOrOwnedObject", "SharedObject", "Receiving")


class _R(BcsReader):
    """The renewal reader: BCS primitives, plus Sui's digests and PTB arguments."""

    __slots__ = ()

    def digest(self) -> None:
        if self.uleb() != 32:
            raise _Unsupported
        self.take(32)

    def argument(self) -> tuple[str, int]:
        tag = self.uleb()
        if tag == 0:
            return ("GasCoin", -1)
        if tag in (1, 2):
            return (_ARGS[tag], self.u16())
        if tag == 3:
            self.u16()
            self.u16()
            return ("NestedResult", -1)
        raise _Unsupported


def _read_fast(raw: bytes) -> _Tx:
    r = _R(raw)
    if r.uleb() != 0 or r.uleb() != 0:  # TransactionData::V1, TransactionKind::Programmable
        raise _Unsupported
    inputs: list[_Input] = []
    for _ in range(r.uleb()):
        tag = r.uleb()
        if tag == 0:
            inputs.append(_Input("Pure", pure=r.take(r.uleb())))
            continue
        if tag != 1:
            raise _Unsupported
        obj = r.uleb()
        if obj not in (0, 1, 2):
            raise _Unsupported
        oid, version = r.address(), r.u64()
        if obj == 1:
            flag = r.take(1)[0]
            if flag > 1:
                raise _Unsupported
            inputs.append(_Input("SharedObject", oid, version, bool(flag)))
        else:
            r.digest()
            inputs.append(_Input(_CALL_ARG_OBJECTS[obj], oid, version))
    commands: list[_Command] = []
    for _ in range(r.uleb()):
        tag = r.uleb()
        if tag == 0:  # MoveCall
            package, module, function = r.address(), r.string(), r.string()
            if r.uleb() != 0:  # type arguments: not in a renewal
                raise _Unsupported
            args = tuple(r.argument() for _ in range(r.uleb()))
            commands.append(_Command("MoveCall", package, module, function, args))
        elif tag == 1:  # TransferObjects(Vec<Argument>, Argument)
            [r.argument() for _ in range(r.uleb())]
            r.argument()
            commands.append(_Command("TransferObjects"))
        elif tag in (2, 3):  # SplitCoins / MergeCoins (Argument, Vec<Argument>)
            r.argument()
            [r.argument() for _ in range(r.uleb())]
            commands.append(_Command("SplitCoins" if tag == 2 else "MergeCoins"))
        else:
            raise _Unsupported
    sender = r.address()
    gas: list[str] = []
    gas_versions: list[int] = []
    for _ in range(r.uleb()):
        gas.append(r.address())
        gas_versions.append(r.u64())
        r.digest()
    r.address()  # gas owner
    r.u64()  # price
    budget = r.u64()
    exp_tag = r.uleb()
    if exp_tag == 0:
        expiration = None
    elif exp_tag == 1:
        expiration = r.u64()
    else:
        raise _Unsupported
    if r.pos != len(raw):
        raise _Unsupported
    return _Tx(
        sender, tuple(inputs), tuple(commands), expiration, budget, tuple(gas), tuple(gas_versions)
    )


class _W(BcsWriter):
    """The renewal writer: BCS primitives, plus owned-object refs and input arguments."""

    __slots__ = ()

    def addr(self, a: str) -> None:
        self.address(normalize_address(a))

    def owned(self, ref: ObjectRef) -> None:
        self.addr(ref.object_id)
        self.u64(ref.version)
        digest = ref.digest if isinstance(ref.digest, bytes) else b58decode(ref.digest)
        if len(digest) != 32:
            raise ValueError(f"object digest of {ref.object_id} is not 32 bytes")
        self.uleb(32)
        self.buf += digest

    def input_arg(self, index: int) -> None:
        self.uleb(1)
        self.buf += index.to_bytes(2, "little")


def _write_extend_tx(
    *,
    sender: str,
    package_id: str,
    system: SharedRef,
    calls: Sequence[ExtendCall],
    wal_coins: Sequence[ObjectRef],
    gas_payment: Sequence[ObjectRef],
    gas_price: int,
    gas_budget: int,
    expiration_epoch: int | None,
) -> bytes:
    """The same bytes as :func:`build_extend_kind` + pysui's ``TransactionData``, written
    directly: inputs in the builder's order (System, WAL coins, then per call its Blob
    and its ``k`` the first time each is seen), MergeCoins first when needed."""
    inputs = _W()
    n_inputs = 0

    def add_owned(ref: ObjectRef) -> int:
        nonlocal n_inputs
        inputs.uleb(1)
        inputs.uleb(0)
        inputs.owned(ref)
        n_inputs += 1
        return n_inputs - 1

    inputs.uleb(1)
    inputs.uleb(1)
    inputs.addr(system.object_id)
    inputs.u64(system.initial_shared_version)
    inputs.buf.append(1 if system.mutable else 0)
    n_inputs = 1
    primary, *extra = wal_coins
    coin_idx = add_owned(primary)
    extra_idx = [add_owned(c) for c in extra]
    blob_idx: dict[str, int] = {}
    k_idx: dict[int, int] = {}
    cmds = _W()
    n_cmds = 0
    if extra_idx:
        cmds.uleb(3)
        cmds.input_arg(coin_idx)
        cmds.uleb(len(extra_idx))
        for i in extra_idx:
            cmds.input_arg(i)
        n_cmds += 1
    package = bytes.fromhex(normalize_address(package_id)[2:])
    for call in calls:
        key = normalize_address(call.blob.object_id)
        b = blob_idx.get(key)
        if b is None:
            b = blob_idx[key] = add_owned(call.blob)
        k = k_idx.get(call.epochs)
        if k is None:
            inputs.uleb(0)
            inputs.uleb(4)
            inputs.buf += pure_u32(call.epochs)
            k = k_idx[call.epochs] = n_inputs
            n_inputs += 1
        cmds.uleb(0)
        cmds.buf += package
        cmds.string("system")
        cmds.string("extend_blob")
        cmds.uleb(0)
        cmds.uleb(4)
        for index in (0, b, k, coin_idx):
            cmds.input_arg(index)
        n_cmds += 1
    out = _W()
    out.uleb(0)  # TransactionData::V1
    out.uleb(0)  # TransactionKind::ProgrammableTransaction
    out.uleb(n_inputs)
    out.buf += inputs.buf
    out.uleb(n_cmds)
    out.buf += cmds.buf
    out.addr(sender)
    out.uleb(len(gas_payment))
    for g in gas_payment:
        out.owned(g)
    out.addr(sender)
    out.u64(gas_price)
    out.u64(gas_budget)
    if expiration_epoch is None:
        out.uleb(0)
    else:
        out.uleb(1)
        out.u64(expiration_epoch)
    return bytes(out.buf)
