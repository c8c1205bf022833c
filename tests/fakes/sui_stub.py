"""A fake Sui full node for Walrus renewals, reachable through pysui's real gRPC client.

Where it plugs in: pysui's ``GrpcProtocolClient`` turns every ``SuiCommand``
into a ``sui.rpc.v2`` protobuf request and hands it to a grpclib ``Channel``.
``FakeChannel`` replaces that channel: requests and responses are serialized to
protobuf bytes and parsed back (the wire format), routed by RPC path to
``FakeSuiNode``, and failures come back the way grpclib reports them
(``GRPCError`` with a status, ``asyncio.TimeoutError``, socket errors). Everything
above the channel — pysui's command objects, request building, error mapping,
response rendering — is the real code.

``FakeSuiNode`` is a small ledger with Walrus semantics, not canned replies: it
decodes the BCS ``TransactionData`` with its own decoder (independent of
pysui's, so a builder bug is caught rather than mirrored), checks the Ed25519
signature and every owned object's version/digest, runs ``MergeCoins`` and
``<pkg>::system::extend_blob`` with the Move checks from notes §2.2 (certified,
not expired, 53-epoch cap, coin balance, ``u32`` argument width, package
version), charges gas, bumps versions and answers with effects, events and
balance changes. Re-executing a known digest returns its recorded effects, as
Sui does.

The Move JSON it renders (u64 as strings, u32 as numbers, ``Option`` as
null/value) is our best reading of the gRPC ``json`` field, unverified live;
``u64_as_number=True`` renders u64s as numbers to exercise the other spelling.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import base58
import pysui.sui.sui_grpc.suimsgs.sui.rpc.v2 as sp
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from grpclib.const import Status
from grpclib.exceptions import GRPCError
from pysui.sui.sui_grpc.suimsgs.google import protobuf as gp
from pysui.sui.sui_grpc.suimsgs.google import rpc as grpc_status

SUI_COIN = "0x2::coin::Coin<0x2::sui::SUI>"
MIB = 1 << 20


def norm(addr: str) -> str:
    s = addr.lower().removeprefix("0x")
    return "0x" + s.rjust(64, "0")


def random_id() -> str:
    return "0x" + os.urandom(32).hex()


def random_digest() -> str:
    return base58.b58encode(os.urandom(32)).decode()


def tx_digest(raw: bytes) -> str:
    return base58.b58encode(
        hashlib.blake2b(b"TransactionData::" + raw, digest_size=32).digest()
    ).decode()


# --- an independent BCS reader for TransactionData ---------------------------------------


class BcsError(ValueError):
    pass


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.i = data, 0

    def take(self, n: int) -> bytes:
        if self.i + n > len(self.data):
            raise BcsError("truncated")
        out = self.data[self.i : self.i + n]
        self.i += n
        return out

    def u8(self) -> int:
        return self.take(1)[0]

    def u16(self) -> int:
        return int.from_bytes(self.take(2), "little")

    def u64(self) -> int:
        return int.from_bytes(self.take(8), "little")

    def uleb(self) -> int:
        shift = value = 0
        while True:
            b = self.u8()
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                return value
            shift += 7

    def address(self) -> str:
        return "0x" + self.take(32).hex()

    def blob(self) -> bytes:
        return self.take(self.uleb())

    def string(self) -> str:
        return self.blob().decode()


@dataclass(frozen=True)
class PureInput:
    value: bytes


@dataclass(frozen=True)
class OwnedInput:
    object_id: str
    version: int
    digest: str


@dataclass(frozen=True)
class SharedInput:
    object_id: str
    initial_shared_version: int
    mutable: bool


@dataclass(frozen=True)
class Arg:
    kind: str  # GasCoin | Input | Result | NestedResult
    index: int = 0


@dataclass(frozen=True)
class MoveCallCmd:
    package: str
    module: str
    function: str
    type_args: int
    args: tuple[Arg, ...]


@dataclass(frozen=True)
class MergeCoinsCmd:
    destination: Arg
    sources: tuple[Arg, ...]


@dataclass(frozen=True)
class DecodedTx:
    inputs: tuple[PureInput | OwnedInput | SharedInput, ...]
    commands: tuple[MoveCallCmd | MergeCoinsCmd, ...]
    sender: str
    gas_payment: tuple[OwnedInput, ...]
    gas_owner: str
    gas_price: int
    gas_budget: int
    expiration_epoch: int | None


def _arg(r: _Reader) -> Arg:
    tag = r.uleb()
    if tag == 0:
        return Arg("GasCoin")
    if tag == 1:
        return Arg("Input", r.u16())
    if tag == 2:
        return Arg("Result", r.u16())
    if tag == 3:
        r.u16()
        r.u16()
        return Arg("NestedResult")
    raise BcsError(f"Argument tag {tag}")


def _objref(r: _Reader) -> OwnedInput:
    oid, version = r.address(), r.u64()
    digest = r.blob()
    if len(digest) != 32:
        raise BcsError("object digest is not 32 bytes")
    return OwnedInput(oid, version, base58.b58encode(digest).decode())


def decode_transaction_data(raw: bytes) -> DecodedTx:
    """Sui ``TransactionData::V1`` with a programmable transaction, from scratch."""
    r = _Reader(raw)
    if r.uleb() != 0:
        raise BcsError("TransactionData is not V1")
    if r.uleb() != 0:
        raise BcsError("not a ProgrammableTransaction")
    inputs: list[PureInput | OwnedInput | SharedInput] = []
    for _ in range(r.uleb()):
        tag = r.uleb()
        if tag == 0:
            inputs.append(PureInput(r.blob()))
        elif tag == 1:
            obj_tag = r.uleb()
            if obj_tag == 0:
                inputs.append(_objref(r))
            elif obj_tag == 1:
                oid, initial = r.address(), r.u64()
                mutable = r.u8()
                if mutable not in (0, 1):
                    raise BcsError("bad mutability byte")
                inputs.append(SharedInput(oid, initial, bool(mutable)))
            else:
                raise BcsError(f"ObjectArg tag {obj_tag}")
        else:
            raise BcsError(f"CallArg tag {tag}")
    commands: list[MoveCallCmd | MergeCoinsCmd] = []
    for _ in range(r.uleb()):
        tag = r.uleb()
        if tag == 0:
            pkg, module, function = r.address(), r.string(), r.string()
            n_types = r.uleb()
            if n_types:
                raise BcsError("type arguments not supported by this reader")
            args = tuple(_arg(r) for _ in range(r.uleb()))
            commands.append(MoveCallCmd(pkg, module, function, n_types, args))
        elif tag == 3:
            dest = _arg(r)
            sources = tuple(_arg(r) for _ in range(r.uleb()))
            commands.append(MergeCoinsCmd(dest, sources))
        else:
            raise BcsError(f"Command tag {tag}")
    sender = r.address()
    payment = tuple(_objref(r) for _ in range(r.uleb()))
    owner, price, budget = r.address(), r.u64(), r.u64()
    exp_tag = r.uleb()
    if exp_tag == 0:
        expiration = None
    elif exp_tag == 1:
        expiration = r.u64()
    else:
        raise BcsError(f"TransactionExpiration tag {exp_tag}")
    if r.i != len(raw):
        raise BcsError(f"{len(raw) - r.i} trailing bytes")
    return DecodedTx(
        tuple(inputs), tuple(commands), sender, payment, owner, price, budget, expiration
    )


def verify_user_signature(sig: bytes, tx_bytes: bytes) -> str:
    """Check an Ed25519 Sui signature over blake2b([0,0,0] ‖ tx); return the signer address."""
    if len(sig) != 97 or sig[0] != 0:
        raise ValueError("not an Ed25519 user signature")
    signature, pubkey = sig[1:65], sig[65:]
    message = hashlib.blake2b(bytes([0, 0, 0]) + tx_bytes, digest_size=32).digest()
    Ed25519PublicKey.from_public_bytes(pubkey).verify(signature, message)
    return "0x" + hashlib.blake2b(bytes([0]) + pubkey, digest_size=32).hexdigest()


# --- the ledger -----------------------------------------------------------------------------


@dataclass
class FakeObject:
    object_id: str
    version: int
    digest: str
    object_type: str
    owner_kind: sp.OwnerOwnerKind
    owner: str | None = None  # address for ADDRESS-owned objects
    initial_shared_version: int | None = None
    fields: dict[str, Any] = field(default_factory=dict)  # Move fields (python ints)
    balance: int | None = None  # coins


@dataclass
class Fault:
    method: str  # RPC name, e.g. "ExecuteTransaction"
    action: str  # "raise" | "hang" | "status" | "call" (run ``callback``, then answer normally)
    error: BaseException | None = None
    callback: Callable[[], None] | None = None
    status: Status | None = None
    message: str = ""
    after: bool = False  # run the handler (commit) first, then fail: a lost response
    times: int = 1


class MoveFailure(Exception):
    def __init__(self, status: sp.ExecutionStatus) -> None:
        super().__init__(status.error.description if status.error else "failure")
        self.status = status


class FakeSuiNode:
    """One Sui network with a Walrus deployment and a server wallet."""

    def __init__(
        self,
        *,
        system_id: str,
        type_origin: str,
        wal_coin_type: str,
        walrus_epoch: int = 100,
        storage_price: int = 11_000,
        sui_epoch: int = 700,
        gas_price: int = 1_000,
        max_epochs_ahead: int = 53,
        system_version: int = 3,
        u64_as_number: bool = False,
        page_size: int = 50,
    ) -> None:
        # Switches for answers a real node may shape differently (all unverified live):
        self.tx_bcs = (
            True  # False: transactions come back structured (kind.programmable_transaction)
        )
        self.emit_events = True
        self.report_balance_changes = True
        self.system_id = norm(system_id)
        self.type_origin = norm(type_origin)
        self.wal_coin_type = wal_coin_type
        self.walrus_epoch = walrus_epoch
        self.storage_price = storage_price
        self.sui_epoch = sui_epoch
        self.gas_price = gas_price
        self.max_epochs_ahead = max_epochs_ahead
        self.system_version = system_version
        self.u64_as_number = u64_as_number
        self.page_size = page_size
        self.package_id = random_id()  # current Walrus package (System.package_id)
        self.new_package_id: str | None = None
        self.packages: dict[str, int] = {self.package_id: system_version}
        self.objects: dict[str, FakeObject] = {}
        self.transactions: dict[str, sp.ExecutedTransaction] = {}
        self.checkpoint = 5_000
        self.timestamp = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
        self.calls: list[str] = []
        self.faults: list[Fault] = []
        self.computation_units_per_call = 150
        self.system_shared_version = 1_000
        self.add_object(
            FakeObject(
                self.system_id,
                500,
                random_digest(),
                f"{self.type_origin}::system::System",
                sp.OwnerOwnerKind.SHARED,
                initial_shared_version=self.system_shared_version,
            )
        )

    # --- seeding ---------------------------------------------------------------------------

    def add_object(self, obj: FakeObject) -> FakeObject:
        obj.object_id = norm(obj.object_id)
        self.objects[obj.object_id] = obj
        return obj

    def add_coin(self, owner: str, balance: int, coin_type: str | None = None) -> FakeObject:
        inner = coin_type or self.wal_coin_type
        return self.add_object(
            FakeObject(
                random_id(),
                10,
                random_digest(),
                SUI_COIN if inner == "sui" else f"0x2::coin::Coin<{inner}>",
                sp.OwnerOwnerKind.ADDRESS,
                owner=norm(owner),
                balance=balance,
            )
        )

    def add_sui(self, owner: str, balance: int) -> FakeObject:
        return self.add_coin(owner, balance, "sui")

    def add_blob(
        self,
        owner: str,
        *,
        end_epoch: int,
        storage_size: int = 66_034_000,
        size: int = 17,
        blob_id: int | None = None,
        certified: bool = True,
        registered_epoch: int = 90,
        deletable: bool = True,
        object_type: str | None = None,
        object_id: str | None = None,
    ) -> FakeObject:
        return self.add_object(
            FakeObject(
                object_id or random_id(),
                20,
                random_digest(),
                object_type or f"{self.type_origin}::blob::Blob",
                sp.OwnerOwnerKind.ADDRESS,
                owner=norm(owner),
                fields={
                    "registered_epoch": registered_epoch,
                    "blob_id": blob_id if blob_id is not None else int.from_bytes(os.urandom(32)),
                    "size": size,
                    "encoding_type": 1,
                    "certified_epoch": registered_epoch if certified else None,
                    "storage": {
                        "id": random_id(),
                        "start_epoch": registered_epoch,
                        "end_epoch": end_epoch,
                        "storage_size": storage_size,
                    },
                    "deletable": deletable,
                },
            )
        )

    def inject(self, method: str, action: str = "raise", **kw: Any) -> Fault:
        fault = Fault(method, action, **kw)
        self.faults.append(fault)
        return fault

    def count(self, method: str) -> int:
        return sum(1 for c in self.calls if c == method)

    # --- rendering -------------------------------------------------------------------------

    def _u64(self, v: int) -> int | str:
        return v if self.u64_as_number else str(v)

    def _df_id(self) -> str:
        name = self.system_version.to_bytes(8, "little")
        pre = b"\xf0" + bytes.fromhex(self.system_id[2:]) + (8).to_bytes(8, "little") + name
        return "0x" + hashlib.blake2b(pre + b"\x02", digest_size=32).hexdigest()

    def _json(self, obj: FakeObject) -> dict[str, Any] | None:
        u = self._u64
        if obj.object_id == self.system_id:
            return {
                "id": obj.object_id,
                "version": u(self.system_version),
                "package_id": self.package_id,
                "new_package_id": self.new_package_id,
            }
        if obj.object_type.endswith("::blob::Blob"):
            f = obj.fields
            st = f["storage"]
            return {
                "id": obj.object_id,
                "registered_epoch": f["registered_epoch"],
                "blob_id": str(f["blob_id"]),
                "size": u(f["size"]),
                "encoding_type": f["encoding_type"],
                "certified_epoch": f["certified_epoch"],
                "storage": {
                    "id": st["id"],
                    "start_epoch": st["start_epoch"],
                    "end_epoch": st["end_epoch"],
                    "storage_size": u(st["storage_size"]),
                },
                "deletable": f["deletable"],
            }
        if obj.balance is not None:
            return {"id": obj.object_id, "balance": u(obj.balance)}
        return {"id": obj.object_id}

    def _inner_object(self) -> sp.Object:
        u = self._u64
        return sp.Object(
            object_id=self._df_id(),
            version=500,
            digest=random_digest(),
            owner=sp.Owner(kind=sp.OwnerOwnerKind.OBJECT, address=self.system_id),
            object_type=f"0x2::dynamic_field::Field<u64, {self.type_origin}::system_state_inner::SystemStateInnerV1>",
            json=gp.Value.from_dict(
                {
                    "id": self._df_id(),
                    "name": u(self.system_version),
                    "value": {
                        "committee": {"members": [], "n_shards": 1000, "epoch": self.walrus_epoch},
                        "total_capacity_size": u(10**15),
                        "used_capacity_size": u(10**12),
                        "storage_price_per_unit_size": u(self.storage_price),
                        "write_price_per_unit_size": u(20_000),
                        "future_accounting": {
                            "current_index": 0,
                            "length": self.max_epochs_ahead,
                            "ring_buffer": [],
                        },
                    },
                }
            ),
        )

    def render(self, obj: FakeObject) -> sp.Object:
        owner = (
            sp.Owner(kind=obj.owner_kind, version=obj.initial_shared_version)
            if obj.owner_kind == sp.OwnerOwnerKind.SHARED
            else sp.Owner(kind=obj.owner_kind, address=obj.owner)
        )
        data = self._json(obj)
        return sp.Object(
            object_id=obj.object_id,
            version=obj.version,
            digest=obj.digest,
            owner=owner,
            object_type=obj.object_type,
            json=gp.Value.from_dict(data) if data is not None else None,
            balance=obj.balance,
        )

    def _lookup_object(self, oid: str) -> sp.Object | None:
        oid = norm(oid)
        if oid == self._df_id():
            return self._inner_object()
        obj = self.objects.get(oid)
        return self.render(obj) if obj else None

    # --- RPC handlers (protobuf in, protobuf out) --------------------------------------------

    async def GetObject(self, req: sp.GetObjectRequest) -> sp.GetObjectResponse:
        obj = self._lookup_object(req.object_id or "")
        if obj is None:
            raise GRPCError(Status.NOT_FOUND, f"object {req.object_id} not found")
        return sp.GetObjectResponse(object=obj)

    async def BatchGetObjects(self, req: sp.BatchGetObjectsRequest) -> sp.BatchGetObjectsResponse:
        out = []
        for r in req.requests:
            obj = self._lookup_object(r.object_id or "")
            out.append(
                sp.GetObjectResult(object=obj)
                if obj is not None
                else sp.GetObjectResult(
                    error=grpc_status.Status(code=5, message=f"{r.object_id} not found")
                )
            )
        return sp.BatchGetObjectsResponse(objects=out)

    async def ListOwnedObjects(
        self, req: sp.ListOwnedObjectsRequest
    ) -> sp.ListOwnedObjectsResponse:
        owner = norm(req.owner or "")
        wanted = req.object_type
        matching = sorted(
            (
                o
                for o in self.objects.values()
                if o.owner_kind == sp.OwnerOwnerKind.ADDRESS
                and o.owner == owner
                and (wanted is None or _same_type(o.object_type, wanted))
            ),
            key=lambda o: o.object_id,
        )
        start = int(req.page_token.decode()) if req.page_token else 0
        size = req.page_size or self.page_size
        page = matching[start : start + size]
        more = start + size < len(matching)
        return sp.ListOwnedObjectsResponse(
            objects=[self.render(o) for o in page],
            next_page_token=str(start + size).encode() if more else None,
        )

    async def GetEpoch(self, req: sp.GetEpochRequest) -> sp.GetEpochResponse:
        start = self.timestamp - timedelta(hours=3)
        return sp.GetEpochResponse(
            epoch=sp.Epoch(
                epoch=self.sui_epoch,
                reference_gas_price=self.gas_price,
                start=start,
                end=None,
            )
        )

    async def GetTransaction(self, req: sp.GetTransactionRequest) -> sp.GetTransactionResponse:
        executed = self.transactions.get(req.digest or "")
        if executed is None:
            raise GRPCError(Status.NOT_FOUND, f"transaction {req.digest} not found")
        return sp.GetTransactionResponse(transaction=executed)

    async def ExecuteTransaction(
        self, req: sp.ExecuteTransactionRequest
    ) -> sp.ExecuteTransactionResponse:
        raw = bytes(req.transaction.bcs.value)
        digest = tx_digest(raw)
        if digest in self.transactions:
            return sp.ExecuteTransactionResponse(transaction=self.transactions[digest])
        sigs = [bytes(s.bcs.value) for s in req.signatures]
        executed = self.run(raw, signatures=sigs, commit=True)
        return sp.ExecuteTransactionResponse(transaction=executed)

    async def SimulateTransaction(
        self, req: sp.SimulateTransactionRequest
    ) -> sp.SimulateTransactionResponse:
        raw = bytes(req.transaction.bcs.value)
        return sp.SimulateTransactionResponse(
            transaction=self.run(raw, signatures=None, commit=False)
        )

    # --- execution engine -------------------------------------------------------------------

    def _refuse(self, message: str) -> GRPCError:
        return GRPCError(Status.INVALID_ARGUMENT, message)

    def run(
        self, raw: bytes, *, signatures: list[bytes] | None, commit: bool
    ) -> sp.ExecutedTransaction:
        """Validate like a validator, execute like Move; commit only when asked."""
        try:
            tx = decode_transaction_data(raw)
        except BcsError as exc:
            raise self._refuse(f"invalid transaction bytes: {exc}") from None
        digest = tx_digest(raw)
        sender = norm(tx.sender)
        if signatures is not None:
            if len(signatures) != 1:
                raise self._refuse("expected one signature")
            try:
                signer = verify_user_signature(signatures[0], raw)
            except (ValueError, InvalidSignature):
                raise self._refuse("signature does not verify") from None
            if signer != sender:
                raise self._refuse("signature is not the sender's")
        if tx.expiration_epoch is not None and self.sui_epoch > tx.expiration_epoch:
            raise self._refuse("TransactionExpired")
        if tx.gas_price < self.gas_price:
            raise self._refuse("gas price below reference gas price")
        if norm(tx.gas_owner) != sender:
            raise self._refuse("sponsored transactions are not supported here")
        # Owned inputs and gas must be current and owned by the sender.
        seen: set[str] = set()
        for ref in (*tx.gas_payment, *(i for i in tx.inputs if isinstance(i, OwnedInput))):
            oid = norm(ref.object_id)
            if oid in seen:
                raise self._refuse(f"duplicate object input {oid}")
            seen.add(oid)
            obj = self.objects.get(oid)
            if obj is None or obj.version != ref.version or obj.digest != ref.digest:
                raise self._refuse(f"ObjectVersionUnavailableForConsumption {oid}@{ref.version}")
            if obj.owner_kind != sp.OwnerOwnerKind.ADDRESS or obj.owner != sender:
                raise self._refuse(f"object {oid} is not owned by the sender")
        for inp in tx.inputs:
            if isinstance(inp, SharedInput):
                obj = self.objects.get(norm(inp.object_id))
                if obj is None or obj.owner_kind != sp.OwnerOwnerKind.SHARED:
                    raise self._refuse(f"{inp.object_id} is not a shared object")
                if obj.initial_shared_version != inp.initial_shared_version:
                    raise self._refuse("wrong initial shared version")
        gas_coins = [self.objects[norm(g.object_id)] for g in tx.gas_payment]
        if not gas_coins or any(c.object_type != SUI_COIN for c in gas_coins):
            raise self._refuse("gas must be paid with SUI coins")
        gas_balance = sum(c.balance or 0 for c in gas_coins)
        if gas_balance < tx.gas_budget:
            raise self._refuse("GasBalanceTooLow")

        n_calls = sum(1 for c in tx.commands if isinstance(c, MoveCallCmd))
        computation = self.gas_price * (1_000 + self.computation_units_per_call * n_calls)
        storage_cost, storage_rebate = 988_000 * n_calls + 1_976_000, 978_120 * n_calls + 1_956_240
        net_gas = computation + storage_cost - storage_rebate

        # Work on copies so a failure applies nothing but gas.
        work = {oid: _copy(o) for oid, o in self.objects.items()}
        events: list[sp.Event] = []
        wal_delta: int = 0
        status = sp.ExecutionStatus(success=True)
        try:
            if computation + max(0, storage_cost - storage_rebate) > tx.gas_budget:
                raise MoveFailure(
                    sp.ExecutionStatus(
                        success=False,
                        error=sp.ExecutionError(
                            description="InsufficientGas",
                            kind=sp.ExecutionErrorExecutionErrorKind.INSUFFICIENT_GAS,
                        ),
                    )
                )
            for index, command in enumerate(tx.commands):
                wal_delta += self._command(tx, index, command, work, events)
        except MoveFailure as failure:
            status = failure.status
            work = {oid: _copy(o) for oid, o in self.objects.items()}
            events, wal_delta = [], 0
        charged = net_gas if status.success else min(tx.gas_budget, computation)
        gas_primary = work[norm(tx.gas_payment[0].object_id)]
        gas_primary.balance = gas_balance - charged
        for extra in tx.gas_payment[1:]:
            del work[norm(extra.object_id)]

        lamport = 1 + max(
            [
                o.version
                for o in (
                    *gas_coins,
                    *(
                        self.objects[norm(i.object_id)]
                        for i in tx.inputs
                        if isinstance(i, OwnedInput)
                    ),
                )
            ]
            + [self.objects[self.system_id].version]
        )
        mutated: list[str] = [norm(tx.gas_payment[0].object_id)]
        if status.success:
            for inp in tx.inputs:
                if isinstance(inp, OwnedInput | SharedInput) and norm(inp.object_id) in work:
                    mutated.append(norm(inp.object_id))
        else:
            # A failed transaction still bumps the versions of its owned inputs.
            for inp in tx.inputs:
                if isinstance(inp, OwnedInput):
                    mutated.append(norm(inp.object_id))
        for oid in mutated:
            work[oid].version = lamport
            work[oid].digest = random_digest()

        balance_changes = [
            sp.BalanceChange(address=sender, coin_type="0x2::sui::SUI", amount=str(-charged))
        ]
        if wal_delta:
            balance_changes.append(
                sp.BalanceChange(
                    address=sender, coin_type=self.wal_coin_type, amount=str(wal_delta)
                )
            )
        if not self.report_balance_changes:
            balance_changes = []
        self.checkpoint += 1
        executed = sp.ExecutedTransaction(
            digest=digest,
            transaction=self._render_transaction(tx, raw, digest),
            signatures=[sp.UserSignature(bcs=sp.Bcs(value=s)) for s in signatures or []],
            effects=sp.TransactionEffects(
                status=status,
                epoch=self.sui_epoch,
                transaction_digest=digest,
                gas_used=sp.GasCostSummary(
                    computation_cost=computation,
                    storage_cost=storage_cost if status.success else 0,
                    storage_rebate=storage_rebate if status.success else 0,
                    non_refundable_storage_fee=0,
                ),
                lamport_version=lamport,
            ),
            events=sp.TransactionEvents(events=events) if events and self.emit_events else None,
            checkpoint=self.checkpoint if commit else None,
            timestamp=self.timestamp if commit else None,
            balance_changes=balance_changes,
        )
        if commit:
            self.objects = work
            self.transactions[digest] = executed
        return executed

    def _render_transaction(self, tx: DecodedTx, raw: bytes, digest: str) -> sp.Transaction:
        sender = norm(tx.sender)
        if self.tx_bcs:
            return sp.Transaction(
                bcs=sp.Bcs(name="TransactionData", value=raw), digest=digest, sender=sender
            )

        def arg(a: Arg) -> sp.Argument:
            if a.kind == "Input":
                return sp.Argument(kind=sp.ArgumentArgumentKind.INPUT, input=a.index)
            return sp.Argument(kind=sp.ArgumentArgumentKind.GAS)

        inputs = []
        for i in tx.inputs:
            if isinstance(i, PureInput):
                inputs.append(sp.Input(kind=sp.InputInputKind.PURE, pure=i.value))
            elif isinstance(i, OwnedInput):
                inputs.append(
                    sp.Input(
                        kind=sp.InputInputKind.IMMUTABLE_OR_OWNED,
                        object_id=i.object_id,
                        version=i.version,
                        digest=i.digest,
                    )
                )
            else:
                inputs.append(
                    sp.Input(
                        kind=sp.InputInputKind.SHARED,
                        object_id=i.object_id,
                        version=i.initial_shared_version,
                        mutable=i.mutable,
                    )
                )
        commands = []
        for c in tx.commands:
            if isinstance(c, MoveCallCmd):
                commands.append(
                    sp.Command(
                        move_call=sp.MoveCall(
                            package=c.package,
                            module=c.module,
                            function=c.function,
                            arguments=[arg(a) for a in c.args],
                        )
                    )
                )
            else:
                commands.append(
                    sp.Command(
                        merge_coins=sp.MergeCoins(
                            coin=arg(c.destination), coins_to_merge=[arg(a) for a in c.sources]
                        )
                    )
                )
        return sp.Transaction(
            digest=digest,
            sender=sender,
            kind=sp.TransactionKind(
                kind=sp.TransactionKindKind.PROGRAMMABLE_TRANSACTION,
                programmable_transaction=sp.ProgrammableTransaction(
                    inputs=inputs, commands=commands
                ),
            ),
        )

    def _abort(self, module: str, code: int, function: str, command: int) -> MoveFailure:
        return MoveFailure(
            sp.ExecutionStatus(
                success=False,
                error=sp.ExecutionError(
                    description=f"MoveAbort in {module}::{function} with code {code}",
                    command=command,
                    kind=sp.ExecutionErrorExecutionErrorKind.MOVE_ABORT,
                    abort=sp.MoveAbort(
                        abort_code=code,
                        location=sp.MoveLocation(
                            package=self.package_id, module=module, function_name=function
                        ),
                    ),
                ),
            )
        )

    def _arg_error(self, description: str, command: int) -> MoveFailure:
        return MoveFailure(
            sp.ExecutionStatus(
                success=False,
                error=sp.ExecutionError(
                    description=description,
                    command=command,
                    kind=sp.ExecutionErrorExecutionErrorKind.COMMAND_ARGUMENT_ERROR,
                ),
            )
        )

    def _input(self, tx: DecodedTx, arg: Arg, command: int) -> PureInput | OwnedInput | SharedInput:
        if arg.kind != "Input" or arg.index >= len(tx.inputs):
            raise self._arg_error(f"unsupported argument {arg}", command)
        return tx.inputs[arg.index]

    def _command(
        self,
        tx: DecodedTx,
        index: int,
        command: MoveCallCmd | MergeCoinsCmd,
        work: dict[str, FakeObject],
        events: list[sp.Event],
    ) -> int:
        """Run one command on ``work``; returns the WAL balance delta for the sender."""
        if isinstance(command, MergeCoinsCmd):
            dest = self._input(tx, command.destination, index)
            if not isinstance(dest, OwnedInput):
                raise self._arg_error("merge destination must be an object", index)
            target = work[norm(dest.object_id)]
            for src_arg in command.sources:
                src = self._input(tx, src_arg, index)
                if not isinstance(src, OwnedInput):
                    raise self._arg_error("merge source must be an object", index)
                coin = work.pop(norm(src.object_id))
                if coin.object_type != target.object_type:
                    raise self._arg_error("merging coins of different types", index)
                target.balance = (target.balance or 0) + (coin.balance or 0)
            return 0
        if command.module != "system" or command.function != "extend_blob":
            raise self._arg_error(f"unknown function {command.module}::{command.function}", index)
        pkg = norm(command.package)
        if pkg not in self.packages:
            raise MoveFailure(
                sp.ExecutionStatus(
                    success=False,
                    error=sp.ExecutionError(
                        description="FunctionNotFound",
                        command=index,
                        kind=sp.ExecutionErrorExecutionErrorKind.FUNCTION_NOT_FOUND,
                    ),
                )
            )
        if self.packages[pkg] != self.system_version:
            raise self._abort("system", 0, "inner_mut", index)  # EWrongVersion
        if len(command.args) != 4:
            raise self._arg_error("extend_blob takes 4 arguments", index)
        system, blob_in, k_in, coin_in = (self._input(tx, a, index) for a in command.args)
        if not isinstance(system, SharedInput) or norm(system.object_id) != self.system_id:
            raise self._arg_error("argument 0 must be the Walrus System", index)
        if not system.mutable:
            raise self._arg_error("System must be passed mutably", index)
        if not isinstance(blob_in, OwnedInput) or not isinstance(coin_in, OwnedInput):
            raise self._arg_error("blob and coin must be owned objects", index)
        if not isinstance(k_in, PureInput) or len(k_in.value) != 4:
            raise self._arg_error("InvalidBCSBytes: extended_epochs is not a u32", index)
        k = int.from_bytes(k_in.value, "little")
        blob = work[norm(blob_in.object_id)]
        coin = work[norm(coin_in.object_id)]
        if (
            not blob.object_type.endswith("::blob::Blob")
            or norm(blob.object_type.split("::")[0]) != self.type_origin
        ):
            raise self._arg_error("argument 1 is not a Blob", index)
        if coin.object_type != f"0x2::coin::Coin<{self.wal_coin_type}>":
            raise self._arg_error("argument 3 is not a Coin<WAL>", index)
        f = blob.fields
        if f["certified_epoch"] is None:
            raise self._abort("blob", 0, "assert_certified_not_expired", index)
        end = f["storage"]["end_epoch"]
        if self.walrus_epoch >= end:
            raise self._abort("blob", 2, "assert_certified_not_expired", index)
        if k == 0 or end - self.walrus_epoch + k > self.max_epochs_ahead:
            raise self._abort("system_state_inner", 2, "extend_blob", index)
        units = -(-f["storage"]["storage_size"] // MIB)
        cost = units * self.storage_price * k
        if (coin.balance or 0) < cost:
            raise self._abort("balance", 2, "split", index)
        coin.balance = (coin.balance or 0) - cost
        f["storage"]["end_epoch"] = end + k
        events.append(
            sp.Event(
                package_id=pkg,
                module="system",
                sender=norm(tx.sender),
                event_type=f"{self.type_origin}::events::BlobCertified",
                json=gp.Value.from_dict(
                    {
                        "epoch": f["certified_epoch"],
                        "blob_id": str(f["blob_id"]),
                        "end_epoch": end + k,
                        "deletable": f["deletable"],
                        "object_id": blob.object_id,
                        "is_extension": True,
                    }
                ),
            )
        )
        return -cost


def _copy(obj: FakeObject) -> FakeObject:
    import copy

    return copy.deepcopy(obj)


def _same_type(a: str, b: str) -> bool:
    import re

    def n(t: str) -> str:
        return re.sub(r"0x[0-9a-fA-F]+", lambda m: norm(m.group(0)), t)

    return n(a) == n(b)


# --- the channel pysui talks to -------------------------------------------------------------------


class _FakeStream:
    def __init__(
        self,
        channel: FakeChannel,
        name: str,
        request_type: type,
        reply_type: type,
        timeout: float | None,
    ) -> None:
        self._channel, self._name = channel, name
        self._request_type, self._reply_type = request_type, reply_type
        self._timeout = timeout
        self._request: Any = None

    async def __aenter__(self) -> _FakeStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def send_message(self, message: Any, end: bool = False) -> None:
        # Through the wire format and back.
        self._request = self._request_type.FromString(bytes(message))

    async def recv_message(self) -> Any:
        call = self._channel.node_call(self._name, self._request)
        if self._timeout is not None:
            reply = await asyncio.wait_for(call, self._timeout)
        else:
            reply = await call
        return self._reply_type.FromString(bytes(reply))


class FakeChannel:
    """Stands in for ``grpclib.client.Channel`` (only ``request`` and ``close`` are used)."""

    def __init__(self, node: FakeSuiNode) -> None:
        self.node = node
        self.closed = False

    def request(
        self,
        name: str,
        cardinality: Any,
        request_type: type,
        reply_type: type,
        *,
        timeout: float | None = None,
        deadline: Any = None,
        metadata: Any = None,
    ) -> _FakeStream:
        return _FakeStream(self, name, request_type, reply_type, timeout)

    async def node_call(self, route: str, request: Any) -> Any:
        method = route.rsplit("/", 1)[-1]
        node = self.node
        node.calls.append(method)
        handler: Callable[[Any], Any] | None = getattr(node, method, None)
        if handler is None:
            raise GRPCError(Status.UNIMPLEMENTED, f"{route} not implemented by the fake")
        fault = next((f for f in node.faults if f.method == method and f.times > 0), None)
        if fault is not None:
            fault.times -= 1
            if fault.after:
                await handler(request)
            if fault.action == "call":
                assert fault.callback is not None
                fault.callback()
                return await handler(request)
            if fault.action == "hang":
                await asyncio.Event().wait()
            if fault.action == "status":
                raise GRPCError(fault.status or Status.INTERNAL, fault.message)
            assert fault.error is not None
            raise fault.error
        return await handler(request)

    def close(self) -> None:
        self.closed = True
