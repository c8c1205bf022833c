"""``check_runway``: the durability receipt — is my data alive, and can I prove it?

Every figure comes from Walkeep's registry of on-chain facts (blob end_epoch,
renewal digests) and the chain's current epoch. ``last_renewal_tx`` is a Sui
transaction digest an auditor can paste into an explorer.

The summary (no memory_id) also counts each namespace (``namespaces``, the largest
``NAMESPACES_MAX``): one ``GROUP BY namespace, status`` off the account's
``(account_id, namespace, status)`` index, with the memories lapsed since the last sweep
moved out of their status exactly as the account's totals move them, so the namespaces
add up to the totals. A key confined to a namespace (``confined_to``) sees only that
namespace: its ids, its counts, its list (``_namespace_summary``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    ARRAY,
    BindParameter,
    ColumnElement,
    Select,
    any_,
    bindparam,
    cast,
    func,
    select,
    union_all,
)
from sqlalchemy.orm import Session

from walkeep import lifecycle
from walkeep.db.models import BigId, Blob, Memory, MemoryCounts, table
from walkeep.lifecycle import LISTED, BlobStatus, MemoryStatus
from walkeep.service import sealed
from walkeep.service.namespaces import validate_namespace
from walkeep.service.runtime import Runtime
from walkeep.service.tools.schemas import (
    NamespaceCounts,
    RunwayMemory,
    RunwayResult,
    RunwaySummary,
)
from walkeep.service.tools.views import resolve

SUMMARY_LIST_MAX = 100
NAMESPACES_MAX = 100
# Landed and not swept: shown "expired" as soon as their blob's end_epoch has passed.
KEPT = (MemoryStatus.ACTIVE, MemoryStatus.PAUSED, MemoryStatus.NO_RENEW)


def check_runway(
    rt: Runtime,
    account_id: str,
    memory_id: str | None = None,
    *,
    confined_to: str | None = None,
) -> RunwayResult:
    """A memory's receipt, or the account summary. ``confined_to`` (a namespace name: the
    calling key is confined to it) limits both to that namespace; an id outside it is
    NOT_FOUND exactly as an unknown one."""
    current = rt.chain.current_epoch()
    token = (
        None
        if confined_to is None
        else sealed.namespace_token(rt, account_id, validate_namespace(confined_to))
    )
    if memory_id is not None:
        with rt.db.read() as s:
            rows = resolve(s, account_id, memory_id, namespace=token)
            return RunwayResult(
                current_epoch=current, memories=[_view(rt, m, b, current) for m, b in rows]
            )
    # One snapshot: the counts, the corrections and the listed rows must agree.
    with rt.db.read(snapshot=True) as s:
        counts = namespace_counts(s, account_id, current, token)
        if token is None:
            summary, listed = account_summary(s, account_id, current)
        else:
            summary, listed = _namespace_summary(s, account_id, token, current, counts)
        pairs = (
            s.execute(
                select(Memory, Blob)
                .outerjoin(Blob, Blob.id == Memory.blob_pk)
                .where(Memory.id.in_(listed))
            ).all()
            if listed
            else []
        )
    summary = summary.model_copy(update=_named(rt, account_id, counts))
    views = [_view(rt, m, b, current) for m, b in pairs]
    # Most at-risk first: lapsed (runway 0), least runway, not landed yet; then memory_id.
    views.sort(key=lambda v: (v.runway_epochs is None, v.runway_epochs or 0, v.memory_id))
    return RunwayResult(current_epoch=current, memories=views, account=summary)


def account_summary(s: Session, account_id: str, current: int) -> tuple[RunwaySummary, list[str]]:
    """The account's counts and the ids of its ``SUMMARY_LIST_MAX`` most at-risk memories,
    without reading every memory (issue 14): at most ~2 * sqrt(100 * n) index entries
    (20,000 at a million) plus one blob row per blob in the sweep's backlog, however the
    account is spread.

    Equal, by construction, to counting and sorting every listed memory's view:

    - counts per status come from ``memory_counts`` (kept exact by triggers);
    - a kept memory whose blob lapsed since the last sweep is shown ``expired``: those
      sit on the account's live (or orphan) blobs with end_epoch <= current, which the
      sweep has not processed yet; they are counted from those blobs' own counts
      (kept by triggers too) and moved out of their status's count;
    - the list is ordered by (runway, memory_id), "no blob" last. Runway 0 is the
      expired memories and those lapsed ones; runway r > 0 the kept memories on live
      blobs ending at current + r (at most 53 values); no blob is ``storing``. The
      smallest ids of each group come off an index, or from ``_smallest_in``.

    It relies on what the lifecycle guarantees: a storing memory has no blob, every
    other listed one has a blob of its own account, a kept memory's blob is live
    until the sweep expires it together with its memories, and an expired blob has
    lapsed for good. Ids sort the same in SQL and in Python: ASCII, one prefix.
    """
    p: dict[str, object] = {"p_account": account_id, "p_current": current}
    row = s.execute(_COUNTS, p).first()
    n = {st: int(getattr(row, col)) if row is not None else 0 for st, col in _COUNTED.items()}
    n[MemoryStatus.STORING] = int(s.scalar(_STORING_COUNT, p) or 0)
    n_kept = sum(n[st] for st in KEPT)
    lapsed_row = s.execute(_LAPSED_COUNTS, p).one()
    lapsed = {st: int(k) for st, k in zip(KEPT, lapsed_row, strict=True) if k}
    min_end = s.scalar(_MIN_ALIVE_END, p)
    summary = RunwaySummary(
        total_memories=sum(n.values()),
        active=n[MemoryStatus.ACTIVE] - lapsed.get(MemoryStatus.ACTIVE, 0),
        paused=n[MemoryStatus.PAUSED] - lapsed.get(MemoryStatus.PAUSED, 0),
        no_renew=n[MemoryStatus.NO_RENEW] - lapsed.get(MemoryStatus.NO_RENEW, 0),
        min_runway_epochs=lifecycle.runway(min_end, current) if min_end is not None else None,
    )

    need = SUMMARY_LIST_MAX
    zero: list[str] = []
    if n[MemoryStatus.EXPIRED]:
        zero += s.scalars(_smallest(MemoryStatus.EXPIRED), {**p, "p_n": need})
    if lapsed:
        zero += _smallest_in(s, _LAPSED, p, need, n_kept, size=sum(lapsed.values()))
    listed = sorted(zero)[:need]
    need -= len(listed)
    if need > 0:
        listed += _paid_for(s, p, need, n_kept)
        need = SUMMARY_LIST_MAX - len(listed)
    if need > 0 and n[MemoryStatus.STORING]:
        listed += s.scalars(_smallest(MemoryStatus.STORING), {**p, "p_n": need})
    return summary, listed


def namespace_counts(
    s: Session, account_id: str, current: int, token: str | None = None
) -> dict[str, NamespaceCounts]:
    """Each namespace's counts (keyed by token, ``namespace`` left as the token), counted
    as :func:`account_summary` counts the account: every listed status in the total; a
    kept memory whose blob lapsed since the last sweep out of its status's count. Only
    namespaces holding a listed memory; only ``token``'s when given.

    One index-only ``GROUP BY`` over ``(account_id, namespace, status)`` (every memory of
    the account: bench/summary.py measures it at 100,000), and the lapsed blobs' members,
    at most the sweep's backlog."""
    p: dict[str, object] = {"p_account": account_id, "p_current": current}
    by_status = _BY_NAMESPACE if token is None else _BY_NAMESPACE.where(_M.c.namespace == token)
    lapsed_q = _LAPSED_BY_NAMESPACE[_on_pg(s)]
    if token is not None:
        lapsed_q = lapsed_q.where(_M.c.namespace == token)
    lapsed: dict[tuple[str, str], int] = {(ns, st): int(k) for ns, st, k in s.execute(lapsed_q, p)}
    out: dict[str, list[int]] = {}
    for ns, st, k in s.execute(by_status, p):
        if st not in LISTED:
            continue  # accepting and failed are not memories (not listed, not counted)
        row = out.setdefault(ns, [0, 0, 0, 0])
        row[0] += int(k)
        if st in _COLUMN_OF:
            row[_COLUMN_OF[st]] += int(k) - lapsed.get((ns, st), 0)
    return {
        ns: NamespaceCounts(namespace=ns, total_memories=t, active=a, paused=pz, no_renew=nr)
        for ns, (t, a, pz, nr) in out.items()
        if t
    }


def _named(rt: Runtime, account_id: str, counts: dict[str, NamespaceCounts]) -> dict[str, object]:
    """The summary's ``namespaces`` (names opened, most memories first, ties by name,
    at most ``NAMESPACES_MAX``) and ``more_namespaces``. Only the names that can make the
    cut are opened: those with at least as many memories as the last one kept."""
    ranked = sorted(counts.values(), key=lambda c: -c.total_memories)
    if len(ranked) > NAMESPACES_MAX:
        floor = ranked[NAMESPACES_MAX - 1].total_memories
        ranked = [c for c in ranked if c.total_memories >= floor]
    names = sealed.namespace_names(rt, account_id, [c.namespace for c in ranked])
    shown = sorted(
        (c.model_copy(update={"namespace": names[c.namespace]}) for c in ranked),
        key=lambda c: (-c.total_memories, c.namespace),
    )[:NAMESPACES_MAX]
    return {"namespaces": shown, "more_namespaces": len(counts) - len(shown)}


def _namespace_summary(
    s: Session,
    account_id: str,
    token: str,
    current: int,
    counts: dict[str, NamespaceCounts],
) -> tuple[RunwaySummary, list[str]]:
    """:func:`account_summary` for one namespace (a key confined to it): its counts, its
    shortest runway and its ``SUMMARY_LIST_MAX`` most at-risk memories, in the same order
    (runway, then memory_id; no blob last). Per-account counters cannot be split by
    namespace, so this reads the namespace's memories off the
    ``(account_id, namespace, status)`` index: cost grows with the namespace, not the
    account."""
    p: dict[str, object] = {"p_account": account_id, "p_current": current, "p_ns": token}
    mine = counts.get(token)
    min_end = s.scalar(_NS_MIN_ALIVE_END, p)
    summary = RunwaySummary(
        total_memories=mine.total_memories if mine else 0,
        active=mine.active if mine else 0,
        paused=mine.paused if mine else 0,
        no_renew=mine.no_renew if mine else 0,
        min_runway_epochs=lifecycle.runway(min_end, current) if min_end is not None else None,
    )
    need = SUMMARY_LIST_MAX
    zero = [*s.scalars(_NS_SMALLEST[MemoryStatus.EXPIRED], {**p, "p_n": need})]
    zero += s.scalars(_NS_LAPSED[_on_pg(s)], p)
    listed = sorted(zero)[:need]
    need -= len(listed)
    if need > 0:
        listed += s.scalars(_NS_FIRST_PAID, {**p, "p_n": need})
        need = SUMMARY_LIST_MAX - len(listed)
    if need > 0:
        listed += s.scalars(_NS_SMALLEST[MemoryStatus.STORING], {**p, "p_n": need})
    return summary, listed


def _paid_for(s: Session, p: dict[str, object], need: int, n_kept: int) -> list[str]:
    """The ``need`` kept memories with the least runway left (> 0), by (end_epoch, id).

    The first need + 1 of them in end_epoch order (ties in any order) come straight
    off the blobs index: every end_epoch before the last one seen is complete. Only
    that last bucket may be cut, and it can be huge (a day's stores, or every blob a
    renewal pass extended to the same epoch): ``_smallest_in`` finds its first ids.
    """
    rows = [(int(e), mid) for e, mid in s.execute(_FIRST_PAID, {**p, "p_n": need + 1})]
    if len(rows) <= need:
        return [mid for _, mid in sorted(rows)]
    last = rows[need][0]
    before = sorted(r for r in rows if r[0] < last)
    k = need - len(before)
    return [mid for _, mid in before] + _smallest_in(s, _BUCKET, {**p, "p_end": last}, k, n_kept)


def _smallest_in(
    s: Session, group: _Group, p: dict[str, object], k: int, n_kept: int, size: int | None = None
) -> list[str]:
    """The k smallest memory ids of a group of the account's kept memories (those whose
    blob matches ``group``), without sorting a group that may hold a million.

    Walk the account's kept memories in id order (one index range per status,
    merged) and keep those in the group: about k * n_kept / size rows, cheap when the
    group is big. Read at most sqrt(k * n_kept) that way; a group it could not fill k
    from is small, so read it whole instead (by its blobs) and sort. Either way at
    most ~2 * sqrt(100 * n) rows: 20,000 at a million memories.
    """
    walk = max(k, math.isqrt(k * n_kept))
    if size is None or size > walk:
        found = list(s.scalars(group.walk, {**p, "p_walk": walk, "p_k": k}))
        if len(found) == k:
            return found
    return sorted(s.scalars(group.members[_on_pg(s)], p))[:k]


def _on_pg(s: Session) -> bool:
    return s.get_bind().dialect.name == "postgresql"


# Built once (check_runway is called by every agent, often).
_M, _B, _C = table(Memory), table(Blob), table(MemoryCounts)
_COUNTED = {
    MemoryStatus.ACTIVE: "active",
    MemoryStatus.PAUSED: "paused",
    MemoryStatus.NO_RENEW: "no_renew",
    MemoryStatus.EXPIRED: "expired",
}
_ACCOUNT: BindParameter[str] = bindparam("p_account")
# A blob's count of its memories in each KEPT status, in KEPT's order.
_KEPT_COLUMNS = (_B.c.active_memories, _B.c.paused_memories, _B.c.no_renew_memories)
_COUNTS = select(*(_C.c[col] for col in _COUNTED.values())).where(_C.c.account_id == _ACCOUNT)
# Storing memories are not in memory_counts (migration 0011): at most the write backlog,
# counted off the (account_id, status, id, blob_pk) index.
_STORING_COUNT = (
    select(func.count())
    .select_from(_M)
    .where(_M.c.account_id == _ACCOUNT, _M.c.status == MemoryStatus.STORING)
)


def _smallest(status: MemoryStatus) -> Select[str]:
    """The account's smallest memory ids in one status: a range of (account_id, status, id)."""
    return (
        select(_M.c.id)
        .where(_M.c.account_id == _ACCOUNT, _M.c.status == status)
        .order_by(_M.c.id)
        .limit(bindparam("p_n"))
    )


def _on_blobs(columns: Sequence[Any], blobs: Select[int], postgres: bool) -> Select[Any]:
    """Kept memories on the blobs ``blobs`` selects, probed by blob_pk. On PostgreSQL the
    blob ids go in as one array (``= ANY``): however wrong the planner's estimates, it
    cannot turn this into a hash join over every memory of the account. No memory-side
    account filter: a blob's memories are its account's."""
    if postgres:
        ids = blobs.with_only_columns(func.array_agg(_B.c.id)).scalar_subquery()
        on = _M.c.blob_pk == any_(cast(ids, ARRAY(BigId)))
    else:
        on = _M.c.blob_pk.in_(blobs)
    return select(*columns).where(on, _M.c.status.in_(KEPT))


class _Group:
    """The account's kept memories whose blob matches ``where``. ``members``: all their
    ids, by the blobs (``[on PostgreSQL]``). ``walk``: of the account's first p_walk kept
    memories in id order, the first p_k in the group."""

    def __init__(self, *where: ColumnElement[bool]) -> None:
        self.blobs: Select[int] = select(_B.c.id).where(_B.c.account_id == _ACCOUNT, *where)
        self.members = tuple(_on_blobs([_M.c.id], self.blobs, pg) for pg in (False, True))
        by_id = union_all(
            *(
                select(_M.c.id, _M.c.blob_pk)
                .where(_M.c.account_id == _ACCOUNT, _M.c.status == st)
                .order_by(_M.c.id)
                .limit(bindparam("p_walk"))
                .subquery()
                .select()
                for st in KEPT
            )
        ).subquery()
        first = select(by_id).order_by(by_id.c.id).limit(bindparam("p_walk")).subquery()
        self.walk: Select[str] = (
            select(first.c.id)
            .join(_B, _B.c.id == first.c.blob_pk)
            .where(*where)
            .order_by(first.c.id)
            .limit(bindparam("p_k"))
        )


# Past end_epoch and not expired by the sweep yet: shown expired, runway 0.
_LAPSED = _Group(
    _B.c.status.in_([BlobStatus.LIVE, BlobStatus.ORPHAN]), _B.c.end_epoch <= bindparam("p_current")
)
# Still paid for, ending at p_end.
_BUCKET = _Group(_B.c.status == BlobStatus.LIVE, _B.c.end_epoch == bindparam("p_end"))
# Lapsed memories per kept status (in KEPT's order): the lapsed blobs' own counts
# (migration 0013), never a probe of memories per blob.
_LAPSED_COUNTS = _LAPSED.blobs.with_only_columns(
    *(func.coalesce(func.sum(c), 0) for c in _KEPT_COLUMNS)
)
# min_runway_epochs: the first still-paid blob holding an active or paused memory.
_MIN_ALIVE_END = (
    select(_B.c.end_epoch)
    .where(
        _B.c.account_id == _ACCOUNT,
        _B.c.status == BlobStatus.LIVE,
        _B.c.end_epoch > bindparam("p_current"),
        _B.c.active_memories + _B.c.paused_memories > 0,
    )
    .order_by(_B.c.end_epoch)
    .limit(1)
)
# The first p_n kept memories on still-paid blobs in end_epoch order (ties: any order).
_FIRST_PAID = (
    select(_B.c.end_epoch, _M.c.id)
    .join(_M, _M.c.blob_pk == _B.c.id)
    .where(
        _B.c.account_id == _ACCOUNT,
        _B.c.status == BlobStatus.LIVE,
        _B.c.end_epoch > bindparam("p_current"),
        _M.c.status.in_(KEPT),
    )
    .order_by(_B.c.end_epoch)
    .limit(bindparam("p_n"))
)


# --- per namespace -------------------------------------------------------------------
_NS: BindParameter[str] = bindparam("p_ns")
# The summary's counted statuses and their column in a NamespaceCounts row
# (total, active, paused, no_renew).
_COLUMN_OF = {MemoryStatus.ACTIVE: 1, MemoryStatus.PAUSED: 2, MemoryStatus.NO_RENEW: 3}
_BY_NAMESPACE = (
    select(_M.c.namespace, _M.c.status, func.count())
    .where(_M.c.account_id == _ACCOUNT)
    .group_by(_M.c.namespace, _M.c.status)
)
# Kept memories on blobs lapsed since the last sweep, per namespace and status.
_LAPSED_BY_NAMESPACE = tuple(
    _on_blobs([_M.c.namespace, _M.c.status, func.count()], _LAPSED.blobs, pg).group_by(
        _M.c.namespace, _M.c.status
    )
    for pg in (False, True)
)
_NS_SMALLEST = {
    st: select(_M.c.id)
    .where(_M.c.account_id == _ACCOUNT, _M.c.namespace == _NS, _M.c.status == st)
    .order_by(_M.c.id)
    .limit(bindparam("p_n"))
    for st in (MemoryStatus.EXPIRED, MemoryStatus.STORING)
}
# The namespace's kept memories on lapsed blobs (runway 0): at most the sweep's backlog.
_NS_LAPSED = tuple(
    _on_blobs([_M.c.id], _LAPSED.blobs, pg).where(_M.c.namespace == _NS) for pg in (False, True)
)
_NS_KEPT_ON_LIVE = (
    _M.c.account_id == _ACCOUNT,
    _M.c.namespace == _NS,
    _M.c.status.in_(KEPT),
    _B.c.status == BlobStatus.LIVE,
    _B.c.end_epoch > bindparam("p_current"),
)
_NS_FIRST_PAID = (
    select(_M.c.id)
    .join(_B, _B.c.id == _M.c.blob_pk)
    .where(*_NS_KEPT_ON_LIVE)
    .order_by(_B.c.end_epoch, _M.c.id)
    .limit(bindparam("p_n"))
)
_NS_MIN_ALIVE_END = (
    select(func.min(_B.c.end_epoch))
    .select_from(_M)
    .join(_B, _B.c.id == _M.c.blob_pk)
    .where(
        _M.c.account_id == _ACCOUNT,
        _M.c.namespace == _NS,
        _M.c.status.in_([MemoryStatus.ACTIVE, MemoryStatus.PAUSED]),
        _B.c.status == BlobStatus.LIVE,
        _B.c.end_epoch > bindparam("p_current"),
    )
)


def _view(rt: Runtime, m: Memory, b: Blob | None, current: int) -> RunwayMemory:
    status = m.status
    if b is not None and status in KEPT and b.end_epoch <= current:
        status = MemoryStatus.EXPIRED  # lapsed since the last sweep: say so now
    expired = m.expires_at is not None and m.expires_at <= rt.clock.now()
    if expired and status in (MemoryStatus.ACTIVE, MemoryStatus.PAUSED):
        status = MemoryStatus.EXPIRED  # its expiry passed; the sweep marks it next
    if b is None:
        return RunwayMemory(
            memory_id=m.id,
            status=status,  # type: ignore[arg-type]
            end_epoch=None,
            current_epoch=current,
            runway_epochs=None,
            renewals_performed=0,
            last_renewal_tx=None,
            next_renewal_epoch=None,
            expires_at=m.expires_at,
            supersedes=m.supersedes,
            superseded_by=m.superseded_by,
        )
    # Renewed while active — and, for a memory that expires, only while its blob ends
    # before the end of the epoch holding its expiry.
    renewing = status == MemoryStatus.ACTIVE and (
        m.expires_epoch is None or b.end_epoch < lifecycle.expiry_end_epoch(m.expires_epoch)
    )
    return RunwayMemory(
        memory_id=m.id,
        status=status,  # type: ignore[arg-type]
        end_epoch=b.end_epoch,
        current_epoch=current,
        runway_epochs=lifecycle.runway(b.end_epoch, current),
        renewals_performed=b.renewals_performed,
        last_renewal_tx=b.last_renewal_tx,
        next_renewal_epoch=max(
            current, lifecycle.next_renewal_epoch(b.end_epoch, rt.settings.renew_threshold_epochs)
        )
        if renewing
        else None,
        last_renewal_url=rt.chain.explorer_tx_url(b.last_renewal_tx) if b.last_renewal_tx else None,
        expires_at=m.expires_at,
        supersedes=m.supersedes,
        superseded_by=m.superseded_by,
    )
