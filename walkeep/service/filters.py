"""What recall and export may be narrowed to: a time range on ``stored_at``, and metadata.

``after`` is inclusive and ``before`` exclusive, so ranges laid end to end never share a
memory; ``metadata`` keeps a memory when every given name has exactly the given value.
Metadata is sealed at rest, so a filter never reads it: each ``name=value`` pair is
matched by its keyed token in ``memory_tags`` (``walkeep/service/sealed.py``), as the
lexical index matches words by keyed hashes.

A filter is applied two ways, and recall picks per query
(``walkeep/service/tools/recall.py``): every check of a hit against the memories table
carries :meth:`Filters.where`, and :func:`candidate_blobs` lists the blobs that match,
when they are few, for the index to rank among alone. Either way a filtered recall
returns the best matching memories, never the best memories with the others dropped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Select, exists, func, select
from sqlalchemy.orm import aliased

from walkeep.db.models import Memory, MemoryTag
from walkeep.errors import ValidationError
from walkeep.lifecycle import VISIBLE
from walkeep.service import sealed
from walkeep.service.instants import parse_instant
from walkeep.service.runtime import Runtime


@dataclass(frozen=True, slots=True)
class Filters:
    """A checked filter; an empty one (``not filters``) narrows nothing."""

    after: datetime | None = None
    before: datetime | None = None
    tags: tuple[str, ...] = ()  # keyed tokens of the metadata pairs, sorted

    def __bool__(self) -> bool:
        return self.after is not None or self.before is not None or bool(self.tags)

    def where(self, account_id: str, *, by_time: bool = False) -> list[ColumnElement[bool]]:
        """Conditions on ``Memory`` that keep exactly the matching memories.

        ``by_time``: the time range may pick the index the query walks (export's pages,
        in ``stored_at`` order). Without it, the range is written so that no index can
        serve it (a landed memory's ``stored_at`` is never NULL, so the two forms keep
        the same rows): recall checks a handful of hits by ``blob_id``, and SQLite's
        planner, given an indexable range, walked half an account's ``stored_at``
        index instead (13 ms, against 0.3, at 100,000 memories).
        """
        times = self.times(indexed=by_time)
        return times + [_has(account_id, tag) for tag in self.tags]

    def times(self, *, indexed: bool = True) -> list[ColumnElement[bool]]:
        """The time range, on ``stored_at`` as its index holds it, or (not ``indexed``)
        in a form no index serves."""
        column: ColumnElement[Any] = (
            Memory.stored_at.expression
            if indexed
            else func.coalesce(Memory.stored_at, Memory.accepted_at)
        )
        conds: list[ColumnElement[bool]] = []
        if self.after is not None:
            conds.append(column >= self.after)
        if self.before is not None:
            conds.append(column < self.before)
        return conds

    def key(self) -> str:
        """The filter as a string, for export's cursor MAC: a cursor is good only for the
        filter that produced it (the tags are keyed tokens, never the values)."""
        return json.dumps(
            [
                self.after.isoformat() if self.after else None,
                self.before.isoformat() if self.before else None,
                list(self.tags),
            ],
            separators=(",", ":"),
        )


def _has(account_id: str, tag: str) -> ColumnElement[bool]:
    """The memory carries ``tag``: one primary-key probe of ``memory_tags`` per memory.
    (An alias: a query driven from ``memory_tags`` must not correlate this one with it.)"""
    return exists().where(
        _TAG.account_id == account_id, _TAG.tag == tag, _TAG.memory_id == Memory.id
    )


# One alias for every query: a fresh one each time made each statement new to SQLAlchemy's
# compiled-statement cache (1.2 ms a recall).
_TAG = aliased(MemoryTag)


def parse(
    rt: Runtime,
    account_id: str,
    *,
    after: object = None,
    before: object = None,
    metadata: object = None,
) -> Filters:
    """The filter a tool was given, checked: VALIDATION_ERROR names the field at fault."""
    start = parse_instant(after, "after", date_is_end_of_day=False) if after is not None else None
    end = parse_instant(before, "before", date_is_end_of_day=False) if before is not None else None
    if start is not None and end is not None and start >= end:
        raise ValidationError(
            "after must be earlier than before (after is inclusive, before exclusive): "
            "this range holds no memory",
            {"field": "after", "after": start.isoformat(), "before": end.isoformat()},
        )
    tags: tuple[str, ...] = ()
    if metadata is not None:
        tags = tuple(sealed.metadata_tags(rt, account_id, _pairs(rt, metadata)))
    return Filters(start, end, tags)


def _pairs(rt: Runtime, metadata: object) -> dict[str, str]:
    if not isinstance(metadata, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise ValidationError(
            'metadata must map strings to strings, e.g. {"project": "apollo"}',
            {"field": "metadata"},
        )
    most = rt.settings.max_metadata_keys
    if len(metadata) > most:
        raise ValidationError(
            f"metadata names {len(metadata)} keys; a memory has at most {most}",
            {"field": "metadata", "max_keys": most},
        )
    if any(not k for k in metadata):
        raise ValidationError("metadata keys must not be empty", {"field": "metadata"})
    return dict(metadata)


def candidate_blobs(
    rt: Runtime, account_id: str, namespace: str | None, narrow: Filters, cap: int | None
) -> list[str] | None:
    """The blobs of the visible memories in scope that match, or None if more than
    ``cap`` memories may (then ranking everything and checking each hit is cheaper).

    A superset of what recall may show (a blob's end epoch and a memory's expiry are
    checked per hit). First a count of at most ``cap + 1`` entries of one index, without
    a row leaving the database: ``memory_tags``' primary key for the filter's first
    metadata pair (an upper bound: it counts memories that left, and ignores the other
    conditions), else ``ix_memories_stored``. Only when that is small are the blobs read.
    """
    q: Select[Any] = select(Memory.blob_id).where(
        Memory.status.in_(list(VISIBLE)), Memory.blob_id.is_not(None), *narrow.times()
    )
    if narrow.tags:
        # Driven from the first pair's tokens: the join walks its (account, tag) range
        # and finds each memory by its primary key; the other pairs are probed per
        # memory. No condition on memories' own indexes, so that SQLite's planner (no
        # statistics) cannot start from the account's every memory instead.
        first, *rest = narrow.tags
        probe: Select[Any] = select(MemoryTag.memory_id).where(
            MemoryTag.account_id == account_id, MemoryTag.tag == first
        )
        q = (
            q.select_from(MemoryTag)
            .join(Memory, Memory.id == MemoryTag.memory_id)
            .where(
                MemoryTag.account_id == account_id,
                MemoryTag.tag == first,
                *(_has(account_id, tag) for tag in rest),
            )
        )
    else:
        q = q.where(Memory.account_id == account_id)
    if namespace is not None:
        q = q.where(Memory.namespace == namespace)
    if not narrow.tags:
        probe = q  # index-only: ix_memories_stored holds every column it reads
    with rt.db.read() as s:
        if cap is not None:
            counted = select(func.count()).select_from(probe.limit(cap + 1).subquery())
            if (s.scalar(counted) or 0) > cap:
                return None
        rows = s.scalars(q).all()
    return list(dict.fromkeys(b for b in rows if b is not None))
