"""What storage costs Walkeep's customers: prices and shares over Walrus's units. Pure integers.

What Walrus itself charges (encoded size, units, FROST per unit-epoch) is protocol,
in ``walkeep.protocol.walrus``; this module is Walkeep's policy on top of it.

Walkeep charges credits (1 credit = 1 US cent = 1000 millicredits):
- a store costs ``store_price_mc_per_64kib`` per started 64 KiB of content;
- a renewal costs ``renewal_price_mc_per_unit_epoch`` per encoded MiB unit per
  epoch added. Both are configurable; the chain's WAL cost is recorded beside.
"""

from __future__ import annotations

from collections.abc import Sequence

from walkeep.protocol.walrus import N_SHARDS, encoded_blob_length, storage_units


def store_cost_mc(size_bytes: int, price_mc_per_64kib: int) -> int:
    """A store's price: per started 64 KiB, at least one unit."""
    units = max(1, -(-size_bytes // (64 * 1024)))
    return units * price_mc_per_64kib


def store_cost_for_epochs_mc(
    size_bytes: int, price_mc_per_64kib: int, epochs: int, initial_epochs: int
) -> int:
    """A store's price when the memory needs only ``epochs`` of the ``initial_epochs`` a
    store buys (it expires first): that fraction of ``store_cost_mc``, rounded down (the
    fraction of a millicredit is Walkeep's). ``epochs >= initial_epochs``: the full price."""
    full = store_cost_mc(size_bytes, price_mc_per_64kib)
    if epochs >= initial_epochs:
        return full
    return full * max(0, epochs) // max(1, initial_epochs)


def renewal_cost_mc(storage_size: int, epochs: int, price_mc_per_unit_epoch: int) -> int:
    return storage_units(storage_size) * epochs * price_mc_per_unit_epoch


# --- quilts --------------------------------------------------------------------------------
# A quilt is one Blob object renewed as a whole, shared by many memories of one account.
# Its cost is apportioned once, when it lands, and the shares are fixed from then on:
#
# 1. **Apportionment (largest remainder).** The quilt's encoded units, in millionths
#    (``storage_units(storage_size) * MICRO``), are split among its patches in proportion
#    to their bytes: each patch first gets the floor of its exact proportional part; the
#    millionths left over (fewer than the number of patches) go one each to the patches
#    with the largest remainders, ties to the earlier patch. The shares of ALL patches
#    then sum EXACTLY to the quilt's units: nothing is rounded up, nothing is lost.
# 2. **The cap.** A patch's share never exceeds what the memory would cost as a blob of its
#    own (``alone``): packing must never make anyone pay more. What a cap cuts is not
#    handed to the other patches; it is Walkeep's loss. A quilt's *apportioned* shares
#    (their sum, recorded on the quilt's ``blobs`` row) are therefore its units, or less
#    when a cap bit — never more.
# 3. **Renewal.** Extending a quilt by ``epochs`` bills the account for the shares of its
#    kept (active) members only, at ``share_renewal_cost_mc``: the exact part
#    ``kept * epochs * price / MICRO``, rounded DOWN to a millicredit. When every member is
#    kept (and no cap bit), the kept shares are the whole quilt and the bill is exactly the
#    whole quilt's chain-priced cost; otherwise it is the kept members' exact part, less
#    the fraction of a millicredit. Forgotten or lapsed members' shares are Walkeep's cost.
#    A member stored with an expiry is kept (billed) only while it still needs the
#    quilt, and a quilt is extended only as far as the first kept member needs it (a
#    later renewal carries on for the rest): every billed share is billed for every
#    epoch added, so the bill is still ``kept × epochs × price / MICRO`` rounded down,
#    and no quilt is extended past the last epoch any live member needs.
#    Shares are fixed when the quilt lands, so forgetting a neighbour never raises them.
# 4. **Compaction** (re-packing a quilt's live members into a new quilt) lands them like
#    any other writes: the new quilt is apportioned by the same rule.
#
# ``walkeep verify`` checks each quilt renewal against these figures exactly
# (walkeep/service/operators/verify.py; docs/auditors.md).
MICRO = 1_000_000


def apportion_quilt_shares(quilt_storage_size: int, patch_bytes: Sequence[int]) -> list[int]:
    """Each patch's fixed share of its quilt's units, in millionths of a unit, in patch
    order: largest remainder over the quilt's units, then each capped at what the patch
    would cost alone (see the rules above). Deterministic: same input, same shares."""
    if not patch_bytes:
        return []
    total = storage_units(quilt_storage_size) * MICRO
    weights = [max(0, b) for b in patch_bytes]
    payload = sum(weights)
    if payload == 0:  # nothing to weigh by: equal parts
        weights, payload = [1] * len(weights), len(weights)
    floors = [total * w // payload for w in weights]
    left = total - sum(floors)  # < len(weights)
    # Largest remainder first, the earlier patch on a tie (a stable sort).
    order = sorted(range(len(weights)), key=lambda i: -(total * weights[i] % payload))
    for i in order[:left]:
        floors[i] += 1
    return [
        min(share, storage_units(encoded_blob_length(b)) * MICRO)
        for share, b in zip(floors, patch_bytes, strict=True)
    ]


def share_renewal_cost_mc(kept_micro: int, epochs: int, price_mc_per_unit_epoch: int) -> int:
    """What extending a quilt bills its account for kept shares summing to ``kept_micro``:
    their exact part of the chain-priced cost, rounded down (the fraction is Walkeep's)."""
    return max(0, kept_micro) * epochs * price_mc_per_unit_epoch // MICRO


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
