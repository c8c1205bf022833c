"""WalrusBlobStore: unit tests over httpx.MockTransport, then end to end against
``walkeep devnet`` served by real uvicorn over real HTTP."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from walkeep.backends.base import BlobStore, Faults
from walkeep.backends.localnet.devnet import create_devnet_app
from walkeep.backends.localnet.engine import LocalNetwork
from walkeep.backends.walrus import WalrusBlobStore, aip193
from walkeep.clock import ManualClock
from walkeep.errors import NotFound, QuotaExceeded, RelayerUnavailable, ValidationError
from walkeep.protocol.walrus import encoded_blob_length, walrus_storage_cost_frost

OWNER = "0x" + "5a" * 32
PUB = "http://publisher.test"
AGG = "http://aggregator.test"

# notes/walrus-sui.md §1.3 (docs example, camelCase at every level)
NEWLY_CREATED = {
    "newlyCreated": {
        "blobObject": {
            "id": "0xe91eee8c5b6f35b9a250cfc29e30f0d9e5463a21fd8d1ddb0fc22d44db4eac50",
            "registeredEpoch": 34,
            "blobId": "M4hsZGQ1oCktdzegB6HnI6Mi28S2nqOPHxK-W7_4BUk",
            "size": 17,
            "encodingType": "RS2",
            "certifiedEpoch": 34,
            "storage": {
                "id": "0x4748cd83217b5ce7aa77e7f1ad6fc5f7f694e26a157381b9391ac65c47815faf",
                "startEpoch": 34,
                "endEpoch": 35,
                "storageSize": 66034000,
            },
            "deletable": False,
        },
        "resourceOperation": {"registerFromScratch": {"encodedLength": 66034000, "epochsAhead": 1}},
        "cost": 132300,
    }
}


def aip(code: int, status: str, reason: str, message: str = "nope") -> dict[str, Any]:
    return {
        "error": {
            "code": code,
            "status": status,
            "message": message,
            "details": [
                {"@type": "ErrorInfo", "reason": reason, "domain": "walrus", "metadata": {}}
            ],
        }
    }


class Recorder:
    """A MockTransport whose answers are scripted per call, recording every request."""

    def __init__(self, *answers: httpx.Response | Exception) -> None:
        self.answers = list(answers)
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer


def store_with(
    recorder: Recorder,
    *,
    jwt: str | None = None,
    retries: int = 2,
    rng_values: list[float] | None = None,
) -> tuple[WalrusBlobStore, list[float]]:
    waits: list[float] = []
    values = iter(rng_values or [0.5] * 10)
    store = WalrusBlobStore(
        PUB,
        AGG,
        jwt=jwt,
        retries=retries,
        http=httpx.Client(transport=httpx.MockTransport(recorder)),
        sleep=waits.append,
        rng=lambda: next(values),
    )
    return store, waits


# --- put ------------------------------------------------------------------------------------------


def test_put_parses_camel_case_and_sends_the_right_request() -> None:
    rec = Recorder(httpx.Response(200, json=NEWLY_CREATED))
    store, _ = store_with(rec)
    assert isinstance(store, BlobStore)
    stored = store.put(b"some other string", epochs=1, owner=OWNER.upper().replace("0X", "0x"))
    blob = stored.blob
    assert stored.newly_created is True
    assert stored.cost_frost == 132300
    assert blob.blob_id == "M4hsZGQ1oCktdzegB6HnI6Mi28S2nqOPHxK-W7_4BUk"
    assert blob.blob_object_id.startswith("0xe91e")
    assert (blob.size, blob.storage_size) == (17, 66034000)
    assert (blob.registered_epoch, blob.certified_epoch, blob.end_epoch) == (34, 34, 35)
    assert blob.deletable is False
    assert blob.owner == OWNER  # the send_object_to we asked for, normalised

    (request,) = rec.requests
    assert request.method == "PUT"
    assert request.url.host == "publisher.test" and request.url.path == "/v1/blobs"
    assert dict(request.url.params) == {"epochs": "1", "send_object_to": OWNER, "force": "true"}
    assert request.content == b"some other string"
    assert "authorization" not in request.headers


def test_jwt_goes_to_the_publisher_only() -> None:
    rec = Recorder(httpx.Response(200, json=NEWLY_CREATED))
    store, _ = store_with(rec, jwt="eyJ.test.jwt")
    store.put(b"x", epochs=1, owner=OWNER)
    assert rec.requests[0].headers["authorization"] == "Bearer eyJ.test.jwt"
    rec.answers = [httpx.Response(200, content=b"x")]
    store.get("blob")
    assert "authorization" not in rec.requests[1].headers


def test_already_certified_is_not_ours() -> None:
    body = {
        "alreadyCertified": {
            "blobId": "M4hsZGQ1oCktdzegB6HnI6Mi28S2nqOPHxK-W7_4BUk",
            "event": {"txDigest": "4XQHFa9S324wTzYHF3vsBSwpUZuLpmwTHYMFv9nsttSs", "eventSeq": "0"},
            "endEpoch": 35,
        }
    }
    store, _ = store_with(Recorder(httpx.Response(200, json=body)))
    stored = store.put(b"some other string", epochs=1, owner=OWNER)
    assert stored.newly_created is False
    assert stored.cost_frost is None
    assert stored.blob.end_epoch == 35
    assert stored.blob.owner == ""  # nothing we own, nothing we can renew
    assert stored.blob.blob_object_id == ""
    assert stored.blob.storage_size == encoded_blob_length(17) == 66034000


def test_marked_invalid_and_error_variants() -> None:
    invalid = {"markedInvalid": {"blobId": "abc", "event": {"txDigest": "d", "eventSeq": "0"}}}
    store, _ = store_with(Recorder(httpx.Response(200, json=invalid)))
    with pytest.raises(ValidationError):
        store.put(b"x", epochs=1, owner=OWNER)
    failed = {"error": {"blobId": "abc", "failurePhase": "certify", "errorMsg": "boom"}}
    store, _ = store_with(Recorder(httpx.Response(200, json=failed)))
    with pytest.raises(RelayerUnavailable) as info:
        store.put(b"x", epochs=1, owner=OWNER)
    assert info.value.data["reason"] == "certify"
    assert info.value.data["outcome"] == "unknown"


def test_504_insufficient_confirmations_is_not_retried() -> None:
    rec = Recorder(
        httpx.Response(504, json=aip(504, "DEADLINE_EXCEEDED", "INSUFFICIENT_CONFIRMATIONS"))
    )
    store, waits = store_with(rec)
    with pytest.raises(RelayerUnavailable) as info:
        store.put(b"x", epochs=3, owner=OWNER)
    assert info.value.data["reason"] == "INSUFFICIENT_CONFIRMATIONS"
    assert info.value.data["status"] == 504
    assert info.value.data["outcome"] == "unknown"
    assert len(rec.requests) == 1  # a retry could mint a second paid Blob
    assert waits == []


@pytest.mark.parametrize(
    ("status", "body", "error", "reason"),
    [
        (413, aip(413, "OUT_OF_RANGE", "BLOB_TOO_LARGE"), QuotaExceeded, "BLOB_TOO_LARGE"),
        (
            400,
            aip(400, "INVALID_ARGUMENT", "MALFORMED_REQUEST"),
            ValidationError,
            "MALFORMED_REQUEST",
        ),
        (451, aip(451, "UNAVAILABLE", "FORBIDDEN_BLOB"), ValidationError, "FORBIDDEN_BLOB"),
        (500, aip(500, "INTERNAL", "INTERNAL"), RelayerUnavailable, "INTERNAL"),
        (
            401,
            aip(401, "UNAUTHENTICATED", "EXPIRED_SIGNATURE"),
            RelayerUnavailable,
            "EXPIRED_SIGNATURE",
        ),
    ],
)
def test_put_error_mapping(
    status: int, body: dict[str, Any], error: type[Exception], reason: str
) -> None:
    rec = Recorder(httpx.Response(status, json=body))
    store, _ = store_with(rec)
    with pytest.raises(error) as info:
        store.put(b"x", epochs=1, owner=OWNER)
    assert info.value.data["reason"] == reason  # type: ignore[attr-defined]
    assert len(rec.requests) == 1


@pytest.mark.parametrize(
    ("exc", "outcome"),
    [
        (httpx.ConnectError("refused"), "not_sent"),
        (httpx.ConnectTimeout("slow"), "not_sent"),
        (httpx.ReadTimeout("slow"), "unknown"),
    ],
)
def test_put_transport_errors(exc: Exception, outcome: str) -> None:
    rec = Recorder(exc)
    store, _ = store_with(rec)
    with pytest.raises(RelayerUnavailable) as info:
        store.put(b"x", epochs=1, owner=OWNER)
    assert info.value.data["outcome"] == outcome
    assert len(rec.requests) == 1


@pytest.mark.parametrize("epochs", [0, -1, 54, True])
def test_put_rejects_bad_epochs_without_sending(epochs: int) -> None:
    rec = Recorder(httpx.Response(200, json=NEWLY_CREATED))
    store, _ = store_with(rec)
    with pytest.raises(ValidationError):
        store.put(b"x", epochs=epochs, owner=OWNER)
    assert rec.requests == []


def test_unparseable_store_result() -> None:
    broken = {"newlyCreated": {"blobObject": {"id": "0x1", "blobId": "b"}}}
    store, _ = store_with(Recorder(httpx.Response(200, json=broken)))
    with pytest.raises(RelayerUnavailable) as info:
        store.put(b"x", epochs=1, owner=OWNER)
    assert info.value.data["outcome"] == "unknown"


# --- get ------------------------------------------------------------------------------------------


def test_get_retries_503_with_jittered_backoff_then_succeeds() -> None:
    unavailable = httpx.Response(503, json=aip(503, "UNAVAILABLE", "BLOB_UNAVAILABLE"))
    rec = Recorder(unavailable, unavailable, httpx.Response(200, content=b"payload"))
    store, waits = store_with(rec, retries=2, rng_values=[0.0, 1.0])
    assert store.get("blob-1") == b"payload"
    assert [r.url.path for r in rec.requests] == ["/v1/blobs/blob-1"] * 3
    # base 0.5 s: attempt 0 step 0.5 → 0.25 + 0.0·0.25; attempt 1 step 1.0 → 0.5 + 1.0·0.5
    assert waits == [0.25, 1.0]


def test_get_gives_up_after_bounded_retries() -> None:
    rec = Recorder(httpx.Response(503, json=aip(503, "UNAVAILABLE", "BLOB_UNAVAILABLE")))
    store, waits = store_with(rec, retries=3)
    with pytest.raises(RelayerUnavailable) as info:
        store.get("blob-1")
    assert len(rec.requests) == 4
    assert len(waits) == 3
    assert waits == sorted(waits)  # exponential (rng fixed at 0.5)
    assert info.value.data["reason"] == "BLOB_UNAVAILABLE"
    assert info.value.data["attempts"] == 4


def test_get_retries_connection_errors_and_honours_retry_after() -> None:
    rec = Recorder(
        httpx.ConnectError("refused"),
        httpx.Response(503, headers={"retry-after": "3"}),
        httpx.Response(200, content=b"ok"),
    )
    store, waits = store_with(rec, retries=2, rng_values=[0.0, 0.0])
    assert store.get("b") == b"ok"
    assert waits == [0.25, 3.0]


def test_get_404_is_not_found_without_retry() -> None:
    rec = Recorder(httpx.Response(404, json=aip(404, "NOT_FOUND", "BLOB_NOT_FOUND")))
    store, waits = store_with(rec)
    with pytest.raises(NotFound) as info:
        store.get("gone")
    assert info.value.data == {"blob_id": "gone", "reason": "BLOB_NOT_FOUND"}
    assert len(rec.requests) == 1 and waits == []


def test_get_by_object_id_path() -> None:
    rec = Recorder(httpx.Response(200, content=b"obj"))
    store, _ = store_with(rec)
    assert store.get_by_object_id("0xabc") == b"obj"
    assert rec.requests[0].url.path == "/v1/blobs/by-object-id/0xabc"


def test_get_many_overlaps_reads_leaves_out_404s_and_raises_what_is_down() -> None:
    """A recall's uncached hits: fetched at once (every read waits until all are in
    flight, so reads made in turn would break the barrier), each id asked once, a 404
    left out, an aggregator that stays down raises."""
    barrier = threading.Barrier(4, timeout=10)
    asked: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        name = request.url.path.rsplit("/", 1)[1]
        asked.append(name)
        barrier.wait()
        if name == "gone":
            return httpx.Response(404, json=aip(404, "NOT_FOUND", "BLOB_NOT_FOUND"))
        if name == "down":
            return httpx.Response(503)
        return httpx.Response(200, content=name.encode())

    with WalrusBlobStore(
        PUB, AGG, retries=0, http=httpx.Client(transport=httpx.MockTransport(answer))
    ) as store:
        got = store.get_many(["b1", "b2", "gone", "b3", "b1"])
        assert got == {"b1": b"b1", "b2": b"b2", "b3": b"b3"}
        assert sorted(asked) == ["b1", "b2", "b3", "gone"]
        with pytest.raises(RelayerUnavailable):
            store.get_many(["b1", "b2", "b3", "down"])
        assert store.get_many([]) == {}


def test_aip193_parsing_tolerates_other_bodies() -> None:
    assert aip193(httpx.Response(404, json=aip(404, "NOT_FOUND", "BLOB_NOT_FOUND", "gone"))) == (
        "BLOB_NOT_FOUND",
        "gone",
    )
    assert aip193(httpx.Response(502, text="bad gateway")) == (None, "bad gateway")
    assert aip193(httpx.Response(500, json={"error": {"status": "INTERNAL"}})) == (
        "INTERNAL",
        "HTTP 500",
    )


def test_health_probe() -> None:
    store, _ = store_with(Recorder(httpx.Response(404)))
    assert store.health().ok is True
    store, _ = store_with(Recorder(httpx.Response(503)))
    health = store.health()
    assert health.ok is False and health.writes == "degraded"
    store, _ = store_with(Recorder(httpx.ConnectError("refused")))
    assert store.health().ok is False


# --- end to end against `walkeep devnet` over real HTTP -------------------------------------------

EPOCH_SECONDS = 3600
PRICE = 11_000


class Devnet:
    """The devnet ASGI app under real uvicorn, on a free port, in a background thread."""

    def __init__(self, state_dir: Path, clock: ManualClock, max_body_bytes: int) -> None:
        self.faults = Faults()
        self.network = LocalNetwork(
            state_dir,
            clock,
            epoch_seconds=EPOCH_SECONDS,
            storage_price_frost=PRICE,
            faults=self.faults,
        )
        app = create_devnet_app(self.network, max_body_bytes=max_body_bytes)
        # Bind and listen before the thread starts: connections queue in the backlog
        # until uvicorn serves them, so nothing has to wait for "started".
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        config = uvicorn.Config(app, log_level="warning", lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._sock.close()
        self.network.close()


@pytest.fixture
def devnet_factory(tmp_path: Path, clock: ManualClock) -> Iterator[Callable[..., Devnet]]:
    started: list[Devnet] = []

    def start(max_body_bytes: int = 10 * 1024 * 1024) -> Devnet:
        net = Devnet(tmp_path / f"net{len(started)}", clock, max_body_bytes)
        started.append(net)
        return net

    yield start
    for net in started:
        net.stop()


@pytest.fixture
def devnet(devnet_factory: Callable[..., Devnet]) -> Devnet:
    return devnet_factory()


class Sent:
    def __init__(self) -> None:
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> None:
        self.requests.append(request)


def devnet_store(devnet_url: str, **kw: Any) -> tuple[WalrusBlobStore, list[float], Sent]:
    waits: list[float] = []
    sent = Sent()
    http = httpx.Client(timeout=10, event_hooks={"request": [sent]})
    store = WalrusBlobStore(devnet_url, devnet_url, http=http, sleep=waits.append, **kw)
    return store, waits, sent


def test_devnet_put_get_round_trip(devnet: Devnet, clock: ManualClock) -> None:
    store, _, sent = devnet_store(devnet.url, jwt="devnet-jwt")
    data = json.dumps({"memory": "User prefers dark mode", "pad": "é" * 300}).encode()
    epoch = devnet.network.current_epoch()
    stored = store.put(data, epochs=5, owner=OWNER)
    blob = stored.blob

    assert stored.newly_created is True
    on_chain = devnet.network.get_object(blob.blob_object_id)
    assert on_chain is not None
    assert blob == on_chain  # every parsed field matches the devnet's object
    assert blob.owner == OWNER
    assert blob.end_epoch == epoch + 5
    assert blob.registered_epoch == epoch
    assert blob.size == len(data)
    assert blob.storage_size == encoded_blob_length(len(data))
    assert stored.cost_frost == walrus_storage_cost_frost(blob.storage_size, 5, PRICE)
    assert sent.requests[0].headers["authorization"] == "Bearer devnet-jwt"

    assert store.get(blob.blob_id) == data
    assert store.get_by_object_id(blob.blob_object_id) == data
    assert "authorization" not in sent.requests[-1].headers
    assert store.health().ok is True

    # a blob lapses once current_epoch >= end_epoch: then the aggregator says 404
    clock.advance(EPOCH_SECONDS * 5)
    with pytest.raises(NotFound):
        store.get(blob.blob_id)


def test_devnet_unknown_blob_is_not_found(devnet: Devnet) -> None:
    store, waits, _ = devnet_store(devnet.url)
    with pytest.raises(NotFound) as info:
        store.get("M4hsZGQ1oCktdzegB6HnI6Mi28S2nqOPHxK-W7_4BUk")
    assert info.value.data["reason"] == "BLOB_NOT_FOUND"
    assert waits == []


def test_devnet_body_limit_is_quota_exceeded(devnet_factory: Callable[..., Devnet]) -> None:
    devnet = devnet_factory(max_body_bytes=1024)
    store, _, _ = devnet_store(devnet.url)
    with pytest.raises(QuotaExceeded):
        store.put(b"x" * 2048, epochs=1, owner=OWNER)
    assert store.put(b"x" * 512, epochs=1, owner=OWNER).newly_created is True


def test_devnet_unreachable_fault(devnet: Devnet) -> None:
    store, waits, _ = devnet_store(devnet.url, retries=2)
    stored = store.put(b"before the outage", epochs=2, owner=OWNER)
    devnet.faults.unreachable = True
    with pytest.raises(RelayerUnavailable) as info:
        store.put(b"during the outage", epochs=2, owner=OWNER)
    assert info.value.data["status"] == 503
    with pytest.raises(RelayerUnavailable):
        store.get(stored.blob.blob_id)
    assert len(waits) == 2  # the read was retried, bounded
    assert store.health().ok is False
    devnet.faults.unreachable = False
    assert store.get(stored.blob.blob_id) == b"before the outage"


def test_publisher_down_is_unavailable() -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{probe.getsockname()[1]}"
    store, waits, _ = devnet_store(url, retries=1)
    with pytest.raises(RelayerUnavailable) as info:
        store.put(b"x", epochs=1, owner=OWNER)
    assert info.value.data["outcome"] == "not_sent"
    with pytest.raises(RelayerUnavailable):
        store.get("b")
    assert len(waits) == 1
    assert store.health().ok is False


def test_devnet_failed_write_is_504_and_not_retried(devnet: Devnet) -> None:
    store, waits, sent = devnet_store(devnet.url)
    devnet.faults.fail_next_writes = 1
    with pytest.raises(RelayerUnavailable) as info:
        store.put(b"flaky", epochs=1, owner=OWNER)
    assert info.value.data["status"] == 504
    assert info.value.data["reason"] == "INSUFFICIENT_CONFIRMATIONS"
    assert [r.method for r in sent.requests] == ["PUT"] and waits == []
    assert store.put(b"flaky", epochs=1, owner=OWNER).newly_created is True


def test_devnet_force_mints_an_object_per_put(devnet: Devnet) -> None:
    store, _, _ = devnet_store(devnet.url)
    first = store.put(b"same bytes", epochs=2, owner=OWNER)
    second = store.put(b"same bytes", epochs=2, owner=OWNER)
    assert first.blob.blob_id == second.blob.blob_id  # content-addressed
    assert first.blob.blob_object_id != second.blob.blob_object_id  # but each PUT is ours
    assert second.newly_created is True
    assert {b.blob_object_id for b in devnet.network.owned_blobs(OWNER)} == {
        first.blob.blob_object_id,
        second.blob.blob_object_id,
    }
