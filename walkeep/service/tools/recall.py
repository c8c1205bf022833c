"""``recall``: search over this account's memories, by words and by meaning. Read-only, free.

The relayer ranks (Walkeep's own index blends BM25 over keyed term hashes with
embedding similarity: walkeep/index/ranking.py says what ``score`` means; it is
always in [0, 1], higher is better, and ``min_score`` drops hits below it);
Walkeep's own registry decides what may be shown: only memories that are
stored, not forgotten, not lapsed (invariant 6), in this account (invariant 7).
If too many of the ranked hits are not showable, it asks the ranking for more,
so a caller still gets ``limit`` hits when that many exist. ``after``, ``before`` and
``metadata`` narrow the question (walkeep/service/filters.py): the hits are then the
best matching memories, with the scores they would have unfiltered. Content is returned
verbatim — it is data, never instructions (invariant 8).
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy import Select, func, select

from walkeep import lifecycle
from walkeep.backends.base import SearchHit
from walkeep.db.models import Blob, Memory
from walkeep.errors import ValidationError
from walkeep.lifecycle import VISIBLE
from walkeep.service import filters, sealed
from walkeep.service.namespaces import validate_namespace
from walkeep.service.runtime import Runtime
from walkeep.service.tools.schemas import RecallHit, RecallResult
from walkeep.service.tools.views import unexpired

log = logging.getLogger(__name__)

LIMIT_MIN, LIMIT_MAX, LIMIT_DEFAULT = 1, 50, 5
QUERY_MAX_CHARS = 4096
# How many ranked hits to ask for at most when many are not showable.
_MAX_CANDIDATES = 1000
# A filter matching at most this many memories has the index rank those alone (listing
# them costs ~1.5 ms a thousand); one matching more ranks everything and keeps the
# matching hits, up to _MAX_FILTERED_CANDIDATES, then lists them all after all.
_FEW_MATCHES = 2000
_MAX_FILTERED_CANDIDATES = 20_000


def recall(
    rt: Runtime,
    account_id: str,
    *,
    query: str,
    namespace: str | None = None,
    limit: int = LIMIT_DEFAULT,
    min_score: float = 0.0,
    after: str | datetime | None = None,
    before: str | datetime | None = None,
    metadata: dict[str, str] | None = None,
) -> RecallResult:
    if not isinstance(query, str) or not query.strip():
        raise ValidationError("query must be a non-empty string", {"field": "query"})
    if len(query) > QUERY_MAX_CHARS:
        raise ValidationError(
            f"query must be at most {QUERY_MAX_CHARS} characters",
            {"field": "query", "max_length": QUERY_MAX_CHARS},
        )
    if isinstance(limit, bool) or not isinstance(limit, int) or not LIMIT_MIN <= limit <= LIMIT_MAX:
        raise ValidationError(
            f"limit must be an integer from {LIMIT_MIN} to {LIMIT_MAX}",
            {"field": "limit", "minimum": LIMIT_MIN, "maximum": LIMIT_MAX},
        )
    if (
        isinstance(min_score, bool)
        or not isinstance(min_score, int | float)
        or not 0.0 <= float(min_score) <= 1.0
    ):
        raise ValidationError(
            "min_score must be a number from 0 to 1",
            {"field": "min_score", "minimum": 0, "maximum": 1},
        )
    if namespace is not None:
        # Matched as its token (walkeep/service/sealed.py), like everything below.
        namespace = sealed.namespace_token(rt, account_id, validate_namespace(namespace))
    narrow = filters.parse(rt, account_id, after=after, before=before, metadata=metadata)
    ask = _Ask(rt, account_id, namespace, query, limit, float(min_score), narrow)
    if not narrow:
        return RecallResult(results=ask.ranked(None, _MAX_CANDIDATES)[0])
    # Filtered: if few memories match, the index ranks those alone; if many do, ranking
    # everything and keeping the matching hits finds ``limit`` of them within a few
    # times ``limit / share`` candidates, cheaper than listing them all. The hits are the
    # same either way: scores do not depend on the filter.
    only = filters.candidate_blobs(rt, account_id, namespace, narrow, cap=_FEW_MATCHES)
    if only is None:
        results, complete = ask.ranked(None, _MAX_FILTERED_CANDIDATES)
        if complete:
            return RecallResult(results=results)
        only = filters.candidate_blobs(rt, account_id, namespace, narrow, cap=None)
    if not only:
        return RecallResult(results=[])
    return RecallResult(results=ask.ranked(only, len(only))[0])


@dataclass(frozen=True, slots=True)
class _Ask:
    """One recall's question, asked of the ranking as often as it takes."""

    rt: Runtime
    account_id: str
    namespace: str | None
    query: str
    limit: int
    min_score: float
    narrow: filters.Filters

    def ranked(self, only: list[str] | None, most: int) -> tuple[list[RecallHit], bool]:
        """The best ``limit`` showable hits, ranking ``only`` those blobs if given, and
        whether that is all there are (False: ``most`` candidates were not enough).

        Over-fetch: some hits may be forgotten, lapsed, still storing or (filtered)
        not matching; if too many are, ask again for more."""
        want = min(self.limit * 3 + 10, max(most, 1))
        # A filtered question ranks everything: its first hits mostly do not match, so
        # their contents are not read ahead.
        read_ahead = not self.narrow or only is not None
        while True:
            if only is None:
                hits = self.rt.relayer.search(self.account_id, self.namespace, self.query, want)
            else:
                hits = self.rt.relayer.search(
                    self.account_id, self.namespace, self.query, want, only=only
                )
            results = _showable(self, hits, read_ahead)
            exhausted = len(hits) < want or (hits and hits[-1].score < self.min_score)
            if len(results) >= self.limit or exhausted:
                return results, True
            if want >= most:
                return results, False
            want = min(want * 4, most)


def _showable(ask: _Ask, hits: list[SearchHit], read_ahead: bool) -> list[RecallHit]:
    """The first ``limit`` hits that are visible memories of this account and scope.

    Hits are checked in rank order, only as many at a time as results are still
    missing (then more, if some were not showable): checking all ``3 × limit + 10``
    candidates at once read three times the memory and blob rows a recall needs, and
    at a million memories those rows are mostly not in the page cache. The first
    ``limit`` hits' contents are read while they are checked (on a helper thread):
    nearly always they are all shown, and at a million memories both are reads from
    disk. Content is only ever returned for a hit the check let through.
    """
    rt, account_id, namespace, limit = ask.rt, ask.account_id, ask.namespace, ask.limit
    min_score, narrow = ask.min_score, ask.narrow
    first: dict[str, SearchHit] = {}
    for h in hits:
        if h.score >= min_score:
            first.setdefault(h.blob_id, h)
    ranked = list(first)
    if not ranked:
        return []
    ahead = [b for b in ranked[:limit] if first[b].content is None] if read_ahead else []
    early = _READ_AHEAD.submit(rt.relayer.read_many, account_id, ahead) if ahead else None
    current = rt.chain.current_epoch()
    results: list[tuple[str, str, float, datetime, int]] = []
    contents: dict[str, str] = {}
    tried: set[str] = set()
    done = 0
    while done < len(ranked) and len(results) < limit:
        missing = limit - len(results)
        # Then more at a time, doubling what was checked: a filter may keep few hits.
        batch = ranked[done : done + (missing if done == 0 else max(4 * missing, 16, done))]
        done += len(batch)
        visible = _visible(rt, account_id, namespace, narrow, batch, current)
        shown = [b for b in batch if b in visible]
        if early is not None:
            # Not started yet (the helpers busy with other recalls): read below instead.
            if not early.cancel() and any(b in visible for b in ahead):
                try:
                    contents.update(early.result())
                    tried.update(ahead)
                except Exception:
                    log.debug("read-ahead failed; reading again", exc_info=True)
            early = None
        while shown and len(results) < limit:
            # As many as are still missing, read together (the backend may overlap the
            # fetches: ten aggregator round trips one after another were most of a
            # cold recall on Walrus), then more only if some were unreadable.
            take, shown = shown[: limit - len(results)], shown[limit - len(results) :]
            unread = [b for b in take if first[b].content is None and b not in tried]
            if unread:
                contents.update(rt.relayer.read_many(account_id, unread))
                tried.update(unread)
            for blob_id in take:
                hit = first[blob_id]
                content = hit.content if hit.content is not None else contents.get(blob_id)
                if content is None:
                    log.warning("blob %s is indexed but unreadable; skipping", blob_id)
                    continue
                stored_at, end_epoch = visible[blob_id]
                results.append((blob_id, content, hit.score, stored_at, end_epoch))
    newest = _newest_memories(rt, account_id, namespace, narrow, [r[0] for r in results], current)
    return [
        RecallHit(
            blob_id=blob_id,
            content=content,
            score=round(float(score), 4),
            stored_at=stored_at,
            runway_epochs=lifecycle.runway(end_epoch, current),
            memory_id=newest[blob_id][0],
            namespace=newest[blob_id][1],
            metadata=newest[blob_id][2],
        )
        for blob_id, content, score, stored_at, end_epoch in results
        if blob_id in newest  # forgotten between the two reads: not shown
    ]


def _newest_memories(
    rt: Runtime,
    account_id: str,
    namespace: str | None,
    narrow: filters.Filters,
    blob_ids: list[str],
    current: int,
) -> dict[str, tuple[str, str, dict[str, str]]]:
    """For each shown blob, the newest visible memory in scope that matches the filter:
    (id, namespace, metadata).

    Identical content stored more than once shares one blob, so a hit is one blob; it is
    reported as the memory stored last. Only the shown hits' rows are read (at most
    ``limit``), apart from the index-only visibility check of every candidate.
    """
    if not blob_ids:
        return {}
    q = _in_scope(
        select(Memory.blob_id, Memory.id, Memory.namespace, Memory.metadata_),
        account_id,
        namespace,
        narrow,
        blob_ids,
        current,
        rt.clock.now(),
    ).order_by(func.coalesce(Memory.stored_at, Memory.accepted_at).desc(), Memory.id.desc())
    rows: dict[str, tuple[str, str, object]] = {}
    with rt.db.read() as s:
        for blob_id, memory_id, ns, metadata in s.execute(q):
            rows.setdefault(blob_id, (memory_id, ns, metadata))
    names = sealed.namespace_names(rt, account_id, {ns for _, ns, _ in rows.values()})
    return {
        blob_id: (memory_id, names[ns], sealed.open_metadata(rt, account_id, metadata))
        for blob_id, (memory_id, ns, metadata) in rows.items()
    }


# Reads a recall's first hits while their visibility is checked (see _showable).
_READ_AHEAD = ThreadPoolExecutor(max_workers=4, thread_name_prefix="recall-read")


def _visible(
    rt: Runtime,
    account_id: str,
    namespace: str | None,
    narrow: filters.Filters,
    blob_ids: list[str],
    current: int,
) -> dict[str | None, tuple[datetime, int]]:
    """Of ``blob_ids``, those holding a visible memory in scope that matches the filter:
    (stored_at, end_epoch)."""
    q = _in_scope(
        select(
            Memory.blob_id,
            func.min(func.coalesce(Memory.stored_at, Memory.accepted_at)),
            func.max(Blob.end_epoch),
        ),
        account_id,
        namespace,
        narrow,
        blob_ids,
        current,
        rt.clock.now(),
    ).group_by(Memory.blob_id)
    with rt.db.read() as s:
        return {row[0]: (row[1], row[2]) for row in s.execute(q)}


_Q = TypeVar("_Q", bound=Select[*tuple[Any, ...]])


def _in_scope(
    q: _Q,
    account_id: str,
    namespace: str | None,
    narrow: filters.Filters,
    blob_ids: list[str],
    current: int,
    now: datetime,
) -> _Q:
    """``q`` over the visible memories of ``blob_ids`` in this account and scope, on blobs
    still paid for and not past their ``expires_at``: what recall may show (invariants 6
    and 7); and of those, the ones the filter keeps."""
    q = q.join(Blob, Blob.id == Memory.blob_pk).where(
        Memory.account_id == account_id,
        Memory.status.in_(list(VISIBLE)),
        Memory.blob_id.in_(blob_ids),
        Blob.end_epoch > current,
        unexpired(now),
        *narrow.where(account_id),
    )
    return q.where(Memory.namespace == namespace) if namespace is not None else q
