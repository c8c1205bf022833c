"""The embedded local network: a faithful model of Walrus + Sui on one machine.

- :class:`LocalNetwork` (``engine``) — the simulated chain + storage, in SQLite;
  ``quilts`` adds quilt storage (many patches as one Blob object) to it, ``records``
  says what its state looks like (objects, transactions, the file's schema).
- :class:`LocalChain` / :class:`LocalBlobStore` — the ``Chain`` / ``BlobStore`` ports.
- ``devnet`` — the same engine served over Walrus's publisher/aggregator HTTP API.
- ``explorer`` — HTML/JSON pages for local transactions and Blob objects.
"""

from walkeep.backends.localnet.blobstore import LocalBlobStore
from walkeep.backends.localnet.chain import LocalChain
from walkeep.backends.localnet.codec import LOCAL_PACKAGE_ID, blob_id_for, tx_digest
from walkeep.backends.localnet.engine import LocalNetwork
from walkeep.backends.localnet.records import NETWORK, ObjectRecord, TxRecord

__all__ = [
    "LOCAL_PACKAGE_ID",
    "NETWORK",
    "LocalBlobStore",
    "LocalChain",
    "LocalNetwork",
    "ObjectRecord",
    "TxRecord",
    "blob_id_for",
    "tx_digest",
]
