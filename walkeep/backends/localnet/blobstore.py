"""The ``BlobStore`` port over the local network: an in-process Walrus publisher.

Writes always use ``force=True`` (a fresh Blob object the owner controls and
can renew), as Walkeep does against real publishers (notes §0.6).
"""

from __future__ import annotations

from collections.abc import Sequence

from walkeep.backends.base import Health, StoredBlob, StoredQuilt, get_each
from walkeep.backends.localnet.engine import LocalNetwork


class LocalBlobStore:
    """``BlobStore`` implementation for ``WALKEEP_RELAYER=local``."""

    name = "local"

    def __init__(self, network: LocalNetwork) -> None:
        self.localnet = network

    def put(self, data: bytes, *, epochs: int, owner: str) -> StoredBlob:
        return self.localnet.store_blob(data, epochs=epochs, owner=owner, force=True)

    def get(self, blob_id: str) -> bytes:
        return self.localnet.read_blob(blob_id)

    def put_quilt(
        self, patches: Sequence[tuple[str, bytes]], *, epochs: int, owner: str
    ) -> StoredQuilt:
        return self.localnet.store_quilt(patches, epochs=epochs, owner=owner, force=True)

    def get_patch(self, patch_id: str) -> bytes:
        return self.localnet.read_patch(patch_id)

    def get_many(self, ids: Sequence[str]) -> dict[str, bytes]:
        # In turn: overlapped on threads, each with its own SQLite connection and page
        # cache, a recall at a million memories took 29–31 ms at p50 instead of 21–23.
        return get_each(self, ids)

    def health(self) -> Health:
        if self.localnet.faults.unreachable:
            return Health(ok=False, writes="paused", detail="local network unreachable")
        return Health(ok=True)
