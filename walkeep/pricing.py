"""What storage costs Walkeep's customers: prices and shares over Walrus's units. Pure integers.

What Walrus itself charges (encoded size, units, FROST per unit-epoch) is protocol,
in ``walkeep.protocol.walrus``; this module is Walkeep's policy on top of it.

Walkeep charges credits (1 credit = 1 US cent = 1000 millicredits):
- a store costs ``store_price_mc_per_64kib`` per started 64 KiB of content;
- a renewal costs ``renewal_price_mc_per_unit_epoch`` per encoded MiB unit per
  epoch added. Both are configurable; the chain's WAL cost is recorded beside.
"""

from __future__ import annotations

from walkeep.protocol.walrus import N_SHARDS, encoded_blob_length, storage_units


def store_cost_mc(size_bytes: int, price_mc_per_64kib: int) -> int:
    """A store's price: per started 64 KiB, at least one unit."""
    units = max(1, -(-size_bytes // (64 * 1024)))
    return units * price_mc_per_64kib


def renewal_cost_mc(storage_size: int, epochs: int, price_mc_per_unit_epoch: int) -> int:
    return storage_units(storage_size) * epochs * price_mc_per_unit_epoch


# --- quilts --------------------------------------------------------------------------------
# A packed memory's renewal price is a share of its quilt's units, kept in
# millionths of a unit so that a 100-byte memory's share of a 63-unit quilt is
# still an exact integer.
MICRO = 1_000_000


def quilt_share_micro(quilt_storage_size: int, payload_bytes: int, patch_bytes: int) -> int:
    """A packed memory's fixed share of its quilt's encoded units (millionths of a unit).

    Proportional to its bytes among the quilt's ``payload_bytes``, rounded up,
    and never more than the memory would cost as a blob of its own: packing
    must never make anyone pay more. Fixed when the quilt lands, so forgetting
    a neighbour never raises it (the neighbour's share becomes Walkeep's cost).
    """
    units = storage_units(quilt_storage_size)
    proportional = -(-units * MICRO * patch_bytes // max(payload_bytes, patch_bytes, 1))
    alone = storage_units(encoded_blob_length(patch_bytes)) * MICRO
    return min(proportional, alone)


def share_renewal_cost_mc(share_micro: int, epochs: int, price_mc_per_unit_epoch: int) -> int:
    """Renewal price of packed memories whose shares add up to ``share_micro``."""
    return -(-share_micro * epochs * price_mc_per_unit_epoch // MICRO)


def packing_saves(size: int, quilt_max_bytes: int, n_shards: int = N_SHARDS) -> bool:
    """The rule that decides whether a memory is packed into a quilt or stored alone.

    A cost comparison: the memory's proportional share of a full quilt
    (``quilt_max_bytes`` of patches) against what it costs as a blob of its
    own. Below ~445 KB every blob costs the same 63 units (metadata dominates),
    so small memories always save; a memory large enough that its own slivers
    dominate — or one that would fill more than the quilt's byte bound — saves
    nothing and goes alone.
    """
    if size <= 0 or size > quilt_max_bytes:
        return False
    full_quilt_units = storage_units(encoded_blob_length(quilt_max_bytes, n_shards))
    alone_units = storage_units(encoded_blob_length(size, n_shards))
    return full_quilt_units * size < alone_units * quilt_max_bytes
