"""What Walrus charges and allows, as its contracts and encoder define it. Pure integers.

Walrus bills storage per 1 MiB unit of *encoded* size per epoch. With 1000
shards every blob carries ~61 MiB of metadata, so a tiny memory is 63 units
(notes/walrus-sui.md §2.5; checked against the docs: 17 B → 66,034,000 and
1,782,224 B → 72,040,000 encoded bytes). Walkeep's own prices over these units
are policy, in ``walkeep.pricing``.
"""

from __future__ import annotations

# Walrus refuses to keep storage paid for more than this many epochs ahead.
MAX_EPOCHS_AHEAD = 53

N_SHARDS = 1000
MIB = 1 << 20


def encoded_blob_length(unencoded_size: int, n_shards: int = N_SHARDS) -> int:
    """Port of Walrus ``encoded_blob_length_for_n_shards`` (RS2 encoding)."""
    f = (n_shards - 1) // 3
    primary, secondary = n_shards - 2 * f, n_shards - f
    symbol = -(-max(unencoded_size, 1) // (primary * secondary))
    symbol += symbol % 2  # RS2 symbols are 2-byte aligned
    metadata = n_shards * (n_shards * 64 + 32)
    return metadata + n_shards * (primary + secondary) * symbol


def storage_units(storage_size: int) -> int:
    """Billable 1 MiB units of an encoded size."""
    return -(-storage_size // MIB)


def walrus_storage_cost_frost(storage_size: int, epochs: int, price_per_unit_frost: int) -> int:
    """What ``extend_blob`` / ``reserve_space`` charge in FROST (1e9 FROST = 1 WAL)."""
    return storage_units(storage_size) * price_per_unit_frost * epochs
