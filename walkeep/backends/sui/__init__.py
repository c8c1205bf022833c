"""The real Sui chain adapter: Walrus ``extend_blob`` renewals with pysui over gRPC.

``SuiChain`` implements ``walkeep.backends.base.Chain`` for ``WALKEEP_NETWORK``
= testnet / mainnet. The pure pieces (ids, digests, the transaction builder)
are importable on their own and need no node.
"""

from walkeep.backends.sui.chain import (
    DEFAULT_MAX_BATCH,
    HARD_MAX_BATCH,
    SuiChain,
    SuiExecutionFailed,
    SuiPreconditionFailed,
    WalrusState,
    select_coins,
)
from walkeep.backends.sui.client import load_keypair, make_grpc_client
from walkeep.backends.sui.codec import (
    blob_id_from_u256,
    df_id_u64,
    normalize_address,
    pure_u32,
    split_batches,
    tx_digest,
    u256_from_blob_id,
)
from walkeep.backends.sui.parse import Coin
from walkeep.backends.sui.presets import SUI_PRESETS, SuiPreset
from walkeep.backends.sui.ptb import (
    DecodedExtend,
    ExtendCall,
    ObjectRef,
    SharedRef,
    build_extend_tx,
    decode_extend_tx,
)

__all__ = [
    "DEFAULT_MAX_BATCH",
    "HARD_MAX_BATCH",
    "SUI_PRESETS",
    "Coin",
    "DecodedExtend",
    "ExtendCall",
    "ObjectRef",
    "SharedRef",
    "SuiChain",
    "SuiExecutionFailed",
    "SuiPreconditionFailed",
    "SuiPreset",
    "WalrusState",
    "blob_id_from_u256",
    "build_extend_tx",
    "decode_extend_tx",
    "df_id_u64",
    "load_keypair",
    "make_grpc_client",
    "normalize_address",
    "pure_u32",
    "select_coins",
    "split_batches",
    "tx_digest",
    "u256_from_blob_id",
]
