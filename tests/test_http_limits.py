"""Issue 13, item 1: every request body is capped before anything reads it.

In process (uvicorn on a free port) for the envelope and the per-route caps, and
against a real ``walkeep serve`` subprocess for the memory bound: anonymous
posts of hundreds of megabytes, declared or chunked, must not grow the server.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_mcp_e2e import Server, free_port

from walkeep.api.app import body_limits
from walkeep.api.middleware import WEBHOOK_MAX_BODY
from walkeep.config import Settings
from walkeep.service.operators import accounts

MIB = 1024 * 1024


@pytest.fixture
def live(settings, clock, db) -> Iterator[Server]:  # type: ignore[no-untyped-def]
    with Server(settings, clock, db) as srv:
        yield srv


def _raw_post(
    port: int, path: str, *, declared: int | None, chunks: Iterable[bytes], chunked: bool
) -> tuple[int, dict[str, str], bytes]:
    """POST over a raw socket, stopping the upload as soon as the server answers.

    httpx would insist on sending the whole body first; a hostile client doesn't.
    """
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
    head += "Transfer-Encoding: chunked\r\n" if chunked else f"Content-Length: {declared}\r\n"
    sock.sendall((head + "\r\n").encode())
    try:
        for chunk in chunks:
            if select.select([sock], [], [], 0)[0]:
                break  # the answer is in: stop uploading
            frame = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n" if chunked else chunk
            sock.sendall(frame)
        else:
            if chunked:
                sock.sendall(b"0\r\n\r\n")
    except (BrokenPipeError, ConnectionResetError):
        pass  # the server closed on us after answering: read what it said
    data = b""
    try:
        while True:
            part = sock.recv(65536)
            if not part:
                break
            data += part
            head_end = data.find(b"\r\n\r\n")
            if head_end >= 0:
                lines = data[:head_end].decode("latin-1").split("\r\n")
                headers = {
                    k.lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])
                }
                length = int(headers.get("content-length", "-1"))
                if length >= 0 and len(data) >= head_end + 4 + length:
                    break
    except ConnectionResetError:
        pass
    finally:
        sock.close()
    head_end = data.find(b"\r\n\r\n")
    assert head_end > 0, f"no HTTP response, got {data[:200]!r}"
    lines = data[:head_end].decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
    return status, headers, data[head_end + 4 :]


def _zeros(total: int, size: int = MIB) -> Iterator[bytes]:
    block = b"0" * size
    for _ in range(total // size):
        yield block


def _assert_413(status: int, headers: dict[str, str], body: bytes, limit: int) -> None:
    assert status == 413, (status, body[:200])
    envelope = json.loads(body)
    assert envelope["code"] == "VALIDATION_ERROR"
    assert envelope["data"] == {"max_body_bytes": limit}
    assert headers["content-type"] == "application/json"


def test_limits_per_route_fit_the_largest_legal_store() -> None:
    limits = body_limits(Settings())
    assert limits.for_path("/webhooks/stripe") == WEBHOOK_MAX_BODY == 64 * 1024
    tool = limits.for_path("/v1/store")
    # 256 KiB of content escaped six-fold (\\u0001) plus the largest metadata fits.
    assert 6 * 256 * 1024 < tool == limits.for_path("/mcp") < 4 * MIB
    assert limits.for_path("/checkout/abc/pay") == limits.for_path("/nowhere") == 64 * 1024
    assert limits.for_path("/v1x") == 64 * 1024  # a prefix is a path segment, not a string


def test_oversized_bodies_get_413_before_auth_or_signature(live: Server) -> None:
    limits = body_limits(live.rt.settings)
    for path in ("/v1/store", "/mcp", "/webhooks/stripe", "/checkout/x/pay", "/readyz"):
        cap = limits.for_path(path)
        status, headers, body = _raw_post(
            live.port, path, declared=200 * MIB, chunks=_zeros(2 * MIB), chunked=False
        )
        _assert_413(status, headers, body, cap)
        status, headers, body = _raw_post(
            live.port, path, declared=None, chunks=_zeros(cap + 2 * MIB, 256 * 1024), chunked=True
        )
        _assert_413(status, headers, body, cap)


def test_the_largest_legal_store_still_fits(live: Server) -> None:
    created = accounts.create_account(live.rt.db, "big", credits_mc=100_000)
    content = "\x01" * live.rt.settings.max_memory_bytes  # worst case for JSON escaping
    payload = json.dumps({"content": content, "request_id": "big-1"})
    assert len(payload) > 6 * live.rt.settings.max_memory_bytes
    r = httpx.post(
        f"{live.url}/v1/store",
        content=payload,
        headers={"Authorization": f"Bearer {created.api_key}", "Content-Type": "application/json"},
        timeout=60,
    )
    assert r.status_code == 200, r.text[:300]
    assert r.json()["status"] == "storing"


def _proc_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"{field} missing from /proc/{pid}/status")


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc")
def test_anonymous_huge_posts_leave_resident_memory_bounded(
    settings: Settings, tmp_path: Path
) -> None:
    """Regression: four anonymous 200 MB posts took the server from 430 MB to 1.8 GB."""
    port = free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("WALKEEP_", "STRIPE_"))},
        "HOME": str(tmp_path),
        "WALKEEP_DATA_DIR": str(settings.data_dir),
        "WALKEEP_DATABASE_URL": settings.db_url,
        "WALKEEP_MASTER_KEY": settings.master_key or "",
        "WALKEEP_EMBEDDER": "hash",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "walkeep.cli", "serve", "--port", str(port), "--no-worker"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, "server exited"
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.1)
        # Warm the request path once so its one-off allocations are in the baseline.
        httpx.post(f"http://127.0.0.1:{port}/webhooks/stripe", content=b"{}", timeout=10)
        baseline = max(_proc_kib(proc.pid, "VmRSS"), _proc_kib(proc.pid, "VmHWM"))
        limits = body_limits(Settings())
        for path in ("/webhooks/stripe", "/v1/store", "/mcp", "/checkout/x/pay"):
            status, headers, body = _raw_post(
                port, path, declared=200 * MIB, chunks=_zeros(8 * MIB), chunked=False
            )
            _assert_413(status, headers, body, limits.for_path(path))
            status, headers, body = _raw_post(
                port, path, declared=None, chunks=_zeros(64 * MIB), chunked=True
            )
            _assert_413(status, headers, body, limits.for_path(path))
        peak = _proc_kib(proc.pid, "VmHWM")
        # Each post may cost at most its route's cap (≤ 2.4 MiB) plus allocator slack;
        # reading even one 64 MiB body would blow through this.
        assert peak - baseline < 32 * 1024, f"peak {peak} KiB vs baseline {baseline} KiB"
        assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


# --- issue 29: slow bodies and anonymous floods ---------------------------------------------


def _slow_post(port: int, path: str, headers: str = "") -> socket.socket:
    """Headers and the first byte of a 100-byte body, then nothing: a slow-loris upload."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: 100\r\n{headers}\r\n{{"
    )
    sock.sendall(head.encode())
    return sock


def _answer(sock: socket.socket) -> tuple[int, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        got = sock.recv(65536)
        if not got:
            break
        data += got
    status = int(data.split(b" ", 2)[1]) if data else 0
    return status, data


def test_a_body_that_does_not_arrive_in_time_is_answered_408(live: Server) -> None:
    """Regression: a connection sending a byte every 10 s stayed open 150 s."""
    live.rt.settings.body_read_seconds = 0.3
    for mw in _body_limits(live):
        mw.read_seconds = mw.guest_read_seconds = 0.3
    for path in ("/mcp", "/v1/store"):
        sock = _slow_post(live.port, path)
        started = time.monotonic()
        status, data = _answer(sock)
        sock.close()
        assert status == 408, data
        assert time.monotonic() - started < 5
        assert b'"code": "VALIDATION_ERROR"' in data


def _body_limits(live: Server) -> list[Any]:
    """The app's BodyLimit instances (the ordinary stack and the /mcp fast path)."""
    from walkeep.api.middleware import BodyLimit

    found: list[Any] = []
    app = live.server.config.app
    stack = [app.mcp_calls, app.middleware_stack]
    while stack:
        node = stack.pop()
        if node is None or any(node is f for f in found):
            continue
        if isinstance(node, BodyLimit):
            found.append(node)
        stack.append(getattr(node, "app", None))
    assert len(found) == 2, found
    return found


def test_anonymous_bodies_are_bounded_and_known_keys_pass(live: Server) -> None:
    """Regression: 400 anonymous slow bodies on /mcp took RSS from 403 MB to 1.34 GB; now
    only ``max_guest_requests`` are read at once, and a caller with a known key is never
    held up by them."""
    gate = _body_limits(live)[0].guests
    assert gate is _body_limits(live)[1].guests  # one gate for both paths
    gate.large.slots = 2
    key = accounts.create_account(live.rt.db, "known", credits_mc=1000).api_key
    auth = {"Authorization": f"Bearer {key}"}
    assert httpx.get(f"{live.url}/v1/check_balance", headers=auth, timeout=10).status_code == 200
    slow = [_slow_post(live.port, "/mcp") for _ in range(2)]
    try:
        deadline = time.monotonic() + 10
        while gate.large.in_flight < 2 and time.monotonic() < deadline:
            time.sleep(0.01)  # the server has taken both slow bodies in hand
        refused = httpx.post(f"{live.url}/v1/store", json={}, timeout=10)
        assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
        assert refused.json()["code"] == "SERVICE_UNAVAILABLE"
        ok = httpx.post(
            f"{live.url}/v1/store",
            json={"content": "still served", "request_id": "k1"},
            headers=auth,
            timeout=10,
        )
        assert ok.status_code == 200, ok.text
    finally:
        for sock in slow:
            sock.close()
