"""Payment routes: the Stripe webhook and the local TEST MODE checkout pages.

Mount with ``app.include_router(walkeep.api.payments.router)``; the app must
carry its ``Runtime`` in ``app.state.runtime``.

The webhook reads the *raw* body: Stripe signs the exact bytes it sent, and
any re-serialisation would break the signature. It answers 400 for a bad
signature (or when Stripe isn't configured), 503 when the session can't be
re-retrieved (Stripe retries later), and 200 otherwise — including duplicates
and events we don't act on, so Stripe stops retrying them.

The checkout pages only exist for the local provider and say TEST MODE in
large letters: no money moves, the Pay button just credits the account. A checkout
that saves a card (``top_up`` with ``save_card``, or the console's "add a card")
shows what the human consents to and lets the operator pick how the saved TEST MODE
card behaves later. ``/topup/action/<charge>`` is the link an automatic charge that
needs its card holder offers: it opens a checkout for the same amount (on Stripe or
here) and redirects to it.
Service calls are blocking (database, provider HTTP), so they run in the
thread pool, never on the event loop.
"""

from __future__ import annotations

import html
import logging
from urllib.parse import parse_qs

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from walkeep.api.console import operator_for
from walkeep.errors import NotFound, WalkeepError
from walkeep.payments.base import InvalidSignature, MalformedEvent
from walkeep.payments.local import TEST_CARDS
from walkeep.service.runtime import Runtime
from walkeep.service.tools.topup import (
    CheckoutStatus,
    action_checkout,
    checkout_status,
    handle_stripe_webhook,
    issue_pay_token,
    pay_local,
)
from walkeep.topup_rule import CONSENT_TEXT

log = logging.getLogger(__name__)

router = APIRouter()


def _runtime(request: Request) -> Runtime:
    rt: Runtime = request.app.state.runtime
    return rt


# --- webhook -------------------------------------------------------------------------


@router.post("/webhooks/stripe", include_in_schema=False)
async def stripe_webhook(request: Request) -> JSONResponse:
    rt = _runtime(request)
    body = await request.body()
    signature = request.headers.get("stripe-signature")
    try:
        outcome = await run_in_threadpool(handle_stripe_webhook, rt, body, signature)
    except MalformedEvent as exc:
        # Signed by Stripe, so not a forgery: say what is wrong with it (retrying the
        # same body can never succeed, hence 400), not that the signature failed.
        log.warning("rejected webhook: %s", exc)
        return JSONResponse({"received": False, "error": "invalid_payload"}, status_code=400)
    except InvalidSignature as exc:
        log.warning("rejected webhook: %s", exc)
        return JSONResponse({"received": False, "error": "invalid_signature"}, status_code=400)
    except WalkeepError as exc:
        # Provider unreachable while re-retrieving the session: let Stripe retry.
        log.warning("webhook not processed (%s): %s", exc.code, exc.message)
        status = exc.http_status if exc.http_status >= 500 else 500
        return JSONResponse({"received": False, "error": exc.code}, status_code=status)
    except Exception:
        log.exception("webhook processing failed")
        return JSONResponse({"received": False, "error": "INTERNAL"}, status_code=500)
    return JSONResponse({"received": True, **outcome.model_dump()})


# --- pages ---------------------------------------------------------------------------

_STYLE = """
body{font-family:system-ui,sans-serif;max-width:34rem;margin:3rem auto;padding:0 1rem;color:#222}
.testmode{background:#ffb020;color:#000;font-weight:800;font-size:1.4rem;text-align:center;
  padding:.7rem;border-radius:.4rem;letter-spacing:.08em}
.box{border:1px solid #ddd;border-radius:.5rem;padding:1.2rem;margin-top:1.2rem}
.amount{font-size:2rem;font-weight:700}
button{font-size:1.1rem;padding:.6rem 1.4rem;border-radius:.4rem;border:0;background:#635bff;
  color:#fff;cursor:pointer}
.muted{color:#666;font-size:.9rem}
.ok{color:#0a7d32;font-weight:700}
.err{color:#b00020;font-weight:700}
.consent{border-left:3px solid #635bff;padding-left:.8rem;font-size:.95rem}
select{font-size:1rem;padding:.3rem;max-width:100%}
"""

_TEST_MODE_BANNER = (
    '<div class="testmode">TEST MODE</div>'
    '<p class="muted">This is Walkeep\'s built-in test checkout. No money moves: '
    "paying adds credits to the account for free. Configure Stripe for real payments.</p>"
)


def _page(
    title: str, body: str, *, test_mode: bool = False, status_code: int = 200
) -> HTMLResponse:
    banner = _TEST_MODE_BANNER if test_mode else ""
    page = (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head>"
        f"<body>{banner}<h1>{html.escape(title)}</h1>{body}</body></html>"
    )
    return HTMLResponse(page, status_code=status_code)


def _error_page(exc: WalkeepError, *, test_mode: bool = True) -> HTMLResponse:
    title = "Checkout not found" if isinstance(exc, NotFound) else "Cannot complete this checkout"
    return _page(
        title,
        f'<p class="err">{html.escape(exc.message)}</p>',
        test_mode=test_mode,
        status_code=exc.http_status,
    )


def _summary(st: CheckoutStatus) -> str:
    what = (
        f"<p>For automatic top-up of account <b>{html.escape(st.account_name)}</b> "
        if st.mode == "setup"
        else f'<div class="amount">${html.escape(st.amount_usd)} '
        f"{html.escape(st.currency.upper())}</div>"
        f"<p>Walkeep credits for account <b>{html.escape(st.account_name)}</b> "
    )
    return (
        what + f'<span class="muted">({html.escape(st.account_id)})</span></p>'
        f'<p class="muted">Checkout {html.escape(st.checkout_id)}</p>'
    )


_CARD_LABELS = {
    "succeeds": "succeeds (like 4242 4242 4242 4242)",
    "declines": "declines, retryable (like 4000 0000 0000 0002)",
    "authentication_required": "needs authentication off-session (like 4000 0027 6000 3184)",
}


def _save_card_fields() -> str:
    """The consent (what saving the card allows) and, in TEST MODE, the card's behaviour."""
    options = "".join(
        f'<option value="{b}"{" selected" if b == "succeeds" else ""}>'
        f"{html.escape(_CARD_LABELS.get(b, b))}</option>"
        for b in TEST_CARDS
    )
    return (
        f'<p class="consent" data-testid="consent">{html.escape(CONSENT_TEXT)}</p>'
        '<p><label for="test_card">The saved TEST MODE card, when charged later, '
        f'</label><select id="test_card" name="test_card">{options}</select></p>'
    )


async def _local_status(rt: Runtime, checkout_id: str) -> CheckoutStatus:
    st = await run_in_threadpool(checkout_status, rt, checkout_id)
    if st.provider != "local" or rt.payments.provider != "local":
        # Stripe checkouts are paid on Stripe's page, never here.
        raise NotFound("no such TEST MODE checkout", {"checkout_id": checkout_id})
    return st


_SIGN_IN_TO_PAY = (
    '<div class="box"><p class="err">Only the account\'s operator can pay a TEST MODE '
    'checkout.</p><p>Sign in to the <a href="/console/login">console</a> with the '
    "account's API key (or as an admin), then open this link again. Agents can ask for "
    "a checkout link, but cannot pay it.</p></div>"
)


# A paid page is a dead end without it (the operator came from the console).
_BACK_TO_CONSOLE = '<p><a href="/console">← Back to the console</a></p>'


@router.get("/checkout/{checkout_id}", response_class=HTMLResponse, include_in_schema=False)
async def checkout_page(checkout_id: str, request: Request) -> HTMLResponse:
    rt = _runtime(request)
    try:
        st = await _local_status(rt, checkout_id)
    except WalkeepError as exc:
        return _error_page(exc)
    cid = html.escape(checkout_id, quote=True)
    if st.status == "complete":
        body = (
            _summary(st)
            + '<div class="box"><p class="ok">The credits were added.</p></div>'
            + _BACK_TO_CONSOLE
        )
        return _page("Already paid", body, test_mode=True)
    elif st.status in ("expired", "failed") or rt.clock.now() >= st.expires_at:
        body = _summary(st) + (
            '<div class="box"><p class="err">This checkout link has expired.</p>'
            "<p>Call <code>top_up</code> again with the same request_id for a fresh link.</p></div>"
        )
    elif not await operator_for(rt, request, st.account_id):
        # The link alone (which the agent that asked for it holds) never pays: the
        # account's operator signs in to the console first.
        body = _summary(st) + _SIGN_IN_TO_PAY
    else:
        # Signed in, and a one-time token: only this rendered page can pay.
        try:
            token = await run_in_threadpool(issue_pay_token, rt, checkout_id)
        except WalkeepError as exc:
            return _error_page(exc)
        if st.mode == "setup":
            button = "Save test card (TEST MODE)"
        else:
            button = f"Pay ${html.escape(st.amount_usd)} (TEST MODE)"
        body = _summary(st) + (
            f'<form class="box" method="post" action="/checkout/{cid}/pay">'
            f'<input type="hidden" name="pay_token" value="{html.escape(token, quote=True)}">'
            + (_save_card_fields() if st.save_card else "")
            + f"<button type=submit>{button}</button>"
            '<p class="muted">Simulated payment: no card, no charge.</p></form>'
        )
    return _page(_title(st), body, test_mode=True)


def _title(st: CheckoutStatus) -> str:
    return "Save a card" if st.mode == "setup" else "Add Walkeep credits"


@router.post("/checkout/{checkout_id}/pay", response_class=HTMLResponse, include_in_schema=False)
async def checkout_pay(checkout_id: str, request: Request) -> HTMLResponse:
    rt = _runtime(request)
    # A small urlencoded form (the body cap keeps it small); no multipart parser needed.
    try:
        form = parse_qs((await request.body()).decode("utf-8", "replace"), max_num_fields=10)
    except ValueError:
        form = {}
    token = next(iter(form.get("pay_token") or []), None)
    test_card = next(iter(form.get("test_card") or []), None)
    try:
        st = await _local_status(rt, checkout_id)
        if not await operator_for(rt, request, st.account_id):
            return _page(
                "Sign in to pay",
                _summary(st) + _SIGN_IN_TO_PAY,
                test_mode=True,
                status_code=403,
            )
        credited = await run_in_threadpool(pay_local, rt, checkout_id, token, test_card)
        st = await run_in_threadpool(checkout_status, rt, checkout_id)
    except WalkeepError as exc:
        return _error_page(exc)
    if st.mode == "setup":
        message = '<p class="ok">The test card was saved.</p>'
    elif credited:
        message = f'<p class="ok">Paid. ${html.escape(st.amount_usd)} of credits were added.</p>'
    else:
        message = '<p class="ok">Already paid — nothing was charged or credited twice.</p>'
    if st.card_saved:
        message += (
            '<p data-testid="card-saved">The card is saved for automatic top-up, which only '
            "the account's operator can turn on (with a monthly cap) in the console.</p>"
        )
    body = (
        _summary(st)
        + f'<div class="box">{message}'
        + "<p>Paused memories resume automatically.</p></div>"
        + _BACK_TO_CONSOLE
    )
    title = (
        "Card saved" if st.mode == "setup" else ("Credits added" if credited else "Already paid")
    )
    return _page(title, body, test_mode=True)


@router.get("/topup/action/{charge_id}", include_in_schema=False, response_model=None)
async def topup_action(charge_id: str, request: Request) -> Response:
    """An automatic charge that needs its card holder: a checkout for the same amount
    that saves the card again, opened now (Checkout links expire; this one does not)."""
    rt = _runtime(request)
    try:
        url = await run_in_threadpool(action_checkout, rt, charge_id)
    except WalkeepError as exc:
        return _error_page(exc, test_mode=rt.payments.provider == "local")
    return RedirectResponse(
        url,
        status_code=303,
        headers={"Cache-Control": "no-store", "Referrer-Policy": "no-referrer"},
    )


@router.get("/topup/done", response_class=HTMLResponse, include_in_schema=False)
async def topup_done() -> HTMLResponse:
    return _page(
        "Thank you",
        "<p>Your payment was received. The credits appear on the account as soon as the "
        "payment provider confirms it — usually within seconds; some bank payments take "
        "a few days.</p><p>You can close this page.</p>",
    )


@router.get("/topup/cancel", response_class=HTMLResponse, include_in_schema=False)
async def topup_cancel() -> HTMLResponse:
    return _page(
        "Top-up cancelled",
        "<p>Nothing was charged. To try again, open the same checkout link while it is "
        "valid, or ask your agent to call <code>top_up</code> again.</p>",
    )
