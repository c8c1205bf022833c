"""The ``Chain`` port over the local network (DESIGN §2).

A thin adapter: every rule lives in :class:`LocalNetwork`; this class fixes
the sender to the server wallet (the address that owns every Blob Walkeep
renews) and points explorer links at the local explorer served by Walkeep
(or ``walkeep devnet``) under ``{public_url}/explorer/…``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager

from walkeep.backends.base import BlobObject, EpochInfo, PreparedTx, TxEffects
from walkeep.backends.localnet.engine import LocalNetwork
from walkeep.backends.localnet.records import NETWORK


class LocalChain:
    """``Chain`` implementation for ``WALKEEP_NETWORK=local``."""

    network = NETWORK

    def __init__(self, network: LocalNetwork, *, public_url: str) -> None:
        self.localnet = network
        self.public_url = public_url.rstrip("/")

    def current_epoch(self) -> int:
        return self.localnet.current_epoch()

    def epoch_info(self) -> EpochInfo:
        return self.localnet.epoch_info()

    def owner_address(self) -> str:
        return self.localnet.server_address

    def storage_price_frost(self) -> int:
        return self.localnet.storage_price_frost()

    def get_blob(self, blob_object_id: str) -> BlobObject | None:
        return self.localnet.get_object(blob_object_id)

    def owned_blobs(self) -> Iterator[BlobObject]:
        return self.localnet.owned_blobs(self.localnet.server_address)

    def prepare_extend(self, items: Sequence[tuple[str, int]]) -> PreparedTx:
        return self.localnet.prepare_extend(self.localnet.server_address, items)

    def execute(self, tx: PreparedTx) -> TxEffects:
        return self.localnet.execute(tx)

    def submission_lock(self) -> AbstractContextManager[None]:
        """Held from a renewal's prepare to its execute: the server wallet's gas coin
        admits one transaction at a time (see LocalNetwork.wallet_lock)."""
        return self.localnet.wallet_lock(self.localnet.server_address)

    def get_transaction(self, digest: str) -> TxEffects | None:
        return self.localnet.get_transaction(digest)

    def walrus_targets(self) -> tuple[str, tuple[str, ...]]:
        """(System object id, package ids a renewal may call): what an audit expects."""
        return self.localnet.system_object_id, (self.localnet.package_id,)

    def get_transaction_bytes(self, digest: str) -> str | None:
        return self.localnet.get_transaction_bytes(digest)

    def explorer_tx_url(self, digest: str) -> str:
        return f"{self.public_url}/explorer/tx/{digest}"

    def explorer_object_url(self, object_id: str) -> str:
        return f"{self.public_url}/explorer/object/{object_id}"

    def can_still_land(self, tx_bytes: str) -> bool:
        """Never: a local transaction executes synchronously inside ``execute`` or not at all."""
        return False
