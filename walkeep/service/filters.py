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

from sqlalchemy import ColumnElement, exists, select
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

    def where(self, account_id: str) -> list[ColumnElement[bool]]:
        """Conditions on ``Memory`` that keep exactly the matching memories."""
        return self.times() + [_has(account_id, tag) for tag in self.tags]

    def times(self) -> list[ColumnElement[bool]]:
        conds: list[ColumnElement[bool]] = []
        if self.after is not None:
            conds.append(Memory.stored_at >= self.after)
        if self.before is not None:
            conds.append(Memory.stored_at < self.before)
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
    t = aliased(MemoryTag)
    return exists().where(t.account_id == account_id, t.tag == tag, t.memory_id == Memory.id)


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
    ``cap`` memories do (then ranking everything and checking each hit is cheaper).

    A superset of what recall may show (a blob's end epoch and a memory's expiry are
    checked per hit). Read off an index: ``memory_tags``' primary key when the filter
    names metadata, else ``ix_memories_stored``; at most ``cap + 1`` rows either way.
    """
    q = select(Memory.blob_id).where(
        Memory.account_id == account_id,
        Memory.status.in_(list(VISIBLE)),
        Memory.blob_id.is_not(None),
    )
    q = q.where(*narrow.times())
    if narrow.tags:
        # Driven from the first pair's tokens (the join walks its (account, tag) range);
        # the others are probed per memory.
        first, *rest = narrow.tags
        q = q.join(MemoryTag, MemoryTag.memory_id == Memory.id).where(
            MemoryTag.account_id == account_id,
            MemoryTag.tag == first,
            *(_has(account_id, tag) for tag in rest),
        )
    if namespace is not None:
        q = q.where(Memory.namespace == namespace)
    if cap is not None:
        q = q.limit(cap + 1)
    with rt.db.read() as s:
        rows = s.scalars(q).all()
    if cap is not None and len(rows) > cap:
        return None
    return list(dict.fromkeys(b for b in rows if b is not None))
