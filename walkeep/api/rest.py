"""The REST mirror under ``/v1``: the same service functions, the same error envelope.

Each route is named after its tool so the mapping is obvious; errors use the
envelope ``{code, message, data}`` with a fitting HTTP status.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from decimal import Decimal
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel, ConfigDict, Field, StringConstraints
from starlette.concurrency import run_in_threadpool

from walkeep.api.auth import KeyCache, bearer_token, unauthorized
from walkeep.errors import Unauthorized, ValidationError
from walkeep.mcp.server import Caller
from walkeep.service.runtime import Runtime
from walkeep.service.tools import balance, export, forget, recall, runway, store
from walkeep.service.tools.confine import confine
from walkeep.service.tools.ratelimit import charge_call
from walkeep.service.tools.schemas import (
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
    403: {"model": ErrorBody, "description": "FORBIDDEN: the key is confined to another namespace"},
    404: {"model": ErrorBody, "description": "NOT_FOUND"},
    413: {"model": ErrorBody, "description": "VALIDATION_ERROR: request body over the cap"},
    422: {"model": ErrorBody, "description": "VALIDATION_ERROR (also malformed JSON)"},
    429: {
        "model": ErrorBody,
        "description": "QUOTA_EXCEEDED, or RATE_LIMITED with a Retry-After header",
    },
    503: {
        "model": ErrorBody,
        "description": "RELAYER_UNAVAILABLE / PAYMENTS_UNAVAILABLE / SERVICE_UNAVAILABLE",
    },
}


async def known_query_only(request: Request) -> None:
    """Refuse a query parameter the route does not take, as bodies refuse unknown fields
    (``extra="forbid"``): a misspelled ``memroy_id`` must not turn a receipt into the
    account summary, nor a misspelled filter widen an export."""
    route = request.scope.get("route")
    dependant = getattr(route, "dependant", None)
    if dependant is None:
        return
    known = {p.alias for p in dependant.query_params}
    for dep in dependant.dependencies:
        known |= {p.alias for p in dep.query_params}
    unknown = sorted(set(request.query_params) - known)
    if unknown:
        raise ValidationError(
            f"{request.url.path.rsplit('/', 1)[-1]} does not take {', '.join(map(repr, unknown))}",
            {"field": unknown[0], "unknown": unknown},
        )


router = APIRouter(
    prefix="/v1", tags=["tools"], responses=ERRORS, dependencies=[Depends(known_query_only)]
)


def runtime(request: Request) -> Runtime:
    return request.app.state.runtime  # type: ignore[no-any-return]


async def caller(request: Request) -> Caller:
    token = bearer_token(request.headers.get("authorization"))
    public_url = runtime(request).settings.public_url
    if not token:
        raise unauthorized(public_url, token_sent=False, path="")
    keys: KeyCache = request.app.state.keys
    try:
        who = await run_in_threadpool(keys.resolve, token)
    except Unauthorized:
        raise unauthorized(public_url, token_sent=True, path="") from None
    # The access log (api/middleware.py) names the tenant, as it does for MCP calls.
    request.state.account_id = who.account_id
    return who


Auth = Annotated[Caller, Depends(caller)]
Rt = Annotated[Runtime, Depends(runtime)]


async def call(rt: Runtime, who: Caller, tool: str, fn: Callable[..., Any], **kwargs: Any) -> Any:
    """Hold a confined key to its namespace, admit the call through the per-key rate
    limit, then run the service function."""
    kwargs = confine(tool, kwargs, who.confined_to)

    def admitted() -> Any:
        charge_call(rt, who.account_id, tool, kwargs)
        return fn(rt, who.account_id, **kwargs)

    return await run_in_threadpool(admitted)


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")


# The request models state every rule the service enforces (at the default settings),
# so a request the OpenAPI document calls valid is never refused as malformed: the
# conformance test (tests/test_openapi_conformance.py) holds them to it.
# At least one character that is not whitespace to Python's str.strip() either
# (which also strips U+001C–U+001F and U+0085, unlike ECMAScript's \s), and no NUL
# anywhere (PostgreSQL text cannot hold it).
NON_BLANK = r"^[^\u0000]*[^\s\u0000\u001c-\u001f\u0085][^\u0000]*$"
NO_NUL = r"^[^\u0000]*$"
# Identifiers (request ids, namespaces, memory ids, metadata keys) also refuse every
# other control character (walkeep.ids.check_identifier; lone surrogates, which the Rust
# regex engine cannot name, are refused there too).
_ID_CHAR = r"[^\u0000-\u001f\u007f-\u009f]"
IDENT = rf"^{_ID_CHAR}*$"
NON_BLANK_IDENT = rf"^{_ID_CHAR}*[^\s\u0000-\u001f\u007f-\u009f]{_ID_CHAR}*$"
HAS_TEXT = r"[^\s\u001c-\u001f\u0085]"  # content: any characters, not only whitespace
# expires_at: an RFC 3339 full-date, or a date-time with its offset. "In the future" and
# "a day that exists" have no JSON Schema form: the service checks them (400).
RFC3339 = (
    r"^[0-9]{4}-[0-9]{2}-[0-9]{2}"
    r"([Tt][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?([Zz]|[+-][0-9]{2}:[0-9]{2}))?$"
)
MetadataKey = Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=IDENT)]
MetadataValue = Annotated[str, StringConstraints(max_length=1024, pattern=NO_NUL)]


_AFTER = (
    "Only memories stored at or after this instant: RFC 3339 timestamp with offset, or a "
    "date (the start of that day UTC)."
)
_BEFORE = "Only memories stored before this instant (exclusive); same forms as after."
_METADATA_FILTER = (
    "Only memories whose metadata has every one of these keys with exactly this value."
)


class StoreIn(_In):
    content: str = Field(
        min_length=1,
        pattern=HAS_TEXT,
        description="The memory (at most WALKEEP_MAX_MEMORY_BYTES UTF-8 bytes, else 429).",
    )
    request_id: str = Field(min_length=1, max_length=255, pattern=NON_BLANK_IDENT)
    namespace: str | None = Field(
        default=None,
        min_length=1,
        max_length=255,
        pattern=NON_BLANK_IDENT,
        description="At most 255 UTF-8 bytes.",
    )
    metadata: dict[MetadataKey, MetadataValue] | None = Field(default=None, max_length=32)
    supersedes: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        pattern=NON_BLANK_IDENT,
        description="A memory this one corrects (memory_id or blob_id): it stops renewing "
        "and leaves recall and export when this store lands.",
    )
    expires_at: str | None = Field(
        default=None,
        min_length=1,
        max_length=64,
        pattern=RFC3339,
        description="RFC 3339 date (the end of that day UTC) or timestamp with offset, in "
        "the future: the memory leaves recall and export then and is renewed no further.",
    )


class RecallIn(_In):
    query: str = Field(min_length=1, max_length=4096, pattern=NON_BLANK)
    namespace: str | None = Field(
        default=None, min_length=1, max_length=255, pattern=NON_BLANK_IDENT
    )
    limit: int = Field(default=5, ge=1, le=50)
    min_score: float = Field(
        default=0.0, ge=0, le=1, description="Leave out results scoring below this (0-1)."
    )
    after: str | None = Field(
        default=None, min_length=1, max_length=64, pattern=RFC3339, description=_AFTER
    )
    before: str | None = Field(
        default=None, min_length=1, max_length=64, pattern=RFC3339, description=_BEFORE
    )
    metadata: dict[MetadataKey, MetadataValue] | None = Field(
        default=None, max_length=32, description=_METADATA_FILTER
    )


class TopUpIn(_In):
    amount_usd: Decimal = Field(
        ge=Decimal("0.50"),
        le=Decimal("10000"),
        decimal_places=2,
        description="Dollars, 0.50 to 10,000, at most two decimals.",
    )
    request_id: str = Field(min_length=1, max_length=255, pattern=NON_BLANK_IDENT)
    save_card: bool = Field(
        default=False,
        description="Also save the card for automatic top-up (never turns it on).",
    )


class ForgetIn(_In):
    memory_id: str = Field(min_length=1, max_length=200, pattern=NON_BLANK_IDENT)
    request_id: str = Field(min_length=1, max_length=255, pattern=NON_BLANK_IDENT)


@router.post("/store", response_model=StoreResult, summary="Store a memory (async accept)")
async def store_route(body: StoreIn, who: Auth, rt: Rt) -> StoreResult:
    return await call(  # type: ignore[no-any-return]
        rt,
        who,
        "store",
        store.store,
        content=body.content,
        request_id=body.request_id,
        namespace=body.namespace or who.default_namespace or "default",
        metadata=body.metadata,
        supersedes=body.supersedes,
        expires_at=body.expires_at,
    )


@router.post("/recall", response_model=RecallResult, summary="Search by words and meaning (free)")
async def recall_route(body: RecallIn, who: Auth, rt: Rt) -> RecallResult:
    """Without ``namespace``: the key's default namespace, else every namespace."""
    return await call(  # type: ignore[no-any-return]
        rt,
        who,
        "recall",
        recall.recall,
        query=body.query,
        namespace=body.namespace or who.default_namespace,
        limit=body.limit,
        min_score=body.min_score,
        after=body.after,
        before=body.before,
        metadata=body.metadata,
    )


@router.get("/check_runway", response_model=RunwayResult, summary="Durability receipt")
async def runway_route(
    who: Auth,
    rt: Rt,
    memory_id: Annotated[
        str | None, Query(min_length=1, max_length=200, pattern=NON_BLANK_IDENT)
    ] = None,
) -> RunwayResult:
    return await call(  # type: ignore[no-any-return]
        rt, who, "check_runway", runway.check_runway, memory_id=memory_id
    )


@router.get("/check_balance", response_model=BalanceResult, summary="Credits and funded runway")
async def balance_route(who: Auth, rt: Rt) -> BalanceResult:
    return await call(rt, who, "check_balance", balance.check_balance)  # type: ignore[no-any-return]


@router.post("/top_up", response_model=TopUpResult, summary="Checkout link for prepaid credits")
async def top_up_route(body: TopUpIn, who: Auth, rt: Rt) -> TopUpResult:
    from walkeep.service.tools import topup

    return await call(  # type: ignore[no-any-return]
        rt,
        who,
        "top_up",
        topup.top_up,
        amount_usd=body.amount_usd,
        request_id=body.request_id,
        save_card=body.save_card,
    )


@router.post("/forget", response_model=ForgetResult, summary="Stop renewing a memory")
async def forget_route(body: ForgetIn, who: Auth, rt: Rt) -> ForgetResult:
    return await call(  # type: ignore[no-any-return]
        rt, who, "forget", forget.forget, memory_id=body.memory_id, request_id=body.request_id
    )


@router.get("/export", response_model=ExportResult, summary="Memories with on-chain ids, paged")
async def export_route(
    who: Auth,
    rt: Rt,
    namespace: Annotated[
        str | None, Query(min_length=1, max_length=255, pattern=NON_BLANK_IDENT)
    ] = None,
    cursor: Annotated[str | None, Query(min_length=1, max_length=export.CURSOR_MAX_CHARS)] = None,
    limit: Annotated[int | None, Query(ge=1, le=export.PAGE_MAX)] = None,
    after: Annotated[
        str | None, Query(min_length=1, max_length=64, pattern=RFC3339, description=_AFTER)
    ] = None,
    before: Annotated[
        str | None, Query(min_length=1, max_length=64, pattern=RFC3339, description=_BEFORE)
    ] = None,
    metadata: Annotated[
        str | None,
        Query(
            min_length=2,
            max_length=40_000,
            description=f"{_METADATA_FILTER} A JSON object, e.g. "
            '{"project":"apollo"} (URL-encoded).',
        ),
    ] = None,
) -> ExportResult:
    """Without ``namespace``: the key's default namespace, else every namespace. While
    ``next_cursor`` is set, call again with ``cursor=<next_cursor>`` (and the same
    filters) for the next page. Like recall, forgotten and lapsed memories are omitted
    (check_runway lists them)."""
    return await call(  # type: ignore[no-any-return]
        rt,
        who,
        "export",
        export.export,
        namespace=namespace or who.default_namespace,
        cursor=cursor,
        limit=limit,
        after=after,
        before=before,
        metadata=_json_map(metadata),
    )


def _json_map(text: str | None) -> object:
    """A query parameter holding a JSON object (export's metadata filter); the service
    checks what it holds, so this only refuses what is not JSON."""
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        raise ValidationError(
            'metadata must be a JSON object of strings, e.g. {"project":"apollo"}',
            {"field": "metadata"},
        ) from None
