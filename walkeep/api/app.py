"""The web process: MCP at ``/mcp``, REST at ``/v1``, health, metrics, pages.

``create_app(rt)`` is pure wiring. Background work (the in-process completer
and, unless ``--no-worker``, the scheduler) starts and stops with the app's
lifespan so tests and ``walkeep serve`` behave the same.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from urllib.parse import urlsplit

import anyio
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from mcp.server.transport_security import TransportSecuritySettings
from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from sqlalchemy import func, select
from sqlalchemy.exc import SQLAlchemyError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from walkeep import __version__, metrics
from walkeep.api.auth import (
    BearerAccountMiddleware,
    KeyCache,
    KnownKeys,
    challenge,
    protected_resource_routes,
)
from walkeep.api.middleware import (
    WEBHOOK_MAX_BODY,
    BodyLimit,
    BodyLimits,
    GuestGate,
    PageHeaders,
    RequestLog,
    SurrogateGuard,
    tool_body_limit,
)
from walkeep.api.rest import router as rest_router
from walkeep.config import Settings
from walkeep.db import is_bad_data, is_outage
from walkeep.db.checkpoint import WalCheckpointer
from walkeep.db.models import Memory
from walkeep.errors import (
    Internal,
    RateLimited,
    ServiceUnavailable,
    Unauthorized,
    ValidationError,
    WalkeepError,
)
from walkeep.lifecycle import MemoryStatus
from walkeep.mcp.server import build_mcp
from walkeep.pressure import Heartbeat, Pressure
from walkeep.service.runtime import Runtime

log = logging.getLogger(__name__)


def transport_security(rt: Runtime) -> TransportSecuritySettings:
    """Host/Origin allow-list for DNS-rebinding protection on /mcp."""
    hosts = {"127.0.0.1:*", "localhost:*", "[::1]:*", "127.0.0.1", "localhost"}
    origins = {"http://127.0.0.1:*", "http://localhost:*"}
    public = urlsplit(rt.settings.public_url)
    if public.hostname:
        hosts.update({public.netloc, f"{public.hostname}:*", public.hostname})
        origins.add(f"{public.scheme}://{public.netloc}")
    for h in rt.settings.allowed_host_list:
        hosts.update({h, f"{h}:*"} if ":" not in h else {h})
        origins.update({f"https://{h}", f"http://{h}"})
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=sorted(hosts),
        allowed_origins=sorted(origins),
    )


def body_limits(settings: Settings) -> BodyLimits:
    """Per-route body caps: tools get what the largest legal store needs, the rest little."""
    metadata = settings.max_metadata_keys * (
        settings.max_metadata_key_chars + settings.max_metadata_value_chars
    )
    tools = tool_body_limit(settings.max_memory_bytes, 4 * metadata)
    return BodyLimits(
        rules=[("/webhooks/stripe", WEBHOOK_MAX_BODY), ("/v1", tools), ("/mcp", tools)]
    )


def create_app(
    rt: Runtime,
    *,
    on_start: Callable[[], None] | None = None,
    on_stop: Callable[[], None] | None = None,
) -> FastAPI:
    limits = body_limits(rt.settings)
    mcp = build_mcp(lambda: rt, transport="http")
    mcp_asgi = mcp.streamable_http_app(
        streamable_http_path="/mcp",
        stateless_http=True,
        json_response=True,
        transport_security=transport_security(rt),
        max_request_body_size=limits.for_path("/mcp"),
    )

    # SQLite: checkpoint the WAL on a thread of its own, not in a request's commit.
    checkpointer = WalCheckpointer(rt.db) if rt.db.sqlite_path is not None else None
    known_keys = KnownKeys(rt.db)

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        await anyio.to_thread.run_sync(known_keys.start)
        if checkpointer is not None:
            checkpointer.start()
        if rt.completer is not None:
            rt.completer.start()
        if on_start is not None:
            await anyio.to_thread.run_sync(on_start)
        async with mcp.session_manager.run():
            try:
                yield
            finally:
                if on_stop is not None:
                    await anyio.to_thread.run_sync(on_stop)
                if rt.completer is not None:
                    await anyio.to_thread.run_sync(rt.completer.stop)
                if checkpointer is not None:
                    await anyio.to_thread.run_sync(checkpointer.stop)
                await anyio.to_thread.run_sync(known_keys.stop)
                await rt.db.close_loop()

    app = WalkeepApp(
        title="Walkeep",
        version=__version__,
        description="Durable, prepaid, auto-renewed memory for AI agents on Walrus. "
        "The MCP endpoint is /mcp; this REST mirror calls the same service functions.",
        lifespan=lifespan,
        docs_url=None,  # served below from packaged files (_install_docs): works offline
        redoc_url=None,
    )
    app.state.runtime = rt
    app.state.keys = KeyCache(rt, known=known_keys)
    app.state.mcp = mcp
    _install_error_handlers(app)
    app.include_router(rest_router)
    _install_ops_routes(app, rt)
    _install_docs(app)
    _install_optional_routers(app, rt)
    app.router.routes.extend(protected_resource_routes(rt.settings.public_url))
    # Stateless JSON mode: no server-initiated stream (GET) and no session to end
    # (DELETE), so only POST exists; anything else is 405 with an Allow header
    # (the transport spec allows it) instead of an event stream held open forever.
    mcp_endpoint = BearerAccountMiddleware(SurrogateGuard(mcp_asgi), app.state.keys)
    app.router.routes.append(Route("/mcp", endpoint=mcp_endpoint, methods=["POST"]))
    # Outermost last: RequestLog sees every response, BodyLimit runs before any read.
    # One gate for both paths: guests' bodies in slots, each valid key's in bytes.
    guests = GuestGate(
        rt.settings.max_guest_requests,
        known=known_keys.tag_of,
        key_bytes=rt.settings.max_body_bytes_per_key,
    )
    read_seconds = rt.settings.body_read_seconds
    guest_seconds = rt.settings.guest_body_read_seconds
    app.add_middleware(PageHeaders)
    app.add_middleware(
        BodyLimit,
        limits=limits,
        read_seconds=read_seconds,
        guest_read_seconds=guest_seconds,
        guests=guests,
    )
    app.add_middleware(RequestLog)
    # Starlette's trailing-slash redirect builds an absolute URL from the Host header
    # (`GET /console/` with `Host: evil.example` redirected there). Redirects here are
    # relative paths only; `/console/` has its own route.
    app.router.redirect_slashes = False
    app.mcp_calls = RequestLog(
        BodyLimit(
            mcp_endpoint,
            limits=limits,
            read_seconds=read_seconds,
            guest_read_seconds=guest_seconds,
            guests=guests,
        )
    )
    app.pressure = rt.pressure
    return app


class WalkeepApp(FastAPI):
    """FastAPI, with tool calls (``POST /mcp``) taken straight to the MCP endpoint.

    Every tool call used to cross FastAPI's exception and telemetry middleware and match
    against every REST, console and docs route before reaching ``/mcp`` — about a
    millisecond of interpreter time per call, on the GIL the requests share, for
    nothing a tool call uses (bench/ceiling.py measures the difference). Tool calls keep
    exactly the same wrappers as before: the access log, the body cap and the bearer
    check; every other request (including other methods on ``/mcp``: 405) takes the
    ordinary route.
    """

    mcp_calls: ASGIApp | None = None
    # Every HTTP request is counted in flight here, so that background work can step
    # aside during a burst (walkeep/pressure.py).
    pressure: Pressure | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.pressure is None:
            await self._route(scope, receive, send)
            return
        self.pressure.enter()
        try:
            await self._route(scope, receive, send)
        finally:
            self.pressure.leave()

    async def _route(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            self.mcp_calls is not None
            and scope["type"] == "http"
            and scope["path"] == "/mcp"
            and scope["method"] == "POST"
        ):
            scope["app"] = self
            await self.mcp_calls(scope, receive, send)
            return
        await super().__call__(scope, receive, send)


def _install_docs(app: FastAPI) -> None:
    """Swagger UI 5 from the fastapi-offline package's files instead of a CDN.

    Why that package: FastAPI publishes OpenAPI 3.1, which Swagger UI reads from 5.0 on;
    swagger-ui-bundle (the previous source) ships 4.15, which rendered only "Unable to
    render this definition". tests/test_docs_browser.py opens the page in Chromium."""
    from importlib.resources import files

    app.mount(
        "/docs/assets",
        StaticFiles(directory=str(files("fastapi_offline") / "static")),
        name="swagger-ui-assets",
    )

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=app.openapi_url or "/openapi.json",
            title=f"{app.title} — API",
            swagger_js_url="/docs/assets/swagger-ui-bundle.js",
            swagger_css_url="/docs/assets/swagger-ui.css",
            swagger_favicon_url="/docs/assets/favicon.png",
        )


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(WalkeepError)
    async def walkeep_error(_req: Request, exc: WalkeepError) -> JSONResponse:
        headers: dict[str, str] = {}
        if isinstance(exc, Unauthorized):
            url = _req.app.state.runtime.settings.public_url
            sent = bool(_req.headers.get("authorization"))
            headers["WWW-Authenticate"] = challenge(url, token_sent=sent, path="")
        if isinstance(exc, RateLimited):
            headers["Retry-After"] = str(exc.data.get("retry_after_seconds", 1))
        if isinstance(exc, ServiceUnavailable):
            headers["Retry-After"] = "5"
        return JSONResponse(exc.body(), status_code=exc.http_status, headers=headers or None)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_req: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [
            {
                "loc": ".".join(str(p) for p in e.get("loc", ())),
                "msg": e.get("msg"),
                "type": e.get("type"),
            }
            for e in exc.errors()
        ]
        # Name the first offending field, as the service layer's own errors do
        # (``loc`` is e.g. ("body", "metadata", "k"): the field is the part after
        # where it came from).
        loc = [str(p) for p in (exc.errors()[0].get("loc", ()) if exc.errors() else ())]
        field = loc[1] if len(loc) > 1 else (loc[0] if loc else "")
        first = errors[0]["msg"] if errors else "invalid request"
        err = ValidationError(
            f"invalid {field}: {first}" if field else "invalid request",
            {"field": field, "errors": errors} if field else {"errors": errors},
        )
        return JSONResponse(err.body(), status_code=err.http_status)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_req: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {401: "UNAUTHORIZED", 404: "NOT_FOUND", 405: "VALIDATION_ERROR"}.get(
            exc.status_code, "VALIDATION_ERROR" if exc.status_code < 500 else "INTERNAL"
        )
        # Keep the exception's headers: a 405 must say what is Allowed.
        headers = dict(exc.headers or {})
        data: dict[str, object] = {}
        if "Allow" in headers:
            data["allow"] = [m.strip() for m in headers["Allow"].split(",")]
        return JSONResponse(
            {"code": code, "message": str(exc.detail), "data": data},
            status_code=exc.status_code,
            headers=headers or None,
        )

    async def database_error(_req: Request, exc: Exception) -> JSONResponse:
        # Handled here, not by the catch-all below: Starlette re-raises what reaches
        # the catch-all, and uvicorn then drops the keep-alive connection.
        err: WalkeepError
        if is_bad_data(exc):
            log.warning("database refused a value: %s", type(exc).__name__)
            err = ValidationError("a value in this request cannot be stored (e.g. a NUL character)")
            return JSONResponse(err.body(), status_code=err.http_status)
        if not is_outage(exc):
            log.exception("database error", exc_info=exc)
            err = Internal("internal error; it was logged")
            return JSONResponse(err.body(), status_code=err.http_status)
        log.warning("database unavailable: %s", type(exc).__name__)
        err = ServiceUnavailable("Walkeep's database is unreachable; retry shortly")
        return JSONResponse(err.body(), status_code=err.http_status, headers={"Retry-After": "5"})

    app.add_exception_handler(SQLAlchemyError, database_error)

    @app.exception_handler(Exception)
    async def crash(_req: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error", exc_info=exc)
        err = Internal("internal error; it was logged")
        return JSONResponse(err.body(), status_code=500)


def _install_ops_routes(app: FastAPI, rt: Runtime) -> None:
    @app.get("/healthz", tags=["ops"], summary="Liveness")
    async def healthz() -> dict[str, str]:
        return {"status": "ok", "version": __version__}

    @app.get("/readyz", tags=["ops"], summary="Readiness: database, backend, chain, embedder")
    async def readyz() -> JSONResponse:
        report = await anyio.to_thread.run_sync(readiness, rt)
        return JSONResponse(report, status_code=200 if report["ready"] else 503)

    @app.get("/metrics", tags=["ops"], summary="Prometheus metrics")
    async def metrics_route() -> Response:
        if rt.completer is not None:
            metrics.WRITES_IN_FLIGHT.set(rt.completer.pending())
        return Response(generate_latest(metrics.REGISTRY), media_type=CONTENT_TYPE_LATEST)


def readiness(rt: Runtime) -> dict[str, object]:
    checks: dict[str, dict[str, object]] = {}
    try:
        rt.db.ping()
        with rt.db.read() as s:
            storing = s.scalar(
                select(func.count())
                .select_from(Memory)
                .where(Memory.status == MemoryStatus.STORING)
            )
        checks["database"] = {"ok": True, "dialect": rt.db.dialect, "writes_in_flight": storing}
    except Exception as exc:
        # Unauthenticated endpoint: the reason goes to the log, never the URL, user,
        # host or database name to the caller.
        log.warning("readiness: database check failed: %s", exc)
        checks["database"] = {
            "ok": False,
            "dialect": rt.db.dialect,
            "error": "unreachable" if is_outage(exc) else "check failed",
        }
    # Backend and chain: coarse states only. Their detail is a driver's or client's own
    # text (hosts, ports, database and user names on an authentication failure), and
    # this endpoint is unauthenticated: it goes to the log, never to the caller.
    try:
        h = rt.relayer.health()
        if not h.ok or h.detail:
            log.warning("readiness: backend %s: %s", rt.relayer.name, h.detail or "not ok")
        checks["backend"] = {"ok": h.ok, "name": rt.relayer.name, "writes": h.writes}
    except Exception as exc:
        log.warning("readiness: backend %s check failed: %s", rt.relayer.name, exc)
        checks["backend"] = {
            "ok": False,
            "name": rt.relayer.name,
            "writes": "paused",
            "error": "unreachable",
        }
    try:
        checks["chain"] = {
            "ok": True,
            "network": rt.chain.network,
            "epoch": rt.chain.current_epoch(),
        }
    except Exception as exc:
        log.warning("readiness: chain %s check failed: %s", rt.chain.network, exc)
        checks["chain"] = {"ok": False, "network": rt.chain.network, "error": "unreachable"}
    if rt.extras.get("embedder") is not None:
        from walkeep.index.embedder import embedder_status

        st = embedder_status()
        # Whether search fell back to keywords, not why (the reason is in the log).
        checks["embedder"] = {
            "ok": True,
            "model": st.model_id if st else None,
            "degraded": bool(st and st.fallback_reason),
        }
    else:
        checks["embedder"] = {"ok": True, "model": "relayer-side (MemWal embeds)"}
    checks["completer"] = completer_check(rt)
    backend = checks["backend"]
    writes = backend.get("writes", "paused") if backend.get("ok") else "paused"
    ready = bool(checks["database"]["ok"] and checks["chain"]["ok"] and checks["completer"]["ok"])
    return {"ready": ready, "writes": writes, "checks": checks}


# How old the supervisor's heartbeat may be before its web processes say unready (it
# posts every second while its completer is alive: walkeep.api.serve).
COMPLETER_STALE_SECONDS = 10.0


def completer_check(rt: Runtime) -> dict[str, object]:
    """Whether something finishes the writes this process accepts.

    A store is only accepted: its hold settles when a completer lands it. One process
    (``serve``, with or without ``--no-worker``) runs its own completer: ready while that
    is alive and not hung in one round. A web process of ``serve --workers N`` has none;
    its supervisor's posts a heartbeat (:class:`walkeep.pressure.Heartbeat`): ready while
    that is fresh. A runtime with neither (embedded, tests) relies on a worker elsewhere
    (``complete_writes``) and cannot see it from here: not checked.
    """
    if rt.completer is not None:
        return {"ok": rt.completer.alive(), "runs": "in this process"}
    beat = rt.extras.get("completer_heartbeat")
    if isinstance(beat, Heartbeat):
        age = beat.age()
        fresh = age is not None and age < COMPLETER_STALE_SECONDS
        if not fresh:
            log.warning("readiness: no completer heartbeat for %s s", age and round(age))
        return {"ok": fresh, "runs": "in the supervisor"}
    return {"ok": True, "runs": "elsewhere (not checked)"}


def _install_optional_routers(app: FastAPI, rt: Runtime) -> None:
    """Payments pages/webhooks and the console (with ``/``) always; the local explorer
    when on the local network."""
    from walkeep.api.console import router as console_router
    from walkeep.api.payments import router as payments_router

    app.include_router(payments_router)
    app.include_router(console_router)
    network = rt.extras.get("localnet")
    if network is not None:
        from walkeep.backends.localnet.explorer import make_explorer_router

        app.include_router(make_explorer_router(lambda: network))
