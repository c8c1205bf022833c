"""The operator console at ``/console`` and the landing page at ``/``.

Server-rendered Jinja2 templates (``walkeep/api/templates``), one stylesheet
served from the package, charts as inline SVG (``walkeep.api.charts``): no
JavaScript, no CDN, works offline. Pages are thin: authenticate, call one
service function (``walkeep.service.operators.console`` / ``accounts`` / ``statements`` /
``topup``), render. A new API key is shown once, in the answer to the form that made it:
never in a URL, a log or a page after a redirect.

Sessions are signed cookies (itsdangerous; secret from
``WALKEEP_CONSOLE_SECRET`` or ``<data_dir>/console.secret``, mode 0600),
HttpOnly, SameSite=Lax, Secure when the public URL is https, scoped to
``/console``. Each session carries a random CSRF token that every POST form
echoes in a hidden field (compared in constant time) — the sign-in forms too,
through an anonymous pre-session. A session opened with an API key ends when
that key is revoked; every session ends with its account being disabled.

Signed-in sessions also have a row in ``console_sessions`` that the cookie names, so a
session ends on the server: signing out ends it (a copied cookie stops working), and
revoking a key ends the sessions opened with it and the account's link sessions. Failed sign-ins
are throttled per client address and kind of credential (:class:`_SignIn`).

Why one file: the console's routes, each a few lines (authenticate, one service call,
render), sharing one session and CSRF scheme.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import hmac
import logging
import os
import re
import secrets
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
from itsdangerous import BadSignature, URLSafeTimedSerializer
from jinja2 import Environment, PackageLoader, select_autoescape
from markupsafe import Markup, escape
from starlette.concurrency import run_in_threadpool

from walkeep import __version__, ids, ledger, topup_rule
from walkeep.api import charts
from walkeep.config import Settings
from walkeep.db import Database
from walkeep.errors import Internal, Unauthorized, WalkeepError
from walkeep.service import alerts, digests
from walkeep.service.operators import accounts, statements, verify
from walkeep.service.operators import autotopup as auto_svc
from walkeep.service.operators import console as svc
from walkeep.service.runtime import Runtime
from walkeep.service.tools import balance, topup
from walkeep.service.tools.views import epochs_text, short_duration

log = logging.getLogger(__name__)

router = APIRouter(include_in_schema=False)

COOKIE = "walkeep_console"
COOKIE_PATH = "/"
SECRET_FILENAME = "console.secret"
MAX_FORM_BYTES = 16 * 1024
STATIC = {"console.css": "text/css; charset=utf-8"}
# Console pages load nothing from elsewhere and run no script; they must not be framed
# (a framed Top up button could be clickjacked) nor leak one-time links in Referer.
SECURITY_HEADERS = {
    "Cache-Control": "no-store",
    "Content-Security-Policy": "default-src 'self'; script-src 'none'; object-src 'none'; "
    "base-uri 'none'; frame-ancestors 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}

_env = Environment(
    loader=PackageLoader("walkeep.api", "templates"),
    autoescape=select_autoescape(["html"]),
    trim_blocks=True,
    lstrip_blocks=True,
)


# --- formatting helpers (template filters) ---------------------------------------------------


def credits(mc: int) -> str:
    """Credits for people: two decimals when whole cents, three otherwise."""
    text = statements.credits_str(mc)
    return text[:-1] if text.endswith("0") else text


def when(at: datetime | None) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC") if at else "—"


def epochs(n: int | None) -> str:
    """'1 epoch', '3 epochs', or a dash for none."""
    return "—" if n is None else epochs_text(n)


def short(text: str | None, n: int = 10) -> str:
    if not text:
        return "—"
    return text if len(text) <= n + 2 else f"{text[:n]}…"


def size(n: int) -> str:
    for unit in ("B", "KiB", "MiB"):
        if n < 1024 or unit == "MiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n = n / 1024  # type: ignore[assignment]
    return f"{n} B"


_CODE_SPAN = re.compile(r"`([^`\n]+)`")


def prose(text: str | None) -> Markup:
    """A message for people: escaped, with `backticked` commands shown as code.

    Messages are shared with the CLI and tools, where backticks mark commands; in HTML
    they showed as literal backticks. As commands they wrap between words (``cmd``)."""
    escaped = str(escape(text or ""))
    return Markup(_CODE_SPAN.sub(r'<code class="cmd">\1</code>', escaped))


_env.filters.update(
    prose=prose,
    credits=credits,
    usd=ledger.mc_to_usd_str,
    when=when,
    short=short,
    size=size,
    duration=short_duration,
    epochs=epochs,
)


# --- sessions ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Session:
    role: str  # "anon" | "account" | "admin"
    csrf: str
    account_id: str | None = None
    key_id: str | None = None
    sid: str | None = None  # the console_sessions row of a signed-in session

    def dump(self) -> dict[str, Any]:
        return {
            "r": self.role,
            "c": self.csrf,
            "a": self.account_id,
            "k": self.key_id,
            "s": self.sid,
        }


def load_console_secret(settings: Settings) -> str:
    """``WALKEEP_CONSOLE_SECRET``, else ``<data_dir>/console.secret`` (created 0600, atomically).

    Several web processes on one host share the file; across hosts set the
    variable, or a session signed by one process would be refused by another.
    """
    if settings.console_secret:
        return settings.console_secret
    data_dir = Path(settings.data_dir).expanduser()
    data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = data_dir / SECRET_FILENAME
    if not path.exists():
        with contextlib.suppress(FileExistsError):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.fchmod(fd, 0o600)
                os.write(fd, (secrets.token_urlsafe(48) + "\n").encode())
                os.fsync(fd)
            finally:
                os.close(fd)
    for _ in range(200):  # a concurrent creator may be between open() and write()
        text = path.read_text(encoding="ascii").strip()
        if text:
            return text
        time.sleep(0.01)
    raise Internal(f"console secret file {path} is empty")


def _serializer(rt: Runtime) -> URLSafeTimedSerializer:
    ser = rt.extras.get("console_serializer")
    if ser is None:
        ser = URLSafeTimedSerializer(load_console_secret(rt.settings), salt="walkeep-console")
        rt.extras["console_serializer"] = ser
    return ser  # type: ignore[no-any-return]


def _read_session(rt: Runtime, request: Request) -> Session | None:
    raw = request.cookies.get(COOKIE)
    if not raw:
        return None
    try:
        data = _serializer(rt).loads(raw, max_age=rt.settings.console_session_hours * 3600)
        return Session(
            role=data["r"],
            csrf=data["c"],
            account_id=data["a"],
            key_id=data["k"],
            sid=data.get("s"),
        )
    except (BadSignature, KeyError, TypeError):
        return None


def _set_session(rt: Runtime, response: Response, session: Session) -> None:
    response.set_cookie(
        COOKIE,
        _serializer(rt).dumps(session.dump()),
        max_age=rt.settings.console_session_hours * 3600,
        # "/": the TEST MODE checkout pages (/checkout/…) require a signed-in operator.
        path=COOKIE_PATH,
        httponly=True,
        samesite="lax",
        secure=rt.settings.public_url.lower().startswith("https://"),
    )


def _clear_session(rt: Runtime, response: Response) -> None:
    response.delete_cookie(
        COOKIE,
        path=COOKIE_PATH,
        httponly=True,
        samesite="lax",
        secure=rt.settings.public_url.lower().startswith("https://"),
    )


def _token_tag(token: str) -> str:
    """A non-secret tag of the admin token kept in admin sessions (to notice rotation)."""
    return hashlib.sha256(b"walkeep-console-admin\x00" + token.encode()).hexdigest()[:32]


def _new_csrf() -> str:
    return secrets.token_urlsafe(24)


async def _form(request: Request) -> dict[str, str]:
    """A small urlencoded form (the console never uploads files), bounded before parsing."""
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            raise _Refused(
                413, "Form too large", "That form was larger than a console form can be."
            )
    parsed = parse_qs(body.decode("utf-8", errors="replace"), keep_blank_values=True)
    return {k: v[0] for k, v in parsed.items()}


class _Refused(Exception):
    def __init__(self, status: int, title: str, message: str) -> None:
        super().__init__(message)
        self.status, self.title, self.message = status, title, message


def _check_csrf(session: Session | None, form: dict[str, str]) -> Session:
    sent = form.get("csrf", "")
    if session is None or not sent or not hmac.compare_digest(sent, session.csrf):
        raise _Refused(
            403,
            "Form expired",
            "This form was missing its security token or came from another page. "
            "Reload the page and try again.",
        )
    return session


async def _signed_in(rt: Runtime, request: Request, role: str | None = None) -> Session:
    """The current session, re-checked against the database; raises _Refused otherwise."""
    session = _read_session(rt, request)
    if session is None or session.role == "anon":
        raise _Refused(401, "Signed out", "Sign in to continue.")
    if session.role == "admin" and not await run_in_threadpool(
        svc.session_open, rt.db, session.sid
    ):
        raise _Refused(401, "Signed out", "Your session ended; sign in again.")
    if session.role == "account":
        assert session.account_id is not None
        ok = await run_in_threadpool(
            svc.session_still_valid, rt.db, session.account_id, session.key_id, session.sid
        )
        if not ok:
            raise _Refused(
                401, "Signed out", "Your session ended (signed out, or a key was revoked)."
            )
    if session.role == "admin" and session.key_id is not None:
        # Opened with the admin token: rotating WALKEEP_ADMIN_TOKEN ends it.
        token = rt.settings.admin_token
        if not token or not hmac.compare_digest(session.key_id, _token_tag(token)):
            raise _Refused(401, "Signed out", "Your session ended: the admin token changed.")
    if role is not None and session.role != role:
        raise _Refused(403, "Not allowed", "This page is for another kind of console user.")
    return session


async def operator_for(rt: Runtime, request: Request, account_id: str) -> bool:
    """Whether this request comes from a signed-in operator of ``account_id`` (or an
    admin): what the local TEST MODE checkout's Pay action requires, so that holding
    the checkout link — as the agent that asked for it does — is not enough to mint
    credits."""
    try:
        session = await _signed_in(rt, request)
    except _Refused:
        return False
    return session.role == "admin" or session.account_id == account_id


# --- rendering --------------------------------------------------------------------------------


def _runtime(request: Request) -> Runtime:
    rt: Runtime = request.app.state.runtime
    return rt


def _render(
    rt: Runtime, name: str, status_code: int = 200, session: Session | None = None, **ctx: Any
) -> HTMLResponse:
    page = _env.get_template(name).render(
        version=__version__,
        network=rt.chain.network,
        session=session,
        payments=rt.payments.provider,
        **ctx,
    )
    return HTMLResponse(page, status_code=status_code, headers=SECURITY_HEADERS)


def _refused(rt: Runtime, request: Request, exc: _Refused) -> Response:
    if exc.status == 401 and request.method == "GET":
        response: Response = RedirectResponse("/console/login", status_code=303)
        _clear_session(rt, response)
        return response
    response = _render(rt, "console/error.html", exc.status, title=exc.title, message=exc.message)
    if exc.status == 401:
        _clear_session(rt, response)
    return response


# --- landing page and static files ------------------------------------------------------------


@router.get("/", response_class=HTMLResponse)
async def home(request: Request) -> HTMLResponse:
    rt = _runtime(request)
    return _render(
        rt,
        "home.html",
        base=rt.settings.public_url.rstrip("/"),
        relayer=rt.relayer.name,
        explorer="localnet" in rt.extras,
    )


@router.get("/console/static/{name}")
async def static(name: str) -> Response:
    if name not in STATIC:
        return Response("not found", status_code=404, media_type="text/plain")
    text = resources.files("walkeep.api").joinpath("static", name).read_bytes()
    return Response(text, media_type=STATIC[name], headers={"Cache-Control": "max-age=3600"})


# --- sign-in / sign-out -----------------------------------------------------------------------


@router.get("/console/", include_in_schema=False)
async def console_slash() -> RedirectResponse:
    """A relative redirect: never one built from the request's Host header."""
    return RedirectResponse("/console", status_code=308)


@router.get("/console", response_model=None)
async def console_root(request: Request) -> Response:
    session = _read_session(_runtime(request), request)
    if session is None or session.role == "anon":
        return RedirectResponse("/console/login", status_code=303)
    target = "/console/admin" if session.role == "admin" else "/console/account"
    return RedirectResponse(target, status_code=303)


def _login_page(
    rt: Runtime, request: Request, template: str, status_code: int = 200, **ctx: Any
) -> HTMLResponse:
    """A sign-in form under a fresh anonymous session (its CSRF token guards the POST)."""
    session = _read_session(rt, request)
    if session is None or session.role != "anon":
        session = Session(role="anon", csrf=_new_csrf())
    response = _render(rt, template, status_code, csrf=session.csrf, **ctx)
    _set_session(rt, response, session)
    return response


@router.get("/console/login", response_class=HTMLResponse)
async def login_page(request: Request) -> HTMLResponse:
    rt = _runtime(request)
    return _login_page(rt, request, "console/login.html", admin=bool(rt.settings.admin_token))


@router.post("/console/login", response_model=None)
async def login(request: Request) -> Response:
    rt = _runtime(request)
    try:
        form = await _form(request)
        _check_csrf(_read_session(rt, request), form)
    except _Refused as exc:
        return _refused(rt, request, exc)
    credential = form.get("credential", "").strip()
    admin_token = rt.settings.admin_token
    attempt = _SignIn.of(request, credential)
    wait = await run_in_threadpool(svc.sign_in_wait, rt.db, attempt.client_bucket)
    if wait:
        log.warning("console sign-in throttled")
        throttled = _login_page(
            rt,
            request,
            "console/login.html",
            429,
            admin=bool(admin_token),
            error=f"Too many failed sign-ins from here; try again in {wait} s.",
        )
        throttled.headers["Retry-After"] = str(wait)
        return throttled
    session: Session | None = None
    if admin_token and credential and hmac.compare_digest(credential, admin_token):
        session = Session(role="admin", csrf=_new_csrf(), key_id=_token_tag(admin_token))
    elif credential:
        try:
            principal = await run_in_threadpool(
                accounts.authenticate, rt.db, credential, digests.master_key(rt)
            )
        except Unauthorized:
            principal = None
        if principal is not None and principal.only_namespace:
            # The console shows and acts on the whole account (every namespace, credits,
            # alerts); a key confined to one namespace must not open it. Not a failed
            # guess: the key is valid, so it is not counted against the client.
            log.info("console sign-in refused: the key is confined to a namespace")
            return _login_page(
                rt,
                request,
                "console/login.html",
                403,
                admin=bool(admin_token),
                error="This key is confined to one namespace and cannot sign in to the "
                "console, which shows the whole account. Sign in with another key of the "
                "account, or ask your operator for a sign-in link.",
            )
        if principal is not None:
            session = Session(
                role="account",
                csrf=_new_csrf(),
                account_id=principal.account_id,
                key_id=principal.key_id,
            )
    if session is None:
        log.info("console sign-in refused")
        await run_in_threadpool(attempt.failed, rt.db)
        return _login_page(
            rt,
            request,
            "console/login.html",
            401,
            admin=bool(admin_token),
            error="That key was not recognised (unknown, revoked, or mistyped).",
        )
    response = RedirectResponse("/console", status_code=303)
    _set_session(rt, response, await _opened(rt, session))
    return response


async def _opened(rt: Runtime, session: Session) -> Session:
    """``session`` with its server-side row (console_sessions), so it can end there."""
    sid = await run_in_threadpool(
        functools.partial(
            svc.open_session,
            rt.db,
            session.account_id,
            hours=rt.settings.console_session_hours,
            key_id=session.key_id if session.role == "account" else None,
        )
    )
    return dataclasses.replace(session, sid=sid)


@dataclass(frozen=True, slots=True)
class _SignIn:
    """Where a sign-in attempt counts when it fails.

    Only failures count, after the credential is checked, and a client is refused
    without a check only once *it* has failed ``SIGN_IN_PER_MINUTE`` times this minute
    with that kind of credential (the admin token, or an API key). So junk sent by others
    never holds up the right admin token — counting every attempt before checking it put
    the admin behind anyone's ten wrong guesses — and junk API keys do not hold up an
    admin sign-in from the same address. Failures per target (the admin, or a key's
    prefix) are counted too, and logged when many clients guess one target. The client
    is the connection's peer unless the operator names the proxies whose
    ``X-Forwarded-For`` is believed (``WALKEEP_FORWARDED_ALLOW_IPS``): otherwise any
    caller chose the address it was counted under.
    """

    client_bucket: str
    target_bucket: str

    @classmethod
    def of(cls, request: Request, credential: str) -> _SignIn:
        client = request.client.host if request.client else "?"
        try:
            kind, target = "key", ids.api_key_display_prefix(credential)
        except ValueError:
            kind, target = "admin", "admin"
        return cls(f"client:{client}:{kind}", f"target:{target}")

    def failed(self, db: Database) -> None:
        _client, target = svc.sign_in_failed(db, [self.client_bucket, self.target_bucket])
        if target == svc.SIGN_IN_PER_MINUTE + 1:
            log.warning("console sign-in: many failures for one target this minute")


@router.get("/console/link/{token}", response_class=HTMLResponse)
async def link_page(token: str, request: Request) -> HTMLResponse:
    # Spending the link needs a POST: chat apps and mail scanners that prefetch
    # URLs must not burn a one-time link before its owner clicks it.
    return _login_page(_runtime(request), request, "console/link.html", token=token)


@router.post("/console/link", response_model=None)
async def link_redeem(request: Request) -> Response:
    rt = _runtime(request)
    try:
        form = await _form(request)
        _check_csrf(_read_session(rt, request), form)
        try:
            grant = await run_in_threadpool(svc.redeem_console_link, rt.db, form.get("token", ""))
        except Unauthorized as exc:
            raise _Refused(
                401,
                "Link not valid",
                f"{exc.message.capitalize()}. Ask for a new one with "
                "`walkeep console-link`, or sign in with an API key.",
            ) from None
    except _Refused as exc:
        return _refused(rt, request, exc)
    session = (
        Session(role="admin", csrf=_new_csrf())
        if grant.admin
        else Session(role="account", csrf=_new_csrf(), account_id=grant.account_id)
    )
    response = RedirectResponse("/console", status_code=303)
    _set_session(rt, response, await _opened(rt, session))
    return response


@router.post("/console/logout", response_model=None)
async def logout(request: Request) -> Response:
    rt = _runtime(request)
    try:
        session = _check_csrf(_read_session(rt, request), await _form(request))
    except _Refused as exc:
        return _refused(rt, request, exc)
    if session.sid:
        # Server-side: a copy of the cookie taken before sign-out no longer works.
        await run_in_threadpool(svc.end_session, rt.db, session.sid)
    response = RedirectResponse("/console/login", status_code=303)
    _clear_session(rt, response)
    return response


# --- account pages ------------------------------------------------------------------------


def _page_number(request: Request) -> int:
    try:
        return max(1, int(request.query_params.get("page", "1")))
    except ValueError:
        return 1


HISTORY_SHARE = 0.4  # of the chart's width, left of "now"


def balance_chart(view: svc.AccountView, *, width: int, height: int) -> str:
    """History (solid) and the projection at current usage (dashed) of the available balance.

    History spans hours to months while the projection can span years, so the x
    axis is piecewise: history fills the left 40 %, the projection the rest, and
    "now" is where they meet. So each piece is labelled at both ends — the first
    entry, now, the last projected point, and when renewals stop if there is room —
    and the legend says the scale changes at "now".
    """
    now = view.now.timestamp()
    first = view.history[0].at.timestamp() if view.history else now
    last = view.projection[-1].at.timestamp() if view.projection else now
    split = HISTORY_SHARE if first < now else 0.0

    def x_of(t: float) -> float:
        if t <= now:
            return split * (t - first) / (now - first) if now > first else 0.0
        return split + (1 - split) * (t - now) / (last - now) if last > now else split

    fmt = "%b %d" if last - first > 2 * 86400 else "%b %d %H:%M"
    first_day = datetime.fromtimestamp(first, UTC).date()

    def day(t: float) -> str:
        """A tick's date; only the time for a later tick of the first tick's day (a phone's
        narrow chart has no room to repeat "Nov 30" under "now")."""
        at = datetime.fromtimestamp(t, UTC)
        later_same_day = t > first and at.date() == first_day and "%H" in fmt
        return at.strftime("%H:%M" if later_same_day else fmt)

    hist = [(x_of(p.at.timestamp()), p.mc / ledger.MC_PER_CREDIT) for p in view.history]
    proj = [(x_of(p.at.timestamp()), p.mc / ledger.MC_PER_CREDIT) for p in view.projection]
    # Most important first: a tick that would overlap an earlier one is left out.
    ticks = [(0.0, day(first))] if split else []
    ticks += [(1.0, day(last)), (split, day(now))]
    markers = [(split, "now")]
    if view.funded_until is not None and view.funded_until.timestamp() < last:
        stop = view.funded_until.timestamp()
        markers.append((x_of(stop), "renewals stop"))
        ticks.append((x_of(stop), day(stop)))
    return charts.line_chart(
        [
            charts.Series(hist, "line-history", "balance (credits)", step=True),
            charts.Series(proj, "line-projection", "projected at current usage", dashed=True),
        ],
        title="Balance and projected runway",
        x_ticks=ticks,
        y_format=lambda v: f"{v:g}",
        markers=markers,
        width=width,
        height=height,
    )


async def _account_response(
    rt: Runtime,
    request: Request,
    session: Session,
    account_id: str,
    *,
    error: str | None = None,
    status_code: int = 200,
    new_secret: str | None = None,
    keys: _KeysCard | None = None,
) -> HTMLResponse:
    view = await run_in_threadpool(
        lambda: svc.account_view(rt, account_id, page=_page_number(request))
    )
    key_list = await run_in_threadpool(
        lambda: accounts.list_keys(rt.db, account_id, digests.master_key(rt))
    )
    alert_settings = await run_in_threadpool(alerts.get_alert_settings, rt, account_id)
    deliveries = await run_in_threadpool(alerts.recent_deliveries, rt, account_id, 10)
    auto = await run_in_threadpool(balance.auto_top_up_view, rt, account_id)
    auto_charges = await run_in_threadpool(auto_svc.recent_charges, rt, account_id, 10)
    today = rt.clock.now().date()
    return _render(
        rt,
        "console/account.html",
        status_code,
        session=session,
        csrf=session.csrf,
        v=view,
        s=view.summary,
        chart=balance_chart(view, width=640, height=220),
        chart_narrow=balance_chart(view, width=360, height=240),
        statuses=[(str(st), view.summary.by_status.get(st, 0)) for st in svc.STATUS_ORDER],
        request_id="console-" + secrets.token_urlsafe(12),
        stmt_from=today.replace(day=1).isoformat(),
        stmt_to=today.isoformat(),
        base_path=request.url.path,
        can_top_up=session.role == "account",
        error=error,
        alerts=alert_settings,
        deliveries=deliveries,
        new_secret=new_secret,
        keys=key_list,
        key_card=keys or _KeysCard(),
        auto=auto,
        auto_charges=auto_charges,
        consent_text=topup_rule.CONSENT_TEXT,
    )


@dataclass(frozen=True, slots=True)
class _KeysCard:
    """What the API keys card shows beyond the list: a key just made (its only showing),
    a revocation done, or a refusal, with the form as the operator filled it."""

    created: accounts.CreatedKey | None = None
    notice: str | None = None
    error: str | None = None
    namespace: str = ""
    only_namespace: bool = False


@router.get("/console/account", response_model=None)
async def account_page(request: Request) -> Response:
    rt = _runtime(request)
    try:
        session = await _signed_in(rt, request)
    except _Refused as exc:
        return _refused(rt, request, exc)
    if session.role == "admin":
        return RedirectResponse("/console/admin", status_code=303)
    assert session.account_id is not None
    return await _account_response(rt, request, session, session.account_id)


@router.get("/console/accounts/{account_id}", response_model=None)
async def admin_account_page(account_id: str, request: Request) -> Response:
    rt = _runtime(request)
    try:
        session = await _signed_in(rt, request)
        if session.role != "admin" and session.account_id != account_id:
            raise _Refused(404, "Not found", "No such account.")
        return await _account_response(rt, request, session, account_id)
    except _Refused as exc:
        return _refused(rt, request, exc)
    except WalkeepError as exc:
        return _refused(rt, request, _Refused(exc.http_status, "Not found", exc.message))


@router.post("/console/alerts", response_model=None)
async def console_alerts(request: Request) -> Response:
    """Set the account's alert webhook; the new signing secret is shown once, here."""
    rt = _runtime(request)
    try:
        session = await _signed_in(rt, request)
        form = await _form(request)
        _check_csrf(session, form)
    except _Refused as exc:
        return _refused(rt, request, exc)
    account_id = form.get("account_id") if session.role == "admin" else session.account_id
    if not account_id:
        return _refused(rt, request, _Refused(400, "No account", "Choose an account first."))
    try:
        threshold = int(form.get("threshold_epochs") or 4)
    except ValueError:
        threshold = -1
    try:
        secret = await run_in_threadpool(
            alerts.set_alert_webhook, rt, account_id, form.get("url", "").strip(), threshold
        )
    except WalkeepError as exc:
        return await _account_response(
            rt, request, session, account_id, error=exc.message, status_code=422
        )
    return await _account_response(rt, request, session, account_id, new_secret=secret)


async def _acting_account(rt: Runtime, request: Request) -> tuple[Session, dict[str, str], str]:
    """The session, its checked form and the account it acts on: an operator's own, or
    the one an admin's form names."""
    session = await _signed_in(rt, request)
    form = await _form(request)
    _check_csrf(session, form)
    account_id = form.get("account_id") if session.role == "admin" else session.account_id
    if not account_id:
        raise _Refused(400, "No account", "Choose an account first.")
    return session, form, account_id


async def _keys_page(
    rt: Runtime,
    request: Request,
    session: Session,
    account_id: str,
    card: _KeysCard,
    status_code: int = 200,
) -> Response:
    """The account page with its API keys card in ``card``'s state (an admin's form may
    name an account that does not exist: refused, as its page is)."""
    try:
        return await _account_response(
            rt, request, session, account_id, keys=card, status_code=status_code
        )
    except WalkeepError as exc:
        return _refused(rt, request, _Refused(exc.http_status, "Not found", exc.message))


@router.post("/console/keys", response_model=None)
async def console_key_create(request: Request) -> Response:
    """Create an API key. The key is shown once, in this response: a redirect would need
    it stored somewhere until the next page asked for it."""
    rt = _runtime(request)
    try:
        session, form, account_id = await _acting_account(rt, request)
    except _Refused as exc:
        return _refused(rt, request, exc)
    namespace = form.get("namespace", "")
    only = form.get("only_namespace") == "on"
    try:
        created = await run_in_threadpool(
            lambda: accounts.create_key(
                rt.db,
                account_id,
                default_namespace=namespace or None,
                only_namespace=only,
                master_key=digests.master_key(rt),
            )
        )
    except WalkeepError as exc:
        card = _KeysCard(error=exc.message, namespace=namespace, only_namespace=only)
        return await _keys_page(rt, request, session, account_id, card, 422)
    log.info("console: API key %s created", created.prefix)
    return await _keys_page(rt, request, session, account_id, _KeysCard(created))


@router.post("/console/keys/revoke", response_model=None)
async def console_key_revoke(request: Request) -> Response:
    """Revoke one of the account's keys. When that ends the console session (its own key,
    or any key for a session opened with a sign-in link), the answer is the sign-in page."""
    rt = _runtime(request)
    try:
        session, form, account_id = await _acting_account(rt, request)
    except _Refused as exc:
        return _refused(rt, request, exc)
    try:
        revoked = await run_in_threadpool(
            functools.partial(
                accounts.revoke_key, rt.db, form.get("prefix", ""), account_id=account_id
            )
        )
    except WalkeepError as exc:
        return await _keys_page(rt, request, session, account_id, _KeysCard(error=exc.message), 404)
    if revoked.already:
        notice = f"`{revoked.prefix}` was already revoked."
    else:
        log.info("console: API key %s revoked", revoked.prefix)
        notice = f"Revoked `{revoked.prefix}`: agents using it stop working within seconds."
    try:
        await _signed_in(rt, request)
    except _Refused:
        return _login_page(
            rt,
            request,
            "console/login.html",
            admin=bool(rt.settings.admin_token),
            notice=f"{notice} Your console session ended with it; sign in with another key "
            "of the account, or with a sign-in link.",
        )
    return await _keys_page(rt, request, session, account_id, _KeysCard(notice=notice))


@router.get("/console/verify/{digest}", response_model=None)
async def console_verify(digest: str, request: Request) -> Response:
    """The auditor's check of one renewal, as ``walkeep verify`` runs it."""
    rt = _runtime(request)
    try:
        session = await _signed_in(rt, request)
        if session.role != "admin":
            assert session.account_id is not None
            mine = await run_in_threadpool(
                svc.renewal_touches_account, rt.db, digest, session.account_id
            )
            if not mine:
                raise _Refused(404, "Not found", "No renewal of this account has that digest.")
    except _Refused as exc:
        return _refused(rt, request, exc)
    report = await run_in_threadpool(verify.verify_digest, rt, digest)
    return _render(rt, "console/verify.html", session=session, csrf=session.csrf, report=report)


@router.post("/console/topup", response_model=None)
async def console_top_up(request: Request) -> Response:
    rt = _runtime(request)
    try:
        session = await _signed_in(rt, request, role="account")
        form = await _form(request)
        _check_csrf(session, form)
    except _Refused as exc:
        return _refused(rt, request, exc)
    assert session.account_id is not None
    try:
        result = await run_in_threadpool(
            topup.top_up,
            rt,
            session.account_id,
            form.get("amount_usd", "").strip(),
            form.get("request_id", ""),
        )
    except WalkeepError as exc:
        return await _account_response(
            rt, request, session, session.account_id, error=exc.message, status_code=422
        )
    return RedirectResponse(result.checkout_url, status_code=303)


def _int_field(form: dict[str, str], name: str) -> int | str:
    """A whole number from a form, or the text as typed (the service names what is wrong)."""
    text = form.get(name, "").strip()
    try:
        return int(text)
    except ValueError:
        return text


@router.post("/console/auto-top-up", response_model=None)
async def console_auto_top_up(request: Request) -> Response:
    """Turn automatic top-up on with a rule (needs a saved card and a monthly cap), or off."""
    rt = _runtime(request)
    try:
        session = await _signed_in(rt, request)
        form = await _form(request)
        _check_csrf(session, form)
    except _Refused as exc:
        return _refused(rt, request, exc)
    account_id = form.get("account_id") if session.role == "admin" else session.account_id
    if not account_id:
        return _refused(rt, request, _Refused(400, "No account", "Choose an account first."))
    try:
        if form.get("action") == "off":
            await run_in_threadpool(auto_svc.turn_off, rt, account_id)
        else:
            await run_in_threadpool(
                functools.partial(
                    auto_svc.set_rule,
                    rt,
                    account_id,
                    below_runway_epochs=_int_field(form, "below_runway_epochs"),  # type: ignore[arg-type]
                    to_runway_epochs=_int_field(form, "to_runway_epochs"),  # type: ignore[arg-type]
                    monthly_cap_usd=form.get("monthly_cap_usd", "").strip(),
                )
            )
    except WalkeepError as exc:
        return await _account_response(
            rt, request, session, account_id, error=exc.message, status_code=422
        )
    target = "/console/account" if session.role == "account" else f"/console/accounts/{account_id}"
    return RedirectResponse(f"{target}#auto-top-up", status_code=303)


@router.post("/console/auto-top-up/card", response_model=None)
async def console_auto_top_up_card(request: Request) -> Response:
    """Add or replace the saved card: a checkout in setup mode (nothing is charged)."""
    rt = _runtime(request)
    try:
        session = await _signed_in(rt, request, role="account")
        _check_csrf(session, await _form(request))
    except _Refused as exc:
        return _refused(rt, request, exc)
    assert session.account_id is not None
    try:
        url = await run_in_threadpool(auto_svc.card_link, rt, session.account_id)
    except WalkeepError as exc:
        return await _account_response(
            rt, request, session, session.account_id, error=exc.message, status_code=422
        )
    return RedirectResponse(url, status_code=303)


@router.post("/console/auto-top-up/portal", response_model=None)
async def console_auto_top_up_portal(request: Request) -> Response:
    """Manage the saved card on the provider's Customer Portal (a link minted on click)."""
    rt = _runtime(request)
    try:
        session = await _signed_in(rt, request, role="account")
        _check_csrf(session, await _form(request))
    except _Refused as exc:
        return _refused(rt, request, exc)
    assert session.account_id is not None
    back = f"{rt.settings.public_url.rstrip('/')}/console/account#auto-top-up"
    try:
        url = await run_in_threadpool(auto_svc.portal_link, rt, session.account_id, back)
    except WalkeepError as exc:
        return await _account_response(
            rt, request, session, session.account_id, error=exc.message, status_code=422
        )
    return RedirectResponse(url, status_code=303)


def _statement_response(rt: Runtime, request: Request, account_id: str) -> Response:
    q = request.query_params
    start = statements.parse_day(q.get("from", ""), "from")
    end = statements.parse_day(q.get("to", ""), "to")
    run = statements.open_statement(rt.db, account_id, start, end)
    name = f"walkeep-statement-{run.account_name}-{start}-{end}.csv"
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
    # Streamed: a busy account's year is many thousands of rows.
    return StreamingResponse(
        statements.csv_chunks(rt.db, run),
        media_type="text/csv; charset=utf-8",
        headers={"Content-Disposition": f'attachment; filename="{safe}"'},
    )


@router.get("/console/statement.csv", response_model=None)
async def statement_csv(request: Request) -> Response:
    rt = _runtime(request)
    try:
        session = await _signed_in(rt, request)
        account_id = (
            request.query_params.get("account_id", "")
            if session.role == "admin"
            else session.account_id
        )
        if not account_id:
            raise _Refused(422, "Which account?", "Pick an account for the statement.")
        return await run_in_threadpool(_statement_response, rt, request, account_id)
    except _Refused as exc:
        return _refused(rt, request, exc)
    except WalkeepError as exc:
        return _refused(
            rt, request, _Refused(exc.http_status, "Cannot make statement", exc.message)
        )


# --- admin page -------------------------------------------------------------------------------


def _job_names() -> list[str]:
    try:
        from walkeep.scheduler.jobs import JOBS
    except ImportError:  # pragma: no cover - the worker package ships with walkeep
        return []
    return list(JOBS)


@router.get("/console/admin", response_model=None)
async def admin_page(request: Request) -> Response:
    rt = _runtime(request)
    try:
        session = await _signed_in(rt, request, role="admin")
    except _Refused as exc:
        return _refused(rt, request, exc)
    view = await run_in_threadpool(svc.admin_view, rt, _job_names())
    renewals_chart = charts.bar_chart(
        [(d.day[5:], d.renewals) for d in view.days],
        title="Renewal transactions per day (UTC)",
        css_class="bar",
        integer=True,
        width=420,
        height=200,
        empty_text=f"No renewals in the last {svc.ADMIN_DAYS} days",
    )
    wal_chart = charts.bar_chart(
        [(d.day[5:], d.wal_frost / 1e9) for d in view.days],
        title="WAL spent on renewals per day (UTC)",
        css_class="bar-wal",
        y_format=lambda v: f"{v:.3g}",
        width=420,
        height=200,
        empty_text=f"No WAL spent in the last {svc.ADMIN_DAYS} days",
    )
    return _render(
        rt,
        "console/admin.html",
        session=session,
        csrf=session.csrf,
        v=view,
        renewals_chart=renewals_chart,
        wal_chart=wal_chart,
    )
