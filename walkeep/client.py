"""A small typed Python client for Walkeep's REST mirror (``/v1``).

For agents and scripts that do not speak MCP. Methods are named after the tools and
return the same typed results (``walkeep.service.tools.schemas``); a failure raises the
matching ``walkeep.errors`` subclass (``InsufficientBalance``, ``NotFound``, …) built
from the ``{code, message, data}`` envelope, so ``err.data`` says what to do next.
Transport failures (connection refused, timeouts) are httpx's own exceptions.

    from walkeep.client import WalkeepClient

    with WalkeepClient("https://walkeep.example.com", api_key=key) as wk:
        receipt = wk.store("The user prefers metric units.", request_id="pref-1")
        wk.wait_until_stored(receipt.memory_id)  # a store lands in the background
        for hit in wk.recall("units").results:
            print(hit.score, hit.content)
        for memory in wk.export_all():  # every page of export
            print(memory.memory_id, memory.blob_object_id)

The key: ``api_key``, else ``$WALKEEP_API_KEY``, else the one ``walkeep serve`` saved
(``<data dir>/credentials.json``). ``AsyncWalkeepClient`` has the same methods as
coroutines (``export_all`` is an async iterator). Only pydantic, httpx and the schema
module are imported: no database, no model, no network engine.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import date, datetime
from decimal import Decimal
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel

from walkeep import __version__
from walkeep.errors import Internal, WalkeepError, from_body
from walkeep.service.tools.schemas import (
    BalanceResult,
    ExportMemory,
    ExportResult,
    ForgetResult,
    RecallResult,
    RunwayMemory,
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
    key = api_key or os.environ.get("WALKEEP_API_KEY") or _saved_key()
    if not key:
        raise ValueError(
            "no API key: pass api_key=…, set WALKEEP_API_KEY, or run `walkeep serve` once "
            "(it saves one in <data dir>/credentials.json)"
        )
    if not key.isascii() or any(ch.isspace() for ch in key):
        # httpx would fail deep inside with UnicodeEncodeError on a pasted placeholder.
        raise ValueError(
            "the API key is not a key (non-ASCII or spaces): replace the placeholder "
            "with the wk_live_… key `walkeep serve` printed"
        )
    return {"Authorization": f"Bearer {key}", "User-Agent": f"walkeep-client/{__version__}"}


def _saved_key() -> str | None:
    """The key ``walkeep serve`` saved on first run, as ``walkeep mcp`` finds it."""
    from walkeep.config import load_settings
    from walkeep.errors import ConfigurationError
    from walkeep.onboarding import resolve_api_key

    try:
        return resolve_api_key(load_settings(), None)
    except ConfigurationError:
        return None


def _still_storing(result: RunwayResult) -> RunwayMemory | None:
    memory = result.memories[0]
    return None if memory.status == "storing" else memory


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


def _instant(value: str | datetime | date | None) -> str | None:
    """An instant as RFC 3339 text: a date stays a date (``expires_at``: the end of that
    day UTC; ``after``/``before``: its start); a datetime must carry its offset, which
    the server checks."""
    if value is None or isinstance(value, str):
        return value
    return value.isoformat()


def _drop_none(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


def _recall_body(
    query: str,
    namespace: str | None,
    limit: int,
    min_score: float | None,
    after: datetime | date | str | None,
    before: datetime | date | str | None,
    metadata: dict[str, str] | None,
) -> dict[str, Any]:
    return _drop_none(
        {
            "query": query,
            "namespace": namespace,
            "limit": limit,
            "min_score": min_score,
            "after": _instant(after),
            "before": _instant(before),
            "metadata": metadata,
        }
    )


def _export_params(
    namespace: str | None,
    cursor: str | None,
    limit: int | None,
    after: datetime | date | str | None,
    before: datetime | date | str | None,
    metadata: dict[str, str] | None,
) -> dict[str, Any]:
    return _drop_none(
        {
            "namespace": namespace,
            "cursor": cursor,
            "limit": limit,
            "after": _instant(after),
            "before": _instant(before),
            # A JSON object in one query parameter (the REST route parses it).
            "metadata": json.dumps(metadata, separators=(",", ":")) if metadata else None,
        }
    )


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
        supersedes: str | None = None,
        expires_at: str | datetime | date | None = None,
    ) -> StoreResult:
        body = _drop_none(
            {
                "content": content,
                "request_id": _rid(request_id),
                "namespace": namespace,
                "metadata": metadata,
                "supersedes": supersedes,
                "expires_at": _instant(expires_at),
            }
        )
        return _parse(self._http.post("/v1/store", json=body), StoreResult)

    def recall(
        self,
        query: str,
        namespace: str | None = None,
        limit: int = 5,
        *,
        min_score: float | None = None,
        after: datetime | date | str | None = None,
        before: datetime | date | str | None = None,
        metadata: dict[str, str] | None = None,
    ) -> RecallResult:
        """The best ``limit`` matches; ``after``/``before``/``metadata`` narrow them."""
        body = _recall_body(query, namespace, limit, min_score, after, before, metadata)
        return _parse(self._http.post("/v1/recall", json=body), RecallResult)

    def check_runway(self, memory_id: str | None = None) -> RunwayResult:
        params = _drop_none({"memory_id": memory_id})
        return _parse(self._http.get("/v1/check_runway", params=params), RunwayResult)

    def check_balance(self) -> BalanceResult:
        return _parse(self._http.get("/v1/check_balance"), BalanceResult)

    def top_up(
        self,
        amount_usd: Decimal | str | float,
        request_id: str | None = None,
        *,
        save_card: bool = False,
    ) -> TopUpResult:
        """A checkout link; ``save_card`` also saves the card for automatic top-up."""
        body = {"amount_usd": str(amount_usd), "request_id": _rid(request_id)}
        if save_card:
            body["save_card"] = True  # type: ignore[assignment]
        return _parse(self._http.post("/v1/top_up", json=body), TopUpResult)

    def forget(self, memory_id: str, request_id: str | None = None) -> ForgetResult:
        body = {"memory_id": memory_id, "request_id": _rid(request_id)}
        return _parse(self._http.post("/v1/forget", json=body), ForgetResult)

    def export(
        self,
        namespace: str | None = None,
        cursor: str | None = None,
        limit: int | None = None,
        *,
        after: datetime | date | str | None = None,
        before: datetime | date | str | None = None,
        metadata: dict[str, str] | None = None,
    ) -> ExportResult:
        """One page; while ``next_cursor`` is set, pass it as ``cursor`` (same namespace
        and filters)."""
        params = _export_params(namespace, cursor, limit, after, before, metadata)
        return _parse(self._http.get("/v1/export", params=params), ExportResult)

    def export_all(
        self,
        namespace: str | None = None,
        limit: int | None = None,
        *,
        after: datetime | date | str | None = None,
        before: datetime | date | str | None = None,
        metadata: dict[str, str] | None = None,
    ) -> Iterator[ExportMemory]:
        """Every exported memory, page after page (``limit`` per page)."""
        cursor = None
        while True:
            page = self.export(
                namespace, cursor=cursor, limit=limit, after=after, before=before, metadata=metadata
            )
            yield from page.memories
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    def wait_until_stored(
        self, memory_id: str, timeout: float = 120.0, interval: float = 0.5
    ) -> RunwayMemory:
        """Poll ``check_runway`` until the store has landed (``active``) or settled
        otherwise; ``TimeoutError`` after ``timeout`` seconds. A store returns at once
        (``"storing"``) and lands in the background: recall finds it only afterwards."""
        deadline = time.monotonic() + timeout
        while (memory := _still_storing(self.check_runway(memory_id))) is None:
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{memory_id} still storing after {timeout:g} s")
            time.sleep(interval)
        return memory


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
        supersedes: str | None = None,
        expires_at: str | datetime | date | None = None,
    ) -> StoreResult:
        body = _drop_none(
            {
                "content": content,
                "request_id": _rid(request_id),
                "namespace": namespace,
                "metadata": metadata,
                "supersedes": supersedes,
                "expires_at": _instant(expires_at),
            }
        )
        return _parse(await self._http.post("/v1/store", json=body), StoreResult)

    async def recall(
        self,
        query: str,
        namespace: str | None = None,
        limit: int = 5,
        *,
        min_score: float | None = None,
        after: datetime | date | str | None = None,
        before: datetime | date | str | None = None,
        metadata: dict[str, str] | None = None,
    ) -> RecallResult:
        body = _recall_body(query, namespace, limit, min_score, after, before, metadata)
        return _parse(await self._http.post("/v1/recall", json=body), RecallResult)

    async def check_runway(self, memory_id: str | None = None) -> RunwayResult:
        params = _drop_none({"memory_id": memory_id})
        return _parse(await self._http.get("/v1/check_runway", params=params), RunwayResult)

    async def check_balance(self) -> BalanceResult:
        return _parse(await self._http.get("/v1/check_balance"), BalanceResult)

    async def top_up(
        self,
        amount_usd: Decimal | str | float,
        request_id: str | None = None,
        *,
        save_card: bool = False,
    ) -> TopUpResult:
        """A checkout link; ``save_card`` also saves the card for automatic top-up."""
        body = {"amount_usd": str(amount_usd), "request_id": _rid(request_id)}
        if save_card:
            body["save_card"] = True  # type: ignore[assignment]
        return _parse(await self._http.post("/v1/top_up", json=body), TopUpResult)

    async def forget(self, memory_id: str, request_id: str | None = None) -> ForgetResult:
        body = {"memory_id": memory_id, "request_id": _rid(request_id)}
        return _parse(await self._http.post("/v1/forget", json=body), ForgetResult)

    async def export(
        self,
        namespace: str | None = None,
        cursor: str | None = None,
        limit: int | None = None,
        *,
        after: datetime | date | str | None = None,
        before: datetime | date | str | None = None,
        metadata: dict[str, str] | None = None,
    ) -> ExportResult:
        params = _export_params(namespace, cursor, limit, after, before, metadata)
        return _parse(await self._http.get("/v1/export", params=params), ExportResult)

    async def export_all(
        self,
        namespace: str | None = None,
        limit: int | None = None,
        *,
        after: datetime | date | str | None = None,
        before: datetime | date | str | None = None,
        metadata: dict[str, str] | None = None,
    ) -> AsyncIterator[ExportMemory]:
        cursor = None
        while True:
            page = await self.export(
                namespace, cursor=cursor, limit=limit, after=after, before=before, metadata=metadata
            )
            for memory in page.memories:
                yield memory
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    async def wait_until_stored(
        self, memory_id: str, timeout: float = 120.0, interval: float = 0.5
    ) -> RunwayMemory:
        deadline = time.monotonic() + timeout
        while (memory := _still_storing(await self.check_runway(memory_id))) is None:
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{memory_id} still storing after {timeout:g} s")
            await asyncio.sleep(interval)
        return memory
