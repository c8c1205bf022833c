"""What a copy of the data reveals (docs/security.md, "What a copy reveals"): no namespace or
metadata string anywhere under the data directory or in the database (its WAL, a
``pg_dump``), and no vector a guesser could match with the public model in the database."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import func, select, update
from sqlalchemy import text as sql
from typer.testing import CliRunner

from tests.conftest import TEST_MASTER_KEY
from tests.helpers import account, database_bytes, land_all
from walkeep import cli
from walkeep.clock import ManualClock
from walkeep.db import migrate as migrations
from walkeep.db.models import Embedding, Memory
from walkeep.index.rows import chunk_text, encode_vector
from walkeep.index.segment import quantise
from walkeep.service import digests, sealed
from walkeep.service.jobs import purge, reindex, sweep
from walkeep.service.operators import accounts
from walkeep.service.runtime import Runtime
from walkeep.service.tools import export, forget, recall, store

NAMESPACE = "patient-vortigern-4821"
METADATA = {"ssn_of_patient": "078-05-1120", "contact": "zelda.quist@example.org"}
SECRETS = [
    "My PIN is 4821 and the spare key is under the heron statue",
    "Diagnosis: type 2 diabetes, started metformin in March",
    "Door code 7731# for the Quist residence",
]


def _encodings(text: str) -> set[bytes]:
    """``text`` as the bytes a file or dump could hold it in."""
    raw = text.encode("utf-8")
    return {
        raw,
        text.encode("utf-16-le"),
        text.encode("utf-16-be"),
        text.encode("utf-32-le"),
        raw.hex().encode(),
        raw.hex().upper().encode(),
        base64.b64encode(raw).rstrip(b"="),
        base64.urlsafe_b64encode(raw).rstrip(b"="),
    }


def _files(root: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file())


def _metadata(i: int) -> dict[str, str]:
    return {**METADATA, "n": str(i)}  # each memory's own (sealed alike when equal)


def _stored(rt: Runtime) -> tuple[str, list[str]]:
    a = account(rt)
    ids = [
        store.store(
            rt, a, content=text, request_id=f"s{i}", namespace=NAMESPACE, metadata=_metadata(i)
        ).memory_id
        for i, text in enumerate(SECRETS)
    ]
    land_all(rt)
    forget.forget(rt, a, memory_id=ids[1], request_id="f1")
    return a, ids


def test_no_namespace_or_metadata_string_is_in_the_database_or_the_data_directory(
    rt: Runtime,
) -> None:
    a, _ = _stored(rt)
    # Built, so its files are on disk to be scanned too.
    assert recall.recall(rt, a, query="heron statue", namespace=NAMESPACE).results
    everything = database_bytes(rt) + _files(rt.settings.data_dir)
    assert len(everything) > 10_000
    strings = [NAMESPACE, *METADATA, *METADATA.values()]
    for text in strings:
        found = [e for e in _encodings(text) if e in everything]
        assert not found, f"{text!r} is readable at rest as {found[0][:40]!r}"


def test_the_tools_still_show_namespaces_and_metadata(rt: Runtime) -> None:
    a, ids = _stored(rt)
    hits = recall.recall(rt, a, query="heron statue spare key", namespace=NAMESPACE).results
    assert hits and hits[0].memory_id == ids[0]
    assert hits[0].namespace == NAMESPACE and hits[0].metadata == _metadata(0)
    items = export.export(rt, a, namespace=NAMESPACE).memories
    assert sorted((m.memory_id, m.metadata) for m in items) == sorted(
        [(ids[0], _metadata(0)), (ids[2], _metadata(2))]
    )
    assert all(m.namespace == NAMESPACE for m in items)
    # Another namespace sees none of them; the name is matched, not stored.
    assert not recall.recall(rt, a, query="heron statue", namespace="elsewhere").results
    with rt.db.read() as s:
        stored_ns = set(s.scalars(select(Memory.namespace).where(Memory.account_id == a)))
    assert stored_ns == {sealed.namespace_token(rt, a, NAMESPACE)}


def test_no_vector_in_the_database_matches_the_model_s_embedding_of_any_content(
    rt: Runtime,
) -> None:
    """The guess-confirming attack: embed a candidate text with the public model and look
    for its vector (float32, or the index's int8) in a copy of the database."""
    a, _ = _stored(rt)
    embedder = rt.relayer.index.embedder  # type: ignore[attr-defined]
    chunks = [c for text in SECRETS for c in chunk_text(text)]
    vectors = np.asarray(embedder.embed(chunks), dtype=np.float32)
    raw = database_bytes(rt)
    with rt.db.read() as s:
        assert s.scalar(select(Embedding.id).where(Embedding.account_id == a).limit(1))
    for v, i8 in zip(vectors, quantise(vectors), strict=True):
        float_bytes = encode_vector(v)
        # Any 64-byte window of the vector would do for a guesser; none is there.
        assert float_bytes[:64] not in raw and float_bytes[-64:] not in raw
        assert i8.tobytes()[:64] not in raw


def _left_behind(rt: Runtime, a: str, memory_id: str) -> tuple[str, object, int]:
    """(content hash, stored metadata, index rows of its blob in its namespace)."""
    with rt.db.read() as s:
        m = s.get(Memory, memory_id)
        assert m is not None
        rows = s.scalar(
            select(func.count()).where(
                Embedding.account_id == a,
                Embedding.blob_id == m.blob_id,
                Embedding.namespace == m.namespace,
            )
        )
        return m.content_hash, m.metadata_, int(rows or 0)


def test_a_forgotten_memory_leaves_the_database_and_the_index_files_within_the_window(
    rt: Runtime, clock: ManualClock
) -> None:
    a, ids = _stored(rt)
    hits = recall.recall(rt, a, query="metformin diabetes", namespace=NAMESPACE).results
    assert ids[1] not in {h.memory_id for h in hits}
    index = rt.relayer.index  # type: ignore[attr-defined]
    assert index.merge(a, full=True)  # index files on disk, with the forgotten rows
    with rt.db.read() as s:
        blob_id = s.scalar(select(Memory.blob_id).where(Memory.id == ids[1]))
    assert blob_id is not None
    forgotten_hash, forgotten_md, rows = _left_behind(rt, a, ids[1])
    assert rows > 0 and forgotten_hash and forgotten_md
    index_dir = rt.settings.data_dir / "index"
    assert blob_id.encode() in _files(index_dir)

    # Before the window's half: the sweep leaves it (purges are batched). An hour's
    # window, so that no memory lapses meanwhile on the test network's short epochs.
    rt.settings.purge_within_hours = 1
    clock.advance(minutes=25)
    assert sweep.sweep(rt).purged_memories == 0
    assert _left_behind(rt, a, ids[1])[2] == rows
    clock.advance(minutes=10)
    assert sweep.sweep(rt).purged_memories == 1

    assert _left_behind(rt, a, ids[1]) == (purge.PURGED, {}, 0)
    raw = database_bytes(rt)
    assert forgotten_hash.encode() not in raw
    assert str(forgotten_md).encode() not in raw
    assert blob_id.encode() not in _files(index_dir)
    # The live ones are untouched, and recall answers from the new index files.
    hits = recall.recall(rt, a, query="heron statue spare key", namespace=NAMESPACE).results
    assert hits and hits[0].memory_id == ids[0] and hits[0].metadata == _metadata(0)
    assert _left_behind(rt, a, ids[0])[2] > 0


def test_rows_shared_with_a_live_copy_stay_and_the_cli_purges_at_once(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Identical content in one namespace is one blob with one set of index rows: storing
    it again after a forget keeps them for the new memory, even before it lands."""
    a = account(rt)
    first = store.store(rt, a, content="the heron nests by the weir", request_id="c1")
    land_all(rt)
    forget.forget(rt, a, memory_id=first.memory_id, request_id="f")
    second = store.store(rt, a, content="the heron nests by the weir", request_id="c2")
    report = purge.purge(rt, [a])  # the second is still being written
    assert report.memories == 1 and report.index_rows == 0
    assert _left_behind(rt, a, first.memory_id)[0] == purge.PURGED
    land_all(rt)
    assert _left_behind(rt, a, second.memory_id)[2] > 0
    hits = recall.recall(rt, a, query="heron weir").results
    assert [h.memory_id for h in hits] == [second.memory_id]
    # Forgetting the last copy purges the rows too, through the command line.
    forget.forget(rt, a, memory_id=second.memory_id, request_id="g")
    monkeypatch.setenv("WALKEEP_DATA_DIR", str(rt.settings.data_dir))
    monkeypatch.setenv("WALKEEP_DATABASE_URL", rt.settings.db_url)
    monkeypatch.setenv("WALKEEP_MASTER_KEY", TEST_MASTER_KEY)
    result = CliRunner().invoke(cli.app, ["index", "purge", "--account", a, "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["index_rows"] > 0
    assert _left_behind(rt, a, second.memory_id)[2] == 0


def _answers(rt: Runtime, a: str) -> list[list[tuple[str, str, dict[str, str]]]]:
    """Three recalls, and one narrowed by metadata (its tags are filled by migration 0024
    for memories stored before it)."""
    queries = [("heron statue", None), ("diabetes metformin", None), ("door code", NAMESPACE)]
    answers = [
        [
            (h.memory_id, h.namespace, h.metadata)
            for h in recall.recall(rt, a, query=q, namespace=ns).results
        ]
        for q, ns in queries
    ]
    narrowed = recall.recall(rt, a, query="code", metadata={"n": "1", **METADATA}).results
    return [*answers, [(h.memory_id, h.namespace, h.metadata) for h in narrowed]]


def test_a_database_of_the_previous_schema_is_sealed_by_the_upgrade_and_ranks_alike(
    rt: Runtime,
) -> None:
    """Down to 0021 (names, metadata and vectors in clear, as that release stored them) and
    up again: the stored strings are sealed, the index is rebuilt, recall answers alike."""
    a = account(rt)
    for i, text in enumerate(SECRETS):
        ns = NAMESPACE if i % 2 == 0 else "errands"
        store.store(rt, a, content=text, request_id=f"s{i}", namespace=ns, metadata=_metadata(i))
    land_all(rt)
    before = _answers(rt, a)
    assert all(before)
    key = digests.master_key(rt)
    rt.db.engine.dispose()
    migrations.downgrade(rt.settings.db_url, "0021", master_key=key)
    index = rt.relayer.index  # type: ignore[attr-defined]
    with rt.db.begin() as s:
        for row_id, vec in s.execute(select(Embedding.id, Embedding.vector)).all():
            plain = index.rows._open(a, bytes(vec))
            s.execute(update(Embedding).where(Embedding.id == row_id).values(vector=plain))
    with rt.db.read() as s:
        assert NAMESPACE in set(s.scalars(select(Memory.namespace)))
    assert NAMESPACE.encode() in database_bytes(rt)

    rt.db.engine.dispose()
    migrations.upgrade(rt.settings.db_url, master_key=key)
    rt.db.engine.dispose()
    assert _answers(rt, a) == before
    assert reindex.backfill(rt).vectors_sealed == sum(len(chunk_text(t)) for t in SECRETS)
    assert _answers(rt, a) == before
    raw = database_bytes(rt)
    for text in [NAMESPACE, "errands", *METADATA.values()]:
        assert text.encode() not in raw


KEY_NAMESPACE = "ward-7-oncology-thistlewood"


def test_an_api_key_s_default_namespace_is_sealed_at_rest(rt: Runtime) -> None:
    """The operator's choice of namespace for a key names what its agent files under: a
    copy of the database must not show it, and the key still resolves to it."""
    a = account(rt)
    master = digests.master_key(rt)
    made = accounts.create_key(
        rt.db, a, default_namespace=KEY_NAMESPACE, only_namespace=True, master_key=master
    )
    accounts.create_account(
        rt.db, "clinic", default_namespace=KEY_NAMESPACE + "-2", master_key=master
    )
    principal = accounts.authenticate(rt.db, made.api_key, master)
    assert principal.default_namespace == KEY_NAMESPACE and principal.only_namespace
    listed = {k.default_namespace for k in accounts.list_keys(rt.db, a, master)}
    assert listed == {None, KEY_NAMESPACE}
    everything = database_bytes(rt) + _files(rt.settings.data_dir)
    found = [e for e in _encodings(KEY_NAMESPACE) if e in everything]
    assert not found, f"{KEY_NAMESPACE!r} is readable at rest as {found[0][:40]!r}"


def test_keys_namespaces_are_sealed_by_the_upgrade_and_opened_by_the_downgrade(
    rt: Runtime,
) -> None:
    """Migration 0025 on a database of 0024 (the name in clear, as that release stored
    it): sealed on the way up, in clear again on the way down, the key working throughout."""
    a = account(rt)
    master = digests.master_key(rt)
    made = accounts.create_key(rt.db, a, default_namespace=KEY_NAMESPACE, master_key=master)
    rt.db.engine.dispose()
    migrations.downgrade(rt.settings.db_url, "0024", master_key=master)
    with rt.db.read() as s:
        stored = set(s.scalars(sql("SELECT default_namespace FROM api_keys")))
    assert stored == {None, KEY_NAMESPACE}
    rt.db.engine.dispose()
    migrations.upgrade(rt.settings.db_url, master_key=master)
    rt.db.engine.dispose()
    assert KEY_NAMESPACE.encode() not in database_bytes(rt)
    principal = accounts.authenticate(rt.db, made.api_key, master)
    assert principal.default_namespace == KEY_NAMESPACE and not principal.only_namespace
