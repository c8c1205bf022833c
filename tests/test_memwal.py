"""MemWalRelayer against the published signing vectors and a signature-checking fake relayer."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from fakes.memwal_relayer import FakeMemWalRelayer

from walkeep.backends.base import BlobObject, JobState, Relayer
from walkeep.backends.localnet import LocalChain, LocalNetwork
from walkeep.backends.memwal import (
    EMPTY_SHA256,
    PLACEHOLDER_PREFIX,
    UNKNOWN,
    MemWalRelayer,
    canonical_json,
    is_resolved,
    memwal_idempotency_key,
    memwal_namespace,
    parse_delegate_key,
    resolve_on_chain,
    sign_request,
    signature_message,
)
from walkeep.clock import ManualClock
from walkeep.errors import (
    ConfigurationError,
    NotFound,
    QuotaExceeded,
    RelayerUnavailable,
    ValidationError,
)

SEED = bytes([1]) * 32
SEED_HEX = SEED.hex()
PUBLIC_HEX = "8a88e3dd7409f195fd52db2d3cba5d72ca6709bf1d94121bf3748801b40f6f5c"
ACCOUNT = "0xabc123"
NONCE = "550e8400-e29b-41d4-a716-446655440000"
TS = 1700000000


# --- published test vectors (notes/memwal.md §6) ---------------------------------------------


def test_vector_post_remember() -> None:
    body = b'{"text":"I love coffee","namespace":"default"}'
    assert canonical_json({"text": "I love coffee", "namespace": "default"}) == body
    assert (
        signature_message(
            method="POST",
            path_and_query="/api/remember",
            body=body,
            timestamp=TS,
            nonce=NONCE,
            account_id=ACCOUNT,
        )
        == "1700000000.POST./api/remember."
        "45f5d8272fe6df0af37eae7f4e3c28accfddd0dac2c892e330cd9132594a06ef."
        "550e8400-e29b-41d4-a716-446655440000.0xabc123"
    )
    headers = sign_request(SEED, "POST", "/api/remember", body, TS, NONCE, ACCOUNT)
    assert headers == {
        "x-public-key": PUBLIC_HEX,
        "x-signature": "def7cefa8c7dea994925da321d0ad651155ec728a0deea9d26d46887f5f85f49"
        "bd929081a1e627d8a0cd5d69d718ae907ceb5769499e93e2b42265f2c422f702",
        "x-timestamp": "1700000000",
        "x-nonce": NONCE,
        "x-account-id": ACCOUNT,
    }


def test_vector_get_job() -> None:
    assert EMPTY_SHA256 == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    assert (
        signature_message(
            method="GET",
            path_and_query="/api/remember/job-1",
            body=b"",
            timestamp=TS,
            nonce=NONCE,
            account_id=ACCOUNT,
        )
        == f"1700000000.GET./api/remember/job-1.{EMPTY_SHA256}.{NONCE}.0xabc123"
    )
    headers = sign_request(SEED, "GET", "/api/remember/job-1", b"", TS, NONCE, ACCOUNT)
    assert headers["x-public-key"] == PUBLIC_HEX
    assert headers["x-signature"] == (
        "211618d9ca7627e5db2be90f9e5c4aa35825db08067079e2cebedeea9088a564"
        "f4c929bac6708d8004112560afea2bc084f771755e90ba5abcdd4a173b939a09"
    )


def test_parse_delegate_key_forms() -> None:
    assert parse_delegate_key("0x" + SEED_HEX) == SEED
    assert parse_delegate_key(SEED_HEX + PUBLIC_HEX) == SEED
    with pytest.raises(ConfigurationError):
        parse_delegate_key(SEED_HEX + "00" * 32)  # public half does not match
    with pytest.raises(ConfigurationError):
        parse_delegate_key("zz" * 32)
    with pytest.raises(ConfigurationError):
        parse_delegate_key("01" * 16)


def test_namespace_and_key_scoping() -> None:
    assert memwal_namespace("acct_a", "notes") == "wk1:acct_a:notes"
    assert memwal_namespace("acct_a", None) == "wk1:acct_a:default"
    assert memwal_namespace("acct_a", "x") != memwal_namespace("acct_b", "x")
    long_ns = "ü" * 200  # 400 UTF-8 bytes
    scoped = memwal_namespace("acct_a", long_ns)
    assert len(scoped.encode()) <= 255
    assert scoped == memwal_namespace("acct_a", long_ns)
    assert scoped != memwal_namespace("acct_a", long_ns + "x")
    assert memwal_idempotency_key("acct_a", "req-1") != memwal_idempotency_key("acct_b", "req-1")


# --- against the fake relayer ----------------------------------------------------------------


@pytest.fixture
def fake(clock: ManualClock) -> Iterator[FakeMemWalRelayer]:
    with FakeMemWalRelayer(clock=clock, keys={PUBLIC_HEX: ACCOUNT}) as relayer:
        yield relayer


class Sleeps:
    def __init__(self) -> None:
        self.waits: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


@pytest.fixture
def sleeps() -> Sleeps:
    return Sleeps()


@pytest.fixture
def client_clock(clock: ManualClock) -> ManualClock:
    """The client's own clock: starts in sync with the fake's, moved independently."""
    return ManualClock(clock.now())


@pytest.fixture
def relayer(
    fake: FakeMemWalRelayer, client_clock: ManualClock, sleeps: Sleeps
) -> Iterator[MemWalRelayer]:
    with MemWalRelayer(fake.url, SEED_HEX, ACCOUNT, clock=client_clock, sleep=sleeps) as r:
        yield r


def _accept(relayer: MemWalRelayer, content: str = "User prefers dark mode", **kw: str) -> str:
    args = {"account_id": "acct_a", "namespace": "default", "idempotency_key": "req-1"} | kw
    return relayer.accept(content=content, epochs=5, **args)


def test_is_a_relayer(relayer: MemWalRelayer) -> None:
    assert isinstance(relayer, Relayer)
    assert relayer.name == "memwal"
    assert relayer.content_listable is False
    assert relayer.public_key_hex == PUBLIC_HEX


def test_accept_poll_pending_then_landed(relayer: MemWalRelayer, fake: FakeMemWalRelayer) -> None:
    job_id = _accept(relayer)
    job = fake.jobs[job_id]
    assert job.text == "User prefers dark mode"
    assert job.namespace == "wk1:acct_a:default"

    assert relayer.poll(job_id).state is JobState.PENDING
    fake.set_job_status(job_id, "running")
    assert relayer.poll(job_id).state is JobState.PENDING
    fake.set_job_status(job_id, "uploaded")
    assert relayer.poll(job_id).state is JobState.PENDING

    blob_id = fake.complete_job(job_id)
    status = relayer.poll(job_id)
    assert status.state is JobState.LANDED
    assert status.blob is not None
    assert status.blob.blob_id == blob_id
    assert status.blob.owner == fake.owner
    # MemWal does not tell us the Blob object or its lifetime: placeholders, clearly marked.
    assert status.blob.blob_object_id == f"{PLACEHOLDER_PREFIX}{blob_id}"
    assert status.blob.end_epoch == UNKNOWN
    assert status.blob.storage_size == UNKNOWN
    assert not is_resolved(status.blob)
    # every request after /health was signed and verified by the fake
    assert [r.status for r in fake.requests_to("GET", "/api/remember/")] == [200] * 4


def test_poll_failed_and_unknown(relayer: MemWalRelayer, fake: FakeMemWalRelayer) -> None:
    job_id = _accept(relayer)
    fake.fail_job(job_id, "walrus upload failed: insufficient WAL")
    status = relayer.poll(job_id)
    assert status.state is JobState.FAILED
    assert status.error == "walrus upload failed: insufficient WAL"

    unknown = relayer.poll("00000000-0000-4000-8000-000000000000")
    assert unknown.state is JobState.FAILED
    assert unknown.error == "unknown job"


def test_done_without_blob_id_is_failed(relayer: MemWalRelayer, fake: FakeMemWalRelayer) -> None:
    job_id = _accept(relayer)
    fake.set_job_status(job_id, "done")
    status = relayer.poll(job_id)
    assert status.state is JobState.FAILED
    assert status.error is not None and "blob_id" in status.error


def test_landed_uses_object_and_epoch_when_relayer_sends_them(
    relayer: MemWalRelayer, fake: FakeMemWalRelayer
) -> None:
    job_id = _accept(relayer)
    object_id = "0x" + "cd" * 32
    fake.complete_job(job_id, blob_object_id=object_id, end_epoch=420, storage_size=66_034_000)
    blob = relayer.poll(job_id).blob
    assert blob is not None
    assert blob.blob_object_id == object_id
    assert blob.end_epoch == 420
    assert is_resolved(blob)


def test_idempotent_accept_scoped_per_account(
    relayer: MemWalRelayer, fake: FakeMemWalRelayer
) -> None:
    first = _accept(relayer)
    assert _accept(relayer) == first
    other = _accept(relayer, account_id="acct_b")
    assert other != first
    assert len(fake.jobs) == 2


def test_paused_refuses_before_sending(relayer: MemWalRelayer, fake: FakeMemWalRelayer) -> None:
    fake.pause()
    with pytest.raises(RelayerUnavailable) as info:
        _accept(relayer)
    assert info.value.data["writes"] == "paused"
    assert fake.requests_to("POST", "/api/remember") == []
    assert len(fake.requests_to("GET", "/health")) == 1
    assert fake.jobs == {}


def test_503_writes_paused_is_unavailable(relayer: MemWalRelayer, fake: FakeMemWalRelayer) -> None:
    fake.remember_paused = True  # the pause flipped between /health and the POST
    with pytest.raises(RelayerUnavailable) as info:
        _accept(relayer)
    assert info.value.data["status"] == 503
    assert info.value.data["detail"] == "writes are paused"
    assert fake.jobs == {}


def test_degraded_still_accepts(relayer: MemWalRelayer, fake: FakeMemWalRelayer) -> None:
    fake.writes = "degraded"
    health = relayer.health()
    assert health.ok and health.writes == "degraded"
    assert _accept(relayer) in fake.jobs


def test_health(relayer: MemWalRelayer, fake: FakeMemWalRelayer) -> None:
    assert relayer.health().ok and relayer.health().writes == "ok"
    fake.writes = "paused"
    assert relayer.health().writes == "paused"


def test_unreachable(fake: FakeMemWalRelayer, client_clock: ManualClock) -> None:
    url = fake.url
    fake.stop()
    with MemWalRelayer(url, SEED_HEX, ACCOUNT, clock=client_clock, timeout=2) as relayer:
        assert relayer.health().ok is False
        with pytest.raises(RelayerUnavailable):
            _accept(relayer)
        with pytest.raises(RelayerUnavailable) as info:
            relayer.poll("some-job")
        assert info.value.data["reason"] == "unreachable"


@pytest.mark.parametrize(
    ("offset", "accepted"), [(301, False), (-301, False), (299, True), (-299, True)]
)
def test_clock_drift_window(
    relayer: MemWalRelayer,
    fake: FakeMemWalRelayer,
    client_clock: ManualClock,
    offset: int,
    accepted: bool,
) -> None:
    client_clock.advance(offset)
    if accepted:
        assert _accept(relayer) in fake.jobs
        return
    with pytest.raises(RelayerUnavailable) as info:
        _accept(relayer)
    assert info.value.data["status"] == 401
    assert info.value.data["auth_error"] == "ERR_TIMESTAMP_OUT_OF_BOUNDS"
    assert fake.jobs == {}


def _signed(
    fake: FakeMemWalRelayer,
    clock: ManualClock,
    body: bytes,
    *,
    seed: bytes = SEED,
    nonce: str = NONCE,
) -> dict[str, str]:
    headers = sign_request(seed, "POST", "/api/remember", body, int(clock.time()), nonce, ACCOUNT)
    return headers | {"content-type": "application/json"}


def test_nonce_replay_refused(fake: FakeMemWalRelayer, clock: ManualClock) -> None:
    body = canonical_json({"text": "hello", "namespace": "default"})
    headers = _signed(fake, clock, body)
    first = httpx.post(f"{fake.url}/api/remember", content=body, headers=headers)
    assert first.status_code == 202
    replay = httpx.post(f"{fake.url}/api/remember", content=body, headers=headers)
    assert replay.status_code == 401
    assert replay.content == b""
    assert len(fake.jobs) == 1


def test_tampered_body_refused(fake: FakeMemWalRelayer, clock: ManualClock) -> None:
    body = canonical_json({"text": "hello", "namespace": "default"})
    headers = _signed(fake, clock, body)
    tampered = canonical_json({"text": "hellO", "namespace": "default"})
    response = httpx.post(f"{fake.url}/api/remember", content=tampered, headers=headers)
    assert response.status_code == 401
    # the same headers on a different path (query strings are signed too)
    response = httpx.post(f"{fake.url}/api/remember?x=1", content=body, headers=headers)
    assert response.status_code == 401
    assert fake.jobs == {}


def test_non_uuid_nonce_and_unknown_key(fake: FakeMemWalRelayer, clock: ManualClock) -> None:
    body = canonical_json({"text": "hello"})
    legacy = _signed(fake, clock, body, nonce="not-a-uuid")
    assert httpx.post(f"{fake.url}/api/remember", content=body, headers=legacy).status_code == 426
    stranger = bytes([7]) * 32
    headers = _signed(
        fake, clock, body, seed=stranger, nonce="6f1c1f0e-8a8b-4c1d-9d7e-1c2b3a4d5e6f"
    )
    public = Ed25519PrivateKey.from_private_bytes(stranger).public_key()
    assert headers["x-public-key"] == public.public_bytes(Encoding.Raw, PublicFormat.Raw).hex()
    response = httpx.post(f"{fake.url}/api/remember", content=body, headers=headers)
    assert response.status_code == 401  # a valid signature from a key no account holds
    assert fake.jobs == {}


def test_429_retry_after_honoured(
    relayer: MemWalRelayer, fake: FakeMemWalRelayer, sleeps: Sleeps
) -> None:
    fake.rate_limit(2, retry_after=3)
    job_id = _accept(relayer)
    assert job_id in fake.jobs
    assert sleeps.waits == [3.0, 3.0]
    statuses = [r.status for r in fake.requests_to("POST", "/api/remember")]
    assert statuses == [429, 429, 202]  # each retry re-signed with a fresh nonce
    nonces = {r.headers["x-nonce"] for r in fake.requests_to("POST", "/api/remember")}
    assert len(nonces) == 3


def test_429_gives_up_with_retry_after(
    relayer: MemWalRelayer, fake: FakeMemWalRelayer, sleeps: Sleeps
) -> None:
    fake.rate_limit(3, retry_after=4)
    with pytest.raises(RelayerUnavailable) as info:
        _accept(relayer)
    assert info.value.data["retry_after_seconds"] == 4
    assert sleeps.waits == [4.0, 4.0]
    assert fake.jobs == {}


def test_429_long_wait_not_slept(
    relayer: MemWalRelayer, fake: FakeMemWalRelayer, sleeps: Sleeps
) -> None:
    fake.rate_limit(1, retry_after=60)
    with pytest.raises(RelayerUnavailable) as info:
        _accept(relayer)
    assert info.value.data["retry_after_seconds"] == 60
    assert sleeps.waits == []


def test_recall_maps_results_and_isolates_accounts(
    relayer: MemWalRelayer, fake: FakeMemWalRelayer
) -> None:
    dark = _accept(relayer, "user prefers dark mode", idempotency_key="r1")
    tea = _accept(relayer, "user drinks green tea", idempotency_key="r2")
    other = _accept(relayer, "user prefers dark mode", idempotency_key="r3", namespace="work")
    blob_dark = fake.complete_job(dark)
    blob_tea = fake.complete_job(tea)
    fake.complete_job(other)

    hits = relayer.search("acct_a", "default", "prefers dark mode", 5)
    assert [h.blob_id for h in hits] == [blob_dark, blob_tea]
    assert hits[0].content == "user prefers dark mode"
    # score = 1 - distance (the fake's distance is a Jaccard distance over words)
    assert hits[0].score == pytest.approx(0.75)  # 3 shared words of 4
    assert hits[1].score == pytest.approx(0.0)  # none shared
    assert hits[0].score > hits[1].score

    assert relayer.search("acct_a", "default", "dark", 1)[0].blob_id == blob_dark
    assert relayer.search("acct_b", "default", "prefers dark mode", 5) == []
    assert len(relayer.search("acct_a", "work", "dark", 5)) == 1
    # namespace=None searches the account's "default" namespace
    assert {h.blob_id for h in relayer.search("acct_a", None, "dark", 5)} == {blob_dark, blob_tea}
    sent = json.loads(fake.requests_to("POST", "/api/recall")[0].body)
    assert sent == {"query": "prefers dark mode", "limit": 5, "namespace": "wk1:acct_a:default"}


def test_non_ascii_text_signs_and_verifies(relayer: MemWalRelayer, fake: FakeMemWalRelayer) -> None:
    text = "café ☕ 日本語 — naïve"
    job_id = _accept(relayer, text)
    raw = fake.requests_to("POST", "/api/remember")[0].body
    raw.decode("ascii")  # ensure_ascii: the wire bytes are pure ASCII escapes
    assert "\\u2615" in raw.decode()
    assert fake.jobs[job_id].text == text
    fake.complete_job(job_id)
    assert relayer.search("acct_a", "default", "café", 1)[0].content == text


def test_read_and_list_are_unsupported(relayer: MemWalRelayer) -> None:
    with pytest.raises(NotFound) as info:
        relayer.read("acct_a", "some-blob")
    assert info.value.data["reason"] == "READ_BY_ID_UNSUPPORTED"
    assert relayer.list_contents("acct_a", None, ["some-blob"]) is None


# --- status mapping without a server ------------------------------------------------------------


def _mock_relayer(handler: httpx.MockTransport) -> MemWalRelayer:
    return MemWalRelayer(
        "http://memwal.test/base",
        SEED_HEX,
        ACCOUNT,
        clock=ManualClock(),
        http=httpx.Client(transport=handler),
        sleep=lambda _: None,
    )


def _health_then(status: int, body: object, headers: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    seen: list[httpx.Request] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.path == "/base/health":
            return httpx.Response(200, json={"status": "ok", "writes": "ok"})
        return httpx.Response(status, json=body, headers=headers)

    return httpx.MockTransport(handle), seen


@pytest.mark.parametrize(
    ("status", "error"),
    [
        (402, QuotaExceeded),
        (413, QuotaExceeded),
        (400, ValidationError),
        (500, RelayerUnavailable),
        (502, RelayerUnavailable),
        (426, RelayerUnavailable),
    ],
)
def test_status_mapping(status: int, error: type[Exception]) -> None:
    transport, seen = _health_then(status, {"error": "nope"})
    with pytest.raises(error):
        _accept(_mock_relayer(transport))
    # the signed path includes the base path, as the server's URI shows it
    signed = seen[-1]
    message = signature_message(
        method="POST",
        path_and_query="/base/api/remember",
        body=signed.content,
        timestamp=int(signed.headers["x-timestamp"]),
        nonce=signed.headers["x-nonce"],
        account_id=ACCOUNT,
    )
    public = Ed25519PrivateKey.from_private_bytes(SEED).public_key()
    public.verify(bytes.fromhex(signed.headers["x-signature"]), message.encode())


def test_timeout_is_unavailable() -> None:
    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/health"):
            return httpx.Response(200, json={"status": "ok", "writes": "ok"})
        raise httpx.ReadTimeout("slow", request=request)

    with pytest.raises(RelayerUnavailable) as info:
        _accept(_mock_relayer(httpx.MockTransport(handle)))
    assert info.value.data["reason"] == "timeout"


def test_relayer_score_preferred_over_distance() -> None:
    body = {
        "results": [
            {"blob_id": "b1", "text": "t1", "distance": 0.5, "score": 0.91},
            {"blob_id": "b2", "text": "t2", "distance": 0.25},
        ],
        "total": 2,
        "dropped_count": 1,
    }
    transport, _ = _health_then(200, body)
    hits = _mock_relayer(transport).search("acct_a", "default", "q", 500)
    assert [(h.blob_id, h.score, h.content) for h in hits] == [
        ("b1", 0.91, "t1"),
        ("b2", 0.75, "t2"),
    ]


def test_limit_is_clamped() -> None:
    transport, seen = _health_then(200, {"results": []})
    _mock_relayer(transport).search("acct_a", "default", "q", 500)
    assert json.loads(seen[-1].content)["limit"] == 100


# --- resolving a landing through the Chain port ---------------------------------------------------


class _StubChain:
    """Only what ``resolve_on_chain`` touches."""

    def __init__(self, owner: str, blobs: list[BlobObject]) -> None:
        self._owner = owner
        self._blobs = blobs

    def owner_address(self) -> str:
        return self._owner

    def owned_blobs(self) -> Iterator[BlobObject]:
        return iter(self._blobs)


def test_resolve_on_chain() -> None:
    owner = "0x" + "ab" * 32
    landed = BlobObject(
        blob_id="B" * 43,
        blob_object_id=f"{PLACEHOLDER_PREFIX}{'B' * 43}",
        size=UNKNOWN,
        storage_size=UNKNOWN,
        registered_epoch=UNKNOWN,
        end_epoch=UNKNOWN,
        owner=owner,
    )
    real = BlobObject("B" * 43, "0x" + "11" * 32, 40, 66_034_000, 7, 10, owner, 7)
    unrelated = BlobObject("C" * 43, "0x" + "22" * 32, 40, 66_034_000, 7, 10, owner, 7)
    mixed_case = _StubChain(owner.upper().replace("0X", "0x"), [unrelated, real])
    assert resolve_on_chain(landed, mixed_case) == real  # type: ignore[arg-type]
    assert resolve_on_chain(landed, _StubChain(owner, [unrelated])) is None  # type: ignore[arg-type]
    # owned by the MemWal account owner, not by Walkeep's wallet: not renewable by us
    assert resolve_on_chain(landed, _StubChain("0x" + "99" * 32, [real])) is None  # type: ignore[arg-type]
    assert is_resolved(real)


# --- poll with a Chain: the landing resolved to the real Blob object ------------------------------


@pytest.fixture
def local_chain(tmp_path: Path, clock: ManualClock) -> Iterator[LocalChain]:
    network = LocalNetwork(tmp_path / "net", clock)
    yield LocalChain(network, public_url="http://127.0.0.1:8080")
    network.close()


def _chain_relayer(
    fake: FakeMemWalRelayer, client_clock: ManualClock, chain: object
) -> MemWalRelayer:
    return MemWalRelayer(
        fake.url,
        SEED_HEX,
        ACCOUNT,
        clock=client_clock,
        chain=chain,  # type: ignore[arg-type]
    )


def test_poll_resolves_blob_owned_by_server_wallet(
    fake: FakeMemWalRelayer, client_clock: ManualClock, local_chain: LocalChain
) -> None:
    fake.owner = local_chain.owner_address()  # the operator's wallet is the MemWal owner
    relayer = _chain_relayer(fake, client_clock, local_chain)
    job_id = _accept(relayer)
    stored = local_chain.localnet.store_blob(
        b"sealed bytes", epochs=3, owner=local_chain.owner_address()
    )
    # done, but the chain does not show the object yet: still pending
    fake.complete_job(job_id, blob_id="A" * 43)
    assert relayer.poll(job_id).state is JobState.PENDING

    fake.complete_job(job_id, blob_id=stored.blob.blob_id)
    status = relayer.poll(job_id)
    assert status.state is JobState.LANDED
    assert status.blob == stored.blob
    assert status.blob is not None and is_resolved(status.blob)
    assert status.blob.end_epoch == local_chain.current_epoch() + 3


def test_poll_fails_a_blob_owned_by_another_wallet(
    fake: FakeMemWalRelayer, client_clock: ManualClock, local_chain: LocalChain
) -> None:
    """Walkeep can't renew a Blob it doesn't own: never register or bill it."""
    relayer = _chain_relayer(fake, client_clock, local_chain)  # fake.owner is someone else
    job_id = _accept(relayer)
    blob_id = fake.complete_job(job_id)
    status = relayer.poll(job_id)
    assert status.state is JobState.FAILED
    assert status.error is not None and blob_id in status.error
    assert local_chain.owner_address() in status.error


def test_poll_chain_outage_is_unavailable(
    fake: FakeMemWalRelayer, client_clock: ManualClock, local_chain: LocalChain
) -> None:
    fake.owner = local_chain.owner_address()
    relayer = _chain_relayer(fake, client_clock, local_chain)
    job_id = _accept(relayer)
    fake.complete_job(job_id)
    local_chain.localnet.faults.unreachable = True
    with pytest.raises(RelayerUnavailable) as info:
        relayer.poll(job_id)
    assert info.value.data["reason"] == "chain"
