"""The ports between Walkeep and the outside world (DESIGN §2).

Three small Protocols, each with local and real implementations:

- ``BlobStore`` — a Walrus publisher/aggregator: put encrypted bytes (alone,
  or many as one quilt), get them back. Local: ``localnet`` (files + simulated chain). Real: ``walrus``
  (HTTP).
- ``Chain`` — the Sui side: the current Walrus epoch, a Blob object's state,
  and ``extend_blob`` for many blobs in one transaction whose digest is known
  *before* it is submitted (the renewal intent records it). Local: the
  simulated chain. Real: ``sui`` (pysui over gRPC).
- ``Relayer`` — what the service layer talks to for memories: accept a write
  and report when it landed, read, semantic search, list contents, health.
  ``SelfRelayer`` runs the write pipeline itself (encrypt, index, put to a
  BlobStore); ``MemWalRelayer`` delegates to the hosted MemWal relayer.

All methods are synchronous: the service layer runs them on worker threads.
Failures are typed: ``RelayerUnavailable`` (unreachable / 5xx: nothing
happened, retry), ``QuotaExceeded`` (too large), ``NotFound`` (gone), and the
chain-specific errors below.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Literal, Protocol, runtime_checkable

from walkeep.errors import NotFound
from walkeep.protocol.quilt import is_patch_id

WriteHealth = Literal["ok", "degraded", "paused"]


@dataclass(frozen=True, slots=True)
class Health:
    ok: bool
    writes: WriteHealth = "ok"
    detail: str = ""


@dataclass(frozen=True, slots=True)
class BlobObject:
    """A Walrus ``Blob`` object as it stands on chain."""

    blob_id: str  # 32 bytes, URL-safe base64 without padding (43 chars)
    blob_object_id: str  # 0x + 64 hex
    size: int  # unencoded bytes
    storage_size: int  # encoded bytes: what storage is billed on
    registered_epoch: int
    end_epoch: int  # exclusive: lapsed once current_epoch >= end_epoch
    owner: str  # 0x + 64 hex
    certified_epoch: int | None = None
    deletable: bool = True


@dataclass(frozen=True, slots=True)
class StoredBlob:
    """The outcome of a publisher PUT."""

    blob: BlobObject
    newly_created: bool
    cost_frost: int | None = None


@dataclass(frozen=True, slots=True)
class QuiltPatch:
    """One patch of a stored quilt: the caller's identifier and its Walrus patch id."""

    identifier: str
    patch_id: str  # 50 chars; its first 43 are the quilt's blob id (walkeep.protocol.quilt)


@dataclass(frozen=True, slots=True)
class StoredQuilt:
    """The outcome of a quilt PUT: one Blob object holding every patch.

    The quilt is stored, paid and extended as that one blob; patches cannot
    be renewed or deleted individually.
    """

    blob: BlobObject  # the quilt's Blob object; blob.blob_id is the quilt id
    patches: tuple[QuiltPatch, ...]  # same order as the request
    newly_created: bool
    cost_frost: int | None = None


@runtime_checkable
class BlobStore(Protocol):
    name: str

    def put(self, data: bytes, *, epochs: int, owner: str) -> StoredBlob:
        """Store bytes for ``epochs`` epochs; the Blob object goes to ``owner``.

        Raises RelayerUnavailable (unreachable, 5xx, 504), QuotaExceeded (413).
        """
        ...

    def get(self, blob_id: str) -> bytes:
        """Raises NotFound if the blob never existed or has lapsed."""
        ...

    def put_quilt(
        self, patches: Sequence[tuple[str, bytes]], *, epochs: int, owner: str
    ) -> StoredQuilt:
        """Store ``(identifier, bytes)`` patches as one quilt blob owned by ``owner``.

        Raises like :meth:`put` (RelayerUnavailable, QuotaExceeded), and
        ValidationError for more than 666 patches or bad identifiers (empty,
        duplicate, starting with ``_``, over 64 KiB).
        """
        ...

    def get_patch(self, patch_id: str) -> bytes:
        """One patch's bytes; NotFound if never stored, malformed, or lapsed."""
        ...

    def get_many(self, ids: Sequence[str]) -> dict[str, bytes]:
        """The bytes of those of ``ids`` (blob ids or quilt patch ids) that exist:
        NotFound ones are left out, other errors raise. A store reached over the network
        overlaps the fetches; a local one reads them in turn (``get_each``)."""
        ...

    def health(self) -> Health: ...


def get_each(store: BlobStore, ids: Iterable[str]) -> dict[str, bytes]:
    """``BlobStore.get_many`` one read after another."""
    out: dict[str, bytes] = {}
    for i in dict.fromkeys(ids):
        try:
            out[i] = store.get_patch(i) if is_patch_id(i) else store.get(i)
        except NotFound:
            continue
    return out


# --- chain ---------------------------------------------------------------------------------


class ChainError(Exception):
    """Base for chain failures."""


class ChainRejected(ChainError):
    """The transaction was refused or failed on chain: nothing was applied.

    Terminal for this transaction (e.g. an expired blob, the 53-epoch cap,
    insufficient WAL). Safe to release holds. ``problems`` (blob object id →
    reason), when present, names the blobs that caused the refusal.
    """

    problems: dict[str, str] = {}


class ChainUnavailable(ChainError):
    """The node could not be reached or the outcome is unknown.

    The transaction *may* have been applied: never treat this as "nothing
    happened"; reconcile by digest.
    """


@dataclass(frozen=True, slots=True)
class EpochInfo:
    epoch: int
    # When the current epoch started and how long epochs last (for human
    # estimates such as "lapses around 2026-12-14"). Approximate on real networks.
    started_at: datetime | None
    duration_seconds: int


@dataclass(frozen=True, slots=True)
class BlobExtension:
    blob_object_id: str
    blob_id: str
    epochs: int
    old_end_epoch: int
    new_end_epoch: int


@dataclass(frozen=True, slots=True)
class PreparedTx:
    """A signed-ready transaction whose digest is already known."""

    digest: str
    tx_bytes: str  # base64 of the BCS TransactionData
    items: tuple[tuple[str, int], ...]  # (blob_object_id, epochs)
    epoch: int  # Walrus epoch when prepared
    payload: object | None = None  # implementation detail (e.g. signature)


@dataclass(frozen=True, slots=True)
class TxEffects:
    digest: str
    success: bool
    sender: str
    epoch: int
    timestamp: datetime | None
    extensions: tuple[BlobExtension, ...] = ()
    wal_cost_frost: int | None = None
    gas_used: int | None = None
    error: str | None = None
    checkpoint: int | None = None
    network: str = "local"


@runtime_checkable
class Chain(Protocol):
    network: str  # "local" | "testnet" | "mainnet"

    def current_epoch(self) -> int: ...

    def epoch_info(self) -> EpochInfo: ...

    def owner_address(self) -> str:
        """The server wallet that owns every Blob Walkeep renews."""
        ...

    def storage_price_frost(self) -> int:
        """Storage price per MiB unit per epoch, in FROST."""
        ...

    def get_blob(self, blob_object_id: str) -> BlobObject | None:
        """None if no such object (or it was deleted)."""
        ...

    def owned_blobs(self) -> Iterator[BlobObject]:
        """Every Blob object the server wallet owns (for the orphan sweep)."""
        ...

    def prepare_extend(self, items: Sequence[tuple[str, int]]) -> PreparedTx:
        """Build (and sign) one transaction extending each blob by its epochs.

        Does not submit. The digest is final: the same PreparedTx, executed,
        produces exactly this digest. Raises ChainRejected if a precondition
        already fails (unknown/expired blob, cap exceeded), ChainUnavailable
        if the node can't be reached.
        """
        ...

    def execute(self, tx: PreparedTx) -> TxEffects:
        """Submit. All or nothing for the batch.

        Returns effects (``success=True``) or raises ChainRejected (nothing
        applied) / ChainUnavailable (outcome unknown: reconcile by digest).
        """
        ...

    def get_transaction(self, digest: str) -> TxEffects | None:
        """Look a transaction up again (reconciliation, audit). None if unknown."""
        ...

    def get_transaction_bytes(self, digest: str) -> str | None:
        """The executed transaction's BCS ``TransactionData`` (base64); None if unknown.

        What an auditor recomputes the digest from and decodes the calls of
        (``walkeep verify``): the chain's copy, never Walkeep's own record.
        """
        ...

    def can_still_land(self, tx_bytes: str) -> bool:
        """Could this signed-but-unconfirmed transaction still be executed later?

        Reconciliation releases an intent's holds only once the answer is False
        (e.g. a Sui transaction past its expiration epoch), so a transaction
        that lands late is never left unbilled.
        """
        ...

    def explorer_tx_url(self, digest: str) -> str: ...

    def explorer_object_url(self, object_id: str) -> str: ...


# --- relayer -------------------------------------------------------------------------------


class JobState(StrEnum):
    PENDING = "pending"
    LANDED = "landed"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class JobStatus:
    state: JobState
    blob: BlobObject | None = None
    error: str | None = None
    # For PENDING: when polling again can first make a difference (None: unknown).
    retry_at: datetime | None = None
    # For LANDED writes packed in a quilt: the memory's patch id (its public
    # blob_id), its fixed share of the quilt's units, the sum of every patch's share
    # (the quilt's apportioned units) and the quilt's patch count.
    patch_id: str | None = None
    share_micro: int | None = None
    patch_count: int | None = None
    quilt_share_micro: int | None = None

    @property
    def public_id(self) -> str:
        """The identifier users see for this write: its patch id, else its blob id."""
        if self.patch_id:
            return self.patch_id
        assert self.blob is not None
        return self.blob.blob_id


@dataclass(frozen=True, slots=True)
class SearchHit:
    blob_id: str
    score: float
    content: str | None = None  # filled when the backend returns text with hits


@dataclass(frozen=True, slots=True)
class ListedContent:
    blob_id: str
    namespace: str
    content: str


@runtime_checkable
class Relayer(Protocol):
    name: str
    # True when ``list_contents`` can return every memory's text (export).
    content_listable: bool

    def health(self) -> Health: ...

    def accept(
        self, *, account_id: str, namespace: str, content: str, idempotency_key: str, epochs: int
    ) -> str:
        """Accept a write; return a job id. Quick: the write itself is async.

        Idempotent on ``idempotency_key`` (a replay returns the same job id).
        Raises RelayerUnavailable (nothing accepted) or QuotaExceeded.
        """
        ...

    def poll(self, job_id: str) -> JobStatus:
        """Where the write stands. May do the work itself (SelfRelayer)."""
        ...

    def read(self, account_id: str, blob_id: str) -> str:
        """Decrypted content; NotFound if gone."""
        ...

    def read_many(self, account_id: str, blob_ids: Sequence[str]) -> dict[str, str]:
        """Decrypted contents of those of ``blob_ids`` that exist (NotFound ones are
        left out), fetched concurrently where the backend can; other errors raise."""
        ...

    def search(
        self,
        account_id: str,
        namespace: str | None,
        query: str,
        limit: int,
        only: Collection[str] | None = None,
    ) -> list[SearchHit]:
        """Up to ``limit`` hits, best first. ``only``: rank just these blobs (a filtered
        recall's candidates); a backend that cannot narrow its search ignores it, and
        recall checks every hit against the filter regardless."""
        ...

    def list_contents(
        self, account_id: str, namespace: str | None, blob_ids: Iterable[str]
    ) -> list[ListedContent] | None:
        """Contents for these blobs, or None if the backend cannot list content."""
        ...


@dataclass(slots=True)
class Faults:
    """Test hooks for injecting failures into local implementations."""

    fail_next_writes: int = 0
    unreachable: bool = False
    extra_latency_ms: int = 0
    fail_next_extends: int = 0
    notes: list[str] = field(default_factory=list)
