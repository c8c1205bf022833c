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
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass

from pysui.sui.sui_bcs import bcs
from pysui.sui.sui_common.txn_transaction_builder import ProgrammableTransactionBuilder

from walkeep.backends.sui.codec import normalize_address, pure_u32

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
    digest: str  # base58


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


def _owned(ref: ObjectRef) -> bcs.ObjectArg:
    return bcs.ObjectArg(
        "ImmOrOwnedObject",
        bcs.ObjectReference(_addr(ref.object_id), ref.version, bcs.Digest.from_str(ref.digest)),
    )


def _gas_ref(ref: ObjectRef) -> bcs.ObjectReference:
    return bcs.ObjectReference(_addr(ref.object_id), ref.version, bcs.Digest.from_str(ref.digest))


def build_extend_kind(
    *,
    package_id: str,
    system: SharedRef,
    calls: Sequence[ExtendCall],
    wal_coins: Sequence[ObjectRef],
) -> bcs.TransactionKind:
    """The programmable transaction (no gas, no sender): inputs + commands."""
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
    """
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
    # Commands that are neither extend_blob nor MergeCoins (an executor that
    # only knows renewals must refuse a transaction that has any).
    other_commands: int = 0


def decode_extend_tx(tx_bytes: bytes | str) -> DecodedExtend:
    """Parse BCS ``TransactionData`` and list its ``system::extend_blob`` calls.

    Accepts raw bytes or base64. Raises ValueError for anything that is not a
    programmable transaction.
    """
    raw = base64.b64decode(tx_bytes) if isinstance(tx_bytes, str) else tx_bytes
    try:
        data = bcs.TransactionData.deserialize(raw)
    except Exception as exc:  # canoser raises a variety of types on bad input
        raise ValueError(f"not a Sui TransactionData: {exc}") from None
    v1 = data.value
    kind = v1.TransactionKind
    if kind.enum_name != "ProgrammableTransaction":
        raise ValueError(f"not a programmable transaction: {kind.enum_name}")
    pt = kind.value
    inputs = list(pt.Inputs)
    owned = tuple(
        normalize_address(i.value.value.ObjectID.to_address_str())
        for i in inputs
        if i.enum_name == "Object" and i.value.enum_name == "ImmOrOwnedObject"
    )
    items: list[tuple[str, int]] = []
    packages: list[str] = []
    calls: list[DecodedCall] = []
    other = 0
    for command in pt.Command:
        if command.enum_name != "MoveCall":
            other += command.enum_name != "MergeCoins"
            continue
        call = command.value
        if call.Module != "system" or call.Function != "extend_blob" or len(call.Arguments) != 4:
            other += 1
            continue
        sys_arg, blob_arg, k_arg, coin_arg = call.Arguments
        if blob_arg.enum_name != "Input" or k_arg.enum_name != "Input":
            other += 1
            continue
        if blob_arg.value >= len(inputs) or k_arg.value >= len(inputs):
            raise ValueError("extend_blob refers to an input that does not exist")
        blob_input, k_input = inputs[blob_arg.value], inputs[k_arg.value]
        if blob_input.enum_name != "Object" or k_input.enum_name != "Pure":
            other += 1
            continue
        k_bytes = bytes(k_input.value)
        if len(k_bytes) != 4:
            raise ValueError("extend_blob epochs argument is not a 4-byte u32")
        blob_ref = blob_input.value
        blob_id = normalize_address(blob_ref.value.ObjectID.to_address_str())
        k = int.from_bytes(k_bytes, "little")
        items.append((blob_id, k))
        pkg = normalize_address(call.Package.to_address_str())
        if pkg not in packages:
            packages.append(pkg)
        system_id, system_mut = _shared_input(inputs, sys_arg)
        calls.append(
            DecodedCall(
                package_id=pkg,
                module=str(call.Module),
                function=str(call.Function),
                system_object_id=system_id,
                system_mutable=system_mut,
                blob_object_id=blob_id,
                blob_version=(
                    int(blob_ref.value.SequenceNumber)
                    if blob_ref.enum_name == "ImmOrOwnedObject"
                    else -1
                ),
                epochs=k,
                coin_object_id=_owned_input(inputs, coin_arg),
            )
        )
    expiration = v1.TransactionExpiration
    return DecodedExtend(
        sender=normalize_address(v1.Sender.to_address_str()),
        package_ids=tuple(packages),
        items=tuple(items),
        expiration_epoch=int(expiration.value) if expiration.enum_name == "Epoch" else None,
        gas_budget=int(v1.GasData.Budget),
        owned_objects=owned,
        gas_coins=tuple(normalize_address(g.ObjectID.to_address_str()) for g in v1.GasData.Payment),
        calls=tuple(calls),
        other_commands=other,
    )


def _shared_input(inputs: list, arg: object) -> tuple[str | None, bool]:  # type: ignore[type-arg]
    """(object id, mutable) of a SharedObject input argument, or (None, False)."""
    if getattr(arg, "enum_name", None) != "Input" or arg.value >= len(inputs):  # type: ignore[attr-defined]
        return None, False
    inp = inputs[arg.value]  # type: ignore[attr-defined]
    if inp.enum_name != "Object" or inp.value.enum_name != "SharedObject":
        return None, False
    ref = inp.value.value
    return normalize_address(ref.ObjectID.to_address_str()), bool(ref.Mutable)


def _owned_input(inputs: list, arg: object) -> str | None:  # type: ignore[type-arg]
    """The object id of an ImmOrOwnedObject input argument, or None."""
    if getattr(arg, "enum_name", None) != "Input" or arg.value >= len(inputs):  # type: ignore[attr-defined]
        return None
    inp = inputs[arg.value]  # type: ignore[attr-defined]
    if inp.enum_name != "Object" or inp.value.enum_name != "ImmOrOwnedObject":
        return None
    return normalize_address(inp.value.value.ObjectID.to_address_str())
