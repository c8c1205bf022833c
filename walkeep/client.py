"""A small typed Python client for Walkeep's REST mirror (``/v1``).

For agents and scripts that do not speak MCP. Methods are named after the tools and
return the same typed results (``walkeep.service.schemas``); a failure raises the
matching ``walkeep.errors`` subclass (``InsufficientBalance``, ``NotFound``, …) built
from the ``{code, message, data}`` envelope, so ``err.data`` says what to do next.
Transport failures (connection refused, timeouts) are httpx's own exceptions.

    from walkeep.client import WalkeepClient

    with WalkeepClient("https://walkeep.example.com", api_key="wk_live_…") as wk:
        wk.store("The user prefers metric units.", request_id="pref-1")
        for hit in wk.recall("units").results:
            print(hit.score, hit.content)

``AsyncWalkeepClient`` has the same methods as coroutines. Only pydantic, httpx and
the schema module are imported: no database, no model, no network engine.
"""

from __future__ import annotations

import os
import uuid
from decimal import Decimal
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel

from walkeep import __version__
from walkeep.errors import Internal, WalkeepError, from_body
from walkeep.service.schemas import (
    BalanceResult,
    ExportResult,
    ForgetResult,
    RecallResult,
    RunwayResult,
    StoreResult,
    TopUpResult,
)

__all__ = ["AsyncWalkeepClient", "WalkeepClient", "WalkeepError"]

M = TypeVar("M", bound=BaseModel)
DEFAULT_TIMEOUT = httpx.Timeout(30.0, read=120.0)


def _base_url(url: str) -> str:
    """Accept the service root or its MCP endpoint (what `walkeep serve` prints)."""
    url = url.rstrip("/")
    return url[: -len("/mcp")] if url.endswith("/mcp") else url


def _headers(api_key: str | None) -> dict[str, str]:
    key = api_key or os.environ.get("WALKEEP_API_KEY")
    if not key:
        raise ValueError("no API key: pass api_key=… or set WALKEEP_API_KEY")
    return {"Authorization": f"Bearer {key}", "User-Agent": f"walkeep-client/{__version__}"}


def _parse(response: httpx.Response, model: type[M]) -> M:
    try:
        body = response.json()
    except ValueError:
        body = None
    if response.is_success and isinstance(body, dict):
        return model.model_validate(body)
    if isinstance(body, dict) and "code" in body:
        raise from_body(body)
    raise Internal(
        f"unexpected HTTP {response.status_code} from {response.request.url}",
        {"status": response.status_code, "body": response.text[:500]},
    )


def _rid(request_id: str | None) -> str:
    # Pass your own request_id to make a retry after a lost response safe: the
    # server answers a replay with the first result and never charges twice.
    return request_id or uuid.uuid4().hex


def _drop_none(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


class WalkeepClient:
    """Synchronous client; one ``httpx.Client`` connection pool per instance."""

    def __init__(
        self,
        url: str,
        api_key: str | None = None,
        *,
        timeout: httpx.Timeout | float = DEFAULT_TIMEOUT,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._http = httpx.Client(
            base_url=_base_url(url), headers=_headers(api_key), timeout=timeout, transport=transport
        )

    def __enter__(self) -> WalkeepClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def store(
        self,
        content: str,
        request_id: str | None = None,
        namespace: str | None = None,
        metadata: dict[str, str] | None = None,
    ) -> StoreResult:
        body = _drop_none(
            {
                "content": content,
                "request_id": _rid(request_id),
                "namespace": namespace,
                "metadata": metadata,
            }
        )
        return _parse(self._http.post("/v1/store", json=body), StoreResult)

    def recall(self, query: str, namespace: str | None = None, limit: int = 5) -> RecallResult:
        body = _drop_none({"query": query, "namespace": namespace, "limit": limit})
        return _parse(self._http.post("/v1/recall", json=body), RecallResult)

    def check_runway(self, memory_id: str | None = None) -> RunwayResult:
        params = _drop_none({"memory_id": memory_id})
        return _parse(self._http.get("/v1/check_runway", params=params), RunwayResult)

    def check_balance(self) -> BalanceResult:
        return _parse(self._http.get("/v1/check_balance"), BalanceResult)

    def top_up(
        self, amount_usd: Decimal | str | float, request_id: str | None = None
    ) -> TopUpResult:
        body = {"amount_usd": str(amount_usd), "request_id": _rid(request_id)}
        return _parse(self._http.post("/v1/top_up", json=body), TopUpResult)

    def forget(self, memory_id: str, request_id: str | None = None) -> ForgetResult:
        body = {"memory_id": memory_id, "request_id": _rid(request_id)}
        return _parse(self._http.post("/v1/forget", json=body), ForgetResult)

    def export(self, namespace: str | None = None) -> ExportResult:
        params = _drop_none({"namespace": namespace})
        return _parse(self._http.get("/v1/export", params=params), ExportResult)


class AsyncWalkeepClient:
    """The same methods as coroutines, over ``httpx.AsyncClient``."""

    def __init__(
        self,
        url: str,
        api_key: str | None = None,
        *,
        timeout: httpx.Timeout | float = DEFAULT_TIMEOUT,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._http = httpx.AsyncClient(
            base_url=_base_url(url), headers=_headers(api_key), timeout=timeout, transport=transport
        )

    async def __aenter__(self) -> AsyncWalkeepClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def store(
        self,
        content: str,
        request_id: str | None = None,
        namespace: str | None = None,
        metadata: dict[str, str] | None = None,
    ) -> StoreResult:
        body = _drop_none(
            {
                "content": content,
                "request_id": _rid(request_id),
                "namespace": namespace,
                "metadata": metadata,
            }
        )
        return _parse(await self._http.post("/v1/store", json=body), StoreResult)

    async def recall(
        self, query: str, namespace: str | None = None, limit: int = 5
    ) -> RecallResult:
        body = _drop_none({"query": query, "namespace": namespace, "limit": limit})
        return _parse(await self._http.post("/v1/recall", json=body), RecallResult)

    async def check_runway(self, memory_id: str | None = None) -> RunwayResult:
        params = _drop_none({"memory_id": memory_id})
        return _parse(await self._http.get("/v1/check_runway", params=params), RunwayResult)

    async def check_balance(self) -> BalanceResult:
        return _parse(await self._http.get("/v1/check_balance"), BalanceResult)

    async def top_up(
        self, amount_usd: Decimal | str | float, request_id: str | None = None
    ) -> TopUpResult:
        body = {"amount_usd": str(amount_usd), "request_id": _rid(request_id)}
        return _parse(await self._http.post("/v1/top_up", json=body), TopUpResult)

    async def forget(self, memory_id: str, request_id: str | None = None) -> ForgetResult:
        body = {"memory_id": memory_id, "request_id": _rid(request_id)}
        return _parse(await self._http.post("/v1/forget", json=body), ForgetResult)

    async def export(self, namespace: str | None = None) -> ExportResult:
        params = _drop_none({"namespace": namespace})
        return _parse(await self._http.get("/v1/export", params=params), ExportResult)
