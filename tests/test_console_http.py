"""The console over real HTTP (uvicorn + httpx): cookies, CSRF, access rules, errors."""

from __future__ import annotations

import re
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.test_mcp_e2e import Server
from walkeep.api.console import COOKIE, SECRET_FILENAME, load_console_secret
from walkeep.config import Settings
from walkeep.service.operators import accounts

ADMIN = "http-admin-token-0123456789"


@pytest.fixture
def live(settings, clock, db) -> Iterator[Server]:  # type: ignore[no-untyped-def]
    settings.admin_token = ADMIN
    with Server(settings, clock, db) as srv:
        yield srv


def _csrf(html: str) -> str:
    m = re.search(r'name="csrf" value="([^"]+)"', html)
    assert m, "form without a CSRF field"
    return m.group(1)


def _login(c: httpx.Client, credential: str) -> httpx.Response:
    page = c.get("/console/login")
    return c.post("/console/login", data={"credential": credential, "csrf": _csrf(page.text)})


def test_landing_page_and_static_assets_are_served_by_walkeep(live: Server) -> None:
    with httpx.Client(base_url=live.url) as c:
        home = c.get("/")
        assert home.status_code == 200 and 'href="/console"' in home.text
        assert f"{live.url}/mcp" in home.text
        css = c.get("/console/static/console.css")
        assert css.status_code == 200 and css.headers["content-type"].startswith("text/css")
        assert c.get("/console/static/../app.py").status_code == 404
        assert c.get("/console/static/evil.js").status_code == 404
        # Nothing on the console's pages comes from another origin.
        assert not re.search(r'(src|href)="(https?:)?//', home.text)
        assert "frame-ancestors 'none'" in home.headers["content-security-policy"]


def test_session_cookie_flags_and_the_csrf_guard(live: Server) -> None:
    created = accounts.create_account(live.rt.db, "acme", credits_mc=100_000)
    with httpx.Client(base_url=live.url) as c:
        assert c.get("/console/account").headers["location"] == "/console/login"
        page = c.get("/console/login")
        cookie = page.headers["set-cookie"]
        assert f"{COOKIE}=" in cookie and "HttpOnly" in cookie and "SameSite=lax" in cookie
        # Path=/: the TEST MODE checkout pages need the operator's session too.
        assert "Path=/;" in cookie or cookie.rstrip().endswith("Path=/")
        assert "Secure" not in cookie  # http public URL
        no_csrf = c.post("/console/login", data={"credential": created.api_key})
        assert no_csrf.status_code == 403 and "security token" in no_csrf.text
        wrong = c.post("/console/login", data={"credential": created.api_key, "csrf": "x" * 32})
        assert wrong.status_code == 403
        ok = _login(c, created.api_key)
        assert ok.status_code == 303 and ok.headers["location"] == "/console"
        account = c.get("/console/account")
        assert account.status_code == 200 and "acme" in account.text
        csrf = _csrf(account.text)
        # A signed-in session still needs the token on every POST.
        assert (
            c.post("/console/topup", data={"amount_usd": "5", "request_id": "r"}).status_code == 403
        )
        topup = c.post("/console/topup", data={"amount_usd": "5", "request_id": "r", "csrf": csrf})
        assert topup.status_code == 303 and "/checkout/" in topup.headers["location"]
        # The same form submitted twice reuses the checkout (top_up is idempotent per request_id).
        again = c.post("/console/topup", data={"amount_usd": "5", "request_id": "r", "csrf": csrf})
        assert again.headers["location"] == topup.headers["location"]
        bad = c.post("/console/topup", data={"amount_usd": "0.10", "request_id": "s", "csrf": csrf})
        assert bad.status_code == 422 and 'role="alert"' in bad.text and "Traceback" not in bad.text
        # A tampered cookie is no session at all.
        c.cookies.set(COOKIE, c.cookies[COOKIE][:-2] + "xx", path="/")
        assert c.get("/console/account").headers["location"] == "/console/login"


def test_forms_are_size_bounded(live: Server) -> None:
    with httpx.Client(base_url=live.url) as c:
        c.get("/console/login")
        big = c.post(
            "/console/login",
            content=b"credential=" + b"a" * 40_000,
            headers={"content-type": "application/x-www-form-urlencoded"},
        )
        assert big.status_code == 413


def test_access_rules_between_operators_and_admins(live: Server) -> None:
    a = accounts.create_account(live.rt.db, "a", credits_mc=1000)
    b = accounts.create_account(live.rt.db, "b", credits_mc=1000)
    with httpx.Client(base_url=live.url) as op, httpx.Client(base_url=live.url) as admin:
        _login(op, a.api_key)
        assert op.get(f"/console/accounts/{a.account_id}").status_code == 200
        assert op.get(f"/console/accounts/{b.account_id}").status_code == 404  # no leak
        assert op.get("/console/admin").status_code == 403
        # An operator's statement is always their own, whatever account_id they pass.
        st = op.get(
            "/console/statement.csv",
            params={"from": "2026-11-01", "to": "2026-12-31", "account_id": b.account_id},
        )
        assert st.status_code == 200 and a.account_id in st.text and b.account_id not in st.text
        assert "attachment" in st.headers["content-disposition"]
        bad = op.get("/console/statement.csv", params={"from": "2026-11-31", "to": "2026-12-01"})
        assert bad.status_code == 422 and "YYYY-MM-DD" in bad.text

        assert _login(admin, ADMIN).headers["location"] == "/console"
        assert admin.get("/console", follow_redirects=False).headers["location"] == "/console/admin"
        page = admin.get("/console/admin")
        assert page.status_code == 200 and ">a</a>" in page.text and ">b</a>" in page.text
        assert admin.get(f"/console/accounts/{b.account_id}").status_code == 200
        assert admin.get("/console/accounts/acct_nope").status_code == 404
        st = admin.get(
            "/console/statement.csv",
            params={"from": "2026-11-01", "to": "2026-12-31", "account_id": b.account_id},
        )
        assert st.status_code == 200 and b.account_id in st.text
        # Admins look at accounts; only an account's operator can start a top-up.
        csrf = _csrf(page.text)
        assert (
            admin.post(
                "/console/topup", data={"amount_usd": "5", "request_id": "x", "csrf": csrf}
            ).status_code
            == 403
        )
        out = admin.post("/console/logout", data={"csrf": csrf})
        assert out.status_code == 303 and f'{COOKIE}=""' in out.headers["set-cookie"]
        assert admin.get("/console/admin").headers["location"] == "/console/login"
        # Rotating the admin token ends sessions opened with the old one.
        _login(admin, ADMIN)
        assert admin.get("/console/admin").status_code == 200
        live.rt.settings.admin_token = ADMIN + "-rotated"
        assert admin.get("/console/admin").headers["location"] == "/console/login"


def test_secure_cookie_on_https_and_a_private_secret_file(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "d", public_url="https://walkeep.example")
    secret = load_console_secret(settings)
    path = tmp_path / "d" / SECRET_FILENAME
    assert len(secret) >= 48 and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_console_secret(settings) == secret  # stable across processes
    assert load_console_secret(Settings(data_dir=tmp_path, console_secret="s" * 40)) == "s" * 40

    from fastapi import Response

    from walkeep.api import console as console_api

    class _Rt:
        extras: dict[str, object] = {}

    rt = _Rt()
    rt.settings = settings  # type: ignore[attr-defined]
    response = Response()
    console_api._set_session(rt, response, console_api.Session(role="anon", csrf="c"))  # type: ignore[arg-type]
    assert "Secure" in response.headers["set-cookie"]


def test_a_weak_admin_token_is_refused_at_startup(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="at least 16"):
        Settings(data_dir=tmp_path, admin_token="short")


def test_a_long_statement_streams_in_chunks_and_still_reconciles(
    live: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    from walkeep.service.operators import statements

    monkeypatch.setattr(statements, "STREAM_ROWS", 4)  # many chunks, many cursor fetches
    a = accounts.create_account(live.rt.db, "busy", credits_mc=1000)
    for i in range(25):
        accounts.grant(live.rt.db, a.account_id, 1000 + i, reason=f"grant {i}")
    day = live.rt.clock.now().date().isoformat()
    with httpx.Client(base_url=live.url) as c:
        _login(c, a.api_key)
        with c.stream("GET", "/console/statement.csv", params={"from": day, "to": day}) as r:
            assert r.status_code == 200
            text = "".join(r.iter_text())
    lines = text.splitlines()
    assert len(lines) == 1 + 1 + 26 + 1  # header, opening, entries, closing
    closing = lines[-1].split(",")
    expected = 1000 + sum(1000 + i for i in range(25))
    assert closing[1] == "closing" and closing[3] == "reconciled"
    assert closing[7] == statements.credits_str(expected)


def test_alert_settings_deliveries_and_the_verify_page(live: Server) -> None:
    """Issue 12: the account page sets the alert webhook (secret shown once) and shows the
    last deliveries; each renewal links to the same check as `walkeep verify`."""
    from tests.helpers import land_all
    from walkeep.service import alerts
    from walkeep.service.jobs import renew
    from walkeep.service.tools import store

    rt = live.rt
    mine = accounts.create_account(rt.db, "alerts-op", credits_mc=100_000)
    other = accounts.create_account(rt.db, "someone-else", credits_mc=100_000)
    store.store(rt, mine.account_id, content="kept for the audit", request_id="r1")
    # The live server's own completer may be landing it: wait for it, then settle the rest.
    assert rt.completer is not None and rt.completer.wait_idle(30)
    land_all(rt)
    s = rt.settings
    rt.clock.advance(rt.chain.epoch_info().duration_seconds * (s.initial_epochs - 1))  # type: ignore[attr-defined]
    report = renew.renew(rt)
    assert report.digests, report
    digest = report.digests[0]

    with httpx.Client(base_url=live.url) as c:
        assert _login(c, mine.api_key).status_code == 303
        page = c.get("/console/account")
        assert 'id="alerts"' in page.text and "No webhook yet" in page.text
        bad = c.post(
            "/console/alerts",
            data={"csrf": _csrf(page.text), "url": "ftp://nope", "threshold_epochs": "3"},
        )
        assert bad.status_code == 422 and alerts.get_alert_settings(rt, mine.account_id) is None
        hook = "http://127.0.0.1:9/walkeep-hook"  # nothing listens: deliveries fail
        done = c.post(
            "/console/alerts",
            data={"csrf": _csrf(page.text), "url": hook, "threshold_epochs": "3"},
        )
        assert done.status_code == 200 and "Signing secret (shown once)" in done.text
        secret = re.search(r'data-testid="alert-secret">.*?<code>([^<]+)</code>', done.text, re.S)
        assert secret is not None
        got = alerts.get_alert_settings(rt, mine.account_id)
        assert got is not None and got.url == hook and got.threshold_epochs == 3
        assert secret.group(1) not in c.get("/console/account").text  # shown once

        alerts.send_test_event(rt, mine.account_id)
        alerts.deliver_alerts(rt)
        shown = c.get("/console/account").text
        assert "alert.test" in shown and "(pending)" in shown  # failed attempt, will retry

        assert f'href="/console/verify/{digest}"' in shown
        audit = c.get(f"/console/verify/{digest}")
        assert audit.status_code == 200 and "OK: every fact holds" in audit.text
        assert "PASS" in audit.text and "FAIL" not in audit.text

    with httpx.Client(base_url=live.url) as c:
        assert _login(c, other.api_key).status_code == 303
        assert c.get(f"/console/verify/{digest}").status_code == 404  # not this account's


def test_the_alerts_card_shows_coarse_outcomes_and_past_deliveries_after_removal(
    live: Server,
) -> None:
    """Issue 39: docs/security.md promises tenants coarse delivery outcomes, but the card
    showed a receiver's exact status (200, 503, 418); and once the webhook was removed it
    said "No webhook yet" above the deliveries it had made."""
    from tests.test_egress import _answer, _read_body, serve
    from walkeep.service import alerts

    rt = live.rt
    mine = accounts.create_account(rt.db, "coarse", credits_mc=100_000)
    codes = [200, 503, 418]

    def answer(h: Any) -> None:
        _read_body(h)
        _answer(h, codes[0])

    with serve(answer) as base, httpx.Client(base_url=live.url) as c:
        alerts.set_alert_webhook(rt, mine.account_id, base + "/hook")
        for code in (200, 503, 418):
            codes[0] = code
            alerts.send_test_event(rt, mine.account_id)
            alerts.deliver_alerts(rt)
            rt.clock.advance(3600)  # type: ignore[attr-defined]
        assert _login(c, mine.api_key).status_code == 303
        page = c.get("/console/account").text
        results = re.findall(r'data-label="Result"><span class="\w+">([^<]*)</span>', page)
        assert sorted(results) == ["HTTP 4xx", "HTTP 5xx", "delivered"], results
        assert not {"200", "503", "418"} & set(results)

        alerts.remove_alert_webhook(rt, mine.account_id)
        page = c.get("/console/account").text
        card = page[page.index('id="alerts"') :]
        assert "No webhook yet" not in card
        assert "No webhook is set now" in card
        assert card.index("No webhook is set now") < card.index('data-label="Result"')
        assert len(re.findall(r'data-label="Result"', card)) == 3


def test_one_epoch_is_singular_wherever_the_console_counts_epochs(live: Server) -> None:
    """Issue 39: "1 epochs" on the account page (runway words, least runway, a memory's
    runway, the alert threshold) and on the admin page."""
    from tests.helpers import land_all
    from walkeep.service import alerts
    from walkeep.service.renewal_price import renewal_burn_mc_per_epoch
    from walkeep.service.tools import store

    rt = live.rt
    content = "one epoch left for this memory"
    # What one store costs and what renewing it costs an epoch, measured on a rich account,
    # so that the tight one holds exactly one epoch of renewals after the same store.
    rich = accounts.create_account(rt.db, "rich", credits_mc=10_000_000)
    store.store(rt, rich.account_id, content=content, request_id="r")
    assert rt.completer is not None and rt.completer.wait_idle(30)
    land_all(rt)
    cost = 10_000_000 - accounts.get_account(rt.db, rich.account_id).available_mc
    burn, _ = renewal_burn_mc_per_epoch(rt, rich.account_id)
    tight = accounts.create_account(rt.db, "tight", credits_mc=cost + burn)
    store.store(rt, tight.account_id, content=content, request_id="r")
    assert rt.completer.wait_idle(30)
    land_all(rt)
    assert accounts.get_account(rt.db, tight.account_id).available_mc == burn
    alerts.set_alert_webhook(rt, tight.account_id, "https://ops.example/hooks", 1)
    epoch = rt.chain.epoch_info().duration_seconds
    rt.clock.advance(epoch * (rt.settings.initial_epochs - 1))  # type: ignore[attr-defined]

    with httpx.Client(base_url=live.url) as c:
        assert _login(c, tight.api_key).status_code == 303
        page = c.get("/console/account").text
    text = re.sub(r"<[^>]+>", " ", page)
    text = re.sub(r"\s+", " ", text)
    assert not re.search(r"\b1 epochs\b", text), re.findall(r".{40}\b1 epochs\b.{20}", text)
    assert "1 epoch of renewals funded on top of 1 already paid" in text
    assert "Least runway: 1 epoch " in text
    assert re.search(r'data-label="Runway">1 epoch</td>', page)
    assert "below 1 epoch of funded runway" in text

    with httpx.Client(base_url=live.url) as c:
        assert _login(c, ADMIN).status_code == 303
        admin = c.get("/console/admin").text
    assert re.search(r'data-label="Least runway">1 epoch</td>', admin)
    assert not re.search(r">1 epochs<", admin)


# --- issue 29: sessions end on the server, sign-in is throttled ------------------------------


def test_sign_out_ends_the_session_on_the_server(live: Server) -> None:
    """Regression: the session was only a signed cookie, so a copy taken before sign-out
    kept working for its whole 12 hours."""
    created = accounts.create_account(live.rt.db, "copied", credits_mc=0)
    for credential in (created.api_key, ADMIN):
        with httpx.Client(base_url=live.url) as c:
            assert _login(c, credential).status_code == 303
            page = c.get("/console", follow_redirects=True)
            assert page.status_code == 200
            copied = c.cookies[COOKIE]
            out = c.post("/console/logout", data={"csrf": _csrf(page.text)})
            assert out.status_code == 303
        with httpx.Client(base_url=live.url, cookies={COOKIE: copied}) as thief:
            for path in ("/console/account", "/console/admin"):
                r = thief.get(path)
                assert r.status_code == 303 and r.headers["location"] == "/console/login", path


def test_revoking_a_key_ends_link_sessions_of_the_account(live: Server) -> None:
    from walkeep.service.operators import console as svc

    created = accounts.create_account(live.rt.db, "linked", credits_mc=0)
    token, _ = svc.create_console_link(live.rt.db, created.account_id, minutes=15)
    with httpx.Client(base_url=live.url) as c:
        page = c.get(f"/console/link/{token}")
        done = c.post("/console/link", data={"token": token, "csrf": _csrf(page.text)})
        assert done.status_code == 303
        assert c.get("/console/account").status_code == 200
        accounts.revoke_key(live.rt.db, created.key_prefix)
        assert c.get("/console/account").headers["location"] == "/console/login"


def test_sign_in_attempts_are_throttled_per_client_and_per_target(live: Server) -> None:
    """Regression: 300 wrong admin-token guesses took 0.7 s."""
    with httpx.Client(base_url=live.url) as c:
        codes = [_login(c, "not-the-admin-token").status_code for _ in range(12)]
        assert codes[:10] == [401] * 10 and codes[10:] == [429, 429], codes
        throttled = _login(c, ADMIN)  # even the right token waits its turn
        assert throttled.status_code == 429 and int(throttled.headers["retry-after"]) >= 1
        live.rt.clock.advance(60)  # type: ignore[attr-defined]
        assert _login(c, ADMIN).status_code == 303
