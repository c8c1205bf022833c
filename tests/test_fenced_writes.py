"""Issue 13.2 end to end: with the ``walrus`` backend against ``walkeep devnet`` over real
HTTP, killed and restarted, a store that failed at its deadline never uploads afterwards
and its retry writes one copy: Blob objects created = memories stored."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest
import uvicorn

from tests.helpers import account, land_all
from walkeep import ledger
from walkeep.backends.localnet.devnet import create_devnet_app
from walkeep.backends.localnet.engine import LocalNetwork
from walkeep.bootstrap import build_runtime
from walkeep.clock import ManualClock
from walkeep.db import Database
from walkeep.lifecycle import MemoryStatus
from walkeep.service.tools import runway, store


class Devnet:
    """``walkeep devnet`` under real uvicorn on a fixed port, so it can be killed and
    started again where the runtime's publisher URL points."""

    def __init__(self, state_dir: Path, clock: ManualClock, port: int = 0) -> None:
        self.network = LocalNetwork(state_dir, clock, configure=True)
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", port))
        self._sock.listen(64)
        self.port = int(self._sock.getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(create_devnet_app(self.network), log_level="warning")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True
        )
        self._thread.start()

    def kill(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._sock.close()
        self.network.close()


@pytest.mark.parametrize("quilts", ["on", "off"])
def test_a_store_failed_during_an_outage_never_uploads_when_storage_returns(
    settings, clock: ManualClock, db: Database, quilts: str
) -> None:  # type: ignore[no-untyped-def]
    devnet = Devnet(settings.localnet_dir, clock)
    try:
        rt = build_runtime(
            settings.model_copy(
                update={
                    "relayer": "walrus",
                    "walrus_publisher_url": devnet.url,
                    "walrus_aggregator_url": devnet.url,
                    "quilts": quilts,
                }
            ),
            clock=clock,
            database=db,
            with_completer=False,
        )
        owner = rt.chain.owner_address()
        a = account(rt, credits=10)
        first = store.store(rt, a, content="stored while storage was up", request_id="r1")
        assert land_all(rt).landed == 1
        # Accepted just before the health check noticed the outage…
        late = store.store(rt, a, content="accepted as storage went down", request_id="r2")
        devnet.kill()
        assert land_all(rt).landed == 0  # the upload fails: backs off
        # …and failed at its deadline: the hold is released, the write fenced off.
        clock.advance(rt.settings.completion_deadline_seconds + 1)
        assert land_all(rt).failed == 1
        with rt.db.read() as s:
            assert ledger.balance(s, a) == ledger.Balance(9_000, 0)

        # Storage returns: the failed attempt stays unwritten, however long we wait.
        devnet = Devnet(settings.localnet_dir, clock, port=devnet.port)
        rt.relayer.invalidate_health()  # type: ignore[attr-defined]
        clock.advance(minutes=30)
        assert land_all(rt).landed == 0
        assert len(list(devnet.network.owned_blobs(owner))) == 1

        # The retry writes exactly one copy; objects created = memories stored.
        again = store.store(rt, a, content="accepted as storage went down", request_id="r2")
        assert again.memory_id == late.memory_id
        assert land_all(rt).landed == 1
        views = runway.check_runway(rt, a).memories
        assert {v.memory_id for v in views} == {first.memory_id, late.memory_id}
        assert {v.status for v in views} == {MemoryStatus.ACTIVE}
        assert len(list(devnet.network.owned_blobs(owner))) == len(views) == 2
        with rt.db.read() as s:
            assert ledger.balance(s, a) == ledger.Balance(8_000, 0)
    finally:
        devnet.kill()
