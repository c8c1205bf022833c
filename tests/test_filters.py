"""``after``/``before``/``metadata`` on recall and export: exact, inside the search.

Each filter alone and combined, at its boundaries (``after`` inclusive, ``before``
exclusive), with namespaces, with memories that left (forgotten, superseded, expired,
lapsed); a filtered recall equals the unfiltered ranking with the non-matching memories
taken out — whether the index ranks the few matching blobs alone or ranks everything
and keeps the matching hits — and fills ``limit`` when enough match; malformed filters
are VALIDATION_ERRORs naming the field; export pages carry their filter in the cursor.
Run on SQLite and PostgreSQL with the same expectations.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import anyio
import httpx
import pytest
from sqlalchemy import select, update

from tests.helpers import account, land_all
from tests.test_mcp_e2e import (  # noqa: F401  (fixture)
    Server,
    call_err,
    call_ok,
    live,
    mcp_client,
    wait_landed,
)
from walkeep import errors
from walkeep.client import WalkeepClient
from walkeep.clock import ManualClock
from walkeep.db.models import Blob, Memory, MemoryTag
from walkeep.errors import ValidationError
from walkeep.service.jobs import purge
from walkeep.service.operators import accounts
from walkeep.service.runtime import Runtime
from walkeep.service.tools import export, forget, recall, store


def _stored(rt: Runtime, a: str, content: str, rid: str, **kw: object) -> str:
    mid = store.store(rt, a, content=content, request_id=rid, **kw).memory_id  # type: ignore[arg-type]
    land_all(rt)
    return mid


def _recalled(rt: Runtime, a: str, query: str = "weekly report", **kw: object) -> list[str]:
    return [h.memory_id for h in recall.recall(rt, a, query=query, limit=50, **kw).results]  # type: ignore[arg-type]


def _exported(rt: Runtime, a: str, **kw: object) -> list[str]:
    return [m.memory_id for m in export.export(rt, a, **kw).memories]  # type: ignore[arg-type]


def _stored_at(rt: Runtime, mid: str) -> datetime:
    with rt.db.read() as s:
        m = s.get(Memory, mid)
        assert m is not None and m.stored_at is not None
        return m.stored_at


@pytest.fixture
def four(rt: Runtime, clock: ManualClock) -> tuple[str, list[str], list[datetime]]:
    """Four reports an hour apart: apollo/zeus alternate, ann owns the first two; a fifth
    in another namespace is apollo too."""
    a = account(rt)
    labels = [
        {"project": "apollo", "owner": "ann"},
        {"project": "zeus", "owner": "ann"},
        {"project": "apollo", "owner": "bob"},
        {"project": "zeus"},
    ]
    mids = []
    for i, md in enumerate(labels):
        mids.append(_stored(rt, a, f"weekly report number {i} of the team", f"r{i}", metadata=md))
        clock.advance(3600)
    mids.append(
        _stored(
            rt,
            a,
            "weekly report of the other team",
            "r4",
            metadata={"project": "apollo"},
            namespace="other",
        )
    )
    return a, mids, [_stored_at(rt, m) for m in mids]


def test_each_filter_alone_and_combined_at_its_boundaries(
    rt: Runtime, four: tuple[str, list[str], list[datetime]]
) -> None:
    a, m, t = four
    ns = {"namespace": "default"}
    cases: list[tuple[dict[str, object], set[str]]] = [
        ({}, set(m[:4])),
        ({"after": t[1].isoformat()}, {m[1], m[2], m[3]}),  # inclusive
        ({"before": t[2].isoformat()}, {m[0], m[1]}),  # exclusive
        ({"after": t[1], "before": t[3]}, {m[1], m[2]}),
        ({"after": t[0].date().isoformat()}, set(m[:4])),  # a date: the start of its day
        ({"before": t[0].date().isoformat()}, set()),
        ({"metadata": {"project": "apollo"}}, {m[0], m[2]}),
        ({"metadata": {"project": "apollo", "owner": "ann"}}, {m[0]}),
        ({"metadata": {"owner": "ann"}, "after": t[1]}, {m[1]}),
        (
            {"metadata": {"project": "apollo"}, "before": t[2] + timedelta(microseconds=1)},
            {m[0], m[2]},
        ),
        ({"metadata": {"project": "Apollo"}}, set()),  # exact values
        ({"metadata": {"projec": "apollo"}}, set()),
        ({"metadata": {}}, set(m[:4])),  # an empty map narrows nothing
    ]
    for filt, want in cases:
        assert set(_recalled(rt, a, **ns, **filt)) == want, filt
        assert set(_exported(rt, a, **ns, **filt)) == want, filt
    # Namespaces: the filter applies within the one asked for, or across all.
    apollo = {"metadata": {"project": "apollo"}}
    assert set(_recalled(rt, a, namespace="other", **apollo)) == {m[4]}
    assert set(_recalled(rt, a, **apollo)) == {m[0], m[2], m[4]}
    assert set(_exported(rt, a, **apollo)) == {m[0], m[2], m[4]}
    # Hits carry what was stored.
    hit = recall.recall(rt, a, query="weekly report", metadata={"owner": "bob"}).results[0]
    assert (hit.memory_id, hit.namespace, hit.metadata) == (
        m[2],
        "default",
        {"project": "apollo", "owner": "bob"},
    )


def test_memories_that_left_never_match(rt: Runtime, clock: ManualClock) -> None:
    a = account(rt)
    tag = {"metadata": {"topic": "kestrel"}}
    kept = _stored(rt, a, "kestrels hover over the field", "k", **tag)
    gone = _stored(rt, a, "kestrels nest in the old tower", "g", **tag)
    forget.forget(rt, a, memory_id=gone, request_id="f")
    old = _stored(rt, a, "kestrels eat voles mostly", "o", **tag)
    new = _stored(rt, a, "kestrels eat voles and beetles", "n", supersedes=old, **tag)
    until = rt.clock.now() + timedelta(hours=1)
    brief = _stored(rt, a, "kestrels seen at the pond today", "b", expires_at=until, **tag)
    lapsed = _stored(rt, a, "kestrels migrate in autumn", "l", **tag)
    with rt.db.begin() as s:  # its blob's paid epochs ran out (renewal never came)
        pk = s.scalar(select(Memory.blob_pk).where(Memory.id == lapsed))
        s.execute(update(Blob).where(Blob.id == pk).values(end_epoch=rt.chain.current_epoch()))
    assert set(_recalled(rt, a, "kestrels", **tag)) == {kept, new, brief}
    clock.advance(3601)
    assert set(_recalled(rt, a, "kestrels", **tag)) == {kept, new}
    assert set(_exported(rt, a, **tag)) == {kept, new}
    # A purge takes the tags of what left with its metadata; live ones keep theirs.
    clock.advance(rt.settings.purge_within_hours * 3600)
    purge.purge(rt, [a])
    with rt.db.read() as s:
        tagged = set(s.scalars(select(MemoryTag.memory_id).where(MemoryTag.account_id == a)))
    assert kept in tagged and new in tagged
    assert gone not in tagged and old not in tagged


@pytest.mark.parametrize("few", [0, 100_000], ids=["rank-all-then-keep", "rank-matches-alone"])
def test_a_filtered_recall_is_the_ranking_with_the_others_taken_out(
    rt: Runtime, clock: ManualClock, monkeypatch: pytest.MonkeyPatch, few: int
) -> None:
    """Both ways of applying a filter give the best matching memories, with the scores
    they have unfiltered, and fill ``limit`` when enough match."""
    monkeypatch.setattr(recall, "_FEW_MATCHES", few)
    a = account(rt, credits=1000)
    topics = ["lighthouse", "harbour", "ferry", "tide", "gull"]
    mids: list[str] = []
    for i in range(60):
        md = {"half": "yes" if i % 2 else "no"}
        if i % 10 == 3:
            md["rare"] = "yes"
        text = f"log {i}: the {topics[i % 5]} by the {topics[(i * 3) % 5]} at dawn"
        mids.append(store.store(rt, a, content=text, request_id=f"s{i}", metadata=md).memory_id)
        if i == 29:
            land_all(rt)
            clock.advance(600)
    land_all(rt)
    middle = _stored_at(rt, mids[30])
    with rt.db.read() as s:
        rows = s.execute(select(Memory.id, Memory.blob_id).where(Memory.account_id == a)).all()
    memory_of = {b: m for m, b in rows}
    query = "the ferry at dawn by the harbour"
    ranking = [(memory_of[h.blob_id], h.score) for h in rt.relayer.search(a, None, query, 1000)]
    assert len(ranking) == 60
    cases: list[tuple[dict[str, object], set[str]]] = [
        ({"metadata": {"rare": "yes"}}, {mids[i] for i in range(60) if i % 10 == 3}),
        ({"metadata": {"half": "yes"}}, {mids[i] for i in range(60) if i % 2}),
        ({"after": middle}, set(mids[30:])),
        ({"before": middle, "metadata": {"half": "no"}}, {mids[i] for i in range(0, 30, 2)}),
    ]
    for filt, matching in cases:
        for limit in (3, 5, 20):
            want = [(m, round(sc, 4)) for m, sc in ranking if m in matching][:limit]
            got = recall.recall(rt, a, query=query, limit=limit, **filt).results  # type: ignore[arg-type]
            assert [(h.memory_id, h.score) for h in got] == want, (filt, limit)
            assert len(got) == min(limit, len(matching))


def test_identical_content_is_one_hit_the_newest_that_matches(
    rt: Runtime, clock: ManualClock
) -> None:
    a = account(rt)
    first = _stored(rt, a, "the spare key is under the blue pot", "1", metadata={"v": "1"})
    clock.advance(60)
    second = _stored(rt, a, "the spare key is under the blue pot", "2", metadata={"v": "2"})
    hits = recall.recall(rt, a, query="spare key").results
    assert [h.memory_id for h in hits] == [second]
    hits = recall.recall(rt, a, query="spare key", metadata={"v": "1"}).results
    assert [(h.memory_id, h.metadata) for h in hits] == [(first, {"v": "1"})]


@pytest.mark.parametrize(
    ("args", "field"),
    [
        ({"after": "yesterday"}, "after"),
        ({"before": "2026-13-01"}, "before"),
        ({"after": "2026-12-01T10:00:00"}, "after"),  # no offset
        ({"after": "2026-12-02", "before": "2026-12-01"}, "after"),
        ({"after": "2026-12-01T00:00:00Z", "before": "2026-12-01"}, "after"),  # empty range
        ({"metadata": ["project", "apollo"]}, "metadata"),
        ({"metadata": {"project": 7}}, "metadata"),
        ({"metadata": {"": "x"}}, "metadata"),
    ],
)
def test_a_malformed_or_contradictory_filter_names_its_field(
    rt: Runtime, args: dict[str, object], field: str
) -> None:
    a = account(rt)
    with pytest.raises(ValidationError) as exc:
        recall.recall(rt, a, query="anything", **args)  # type: ignore[arg-type]
    assert exc.value.data["field"] == field
    with pytest.raises(ValidationError) as exc:
        export.export(rt, a, **args)  # type: ignore[arg-type]
    assert exc.value.data["field"] == field


def test_an_export_cursor_belongs_to_its_filter(
    rt: Runtime, four: tuple[str, list[str], list[datetime]]
) -> None:
    a, m, _ = four
    apollo = {"metadata": {"project": "apollo"}}
    seen: list[str] = []
    cursor = None
    while True:
        page = export.export(rt, a, cursor=cursor, limit=1, **apollo)  # type: ignore[arg-type]
        seen += [x.memory_id for x in page.memories]
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert sorted(seen) == sorted([m[0], m[2], m[4]])
    first = export.export(rt, a, limit=1, **apollo)  # type: ignore[arg-type]
    assert first.next_cursor is not None
    for other in ({}, {"metadata": {"project": "zeus"}}, {"after": "2000-01-01"}):
        with pytest.raises(ValidationError) as exc:
            export.export(rt, a, cursor=first.next_cursor, limit=1, **other)  # type: ignore[arg-type]
        assert exc.value.data["field"] == "cursor"


def test_metadata_and_filters_round_trip_over_mcp(live: Server) -> None:  # noqa: F811
    rt = live.rt
    key = accounts.create_account(rt.db, "mcp-filters", credits_mc=100_000).api_key

    async def go() -> None:
        async with mcp_client(live, key) as c:
            tools = {t.name: t for t in (await c.list_tools()).tools}
            for name in ("recall", "export"):
                props = tools[name].input_schema["properties"]
                assert {"after", "before", "metadata"} <= props.keys()
            md = {"project": "apollo", "owner": "ann"}
            kept = await call_ok(
                c,
                "store",
                {"content": "Apollo ships on Friday.", "request_id": "a", "metadata": md},
            )
            await call_ok(c, "store", {"content": "Zeus ships on Monday.", "request_id": "z"})
            await anyio.to_thread.run_sync(wait_landed, rt)
            got = await call_ok(c, "recall", {"query": "ships", "metadata": {"project": "apollo"}})
            assert [(h["memory_id"], h["metadata"], h["namespace"]) for h in got["results"]] == [
                (kept["memory_id"], md, "default")
            ]
            page = await call_ok(c, "export", {"metadata": {"owner": "ann"}, "after": "2000-01-01"})
            assert [(m["memory_id"], m["metadata"]) for m in page["memories"]] == [
                (kept["memory_id"], md)
            ]
            err = await call_err(
                c, "recall", {"query": "ships", "after": "tomorrow"}, "VALIDATION_ERROR"
            )
            assert err["data"]["field"] == "after"
            # A misspelled filter is refused, never ignored.
            err = await call_err(
                c, "recall", {"query": "ships", "metdata": {"project": "zeus"}}, "VALIDATION_ERROR"
            )
            assert "metdata" in err["message"]

    anyio.run(go)


def test_metadata_and_filters_round_trip_over_rest_and_the_python_client(live: Server) -> None:  # noqa: F811
    rt = live.rt
    key = accounts.create_account(rt.db, "py-filters", credits_mc=100_000).api_key
    md = {"project": "apollo", "note": "a=b&c"}  # characters a query string must escape
    with WalkeepClient(live.url, api_key=key) as wk:
        kept = wk.store("Apollo ships on Friday.", request_id="a", metadata=md)
        wk.store("Zeus ships on Monday.", request_id="z", metadata={"project": "zeus"})
        wait_landed(rt)
        hits = wk.recall("ships", metadata={"note": "a=b&c"}).results
        assert [(h.memory_id, h.metadata) for h in hits] == [(kept.memory_id, md)]
        assert wk.recall("ships", before="2000-01-01").results == []
        exported = list(wk.export_all(metadata=md, after=rt.clock.now() - timedelta(days=1)))
        assert [(m.memory_id, m.metadata) for m in exported] == [(kept.memory_id, md)]
        try:
            wk.recall("ships", after="2030-01-02", before="2030-01-01")
        except errors.ValidationError as exc:
            assert exc.data["field"] == "after"
        else:
            raise AssertionError("a contradictory range was accepted")
    auth = {"Authorization": f"Bearer {key}"}
    r = httpx.get(f"{live.url}/v1/export", headers=auth, params={"metadata": "project=apollo"})
    assert r.status_code in (400, 422) and r.json()["data"]["field"] == "metadata"
    r = httpx.get(f"{live.url}/v1/export", headers=auth, params={"afterr": "2000-01-01"})
    assert r.status_code in (400, 422) and r.json()["data"]["field"] == "afterr"
    r = httpx.post(
        f"{live.url}/v1/recall", headers=auth, json={"query": "ships", "befor": "2000-01-01"}
    )
    assert r.status_code in (400, 422) and r.json()["code"] == "VALIDATION_ERROR"
