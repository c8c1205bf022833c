"""`walkeep devnet` speaks Walrus's publisher/aggregator wire format over real HTTP."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import uvicorn

from walkeep.backends.localnet import LocalChain, LocalNetwork
from walkeep.backends.localnet.codec import EXTEND_FUNCTION, LOCAL_PACKAGE_ID, blob_id_for
from walkeep.backends.localnet.devnet import create_devnet_app
from walkeep.clock import ManualClock

EPOCH = 3600
PRICE = 11_000
LIMIT = 64 * 1024
OTHER = "0x" + "cd" * 32
DOCS_EXAMPLE = b"some other string"  # the 17-byte blob of the Walrus docs' example


@dataclass
class Devnet:
    net: LocalNetwork
    http: httpx.Client
    clock: ManualClock
    url: str


@pytest.fixture
def devnet(tmp_path: Path, clock: ManualClock) -> Iterator[Devnet]:
    yield from serve_devnet(tmp_path, clock, LIMIT)


def serve_devnet(tmp_path: Path, clock: ManualClock, limit: int) -> Iterator[Devnet]:
    """The devnet app under real uvicorn on a free port, for a fixture to yield from."""
    net = LocalNetwork(tmp_path / "ln", clock, epoch_seconds=EPOCH, storage_price_frost=PRICE)
    app = create_devnet_app(net, max_body_bytes=limit)
    # Bind and listen before uvicorn starts: early connections wait in the
    # backlog, so no polling for readiness is needed.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    client = httpx.Client(base_url=url, timeout=20)
    try:
        yield Devnet(net, client, clock, url)
    finally:
        client.close()
        server.should_exit = True
        thread.join(timeout=20)
        sock.close()
        net.close()
    assert not thread.is_alive()


def put(d: Devnet, data: bytes, **params: str) -> httpx.Response:
    return d.http.put("/v1/blobs", params=params, content=data)


def assert_aip193(resp: httpx.Response, code: int, status: str, reason: str) -> None:
    assert resp.status_code == code
    body = resp.json()
    assert set(body) == {"error"}
    err = body["error"]
    assert set(err) == {"code", "status", "message", "details"}
    assert err["code"] == code and err["status"] == status
    assert isinstance(err["message"], str) and err["message"]
    (detail,) = err["details"]
    assert set(detail) == {"@type", "reason", "domain", "metadata"}
    assert detail["@type"] == "ErrorInfo"
    assert detail["reason"] == reason
    assert detail["domain"] == "daemon.walrus.space"
    assert isinstance(detail["metadata"], dict)


# --- PUT /v1/blobs ---------------------------------------------------------------------------


def test_put_newly_created_has_walrus_camel_case_shape(devnet: Devnet) -> None:
    devnet.clock.advance(EPOCH * 34)
    resp = put(devnet, DOCS_EXAMPLE, epochs="1", send_object_to=OTHER, force="true")
    assert resp.status_code == 200
    body = resp.json()
    assert set(body) == {"newlyCreated"}
    created = body["newlyCreated"]
    assert set(created) == {"blobObject", "resourceOperation", "cost"}
    obj = created["blobObject"]
    assert set(obj) == {
        "id",
        "registeredEpoch",
        "blobId",
        "size",
        "encodingType",
        "certifiedEpoch",
        "storage",
        "deletable",
    }
    assert set(obj["storage"]) == {"id", "startEpoch", "endEpoch", "storageSize"}
    # The values of the docs' example (storing-blobs.mdx), except the ids.
    assert obj["registeredEpoch"] == obj["certifiedEpoch"] == 34
    assert obj["size"] == 17
    assert obj["encodingType"] == "RS2"
    assert obj["deletable"] is True
    assert obj["storage"]["startEpoch"] == 34 and obj["storage"]["endEpoch"] == 35
    assert obj["storage"]["storageSize"] == 66_034_000
    assert obj["blobId"] == blob_id_for(DOCS_EXAMPLE) and len(obj["blobId"]) == 43
    assert obj["id"].startswith("0x") and len(obj["id"]) == 66
    assert obj["storage"]["id"].startswith("0x") and obj["storage"]["id"] != obj["id"]
    assert created["resourceOperation"] == {
        "registerFromScratch": {"encodedLength": 66_034_000, "epochsAhead": 1}
    }
    assert created["cost"] == 63 * PRICE * 1
    # send_object_to: the Blob object belongs to that address on chain.
    chain_obj = devnet.net.get_object(obj["id"])
    assert chain_obj is not None and chain_obj.owner == OTHER and chain_obj.end_epoch == 35


def test_put_defaults_one_epoch_owned_by_the_publisher(devnet: Devnet) -> None:
    resp = put(devnet, b"defaults")
    assert resp.status_code == 200
    obj = resp.json()["newlyCreated"]["blobObject"]
    assert obj["storage"]["endEpoch"] == 1
    chain_obj = devnet.net.get_object(obj["id"])
    assert chain_obj is not None and chain_obj.owner == devnet.net.server_address
    perm = put(devnet, b"perm", permanent="true", epochs="3").json()
    assert perm["newlyCreated"]["blobObject"]["deletable"] is False
    assert perm["newlyCreated"]["cost"] == 63 * PRICE * 3


def test_put_force_false_answers_already_certified(devnet: Devnet) -> None:
    # Deletable and held by the publisher's wallet: the answer names the object.
    first = put(devnet, b"again", epochs="5").json()["newlyCreated"]["blobObject"]
    resp = put(devnet, b"again", epochs="3", force="false")
    assert resp.status_code == 200
    assert resp.json() == {
        "alreadyCertified": {"blobId": first["blobId"], "object": first["id"], "endEpoch": 5}
    }
    # Permanent, owned by someone else: the answer carries the certification event.
    perm = put(devnet, b"forever", epochs="6", permanent="true", send_object_to=OTHER).json()
    perm_obj = perm["newlyCreated"]["blobObject"]
    body = put(devnet, b"forever", epochs="2", permanent="true").json()
    assert set(body) == {"alreadyCertified"}
    already = body["alreadyCertified"]
    assert list(already) == ["blobId", "event", "endEpoch"]
    assert already["blobId"] == perm_obj["blobId"] and already["endEpoch"] == 6
    assert set(already["event"]) == {"txDigest", "eventSeq"}
    assert already["event"]["eventSeq"] == "0"
    # The event's digest is the transaction that certified the blob.
    rec = devnet.net.object_record(perm_obj["id"])
    assert rec is not None and already["event"]["txDigest"] == rec.created_tx
    # force=true always creates a new object.
    forced = put(devnet, b"again", epochs="3", force="true").json()
    assert forced["newlyCreated"]["blobObject"]["id"] != first["id"]


def test_put_rejects_permanent_and_deletable(devnet: Devnet) -> None:
    resp = put(devnet, b"x", permanent="true", deletable="true")
    assert_aip193(resp, 400, "INVALID_ARGUMENT", "INVALID_BLOB_PERSISTENCE")
    assert list(devnet.net.owned_blobs(devnet.net.server_address)) == []


@pytest.mark.parametrize(
    "params",
    [
        {"share": "true", "send_object_to": OTHER},
        {"epochs": "0"},
        {"epochs": "54"},
        {"epochs": "two"},
        {"force": "yes"},
        {"send_object_to": "not-an-address"},
        {"encoding_type": "RS1"},
        {"unknown_param": "1"},
    ],
)
def test_put_malformed_requests(devnet: Devnet, params: dict[str, str]) -> None:
    resp = put(devnet, b"x", **params)
    assert_aip193(resp, 400, "INVALID_ARGUMENT", "MALFORMED_REQUEST")


def test_put_body_over_the_limit_is_413(devnet: Devnet) -> None:
    resp = put(devnet, b"z" * (LIMIT + 1))
    assert_aip193(resp, 413, "SIZE_EXCEEDED", "BLOB_TOO_LARGE")
    # Also when streamed without a Content-Length.
    resp = devnet.http.put("/v1/blobs", content=iter([b"z" * LIMIT, b"z"]))
    assert resp.status_code == 413
    assert list(devnet.net.owned_blobs(devnet.net.server_address)) == []
    assert put(devnet, b"z" * LIMIT).status_code == 200  # exactly at the limit is fine


# --- GET /v1/blobs ---------------------------------------------------------------------------


def test_get_returns_raw_bytes(devnet: Devnet) -> None:
    data = bytes(range(256)) * 3
    obj = put(devnet, data, epochs="2").json()["newlyCreated"]["blobObject"]
    resp = devnet.http.get(f"/v1/blobs/{obj['blobId']}")
    assert resp.status_code == 200
    assert resp.headers["content-type"] == "application/octet-stream"
    assert resp.content == data
    resp = devnet.http.get(f"/v1/blobs/by-object-id/{obj['id']}")
    assert resp.status_code == 200
    assert resp.headers["content-type"] == "application/octet-stream"
    assert resp.content == data


def test_get_unknown_or_lapsed_is_404(devnet: Devnet) -> None:
    resp = devnet.http.get(f"/v1/blobs/{blob_id_for(b'never')}")
    assert_aip193(resp, 404, "NOT_FOUND", "BLOB_NOT_FOUND")
    resp = devnet.http.get(f"/v1/blobs/by-object-id/0x{'42' * 32}")
    assert_aip193(resp, 404, "NOT_FOUND", "BLOB_NOT_FOUND")
    obj = put(devnet, b"brief", epochs="1").json()["newlyCreated"]["blobObject"]
    assert devnet.http.get(f"/v1/blobs/{obj['blobId']}").status_code == 200
    devnet.clock.advance(EPOCH)  # end_epoch reached: the blob is gone
    assert_aip193(devnet.http.get(f"/v1/blobs/{obj['blobId']}"), 404, "NOT_FOUND", "BLOB_NOT_FOUND")
    resp = devnet.http.get(f"/v1/blobs/by-object-id/{obj['id']}")
    assert_aip193(resp, 404, "NOT_FOUND", "BLOB_NOT_FOUND")


def test_get_malformed_ids_are_400(devnet: Devnet) -> None:
    resp = devnet.http.get("/v1/blobs/short")
    assert_aip193(resp, 400, "INVALID_ARGUMENT", "INVALID_ID_FORMAT")
    resp = devnet.http.get("/v1/blobs/by-object-id/0xnothex")
    assert_aip193(resp, 400, "INVALID_ARGUMENT", "INVALID_ID_FORMAT")


# --- faults ----------------------------------------------------------------------------------


def test_faults_map_to_walrus_errors(devnet: Devnet) -> None:
    obj = put(devnet, b"faulty", epochs="2").json()["newlyCreated"]["blobObject"]
    devnet.net.faults.unreachable = True
    assert_aip193(put(devnet, b"x"), 503, "UNAVAILABLE", "SERVICE_UNAVAILABLE")
    resp = devnet.http.get(f"/v1/blobs/{obj['blobId']}")
    assert_aip193(resp, 503, "UNAVAILABLE", "BLOB_UNAVAILABLE")
    resp = devnet.http.get(f"/v1/blobs/by-object-id/{obj['id']}")
    assert_aip193(resp, 503, "UNAVAILABLE", "BLOB_UNAVAILABLE")
    assert devnet.http.get("/local/v1/epoch").status_code == 503
    assert_aip193(devnet.http.get("/status"), 503, "UNAVAILABLE", "SERVICE_UNAVAILABLE")
    assert devnet.http.get("/v1/api").status_code == 503
    devnet.net.faults.unreachable = False
    devnet.net.faults.fail_next_writes = 1
    assert_aip193(put(devnet, b"x"), 504, "DEADLINE_EXCEEDED", "INSUFFICIENT_CONFIRMATIONS")
    assert put(devnet, b"x").status_code == 200


def test_liveness_probes_like_a_real_daemon(devnet: Devnet) -> None:
    status = devnet.http.get("/status")
    assert status.status_code == 200 and status.text == "OK"
    api = devnet.http.get("/v1/api")
    assert api.status_code == 200 and "network: local" in api.text


# --- local-only JSON ---------------------------------------------------------------------------


def test_local_epoch_and_object_endpoints(devnet: Devnet) -> None:
    genesis = devnet.clock.now()
    devnet.clock.advance(EPOCH * 3 + 10)
    body = devnet.http.get("/local/v1/epoch").json()
    assert body["network"] == "local"
    assert body["epoch"] == 3
    assert body["epoch_seconds"] == EPOCH
    assert body["genesis"] == genesis.isoformat()
    assert body["server_address"] == devnet.net.server_address
    assert body["storage_price_frost"] == PRICE
    assert body["package_id"] == LOCAL_PACKAGE_ID

    obj = put(devnet, b"local json", epochs="2", send_object_to=OTHER).json()
    oid = obj["newlyCreated"]["blobObject"]["id"]
    body = devnet.http.get(f"/local/v1/objects/{oid}").json()
    assert body["network"] == "local"
    assert body["blob_object_id"] == oid
    assert body["blob_id"] == blob_id_for(b"local json")
    assert body["owner"] == OTHER
    assert (body["registered_epoch"], body["end_epoch"]) == (3, 5)
    assert body["storage_size"] == 66_034_000 and body["size"] == 10
    assert body["live"] is True
    devnet.clock.advance(EPOCH * 2)
    assert devnet.http.get(f"/local/v1/objects/{oid}").json()["live"] is False
    resp = devnet.http.get(f"/local/v1/objects/0x{'77' * 32}")
    assert_aip193(resp, 404, "NOT_FOUND", "OBJECT_NOT_FOUND")


# --- explorer --------------------------------------------------------------------------------


def _renewal(devnet: Devnet) -> tuple[str, str, str]:
    """Store over HTTP, renew through the Chain port; returns (object id, blob id, digest)."""
    obj = put(devnet, b"audit me", epochs="5").json()["newlyCreated"]["blobObject"]
    chain = LocalChain(devnet.net, public_url=devnet.url)
    devnet.clock.advance(EPOCH * 2)
    fx = chain.execute(chain.prepare_extend([(obj["id"], 3)]))
    return obj["id"], obj["blobId"], fx.digest


def test_explorer_tx_page_html_and_json(devnet: Devnet) -> None:
    oid, blob_id, digest = _renewal(devnet)
    chain = LocalChain(devnet.net, public_url=devnet.url)
    page = devnet.http.get(chain.explorer_tx_url(digest).removeprefix(devnet.url))
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    html = page.text
    assert "network: local" in html
    for expected in (digest, devnet.net.server_address, EXTEND_FUNCTION, oid, blob_id, "success"):
        assert expected in html
    assert "5 → <strong>8</strong>" in html
    assert str(63 * PRICE * 3) in html

    expected_json = {
        "network": "local",
        "digest": digest,
        "status": "success",
        "sender": devnet.net.server_address,
        "epoch": 2,
        "timestamp": devnet.clock.now().isoformat(),
        "calls": [
            {
                "function": f"{LOCAL_PACKAGE_ID}::system::extend_blob",
                "blob_object_id": oid,
                "blob_id": blob_id,
                "epochs": 3,
                "old_end_epoch": 5,
                "new_end_epoch": 8,
            }
        ],
        "wal_cost_frost": 63 * PRICE * 3,
    }
    for resp in (
        devnet.http.get(f"/explorer/tx/{digest}", params={"format": "json"}),
        devnet.http.get(f"/explorer/tx/{digest}", headers={"Accept": "application/json"}),
    ):
        assert resp.status_code == 200
        assert resp.headers["content-type"] == "application/json"
        body = resp.json()
        assert {k: body[k] for k in expected_json} == expected_json
        assert body["kind"] == "extend" and body["gas_used"] > 0 and body["tx_bytes"]


def test_explorer_object_page_html_and_json(devnet: Devnet) -> None:
    oid, blob_id, digest = _renewal(devnet)
    html = devnet.http.get(f"/explorer/object/{oid}").text
    assert "network: local" in html
    for expected in (oid, blob_id, devnet.net.server_address, digest, "live", "66034000"):
        assert expected in html
    body = devnet.http.get(f"/explorer/object/{oid}", params={"format": "json"}).json()
    assert body["network"] == "local"
    assert (body["object_id"], body["blob_id"], body["owner"]) == (
        oid,
        blob_id,
        devnet.net.server_address,
    )
    assert (body["registered_epoch"], body["end_epoch"], body["status"]) == (0, 8, "live")
    assert body["storage_size"] == 66_034_000
    assert [(e["digest"], e["old_end_epoch"], e["new_end_epoch"]) for e in body["extensions"]] == [
        (digest, 5, 8)
    ]
    devnet.clock.advance(EPOCH * 6)
    body = devnet.http.get(f"/explorer/object/{oid}", params={"format": "json"}).json()
    assert body["status"] == "lapsed"
    assert "lapsed" in devnet.http.get(f"/explorer/object/{oid}").text


def test_explorer_unknown_is_404_and_escapes_input(devnet: Devnet) -> None:
    resp = devnet.http.get("/explorer/tx/<img src=x onerror='alert(1)'>")
    assert resp.status_code == 404
    assert resp.headers["content-type"].startswith("text/html")
    assert "<img" not in resp.text
    assert "&lt;img src=x onerror=&#x27;alert(1)&#x27;&gt;" in resp.text
    resp = devnet.http.get("/explorer/tx/1111", params={"format": "json"})
    assert resp.status_code == 404 and resp.json()["error"]["code"] == "NOT_FOUND"
    resp = devnet.http.get(
        f"/explorer/object/0x{'66' * 32}", headers={"Accept": "application/json"}
    )
    assert resp.status_code == 404 and resp.json()["network"] == "local"
    assert devnet.http.get("/explorer/object/nonsense").status_code == 404


def test_explorer_shows_store_transactions(devnet: Devnet) -> None:
    obj = put(devnet, b"stored", epochs="2", send_object_to=OTHER).json()
    rec = devnet.net.object_record(obj["newlyCreated"]["blobObject"]["id"])
    assert rec is not None
    body = devnet.http.get(f"/explorer/tx/{rec.created_tx}", params={"format": "json"}).json()
    assert body["kind"] == "store"
    functions = [c["function"] for c in body["calls"]]
    assert functions == [
        f"{LOCAL_PACKAGE_ID}::system::reserve_space",
        f"{LOCAL_PACKAGE_ID}::system::register_blob",
        f"{LOCAL_PACKAGE_ID}::system::certify_blob",
        "0x2::transfer::public_transfer",
    ]
    assert body["wal_cost_frost"] == obj["newlyCreated"]["cost"]
    assert devnet.http.get(f"/explorer/tx/{rec.created_tx}").status_code == 200
