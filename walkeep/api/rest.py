"""The REST mirror under ``/v1``: the same service functions, the same error envelope.

Each route is named after its tool so the mapping is obvious; errors use the
envelope ``{code, message, data}`` with a fitting HTTP status.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from walkeep.api.auth import KeyCache, bearer_token, unauthorized
from walkeep.errors import Unauthorized
from walkeep.mcp.server import Caller
from walkeep.service import balance, export, forget, recall, runway, store
from walkeep.service.runtime import Runtime
from walkeep.service.schemas import (
    BalanceResult,
    ErrorBody,
    ExportResult,
    ForgetResult,
    RecallResult,
    RunwayResult,
    StoreResult,
    TopUpResult,
)

ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorBody, "description": "UNAUTHORIZED"},
    402: {"model": ErrorBody, "description": "INSUFFICIENT_BALANCE"},
    404: {"model": ErrorBody, "description": "NOT_FOUND"},
    422: {"model": ErrorBody, "description": "VALIDATION_ERROR"},
    429: {"model": ErrorBody, "description": "QUOTA_EXCEEDED"},
    503: {"model": ErrorBody, "description": "RELAYER_UNAVAILABLE / PAYMENTS_UNAVAILABLE"},
}

router = APIRouter(prefix="/v1", tags=["tools"], responses=ERRORS)


def runtime(request: Request) -> Runtime:
    return request.app.state.runtime  # type: ignore[no-any-return]


async def caller(request: Request) -> Caller:
    token = bearer_token(request.headers.get("authorization"))
    public_url = runtime(request).settings.public_url
    if not token:
        raise unauthorized(public_url, token_sent=False, path="")
    keys: KeyCache = request.app.state.keys
    try:
        return await run_in_threadpool(keys.resolve, token)
    except Unauthorized:
        raise unauthorized(public_url, token_sent=True, path="") from None


Auth = Annotated[Caller, Depends(caller)]
Rt = Annotated[Runtime, Depends(runtime)]


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StoreIn(_In):
    content: str = Field(min_length=1)
    request_id: str = Field(min_length=1, max_length=255)
    namespace: str | None = Field(default=None, min_length=1, max_length=255)
    metadata: dict[str, str] | None = None


class RecallIn(_In):
    query: str = Field(min_length=1, max_length=4096)
    namespace: str | None = Field(default=None, min_length=1, max_length=255)
    limit: int = Field(default=5, ge=1, le=50)


class TopUpIn(_In):
    amount_usd: Decimal = Field(gt=0)
    request_id: str = Field(min_length=1, max_length=255)


class ForgetIn(_In):
    memory_id: str = Field(min_length=1, max_length=200)
    request_id: str = Field(min_length=1, max_length=255)


@router.post("/store", response_model=StoreResult, summary="Store a memory (async accept)")
async def store_route(body: StoreIn, who: Auth, rt: Rt) -> StoreResult:
    return await run_in_threadpool(
        store.store,
        rt,
        who.account_id,
        content=body.content,
        request_id=body.request_id,
        namespace=body.namespace or who.default_namespace or "default",
        metadata=body.metadata,
    )


@router.post("/recall", response_model=RecallResult, summary="Semantic search (free)")
async def recall_route(body: RecallIn, who: Auth, rt: Rt) -> RecallResult:
    return await run_in_threadpool(
        recall.recall,
        rt,
        who.account_id,
        query=body.query,
        namespace=body.namespace or who.default_namespace,
        limit=body.limit,
    )


@router.get("/check_runway", response_model=RunwayResult, summary="Durability receipt")
async def runway_route(
    who: Auth, rt: Rt, memory_id: Annotated[str | None, Query(max_length=200)] = None
) -> RunwayResult:
    return await run_in_threadpool(runway.check_runway, rt, who.account_id, memory_id)


@router.get("/check_balance", response_model=BalanceResult, summary="Credits and funded runway")
async def balance_route(who: Auth, rt: Rt) -> BalanceResult:
    return await run_in_threadpool(balance.check_balance, rt, who.account_id)


@router.post("/top_up", response_model=TopUpResult, summary="Checkout link for prepaid credits")
async def top_up_route(body: TopUpIn, who: Auth, rt: Rt) -> TopUpResult:
    from walkeep.service import topup

    return await run_in_threadpool(
        topup.top_up, rt, who.account_id, amount_usd=body.amount_usd, request_id=body.request_id
    )


@router.post("/forget", response_model=ForgetResult, summary="Stop renewing a memory")
async def forget_route(body: ForgetIn, who: Auth, rt: Rt) -> ForgetResult:
    return await run_in_threadpool(
        forget.forget, rt, who.account_id, memory_id=body.memory_id, request_id=body.request_id
    )


@router.get("/export", response_model=ExportResult, summary="Everything, with on-chain ids")
async def export_route(
    who: Auth, rt: Rt, namespace: Annotated[str | None, Query(min_length=1, max_length=255)] = None
) -> ExportResult:
    return await run_in_threadpool(
        export.export, rt, who.account_id, namespace=namespace or who.default_namespace
    )
