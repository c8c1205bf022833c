"""From ``sui.rpc.v2`` protobufs (what pysui returns) to Walkeep's domain values.

Coins, Blobs, failure reasons, ``BlobCertified`` events, balance changes and
the calls a transaction made. Each function is tolerant of the spellings the
node might use (notes §3.4: the ``json`` typing is unverified live) and raises
``MoveShapeError`` when nothing fits, so the adapter can report the outcome as
unknown instead of guessing.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from pysui.sui.sui_grpc.suimsgs.sui.rpc import v2 as sui_prot

from walkeep.backends.base import BlobObject
from walkeep.backends.sui.codec import (
    MoveShapeError,
    blob_id_from_u256,
    move_bool,
    move_field,
    move_id,
    move_int,
    move_option,
    normalize_address,
    normalize_type,
)
from walkeep.backends.sui.ptb import ObjectRef, decode_extend_tx

log = logging.getLogger(__name__)

# Move aborts worth naming in operator-facing messages (notes §2.2).
KNOWN_ABORTS = {
    ("blob", 0): "blob is not certified (blob::ENotCertified)",
    ("blob", 2): "blob storage already expired (blob::EResourceBounds)",
    ("system_state_inner", 2): "too many epochs ahead (system_state_inner::EInvalidEpochsAhead)",
    ("balance", 2): "WAL coin too small (balance::ENotEnough)",
}


@dataclass(frozen=True, slots=True)
class Coin:
    ref: ObjectRef
    balance: int


def json_of(obj: Any) -> Any:
    """``Object.json`` / ``Event.json`` (a ``google.protobuf.Value``) as plain Python."""
    value = getattr(obj, "json", None)
    if value is None:
        raise MoveShapeError(f"object {getattr(obj, 'object_id', '?')} carries no JSON content")
    return value.to_dict()


def coin_from_object(obj: Any) -> Coin:
    balance = obj.balance
    if balance is None:
        raw = move_field(json_of(obj), "balance")
        balance = move_int(raw.get("value") if isinstance(raw, dict) else raw, "coin.balance")
    return Coin(
        ObjectRef(normalize_address(obj.object_id), int(obj.version), str(obj.digest)),
        int(balance),
    )


def owner_address(obj: Any) -> str:
    """The owning address (or parent object id); ``""`` for shared/immutable objects."""
    owner = obj.owner
    if owner is None or not owner.address:
        return ""
    return normalize_address(owner.address)


def owned_by_address(obj: Any, address: str) -> bool:
    owner = obj.owner
    return (
        owner is not None
        and owner.kind == sui_prot.OwnerOwnerKind.ADDRESS
        and bool(owner.address)
        and normalize_address(owner.address) == address
    )


def blob_from_object(obj: Any, origin: str) -> BlobObject | None:
    """A Walrus ``Blob`` (notes §2.1 struct); None when the object has another type.

    The type must be exactly ``<origin>::blob::Blob``: a look-alike struct from
    another package is not a Walrus blob, whatever its fields say.
    """
    if normalize_type(obj.object_type or "") != f"{origin}::blob::Blob":
        return None
    j = json_of(obj)
    storage = move_field(j, "storage")
    certified = move_option(j.get("certified_epoch"))
    return BlobObject(
        blob_id=blob_id_from_u256(move_int(move_field(j, "blob_id"), "blob_id")),
        blob_object_id=normalize_address(obj.object_id),
        size=move_int(move_field(j, "size"), "size"),
        storage_size=move_int(move_field(storage, "storage_size"), "storage_size"),
        registered_epoch=move_int(move_field(j, "registered_epoch"), "registered_epoch"),
        end_epoch=move_int(move_field(storage, "end_epoch"), "end_epoch"),
        owner=owner_address(obj),
        certified_epoch=None if certified is None else move_int(certified, "certified_epoch"),
        deletable=move_bool(j.get("deletable", False), "deletable"),
    )


def describe_failure(status: Any) -> str:
    """A one-line reason from ``ExecutionStatus`` (Move abort location and code when known)."""
    err = getattr(status, "error", None)
    if err is None:
        return "transaction failed"
    parts: list[str] = []
    abort = err.abort
    if abort is not None and abort.abort_code is not None:
        loc = abort.location
        module = (loc.module if loc else None) or "?"
        known = KNOWN_ABORTS.get((module, int(abort.abort_code)))
        clever = abort.clever_error.constant_name if abort.clever_error else None
        where = f"{module}::{(loc.function_name if loc else None) or '?'}"
        parts.append(known or clever or f"Move abort {abort.abort_code} in {where}")
        if known or clever:
            parts.append(f"abort {abort.abort_code} in {where}")
    elif err.kind is not None:
        parts.append(err.kind.name)
    if err.description:
        parts.append(err.description)
    if err.command is not None:
        parts.append(f"command {err.command}")
    return "; ".join(parts) or "transaction failed"


def net_gas(effects: Any) -> int | None:
    """MIST actually spent: computation + storage − rebate."""
    gas = effects.gas_used
    if gas is None:
        return None
    return (
        int(gas.computation_cost or 0) + int(gas.storage_cost or 0) - int(gas.storage_rebate or 0)
    )


def requested_items(executed: Any) -> list[tuple[str, int]]:
    """The (blob object id, k) of every ``system::extend_blob`` call in an executed transaction.

    From the transaction's BCS when the node sends it, else from the
    structured ``kind.programmable_transaction``.
    """
    transaction = executed.transaction
    if transaction is None:
        return []
    if transaction.bcs is not None and transaction.bcs.value:
        try:
            return list(decode_extend_tx(bytes(transaction.bcs.value)).items)
        except ValueError:
            log.warning("could not decode transaction BCS of %s", executed.digest)
    kind = transaction.kind
    ptx = kind.programmable_transaction if kind is not None else None
    if ptx is None:
        return []
    inputs = list(ptx.inputs)
    items: list[tuple[str, int]] = []
    for command in ptx.commands:
        call = command.move_call
        if call is None or call.module != "system" or call.function != "extend_blob":
            continue
        if len(call.arguments) != 4:
            continue
        blob_arg, k_arg = call.arguments[1], call.arguments[2]
        if blob_arg.input is None or k_arg.input is None:
            continue
        blob_in, k_in = inputs[blob_arg.input], inputs[k_arg.input]
        if not blob_in.object_id or k_in.pure is None or len(k_in.pure) != 4:
            continue
        items.append((normalize_address(blob_in.object_id), int.from_bytes(k_in.pure, "little")))
    return items


def extension_events(executed: Any, origin: str) -> dict[str, tuple[int, str]]:
    """``BlobCertified{is_extension: true}`` → {blob object id: (new end_epoch, blob_id)}.

    The event's ``epoch`` is the blob's *original* certification epoch (notes
    §5), so it is deliberately not read.
    """
    out: dict[str, tuple[int, str]] = {}
    events = executed.events.events if executed.events is not None else []
    wanted = f"{origin}::events::BlobCertified"
    for event in events:
        if normalize_type(event.event_type or "") != wanted or event.json is None:
            continue
        try:
            j = json_of(event)
            if not move_bool(j.get("is_extension", False), "is_extension"):
                continue
            oid = move_id(move_field(j, "object_id"), "object_id")
            out[oid] = (
                move_int(move_field(j, "end_epoch"), "end_epoch"),
                blob_id_from_u256(move_int(move_field(j, "blob_id"), "blob_id")),
            )
        except (MoveShapeError, ValueError):
            log.warning("unparseable BlobCertified event in %s", executed.digest)
    return out


def wal_spent(executed: Any, address: str, wal_coin_type: str) -> int | None:
    """WAL (FROST) ``address`` lost in this transaction, from its balance changes; None if absent."""
    total: int | None = None
    for change in executed.balance_changes or []:
        if not change.address or not change.coin_type or change.amount is None:
            continue
        if normalize_address(change.address) != address:
            continue
        if normalize_type(change.coin_type) != wal_coin_type:
            continue
        total = (total or 0) + int(change.amount)
    return None if total is None else max(0, -total)
