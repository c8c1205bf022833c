"""``SuiChain``: the real Chain port — Walrus ``extend_blob`` renewals over Sui gRPC (pysui 1.5.1).

How one renewal batch goes (DESIGN §2, §3 renewals; notes §2–§3):

1. ``prepare_extend`` reads the Walrus System object and its inner state (the
   dynamic field keyed by ``System.version``) for the current Walrus epoch, the
   storage price, the package to call (``System.package_id``) and the 53-epoch
   cap; reads every Blob and refuses early (``ChainRejected``) if one is
   unknown, not ours, uncertified, expired or would pass the cap; picks one WAL
   coin (merging more in the same PTB when one is short) and SUI gas coins;
   builds ONE programmable transaction with the low-level builder; optionally
   dry-runs it to size the gas budget; signs it; returns the digest *before*
   anything is submitted, so the caller can record the intent first.
2. ``execute`` submits exactly those bytes. A Move abort (effects status
   failure) is ``ChainRejected``: the batch applied nothing (gas was paid).
   Anything that leaves the outcome unknown (timeouts, dropped connections,
   unexpected answers) is ``ChainUnavailable``: reconcile by digest.
3. ``get_transaction`` answers "did this digest happen, and what did it do?".

Every transaction carries an *epoch expiration* (current Sui epoch + 1). Sui
validators refuse a transaction once the chain has moved past that epoch, so a
signed transaction whose submission was lost can land at most ~1–2 days (two
Sui epochs) later and never after. Reconciliation can therefore treat "digest
not found and :meth:`SuiChain.is_expired` is true" as final: nothing happened,
release the hold, renew again with a fresh transaction. Without an expiration
the old bytes would stay valid for as long as their object versions are
current, and a second renewal would risk paying twice.

Concurrency: all pysui calls run on one private event loop (see ``runner``),
so any number of worker threads may call the adapter. Two transactions spending
the same owned object version must never be in flight together (validators can
lock the object until the epoch ends), so the owned objects of a submitted,
unsettled transaction are held in-process: ``prepare_extend`` picks other
coins and ``execute`` refuses to submit a conflicting transaction. Across
*processes* nothing is held: run renewals for one wallet from one worker.

Why one file: the Chain port over Sui in the order a renewal runs (prepare, submit,
confirm, recover), each step against the notes it follows.
"""

from __future__ import annotations

import asyncio
import base64
import logging
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from grpclib.const import Status
from pysui.sui.sui_common import sui_commands as cmd
from pysui.sui.sui_grpc.suimsgs.sui.rpc import v2 as sui_prot

from walkeep.backends.base import (
    BlobExtension,
    BlobObject,
    ChainError,
    ChainRejected,
    ChainUnavailable,
    EpochInfo,
    PreparedTx,
    TxEffects,
)
from walkeep.backends.sui.client import REFUSED, RpcFailed, load_keypair, make_grpc_client
from walkeep.backends.sui.codec import (
    U32_MAX,
    MoveShapeError,
    df_id_u64,
    move_field,
    move_id,
    move_int,
    move_option,
    normalize_address,
    split_batches,
    tx_digest,
)
from walkeep.backends.sui.parse import (
    Coin,
    blob_from_object,
    coin_from_object,
    describe_failure,
    extension_events,
    json_of,
    net_gas,
    owned_by_address,
    requested_items,
    wal_spent,
)
from walkeep.backends.sui.presets import SUI_PRESETS, SuiPreset
from walkeep.backends.sui.ptb import (
    MAX_GAS_COINS,
    MAX_MERGE_COINS,
    ExtendCall,
    ObjectRef,
    SharedRef,
    build_extend_tx,
    decode_extend_tx,
)
from walkeep.backends.sui.runner import LoopThread, LoopTimeout
from walkeep.clock import Clock, SystemClock
from walkeep.config import Settings
from walkeep.errors import ConfigurationError
from walkeep.protocol.walrus import MAX_EPOCHS_AHEAD, walrus_storage_cost_frost

log = logging.getLogger(__name__)

# One extend_blob call adds ~141 BCS bytes (an owned-object input + a MoveCall),
# so 200 calls ≈ 29 KB; Sui caps a PTB at 1024 commands and a transaction at
# 128 KiB, which 800 calls (≈ 113 KB) still clears with room for the merge and
# signature. The default follows the worker's ``renew_batch`` (200).
DEFAULT_MAX_BATCH = 200
HARD_MAX_BATCH = 800
SUI_COIN_TYPE = "0x2::coin::Coin<0x2::sui::SUI>"
_OBJECTS_PER_BATCH_GET = 50  # pysui's MAX_MULTI_OBJECT_FETCH
_MAX_COIN_PAGES = 20
_GAS_SAFE_OVERHEAD_UNITS = 1000  # same headroom the official TS SDK adds after a dry run
_PREPARED_CACHE = 1024


class SuiPreconditionFailed(ChainRejected):
    """Refused before signing: nothing was built or submitted.

    ``problems`` maps each offending blob object id to why, so the caller can
    drop those blobs and retry the rest of the batch.
    """

    def __init__(self, problems: dict[str, str]) -> None:
        self.problems = dict(problems)
        detail = "; ".join(f"{oid}: {why}" for oid, why in sorted(self.problems.items()))
        super().__init__(f"cannot extend {len(self.problems)} blob(s): {detail}")


class SuiExecutionFailed(ChainRejected):
    """Executed on chain with status failure: no blob was extended, gas was charged.

    ``effects`` is the failed transaction as recorded (digest, gas), for audit.
    """

    def __init__(self, message: str, effects: TxEffects) -> None:
        super().__init__(message)
        self.effects = effects


@dataclass(frozen=True, slots=True)
class WalrusState:
    """What ``extend_blob`` depends on, read from the System object and its inner field."""

    epoch: int  # Walrus epoch (committee.epoch), not the Sui epoch
    storage_price_frost: int  # per 1 MiB unit per epoch
    package_id: str  # call target (System.package_id)
    new_package_id: str | None  # set while a Walrus upgrade awaits migration
    version: int
    system: SharedRef
    type_origin: str  # package that defined System/Blob/events
    max_epochs_ahead: int


@dataclass(frozen=True, slots=True)
class _Prepared:
    """Facts known at prepare time, kept to describe the effects precisely."""

    extensions: tuple[BlobExtension, ...]
    walrus_epoch: int
    wal_estimate_frost: int
    expiration_epoch: int


@dataclass(slots=True)
class _InFlight:
    """Owned objects (coins, blobs) of a submitted, unsettled transaction.

    Two transactions spending the same owned object version must never be in
    flight together (validators may lock the object until the epoch ends).
    Held from submission until the outcome is known; after an unknown outcome
    for ``in_flight_hold_seconds`` more (or until the digest is found, or its
    expiration epoch has passed). Prepared-but-unsubmitted transactions hold
    nothing: callers may prepare and discard freely.
    """

    objects: frozenset[str]
    expiration_epoch: int | None
    until: float | None = None  # None while the submission is still running


# --- coin and gas policy -------------------------------------------------------------------------


def select_coins(coins: Sequence[Coin], *, need: int, want: int, max_count: int) -> list[Coin]:
    """Pick coins, largest first, until ``want`` is covered (or at least ``need``).

    Returns ``[]`` when even ``max_count`` of the largest coins cannot cover
    ``need``. A single coin is preferred so the common case needs no merge.
    Deterministic: ties break on object id.
    """
    ordered = sorted(
        (c for c in coins if c.balance > 0), key=lambda c: (-c.balance, c.ref.object_id)
    )
    if ordered and ordered[0].balance >= want:
        return [ordered[0]]
    chosen: list[Coin] = []
    total = 0
    for coin in ordered[:max_count]:
        chosen.append(coin)
        total += coin.balance
        if total >= want:
            return chosen
    return chosen if total >= need and chosen else []


def gas_budget_from_simulation(effects: Any, gas_price: int) -> int:
    """Budget after a dry run, as the official TS SDK sizes it.

    ``computation + overhead`` covers execution; storage cost minus rebate is
    added when positive. The budget is a ceiling: unused gas is refunded.
    """
    used = effects.gas_used
    computation = int(used.computation_cost or 0)
    storage = int(used.storage_cost or 0)
    rebate = int(used.storage_rebate or 0)
    base = computation + _GAS_SAFE_OVERHEAD_UNITS * gas_price
    return max(base, base + storage - rebate)


# --- the adapter ----------------------------------------------------------------------------------


class SuiChain:
    """Chain port on Sui testnet/mainnet. Synchronous; thread-safe; lazy (no RPC until used)."""

    def __init__(
        self,
        settings: Settings,
        *,
        client: Any | None = None,
        rpc_timeout: float = 15.0,
        execute_timeout: float = 60.0,
        operation_timeout: float = 180.0,
        max_batch: int | None = None,
        simulate: bool = True,
        gas_budget_base_mist: int = 20_000_000,
        gas_budget_per_call_mist: int = 5_000_000,
        max_gas_budget_mist: int = 5_000_000_000,
        wal_buffer_percent: int = 10,
        expiration_epochs: int = 1,
        in_flight_hold_seconds: float = 300.0,
        clock: Clock | None = None,
    ) -> None:
        if settings.network not in SUI_PRESETS:
            raise ConfigurationError(
                f"WALKEEP_NETWORK={settings.network!r}: the Sui chain runs on testnet or mainnet"
            )
        if max_batch is None:
            max_batch = min(settings.renew_batch, HARD_MAX_BATCH)
        if not 1 <= max_batch <= HARD_MAX_BATCH:
            raise ConfigurationError(f"max_batch must be between 1 and {HARD_MAX_BATCH}")
        self.network: str = settings.network
        self.preset: SuiPreset = SUI_PRESETS[settings.network].with_overrides(settings)
        self._keypair, self._address = load_keypair(settings.sui_private_key)
        self._key_string = (settings.sui_private_key or "").strip()
        self.max_batch = max_batch
        self._client = client
        self._owns_client = client is None
        self._rpc_timeout = rpc_timeout
        self._execute_timeout = execute_timeout
        self._operation_timeout = operation_timeout
        self._simulate = simulate
        self._gas_base = gas_budget_base_mist
        self._gas_per_call = gas_budget_per_call_mist
        self._gas_max = max_gas_budget_mist
        self._wal_buffer_percent = wal_buffer_percent
        self._expiration_epochs = expiration_epochs
        self._in_flight_hold = in_flight_hold_seconds
        self._clock: Clock = clock or SystemClock()
        self._loop = LoopThread(name=f"walkeep-sui-{self.network}")
        self._type_origin: str | None = None
        # Loop-thread-only state (every coroutine runs on the single loop thread).
        self._prepared: OrderedDict[str, _Prepared] = OrderedDict()
        self._in_flight: dict[str, _InFlight] = {}

    # --- plumbing ------------------------------------------------------------------------

    @staticmethod
    def split_batches(
        items: Sequence[tuple[str, int]], max_batch: int = DEFAULT_MAX_BATCH
    ) -> list[list[tuple[str, int]]]:
        """Cut a renewal list into batches ``prepare_extend`` accepts."""
        return split_batches(items, max_batch)

    def _run(self, coro: Any, timeout: float | None = None) -> Any:
        try:
            return self._loop.run(coro, timeout or self._operation_timeout)
        except LoopTimeout as exc:
            raise ChainUnavailable(f"Sui node {self.preset.grpc_url}: {exc}") from None

    async def _get_client(self) -> Any:
        if self._client is None:
            self._client = make_grpc_client(
                url=self.preset.grpc_url, key_string=self._key_string, network=self.network
            )
            self._owns_client = True
        return self._client

    async def _rpc(self, command: Any, *, timeout: float | None = None) -> Any:
        """One pysui call. Transport trouble → ChainUnavailable; a refused call → RpcFailed."""
        client = await self._get_client()
        try:
            result = await client.execute(command=command, timeout=timeout or self._rpc_timeout)
        except (ChainError, asyncio.CancelledError):
            raise
        except Exception as exc:
            raise ChainUnavailable(
                f"Sui node {self.preset.grpc_url} unreachable ({type(exc).__name__}: {exc})"
            ) from exc
        if result.is_ok():
            return result.result_data
        raise RpcFailed.from_result(result.result_string)

    def _unavailable(self, what: str, failure: Exception) -> ChainUnavailable:
        return ChainUnavailable(f"{what} failed on {self.network}: {failure}")

    def close(self) -> None:
        """Close the gRPC channel (if this adapter created it) and stop the loop thread."""
        if self._loop.running and self._client is not None and self._owns_client:
            client = self._client

            async def _close() -> None:
                await client.close()

            try:
                self._loop.run(_close(), 5.0)
            except Exception:  # closing is best effort: the process may be exiting
                log.debug("closing the pysui client failed", exc_info=True)
        self._client = None if self._owns_client else self._client
        self._loop.close()

    def __enter__(self) -> SuiChain:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- reads -----------------------------------------------------------------------------

    async def _get_object(self, object_id: str) -> Any | None:
        try:
            return await self._rpc(cmd.GetObject(object_id=object_id))
        except RpcFailed as failure:
            if failure.status == Status.NOT_FOUND:
                return None
            raise self._unavailable(f"GetObject({object_id})", failure) from None

    async def _get_objects(self, object_ids: Sequence[str]) -> dict[str, Any | None]:
        found: dict[str, Any | None] = {}
        for chunk in split_batches(list(object_ids), _OBJECTS_PER_BATCH_GET):
            try:
                resp = await self._rpc(cmd.GetMultipleObjects(object_ids=chunk))
            except RpcFailed as failure:
                raise self._unavailable("BatchGetObjects", failure) from None
            results = list(resp.objects)
            if len(results) != len(chunk):
                raise ChainUnavailable(
                    f"BatchGetObjects answered {len(results)} results for {len(chunk)} ids"
                )
            for oid, res in zip(chunk, results, strict=True):
                if res.object is not None:
                    found[oid] = res.object
                elif res.error is not None and res.error.code == Status.NOT_FOUND.value:
                    found[oid] = None
                else:
                    reason = res.error.message if res.error is not None else "empty result"
                    raise ChainUnavailable(f"GetObject({oid}) failed: {reason}")
        return found

    async def _read_walrus_state(self) -> WalrusState:
        system_id = self.preset.system_object_id
        system = await self._get_object(system_id)
        if system is None:
            raise ChainUnavailable(
                f"Walrus System object {system_id} not found on {self.network}"
                " (check WALKEEP_SUI_SYSTEM_OBJECT_ID)"
            )
        owner = system.owner
        if owner is None or owner.kind != sui_prot.OwnerOwnerKind.SHARED or owner.version is None:
            raise ChainUnavailable(f"Walrus System object {system_id} is not a shared object")
        try:
            sj = json_of(system)
            version = move_int(move_field(sj, "version"), "System.version")
            package_id = move_id(move_field(sj, "package_id"), "System.package_id")
            new_pkg = move_option(sj.get("new_package_id"))
            new_package_id = None if new_pkg is None else move_id(new_pkg, "new_package_id")
            origin = (
                normalize_address(system.object_type.split("::", 1)[0])
                if system.object_type
                else self.preset.walrus_type_origin
            )
        except (MoveShapeError, ValueError) as exc:
            raise ChainUnavailable(f"unexpected Walrus System object: {exc}") from None
        inner_id = df_id_u64(system_id, version)
        inner = await self._get_object(inner_id)
        if inner is None:
            raise ChainUnavailable(
                f"Walrus System state field {inner_id} (version {version}) not found"
            )
        try:
            value = move_field(json_of(inner), "value")
            epoch = move_int(move_field(value, "committee", "epoch"), "committee.epoch")
            price = move_int(
                move_field(value, "storage_price_per_unit_size"), "storage_price_per_unit_size"
            )
            accounting = value.get("future_accounting")
            max_ahead = (
                move_int(accounting["length"], "future_accounting.length")
                if isinstance(accounting, dict) and "length" in accounting
                else MAX_EPOCHS_AHEAD
            )
        except MoveShapeError as exc:
            raise ChainUnavailable(f"unexpected Walrus System state: {exc}") from None
        if origin != self.preset.walrus_type_origin:
            log.info("Walrus type origin on %s is %s (preset %s)", self.network, origin,
                     self.preset.walrus_type_origin)  # fmt: skip
        self._type_origin = origin
        return WalrusState(
            epoch=epoch,
            storage_price_frost=price,
            package_id=package_id,
            new_package_id=new_package_id,
            version=version,
            system=SharedRef(system_id, int(owner.version), True),
            type_origin=origin,
            max_epochs_ahead=max_ahead,
        )

    async def _origin(self) -> str:
        if self._type_origin is None:
            await self._read_walrus_state()
        assert self._type_origin is not None
        return self._type_origin

    def _blob_from_object(self, obj: Any, origin: str) -> BlobObject | None:
        """A Walrus Blob from a gRPC Object; None if the object is some other type."""
        try:
            return blob_from_object(obj, origin)
        except (MoveShapeError, ValueError) as exc:
            raise ChainUnavailable(f"unexpected Blob object {obj.object_id}: {exc}") from None

    async def _sui_epoch_and_gas_price(self) -> tuple[int, int]:
        try:
            epoch = await self._rpc(cmd.GetBasicCurrentEpochInfo())
        except RpcFailed as failure:
            raise self._unavailable("GetEpoch", failure) from None
        if epoch is None or epoch.epoch is None or not epoch.reference_gas_price:
            raise ChainUnavailable("GetEpoch returned no epoch / reference gas price")
        return int(epoch.epoch), int(epoch.reference_gas_price)

    async def _list_coins(self, coin_object_type: str) -> list[Coin]:
        coins: list[Coin] = []
        token: bytes | None = None
        for _ in range(_MAX_COIN_PAGES):
            try:
                page = await self._rpc(
                    cmd.GetCoins(
                        owner=self._address, coin_type=coin_object_type, next_page_token=token
                    )
                )
            except RpcFailed as failure:
                raise self._unavailable("GetCoins", failure) from None
            try:
                coins.extend(coin_from_object(o) for o in page.objects)
            except (MoveShapeError, ValueError, TypeError) as exc:
                raise ChainUnavailable(f"unexpected coin object: {exc}") from None
            token = page.next_page_token
            if not token:
                break
        return coins

    # --- Chain: reads ----------------------------------------------------------------------

    def owner_address(self) -> str:
        return self._address

    def current_epoch(self) -> int:
        return self._run(self._read_walrus_state()).epoch

    def storage_price_frost(self) -> int:
        return self._run(self._read_walrus_state()).storage_price_frost

    def walrus_state(self) -> WalrusState:
        """Everything read from the System object at once (one round trip pair)."""
        return self._run(self._read_walrus_state())

    def epoch_info(self) -> EpochInfo:
        """The Walrus epoch and the network's nominal epoch length; start time unknown (None)."""
        state = self._run(self._read_walrus_state())
        return EpochInfo(
            epoch=state.epoch,
            started_at=None,
            duration_seconds=self.preset.epoch_duration_seconds,
        )

    def sui_epoch(self) -> int:
        """The current *Sui* epoch (what transaction expirations are measured in)."""
        return self._run(self._sui_epoch_and_gas_price())[0]

    def get_blob(self, blob_object_id: str) -> BlobObject | None:
        try:
            oid = normalize_address(blob_object_id)
        except ValueError:
            return None

        async def _get() -> BlobObject | None:
            obj = await self._get_object(oid)
            if obj is None:
                return None
            return self._blob_from_object(obj, await self._origin())

        return self._run(_get())

    def owned_blobs(self) -> Iterator[BlobObject]:
        """Every Blob the server wallet owns, fetched lazily page by page."""
        origin = self._run(self._origin())
        blob_type = f"{origin}::blob::Blob"
        token: bytes | None = None
        while True:

            async def _page(tok: bytes | None = token) -> Any:
                try:
                    return await self._rpc(
                        cmd.GetObjectsForType(
                            owner=self._address, object_type=blob_type, next_page_token=tok
                        )
                    )
                except RpcFailed as failure:
                    raise self._unavailable("ListOwnedObjects", failure) from None

            page = self._run(_page())
            for obj in page.objects:
                blob = self._blob_from_object(obj, origin)
                if blob is not None:
                    yield blob
            token = page.next_page_token
            if not token:
                return

    # --- Chain: prepare ----------------------------------------------------------------------

    def _check_items(self, items: Sequence[tuple[str, int]]) -> tuple[tuple[str, int], ...]:
        if not items:
            raise ChainRejected("nothing to extend")
        if len(items) > self.max_batch:
            raise ChainRejected(
                f"{len(items)} blobs exceed max_batch={self.max_batch}: split them with"
                " SuiChain.split_batches() and prepare one transaction per batch"
            )
        problems: dict[str, str] = {}
        out: list[tuple[str, int]] = []
        seen: set[str] = set()
        for raw_id, epochs in items:
            try:
                oid = normalize_address(raw_id)
            except (ValueError, AttributeError):
                problems[str(raw_id)] = "not an object id"
                continue
            if isinstance(epochs, bool) or not isinstance(epochs, int):
                problems[oid] = f"epochs must be an int, got {epochs!r}"
            elif not 0 < epochs <= U32_MAX:
                problems[oid] = f"epochs must be between 1 and {U32_MAX} (a u32), got {epochs}"
            elif oid in seen:
                problems[oid] = "listed twice in one batch"
            seen.add(oid)
            out.append((oid, epochs))
        if problems:
            raise SuiPreconditionFailed(problems)
        return tuple(out)

    def prepare_extend(self, items: Sequence[tuple[str, int]]) -> PreparedTx:
        """One signed PTB extending every blob by its epochs; nothing is submitted.

        Refuses (``ChainRejected``, usually ``SuiPreconditionFailed``) before
        signing when a blob is unknown, not owned by the server wallet, not
        certified, expired, or would end more than ``max_epochs_ahead`` epochs
        ahead; when WAL or SUI is short; or when more than ``max_batch`` items
        are given (callers split upstream with :meth:`split_batches`).
        """
        checked = self._check_items(items)
        return self._run(self._prepare(checked))

    async def _prepare(self, items: tuple[tuple[str, int], ...]) -> PreparedTx:
        state = await self._read_walrus_state()
        objects = await self._get_objects([oid for oid, _ in items])
        problems: dict[str, str] = {}
        calls: list[ExtendCall] = []
        extensions: list[BlobExtension] = []
        cost = 0
        for oid, k in items:
            obj = objects.get(oid)
            if obj is None:
                problems[oid] = "no such object"
                continue
            blob = self._blob_from_object(obj, state.type_origin)
            if blob is None:
                problems[oid] = f"not a Walrus Blob (type {obj.object_type})"
                continue
            if not owned_by_address(obj, self._address):
                problems[oid] = (
                    f"owned by {blob.owner or 'a non-address owner'}, not the server wallet"
                )
            elif blob.certified_epoch is None:
                problems[oid] = "not certified yet"
            elif state.epoch >= blob.end_epoch:
                problems[oid] = (
                    f"expired: end_epoch {blob.end_epoch} <= current epoch {state.epoch}"
                )
            elif blob.end_epoch - state.epoch + k > state.max_epochs_ahead:
                problems[oid] = (
                    f"{blob.end_epoch - state.epoch} + {k} epochs would exceed the"
                    f" {state.max_epochs_ahead}-epoch cap"
                )
            if oid in problems:
                continue
            calls.append(ExtendCall(ObjectRef(oid, int(obj.version), str(obj.digest)), k))
            extensions.append(
                BlobExtension(oid, blob.blob_id, k, blob.end_epoch, blob.end_epoch + k)
            )
            cost += walrus_storage_cost_frost(blob.storage_size, k, state.storage_price_frost)
        if problems:
            raise SuiPreconditionFailed(problems)

        sui_epoch, gas_price = await self._sui_epoch_and_gas_price()
        busy = self._busy_objects(sui_epoch)
        held = sorted(oid for oid, _ in items if oid in busy)
        if held:
            raise ChainUnavailable(
                f"blob(s) {', '.join(held)} are in an unsettled renewal transaction; retry later"
            )

        wal_all = await self._list_coins(self.preset.wal_coin_object_type)
        wal_free = [c for c in wal_all if c.ref.object_id not in busy]
        want = cost + -(-cost * self._wal_buffer_percent // 100)
        wal = select_coins(wal_free, need=cost, want=want, max_count=MAX_MERGE_COINS + 1)
        if not wal:
            self._raise_short("WAL", cost, "FROST", wal_all, wal_free)

        sui_all = await self._list_coins(SUI_COIN_TYPE)
        sui_free = [c for c in sui_all if c.ref.object_id not in busy]
        # Without a dry run the nominal budget is final; with one it only sizes
        # the probe (the dry run then sets the real budget).
        nominal = min(self._gas_max, self._gas_base + self._gas_per_call * len(calls))
        gas = select_coins(
            sui_free,
            need=gas_price if self._simulate else nominal,
            want=nominal,
            max_count=MAX_GAS_COINS,
        )
        if not gas:
            self._raise_short("SUI for gas", nominal, "MIST", sui_all, sui_free)
        gas_total = sum(c.balance for c in gas)

        expiration = sui_epoch + self._expiration_epochs
        package_id = state.package_id

        def build(budget: int, package: str) -> bytes:
            return build_extend_tx(
                sender=self._address,
                package_id=package,
                system=state.system,
                calls=calls,
                wal_coins=[c.ref for c in wal],
                gas_payment=[c.ref for c in gas],
                gas_price=gas_price,
                gas_budget=budget,
                expiration_epoch=expiration,
            )

        if self._simulate:
            probe_budget = min(self._gas_max, gas_total)
            simulated = await self._dry_run(build(probe_budget, package_id))
            upgrade = state.new_package_id
            if not simulated.effects.status.success and upgrade and upgrade != package_id:
                # A Walrus upgrade is pending: the System keeps naming the old package
                # until it is migrated, but if that one refuses, try the announced one.
                retry = await self._dry_run(build(probe_budget, upgrade))
                if retry.effects.status.success:
                    package_id, simulated = upgrade, retry
            if not simulated.effects.status.success:
                raise ChainRejected(f"dry run failed: {describe_failure(simulated.effects.status)}")
            budget = min(gas_budget_from_simulation(simulated.effects, gas_price), self._gas_max)
            if budget > gas_total:
                gas = select_coins(sui_free, need=budget, want=budget, max_count=MAX_GAS_COINS)
                if not gas:
                    self._raise_short("SUI for gas", budget, "MIST", sui_all, sui_free)
        else:
            budget = nominal

        tx_bytes = build(budget, package_id)
        digest = tx_digest(tx_bytes)
        tx_b64 = base64.b64encode(tx_bytes).decode()
        signature = self._keypair.new_sign_secure(tx_b64)
        self._remember(
            digest,
            _Prepared(
                extensions=tuple(extensions),
                walrus_epoch=state.epoch,
                wal_estimate_frost=cost,
                expiration_epoch=expiration,
            ),
        )
        log.info(
            "prepared Walrus renewal %s on %s: %d blob(s), %d FROST, gas budget %d, expires"
            " after Sui epoch %d",
            digest, self.network, len(calls), cost, budget, expiration,
        )  # fmt: skip
        return PreparedTx(
            digest=digest,
            tx_bytes=tx_b64,
            items=items,
            epoch=state.epoch,
            payload=signature,
        )

    async def _dry_run(self, tx_bytes: bytes) -> Any:
        try:
            resp = await self._rpc(
                cmd.SimulateTransaction(
                    tx_bytestr=tx_bytes, checks_enabled=True, gas_selection=False
                )
            )
        except RpcFailed as failure:
            if failure.status in REFUSED:
                raise ChainRejected(f"dry run refused: {failure}") from None
            raise self._unavailable("SimulateTransaction", failure) from None
        executed = getattr(resp, "transaction", None)
        if executed is None or executed.effects is None or executed.effects.status is None:
            raise ChainUnavailable("SimulateTransaction returned no effects")
        return executed

    def _remember(self, digest: str, info: _Prepared) -> None:
        self._prepared[digest] = info
        self._prepared.move_to_end(digest)
        while len(self._prepared) > _PREPARED_CACHE:
            self._prepared.popitem(last=False)

    def _busy_objects(self, sui_epoch: int | None = None, *, exclude: str = "") -> set[str]:
        """Owned objects of unsettled submissions other than ``exclude`` (lapsed holds dropped).

        Resubmitting the *same* digest is always safe: it is the same transaction.
        """
        now = self._clock.time()
        for digest, hold in list(self._in_flight.items()):
            expired = (
                sui_epoch is not None
                and hold.expiration_epoch is not None
                and sui_epoch > hold.expiration_epoch
            )
            if expired or (hold.until is not None and now >= hold.until):
                del self._in_flight[digest]
        return {
            oid
            for digest, hold in self._in_flight.items()
            if digest != exclude
            for oid in hold.objects
        }

    @staticmethod
    def _raise_short(
        what: str, need: int, unit: str, all_coins: Sequence[Coin], free: Sequence[Coin]
    ) -> NoReturn:
        total = sum(c.balance for c in all_coins)
        free_total = sum(c.balance for c in free)
        if free_total < total and total >= need:
            raise ChainUnavailable(
                f"{what}: coins are held by in-flight renewal transactions ({free_total} of"
                f" {total} {unit} free); retry once they settle"
            )
        raise ChainRejected(
            f"insufficient {what}: need {need} {unit}, the server wallet holds {total} {unit}"
            f" in {len(all_coins)} coin(s)"
        )

    # --- Chain: execute / look up ----------------------------------------------------------

    def execute(self, tx: PreparedTx) -> TxEffects:
        """Submit the prepared bytes. Effects on success; ChainRejected / ChainUnavailable otherwise."""
        return self._run(self._execute(tx), self._execute_timeout + self._rpc_timeout * 3)

    async def _execute(self, tx: PreparedTx) -> TxEffects:
        raw = base64.b64decode(tx.tx_bytes)
        if tx_digest(raw) != tx.digest:
            raise ChainRejected("PreparedTx digest does not match its bytes; not submitted")
        signature = tx.payload if isinstance(tx.payload, str) and tx.payload else None
        if signature is None:
            # Ed25519 signing is deterministic: re-signing reproduces the signature.
            signature = self._keypair.new_sign_secure(tx.tx_bytes)
        try:
            decoded = decode_extend_tx(raw)
        except ValueError as exc:
            raise ChainRejected(f"not a renewal transaction; not submitted: {exc}") from None
        objects = frozenset((*decoded.owned_objects, *decoded.gas_coins))
        clash = objects & self._busy_objects(exclude=tx.digest)
        if clash:
            raise ChainRejected(
                f"not submitted: {', '.join(sorted(clash))} already spent by an unsettled"
                " transaction (prepare again once it settles)"
            )
        self._in_flight[tx.digest] = _InFlight(objects, decoded.expiration_epoch)
        try:
            executed = await self._submit(tx, signature)
        except ChainUnavailable:
            # Outcome unknown: the transaction may still be propagating.
            self._in_flight[tx.digest].until = self._clock.time() + self._in_flight_hold
            raise
        except BaseException:
            self._in_flight.pop(tx.digest, None)
            raise
        self._in_flight.pop(tx.digest, None)
        effects = await self._effects(executed, tx.items)
        if not effects.success:
            raise SuiExecutionFailed(
                f"renewal {tx.digest} failed on chain: {effects.error}", effects
            )
        return effects

    async def _submit(self, tx: PreparedTx, signature: str) -> Any:
        """ExecuteTransaction; returns the executed transaction or raises Chain*."""
        try:
            executed = await self._rpc(
                cmd.ExecuteTransaction(tx_bytestr=tx.tx_bytes, sig_array=[signature]),
                timeout=self._execute_timeout,
            )
        except RpcFailed as failure:
            if failure.status not in REFUSED:
                raise self._unavailable(f"ExecuteTransaction({tx.digest})", failure) from None
            # Refused outright. Make sure the digest really is unknown before
            # saying "nothing happened".
            known = await self._lookup(tx.digest)
            if known is None:
                raise ChainRejected(f"transaction refused: {failure}") from None
            executed = known
        if executed is None:
            raise ChainUnavailable(f"ExecuteTransaction({tx.digest}) returned nothing")
        got = executed.digest or (executed.effects.transaction_digest if executed.effects else None)
        if got != tx.digest:
            raise ChainUnavailable(
                f"node reported digest {got} for {tx.digest}: reconcile by digest"
            )
        return executed

    async def _lookup(self, digest: str) -> Any | None:
        try:
            return await self._rpc(cmd.GetTransaction(digest=digest))
        except RpcFailed as failure:
            if failure.status == Status.NOT_FOUND:
                return None
            raise self._unavailable(f"GetTransaction({digest})", failure) from None

    def get_transaction(self, digest: str) -> TxEffects | None:
        """Effects of ``digest``, or None if the node does not know it.

        None means "not executed" only once the transaction's expiration epoch
        has passed (:meth:`is_expired`); full nodes also prune very old
        transactions, so reconcile promptly.
        """

        async def _get() -> TxEffects | None:
            executed = await self._lookup(digest)
            if executed is None:
                return None
            self._in_flight.pop(digest, None)
            return await self._effects(executed, None)

        return self._run(_get())

    def walrus_targets(self) -> tuple[str, tuple[str, ...]]:
        """(System object id, package ids a renewal may call), read live.

        The packages are today's ``System.package_id`` (and ``new_package_id``
        during an upgrade): a renewal made before a Walrus upgrade called an
        older package version, which an audit reports as such.
        """
        state = self.walrus_state()
        packages = (state.package_id,) + ((state.new_package_id,) if state.new_package_id else ())
        return self.preset.system_object_id, tuple(normalize_address(p) for p in packages)

    def get_transaction_bytes(self, digest: str) -> str | None:
        """The executed transaction's BCS bytes (base64) as the node returns them.

        None if the node does not know the digest. Raises ChainUnavailable
        when the node answers without the BCS form (an audit must not fall
        back to Walkeep's own copy of the bytes).
        """

        async def _get() -> str | None:
            executed = await self._lookup(digest)
            if executed is None:
                return None
            transaction = executed.transaction
            if transaction is None or transaction.bcs is None or not transaction.bcs.value:
                raise ChainUnavailable(f"the node returned {digest} without its BCS bytes")
            return base64.b64encode(bytes(transaction.bcs.value)).decode()

        return self._run(_get())

    # Two submitters spending the same WAL/gas coin versions would equivocate and
    # lock the coins until the epoch ends: renewal passes must not overlap.
    single_submitter = True

    def can_still_land(self, tx_bytes: str) -> bool:
        return not self.is_expired(tx_bytes)

    def is_expired(self, tx: PreparedTx | str) -> bool:
        """True once the Sui epoch is past the transaction's expiration: it can never land.

        Accepts the PreparedTx or its base64 bytes (what the renewals table keeps).
        Until this is true, "digest not found" may still turn into "executed".
        """
        tx_bytes = tx.tx_bytes if isinstance(tx, PreparedTx) else tx
        expiration = decode_extend_tx(tx_bytes).expiration_epoch
        if expiration is None:
            return False
        return self.sui_epoch() > expiration

    async def _effects(self, executed: Any, items: Sequence[tuple[str, int]] | None) -> TxEffects:
        digest = executed.digest or executed.effects.transaction_digest
        effects = executed.effects
        if effects is None or effects.status is None:
            raise ChainUnavailable(f"transaction {digest} has no effects")
        success = bool(effects.status.success)
        info = self._prepared.get(digest)
        transaction = executed.transaction
        sender = (
            normalize_address(transaction.sender)
            if transaction is not None and transaction.sender
            else self._address
        )
        if items is None:
            items = requested_items(executed)
        extensions: tuple[BlobExtension, ...] = ()
        wal_cost: int | None = None
        if success:
            origin = await self._origin()
            certified = extension_events(executed, origin)
            planned = {e.blob_object_id: e for e in info.extensions} if info else {}
            found: list[BlobExtension] = []
            for oid, k in items:
                oid = normalize_address(oid)
                event = certified.get(oid)
                plan = planned.get(oid)
                if event is not None:
                    new_end, blob_id = event
                    found.append(BlobExtension(oid, blob_id, k, new_end - k, new_end))
                elif plan is not None:
                    found.append(plan)
            extensions = tuple(found)
            wal_cost = wal_spent(executed, self._address, self.preset.wal_coin_type)
            if wal_cost is None and info is not None:
                wal_cost = info.wal_estimate_frost
        walrus_epoch = info.walrus_epoch if info else (await self._read_walrus_state()).epoch
        return TxEffects(
            digest=digest,
            success=success,
            sender=sender,
            epoch=walrus_epoch,
            timestamp=executed.timestamp,
            extensions=extensions,
            wal_cost_frost=wal_cost,
            gas_used=net_gas(effects),
            error=None if success else describe_failure(effects.status),
            checkpoint=int(executed.checkpoint) if executed.checkpoint is not None else None,
            network=self.network,
        )

    # --- explorers ---------------------------------------------------------------------------

    def explorer_tx_url(self, digest: str) -> str:
        return self.preset.suiscan_tx.format(digest=digest)

    def explorer_object_url(self, object_id: str) -> str:
        return self.preset.suiscan_object.format(object_id=normalize_address(object_id))

    def suivision_tx_url(self, digest: str) -> str:
        return self.preset.suivision_tx.format(digest=digest)
