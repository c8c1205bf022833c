"""What renewing a blob costs its account: a plain blob's units, or a quilt's kept shares.

One home for the price of a renewal, shared by the renewal pass (what it holds
and captures), ``check_balance`` (what the balance funds), the console and the alerts
(``balance.low``), so they can never disagree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from walkeep import lifecycle, pricing
from walkeep.db.models import Blob, Memory
from walkeep.lifecycle import BlobStatus, MemoryStatus
from walkeep.protocol import walrus
from walkeep.service.runtime import Runtime

ACTIVE_ONLY = (MemoryStatus.ACTIVE,)
KEPT = (MemoryStatus.ACTIVE, MemoryStatus.PAUSED)


def quilt_shares(
    s: Session, quilt_pks: list[int], statuses: tuple[MemoryStatus, ...]
) -> dict[int, int]:
    """Per quilt, the sum of its members' fixed shares (millionths of a unit), counting
    identical copies (one patch) once; only members in ``statuses``.

    Two passes because copies are rare: one grouped sum per quilt, streamed off
    ``memories (blob_pk, status, blob_id, share_micro)`` alone, that also tells which
    quilts hold a patch twice; then a distinct sum for only those. Distinct over every
    member at once sorted a million rows (spilling to disk on PostgreSQL): 0.8 s of
    each ``check_balance`` at a million memories, 0.3–0.4 s this way."""
    if not quilt_pks:
        return {}
    in_statuses = Memory.status.in_(list(statuses))
    totals: dict[int, int] = {}
    with_copies: list[int] = []
    rows = s.execute(
        select(
            Memory.blob_pk,
            func.sum(Memory.share_micro),
            func.count(),
            func.count(Memory.blob_id.distinct()),
        )
        .where(Memory.blob_pk.in_(quilt_pks), in_statuses)
        .group_by(Memory.blob_pk)
    )
    for pk, total, n_members, n_patches in rows:
        if pk is None:  # excluded by the IN above; said again for the type checker
            continue
        totals[pk] = int(total or 0)
        if n_members != n_patches:  # a patch held twice, or a member with no patch id
            with_copies.append(pk)
    if with_copies:
        members = (
            select(Memory.blob_pk, Memory.blob_id, Memory.share_micro)
            .where(Memory.blob_pk.in_(with_copies), in_statuses)
            .distinct()
            .subquery()
        )
        distinct = s.execute(
            select(members.c.blob_pk, func.sum(members.c.share_micro)).group_by(members.c.blob_pk)
        )
        totals.update({int(pk): int(total or 0) for pk, total in distinct})
    return totals


def quilt_split(blob: Any, shares: dict[int, int]) -> tuple[int, int]:
    """A quilt's apportioned shares split into (kept, unbilled), millionths of a unit.

    Kept: its kept members' fixed shares (``shares``, from ``quilt_shares``), never more
    than the quilt's apportioned shares (``blobs.share_micro``; a quilt that landed
    without it, from a write recorded before it was kept, counts its whole units).
    Unbilled: the rest, Walkeep's cost. The two always sum to the apportioned shares:
    the renewal records both and ``walkeep verify`` checks that they do."""
    whole = walrus.storage_units(blob.storage_size) * pricing.MICRO
    apportioned = whole if blob.share_micro is None else min(blob.share_micro, whole)
    kept = min(max(0, shares.get(blob.id, 0)), apportioned)
    return kept, apportioned - kept


def blob_renewal_cost_mc(blob: Any, shares: dict[int, int], epochs: int, price: int) -> int:
    """What an account pays to extend ``blob`` by ``epochs``: a plain blob's whole
    encoded units; for a quilt, only its kept members' fixed shares, at their exact
    part rounded down (walkeep/pricing.py) — the shares of forgotten members are
    Walkeep's cost (``walkeep_quilt_unbilled_mc_total``)."""
    if blob.kind == "quilt":
        kept, _unbilled = quilt_split(blob, shares)
        return pricing.share_renewal_cost_mc(kept, epochs, price)
    return pricing.renewal_cost_mc(blob.storage_size, epochs, price)


@dataclass(frozen=True, slots=True)
class Needs:
    """How far a blob's kept members need it, when at least one of them expires.

    ``cap``: the end epoch (exclusive) the last of them needs — None if any has no
    expiry. ``patches``: per patch (identical copies are one patch), its fixed share
    (millionths of a unit; 0 for a plain blob) and the end epoch it needs (None: no
    limit)."""

    cap: int | None
    patches: tuple[tuple[int, int | None], ...]


def blob_needs(
    s: Session, blob_pks: list[int], statuses: tuple[MemoryStatus, ...]
) -> dict[int, Needs]:
    """``Needs`` of each of ``blob_pks`` holding a member in ``statuses`` that expires;
    blobs none of whose members expire are absent (renewed and billed as always).

    Two steps because expiries are the exception: one probe for the blobs that hold an
    expiring member (usually none), then their members only."""
    if not blob_pks:
        return {}
    in_statuses = Memory.status.in_(list(statuses))
    pks = list(
        s.scalars(
            select(Memory.blob_pk)
            .where(Memory.blob_pk.in_(blob_pks), in_statuses, Memory.expires_epoch.is_not(None))
            .distinct()
        )
    )
    if not pks:
        return {}
    per: dict[int, dict[str | None, tuple[int, int | None]]] = {}
    rows = s.execute(
        select(Memory.blob_pk, Memory.blob_id, Memory.share_micro, Memory.expires_epoch).where(
            Memory.blob_pk.in_(pks), in_statuses
        )
    )
    for pk, patch, share, expires_epoch in rows:
        if pk is None:
            continue
        end = None if expires_epoch is None else lifecycle.expiry_end_epoch(expires_epoch)
        patches = per.setdefault(int(pk), {})
        prev = patches.get(patch)
        if prev is not None:
            end = None if prev[1] is None or end is None else max(prev[1], end)
            share = max(prev[0], share or 0)
        patches[patch] = (int(share or 0), end)
    out: dict[int, Needs] = {}
    for pk, patches in per.items():
        ends = [end for _, end in patches.values()]
        cap = None if any(e is None for e in ends) else max(e for e in ends if e is not None)
        out[pk] = Needs(cap, tuple(patches.values()))
    return out


@dataclass(frozen=True, slots=True)
class Plan:
    """One blob's renewal: the epochs it is extended by and what the account pays, with
    a quilt's kept and unbilled shares (None for a plain blob)."""

    epochs: int
    cost_mc: int
    kept_micro: int | None = None
    unbilled_micro: int | None = None


def renewal_plan(
    blob: Any, shares: dict[int, int], needs: Needs | None, epochs: int, price: int
) -> Plan:
    """Extend ``blob`` by at most ``epochs``, never past the last epoch a kept member
    needs, and bill it by the one rule ``walkeep verify`` checks exactly.

    A plain blob: its whole units for those epochs. A quilt whose kept members expire:
    only the shares of members that still need it are kept (billed); the others' are
    unbilled, Walkeep's cost, as a forgotten member's are. And it is extended only as
    far as the *first* of the billed members stops needing it, so that every billed
    share is billed for every epoch added (``kept × epochs``): a later renewal carries
    on for those that need more. A member is thus never billed for an epoch past the
    one holding its expiry, and the bill stays ``⌊kept × epochs × price⌋``."""
    if needs is None:  # no member expires: the rule as it always was
        cost = blob_renewal_cost_mc(blob, shares, epochs, price)
        if blob.kind != "quilt":
            return Plan(epochs, cost)
        kept, unbilled = quilt_split(blob, shares)
        return Plan(epochs, cost, kept, unbilled)
    k = epochs if needs.cap is None else max(0, min(epochs, needs.cap - blob.end_epoch))
    if blob.kind != "quilt":
        return Plan(k, pricing.renewal_cost_mc(blob.storage_size, k, price))
    billed = [
        (share, k if end is None else max(0, min(k, end - blob.end_epoch)))
        for share, end in needs.patches
    ]
    k = min((n for _, n in billed if n > 0), default=0)
    kept, unbilled = quilt_split(blob, {blob.id: sum(sh for sh, n in billed if n > 0)})
    return Plan(k, pricing.share_renewal_cost_mc(kept, k, price), kept, unbilled)


def renewal_burn_mc_per_epoch(rt: Runtime, account_id: str) -> tuple[int, int | None]:
    """(cost of renewing every kept blob for one epoch, their shortest runway)."""
    current = rt.chain.current_epoch()
    # The account's live blobs holding a kept memory, off the blob's own counts (kept by
    # triggers, migration 0013) and the (account_id, status, end_epoch) index. Joined to
    # memories instead, SQLite searched the account's memories once per live blob of every
    # account: check_balance took 150 s on an account of a million memories.
    kept = select(Blob.id, Blob.kind, Blob.storage_size, Blob.share_micro, Blob.end_epoch).where(
        Blob.account_id == account_id,
        Blob.status == BlobStatus.LIVE,
        Blob.end_epoch > current,
        Blob.active_memories + Blob.paused_memories > 0,
    )
    burn = 0
    runways: list[int] = []
    price = rt.settings.renewal_price_mc_per_unit_epoch
    with rt.db.read() as s:
        blobs = list(s.execute(kept))
        shares = quilt_shares(s, [b.id for b in blobs if b.kind == "quilt"], KEPT)
        needs = blob_needs(s, [b.id for b in blobs], KEPT)
    for b in blobs:
        # A quilt costs the account only its members' shares (their real price), and a
        # blob or share whose memories expire within its paid runway costs nothing more.
        burn += renewal_plan(b, shares, needs.get(b.id), 1, price).cost_mc
        runways.append(lifecycle.runway(b.end_epoch, current))
    return burn, (min(runways) if runways else None)
