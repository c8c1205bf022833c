"""Quilts over Walrus's HTTP wire format: `walkeep devnet` served by real uvicorn, and
``WalrusBlobStore.put_quilt`` / ``get_patch`` (scripted transport, then against devnet)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.test_devnet import Devnet, serve_devnet
from walkeep.backends.base import BlobStore
from walkeep.backends.walrus import WalrusBlobStore
from walkeep.clock import ManualClock
from walkeep.errors import NotFound, QuotaExceeded, RelayerUnavailable, ValidationError
from walkeep.protocol.quilt import decode_patch_id, encode_patch_id, plan_layout
from walkeep.protocol.walrus import storage_units

EPOCH = 3600
PRICE = 11_000
LIMIT = 1 << 20
OTHER = "0x" + "cd" * 32


@pytest.fixture
def devnet(tmp_path: Path, clock: ManualClock) -> Iterator[Devnet]:
    yield from serve_devnet(tmp_path, clock, LIMIT)


def put_quilt(
    d: Devnet,
    patches: list[tuple[str, bytes]],
    metadata: Any = None,
    **params: str,
) -> httpx.Response:
    files: list[tuple[str, tuple[str | None, bytes, str]]] = [
        (name, (name, data, "application/octet-stream")) for name, data in patches
    ]
    if metadata is not None:  # a plain (non-file) field, as curl -F '_metadata=[...]' sends
        files.append(("_metadata", (None, json.dumps(metadata).encode(), "application/json")))
    return d.http.put("/v1/quilts", params=params, files=files)


def assert_aip193(resp: httpx.Response, code: int, reason: str) -> None:
    assert resp.status_code == code, resp.text
    err = resp.json()["error"]
    assert err["code"] == code and isinstance(err["message"], str) and err["message"]
    (detail,) = err["details"]
    assert detail["@type"] == "ErrorInfo" and detail["reason"] == reason
    assert detail["domain"] == "daemon.walrus.space"


PATCHES = [("mem-1", b'{"a": 1}'), ("mem-2", b"x" * 5000), ("mem-0", b"")]


# --- devnet: PUT /v1/quilts ------------------------------------------------------------------


def test_put_quilt_answers_walrus_shapes(devnet: Devnet) -> None:
    resp = put_quilt(devnet, PATCHES, epochs="3", send_object_to=OTHER, force="true")
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert set(body) == {"blobStoreResult", "storedQuiltBlobs"}
    created = body["blobStoreResult"]["newlyCreated"]
    assert set(created) == {"blobObject", "resourceOperation", "cost"}
    obj = created["blobObject"]
    layout = plan_layout([(i, len(d)) for i, d in PATCHES])
    assert obj["size"] == layout.laid_out_size
    assert obj["storage"]["storageSize"] == layout.storage_size
    assert obj["storage"]["endEpoch"] == 3
    assert created["cost"] == storage_units(layout.storage_size) * PRICE * 3
    stored = body["storedQuiltBlobs"]
    assert [s["identifier"] for s in stored] == ["mem-1", "mem-2", "mem-0"]
    assert all(set(s) == {"identifier", "quiltPatchId"} for s in stored)
    for s, slot in zip(stored, layout.slots, strict=True):
        assert s["quiltPatchId"] == encode_patch_id(obj["blobId"], slot.start_col, slot.end_col)
    chain_obj = devnet.net.get_object(obj["id"])
    assert chain_obj is not None and chain_obj.owner == OTHER


def test_put_quilt_force_false_answers_already_certified(devnet: Devnet) -> None:
    first = put_quilt(devnet, PATCHES, epochs="5").json()
    again = put_quilt(devnet, PATCHES, epochs="2", force="false")
    assert again.status_code == 200
    obj = first["blobStoreResult"]["newlyCreated"]["blobObject"]
    assert again.json() == {
        "blobStoreResult": {
            "alreadyCertified": {"blobId": obj["blobId"], "object": obj["id"], "endEpoch": 5}
        },
        "storedQuiltBlobs": first["storedQuiltBlobs"],
    }


def test_patches_are_served_by_patch_id_and_by_identifier(devnet: Devnet) -> None:
    meta = [{"identifier": "mem-1", "tags": {"agent": "x"}}]
    body = put_quilt(devnet, PATCHES, meta, epochs="2").json()
    quilt_id = body["blobStoreResult"]["newlyCreated"]["blobObject"]["blobId"]
    for (ident, data), s in zip(PATCHES, body["storedQuiltBlobs"], strict=True):
        resp = devnet.http.get(f"/v1/blobs/by-quilt-patch-id/{s['quiltPatchId']}")
        assert resp.status_code == 200 and resp.content == data
        assert resp.headers["X-Quilt-Patch-Identifier"] == ident
        assert resp.headers["ETag"] == s["quiltPatchId"]
        assert resp.headers["content-type"] == "application/octet-stream"
        resp = devnet.http.get(f"/v1/blobs/by-quilt-id/{quilt_id}/{ident}")
        assert resp.status_code == 200 and resp.content == data
        assert resp.headers["X-Quilt-Patch-Identifier"] == ident
    listing = devnet.http.get(f"/v1/quilts/{quilt_id}/patches")
    assert listing.status_code == 200
    assert sorted(listing.json(), key=lambda p: p["identifier"]) == [
        {
            "identifier": "mem-0",
            "patch_id": body["storedQuiltBlobs"][2]["quiltPatchId"],
            "tags": {},
        },
        {
            "identifier": "mem-1",
            "patch_id": body["storedQuiltBlobs"][0]["quiltPatchId"],
            "tags": {"agent": "x"},
        },
        {
            "identifier": "mem-2",
            "patch_id": body["storedQuiltBlobs"][1]["quiltPatchId"],
            "tags": {},
        },
    ]
    # The quilt itself is an ordinary blob too.
    assert devnet.http.get(f"/v1/blobs/{quilt_id}").status_code == 200


def test_unicode_identifiers_round_trip(devnet: Devnet) -> None:
    body = put_quilt(devnet, [("mémoire/1", b"u")]).json()
    pid = body["storedQuiltBlobs"][0]["quiltPatchId"]
    assert body["storedQuiltBlobs"][0]["identifier"] == "mémoire/1"
    resp = devnet.http.get(f"/v1/blobs/by-quilt-patch-id/{pid}")
    assert resp.content == b"u"
    assert resp.headers["X-Quilt-Patch-Identifier"] == "m%C3%A9moire%2F1"
    quilt_id = decode_patch_id(pid).quilt_blob_id
    assert devnet.http.get(f"/v1/blobs/by-quilt-id/{quilt_id}/mémoire/1").content == b"u"


def test_666_patches_accepted_667_refused(devnet: Devnet) -> None:
    many = [(f"m{i}", i.to_bytes(2, "little")) for i in range(667)]
    resp = put_quilt(devnet, many[:666], epochs="1")
    assert resp.status_code == 200
    assert len(resp.json()["storedQuiltBlobs"]) == 666
    resp = put_quilt(devnet, many, epochs="1")
    assert_aip193(resp, 400, "MALFORMED_REQUEST")
    assert "666" in resp.json()["error"]["message"]
    more = many + [(f"x{i}", b"1") for i in range(50)]
    assert_aip193(put_quilt(devnet, more), 400, "MALFORMED_REQUEST")
    assert len(list(devnet.net.owned_blobs(devnet.net.server_address))) == 1


@pytest.mark.parametrize(
    ("patches", "metadata"),
    [
        ([("_reserved", b"x")], None),
        ([("a", b"x"), ("a", b"y")], None),
        ([], []),  # multipart with only _metadata: no patches
        ([("a", b"x")], {"not": "a list"}),
        ([("a", b"x")], [{"identifier": "zzz", "tags": {}}]),
        ([("a", b"x")], [{"identifier": "a", "tags": {"n": 1}}]),
    ],
)
def test_bad_quilts_are_400(
    devnet: Devnet, patches: list[tuple[str, bytes]], metadata: Any
) -> None:
    resp = put_quilt(devnet, patches, metadata)
    assert resp.request.headers["content-type"].startswith("multipart/form-data")
    assert_aip193(resp, 400, "MALFORMED_REQUEST")
    assert list(devnet.net.owned_blobs(devnet.net.server_address)) == []


def test_put_quilt_needs_multipart_and_valid_query(devnet: Devnet) -> None:
    assert_aip193(devnet.http.put("/v1/quilts", content=b"raw"), 400, "MALFORMED_REQUEST")
    resp = put_quilt(devnet, PATCHES, epochs="54")
    assert_aip193(resp, 400, "MALFORMED_REQUEST")
    resp = put_quilt(devnet, PATCHES, quilt_version="v9")
    assert_aip193(resp, 400, "MALFORMED_REQUEST")
    resp = put_quilt(devnet, PATCHES, permanent="true", deletable="true")
    assert_aip193(resp, 400, "INVALID_BLOB_PERSISTENCE")


def test_put_quilt_body_over_the_limit_is_413(devnet: Devnet) -> None:
    resp = put_quilt(devnet, [("big", b"z" * LIMIT)])
    assert_aip193(resp, 413, "BLOB_TOO_LARGE")
    assert list(devnet.net.owned_blobs(devnet.net.server_address)) == []


def test_unknown_lapsed_and_malformed_patches(devnet: Devnet) -> None:
    body = put_quilt(devnet, PATCHES, epochs="1").json()
    pid = body["storedQuiltBlobs"][0]["quiltPatchId"]
    quilt_id = decode_patch_id(pid).quilt_blob_id
    assert_aip193(devnet.http.get(f"/v1/blobs/by-quilt-id/{quilt_id}/nope"), 404, "BLOB_NOT_FOUND")
    unknown = encode_patch_id("A" * 43, 1, 2)
    assert_aip193(devnet.http.get(f"/v1/blobs/by-quilt-patch-id/{unknown}"), 404, "BLOB_NOT_FOUND")
    for path in ("/v1/blobs/by-quilt-patch-id/short", "/v1/quilts/bad!/patches"):
        assert_aip193(devnet.http.get(path), 400, "INVALID_ID_FORMAT")
    devnet.clock.advance(EPOCH)  # the quilt lapses
    for path in (
        f"/v1/blobs/by-quilt-patch-id/{pid}",
        f"/v1/blobs/by-quilt-id/{quilt_id}/mem-1",
        f"/v1/quilts/{quilt_id}/patches",
    ):
        assert_aip193(devnet.http.get(path), 404, "BLOB_NOT_FOUND")


def test_quilt_faults_map_to_walrus_errors(devnet: Devnet) -> None:
    pid = put_quilt(devnet, PATCHES).json()["storedQuiltBlobs"][0]["quiltPatchId"]
    devnet.net.faults.fail_next_writes = 1
    assert_aip193(put_quilt(devnet, PATCHES), 504, "INSUFFICIENT_CONFIRMATIONS")
    devnet.net.faults.unreachable = True
    assert put_quilt(devnet, PATCHES).status_code == 503
    assert devnet.http.get(f"/v1/blobs/by-quilt-patch-id/{pid}").status_code == 503


# --- WalrusBlobStore.put_quilt / get_patch, scripted --------------------------------------------


def _result(blob_id: str, stored: list[dict[str, str]]) -> dict[str, Any]:
    return {
        "blobStoreResult": {
            "newlyCreated": {
                "blobObject": {
                    "id": "0x" + "11" * 32,
                    "registeredEpoch": 3,
                    "blobId": blob_id,
                    "size": 1_782_224,
                    "encodingType": "RS2",
                    "certifiedEpoch": None,
                    "storage": {
                        "id": "0x" + "22" * 32,
                        "startEpoch": 3,
                        "endEpoch": 8,
                        "storageSize": 72_040_000,
                    },
                    "deletable": True,
                },
                "resourceOperation": {
                    "registerFromScratch": {"encodedLength": 72_040_000, "epochsAhead": 5}
                },
                "cost": 4242,
            }
        },
        "storedQuiltBlobs": stored,
    }


DOC_QUILT = "6XUOE-Q5-nAXHRifN6n9nomVDtHZQbGuAkW3PjlBuKo"
DOC_PATCH = "6XUOE-Q5-nAXHRifN6n9nomVDtHZQbGuAkW3PjlBuKoBAQDQAA"


def scripted(*answers: httpx.Response) -> tuple[WalrusBlobStore, list[httpx.Request]]:
    seen: list[httpx.Request] = []
    queue = list(answers)

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return queue.pop(0)

    store = WalrusBlobStore(
        "http://pub.test",
        "http://agg.test",
        http=httpx.Client(transport=httpx.MockTransport(handler)),
        sleep=lambda _s: None,
    )
    return store, seen


def test_walrus_put_quilt_sends_multipart_and_parses_the_answer() -> None:
    other = encode_patch_id(DOC_QUILT, 208, 300)
    answer = _result(
        DOC_QUILT,
        [
            {"identifier": "b", "quiltPatchId": other},
            {"identifier": "a", "quiltPatchId": DOC_PATCH},
        ],
    )
    store, seen = scripted(httpx.Response(200, json=answer))
    stored = store.put_quilt(
        [("a", b"AAA"), ("b", b"BB")], epochs=5, owner="0x" + OTHER[2:].upper()
    )
    (req,) = seen
    assert req.method == "PUT" and req.url.path == "/v1/quilts"
    assert dict(req.url.params) == {"epochs": "5", "send_object_to": OTHER, "force": "true"}
    assert req.headers["content-type"].startswith("multipart/form-data; boundary=")
    raw = req.read()
    assert b'name="a"' in raw and b"AAA" in raw and b'name="b"' in raw
    assert stored.newly_created and stored.cost_frost == 4242
    assert stored.blob.blob_id == DOC_QUILT and stored.blob.owner == OTHER
    assert stored.blob.storage_size == 72_040_000 and stored.blob.end_epoch == 8
    assert [(p.identifier, p.patch_id) for p in stored.patches] == [("a", DOC_PATCH), ("b", other)]


@pytest.mark.parametrize(
    "stored",
    [
        [{"identifier": "a", "quiltPatchId": DOC_PATCH}],  # "b" missing
        [
            {"identifier": "a", "quiltPatchId": DOC_PATCH},
            {"identifier": "b", "quiltPatchId": "garbage"},
        ],
        [
            {"identifier": "a", "quiltPatchId": DOC_PATCH},
            {"identifier": "b", "quiltPatchId": encode_patch_id("B" * 42 + "A", 5, 6)},
        ],
        [
            {"identifier": "a", "quiltPatchId": DOC_PATCH},
            {"identifier": "a", "quiltPatchId": DOC_PATCH},
        ],
        [{"identifier": "a"}],
    ],
)
def test_walrus_put_quilt_refuses_answers_that_do_not_match(stored: list[dict[str, str]]) -> None:
    store, _ = scripted(httpx.Response(200, json=_result(DOC_QUILT, stored)))
    with pytest.raises(RelayerUnavailable) as info:
        store.put_quilt([("a", b"A"), ("b", b"B")], epochs=1, owner=OTHER)
    assert info.value.data["outcome"] == "unknown"


def test_walrus_put_quilt_is_never_retried_and_maps_errors() -> None:
    store, seen = scripted(httpx.Response(500, json={"error": {"message": "boom"}}))
    with pytest.raises(RelayerUnavailable) as info:
        store.put_quilt([("a", b"A")], epochs=1, owner=OTHER)
    assert len(seen) == 1 and info.value.data["outcome"] == "unknown"
    store, _ = scripted(httpx.Response(413, text="too big"))
    with pytest.raises(QuotaExceeded):
        store.put_quilt([("a", b"A")], epochs=1, owner=OTHER)
    store, _ = scripted(httpx.Response(400, json={"error": {"message": "bad"}}))
    with pytest.raises(ValidationError):
        store.put_quilt([("a", b"A")], epochs=1, owner=OTHER)


@pytest.mark.parametrize(
    "patches",
    [
        [(f"m{i}", b"x") for i in range(667)],
        [("_x", b"x")],
        [("a", b"x"), ("a", b"y")],
        [("", b"x")],
        [("a", "not bytes")],
        [("a",)],
    ],
)
def test_walrus_put_quilt_validates_before_sending(patches: list[tuple[str, bytes]]) -> None:
    store, seen = scripted()
    with pytest.raises(ValidationError):
        store.put_quilt(patches, epochs=1, owner=OTHER)
    assert seen == []


def test_walrus_get_patch_retries_transient_errors_and_refuses_malformed_ids() -> None:
    store, seen = scripted(
        httpx.Response(503, json={"error": {"message": "later"}}),
        httpx.Response(200, content=b"patch bytes"),
    )
    assert store.get_patch(DOC_PATCH) == b"patch bytes"
    assert [r.url.path for r in seen] == [f"/v1/blobs/by-quilt-patch-id/{DOC_PATCH}"] * 2
    store, seen = scripted()
    with pytest.raises(NotFound):
        store.get_patch(DOC_QUILT)
    assert seen == []


# --- WalrusBlobStore against devnet, end to end -----------------------------------------------


def test_walrus_client_against_devnet(devnet: Devnet) -> None:
    with WalrusBlobStore(devnet.url, devnet.url, sleep=lambda _s: None, retries=0) as store:
        assert isinstance(store, BlobStore)
        items = [(f"memory-{i}", bytes([i]) * (100 * i)) for i in range(30)]
        stored = store.put_quilt(items, epochs=2, owner=devnet.net.server_address)
        assert stored.newly_created
        assert [p.identifier for p in stored.patches] == [i for i, _ in items]
        chain_obj = devnet.net.get_object(stored.blob.blob_object_id)
        assert chain_obj == stored.blob
        for (_, data), patch in zip(items, stored.patches, strict=True):
            assert store.get_patch(patch.patch_id) == data
        devnet.clock.advance(EPOCH * 2)
        with pytest.raises(NotFound):
            store.get_patch(stored.patches[0].patch_id)


def test_explorer_shows_a_quilt_and_its_patch_count(devnet: Devnet) -> None:
    body = put_quilt(devnet, PATCHES, epochs="2").json()
    oid = body["blobStoreResult"]["newlyCreated"]["blobObject"]["id"]
    data = devnet.http.get(f"/explorer/object/{oid}", params={"format": "json"}).json()
    assert (data["kind"], data["quilt_patches"]) == ("quilt", 3)
    assert "quilt of 3 patches" in devnet.http.get(f"/explorer/object/{oid}").text
    # A renewal of the quilt is one extend_blob call on one object.
    fx = devnet.net.execute(devnet.net.prepare_extend(devnet.net.server_address, [(oid, 3)]))
    data = devnet.http.get(f"/explorer/object/{oid}", params={"format": "json"}).json()
    assert [e["digest"] for e in data["extensions"]] == [fx.digest]
    plain = devnet.http.put("/v1/blobs", content=b"plain").json()["newlyCreated"]["blobObject"]
    data = devnet.http.get(f"/explorer/object/{plain['id']}", params={"format": "json"}).json()
    assert (data["kind"], data["quilt_patches"]) == ("blob", None)


def test_multipart_content_type_is_case_insensitive(devnet: Devnet) -> None:
    # Media types are case-insensitive (RFC 9110 §8.3.1).
    req = devnet.http.build_request(
        "PUT", "/v1/quilts", files=[("a", ("a", b"A", "application/octet-stream"))]
    )
    req.headers["content-type"] = req.headers["content-type"].replace(
        "multipart/form-data", "Multipart/Form-Data"
    )
    resp = devnet.http.send(req)
    assert resp.status_code == 200, resp.text
    assert resp.json()["storedQuiltBlobs"][0]["identifier"] == "a"
