"""The console's API keys card over real HTTP (uvicorn + httpx): an operator (or an admin,
on an account's page) lists the account's keys, creates one — shown once, in the form's
own answer — optionally confined to its namespace, and revokes one. Every form needs its
CSRF token; a refusal is said inline; revoking the session's own key ends the session.
Runs on SQLite and PostgreSQL."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.test_console_http import _csrf, _login
from tests.test_mcp_e2e import Server
from walkeep.service import digests
from walkeep.service.operators import accounts

ADMIN = "keys-admin-token-0123456789"
NS = "support"
OTHER = "hr-private"


@pytest.fixture
def live(settings, clock, db) -> Iterator[Server]:  # type: ignore[no-untyped-def]
    settings.admin_token = ADMIN
    with Server(settings, clock, db) as srv:
        yield srv


def _new_key(page: httpx.Response) -> str:
    m = re.search(r'data-testid="new-key-value">([^<]+)</code>', page.text)
    assert m, "no new key on the page"
    return m.group(1)


def _keys_card(html: str) -> str:
    start = html.index('id="keys"')
    return html[start : html.index("</section>", start)]


def _create(
    c: httpx.Client, csrf: str, namespace: str = "", *, only: bool = False, **extra: str
) -> httpx.Response:
    data = {"csrf": csrf, "namespace": namespace, **extra}
    if only:
        data["only_namespace"] = "on"
    return c.post("/console/keys", data=data)


def _rest(live: Server, key: str) -> httpx.Client:
    return httpx.Client(base_url=live.url, headers={"Authorization": f"Bearer {key}"}, timeout=30)


def _active(live: Server, account_id: str) -> dict[str, bool]:
    """Each key's prefix: whether it is active."""
    keys = accounts.list_keys(live.rt.db, account_id, digests.master_key(live.rt))
    return {k.prefix: k.revoked_at is None for k in keys}


def _stops_authenticating(live: Server, key: str) -> bool:
    """Web processes cache a looked-up key for up to 5 s (walkeep/api/auth.py)."""
    with _rest(live, key) as http:
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            answer = http.get("/v1/check_balance")
            if answer.status_code == 401:
                return True
            assert answer.status_code == 200, answer.text
            time.sleep(0.25)
    return False


def test_an_operator_creates_keys_that_are_shown_once_and_work_over_rest(live: Server) -> None:
    made = accounts.create_account(live.rt.db, "keys-op", credits_mc=100_000)
    with httpx.Client(base_url=live.url, timeout=30) as c:
        assert _login(c, made.api_key).status_code == 303
        page = c.get("/console/account")
        card = _keys_card(page.text)
        assert made.key_prefix in card and "(signed in with this key)" in card
        assert "Create key" in card and "Confine to this namespace" in card

        plain = _create(c, _csrf(page.text))
        assert plain.status_code == 200
        assert "will not be shown again" in plain.text
        plain_key = _new_key(plain)
        assert plain_key.startswith("wk_") and plain_key != made.api_key

        confined = _create(c, _csrf(page.text), NS, only=True)
        assert confined.status_code == 200
        assert re.search(r"confined to namespace\s*<code>support</code>", confined.text)
        confined_key = _new_key(confined)
        assert plain_key not in confined.text  # each key is shown once, on its own answer

        later = c.get("/console/account").text
        assert plain_key not in later and confined_key not in later
        card = _keys_card(later)
        prefix = confined_key[: len(made.key_prefix)]
        row = card[card.index(f'data-prefix="{prefix}"') :]
        row = row[: row.index("</tr>")]
        assert "<code>support</code>" in row and "only this namespace" in row
        assert "never" in row and "active" in row

    with _rest(live, plain_key) as http:
        assert http.get("/v1/check_balance").status_code == 200
        assert http.post("/v1/recall", json={"query": "x", "namespace": OTHER}).status_code == 200
    with _rest(live, confined_key) as http:
        assert http.post("/v1/recall", json={"query": "x"}).status_code == 200
        refused = http.post("/v1/recall", json={"query": "x", "namespace": OTHER})
        assert refused.status_code == 403
        assert refused.json()["code"] == "FORBIDDEN"
        assert refused.json()["data"]["namespace"] == NS
    keys = accounts.list_keys(live.rt.db, made.account_id, digests.master_key(live.rt))
    # One manual clock: all three were made in the same instant, listed by prefix.
    assert sorted(((k.default_namespace or ""), k.only_namespace) for k in keys) == [
        ("", False),
        ("", False),
        (NS, True),
    ]


def test_the_key_forms_need_their_csrf_token(live: Server) -> None:
    made = accounts.create_account(live.rt.db, "keys-csrf", credits_mc=0)
    other = accounts.create_key(live.rt.db, made.account_id)
    with httpx.Client(base_url=live.url, timeout=30) as c:
        assert _login(c, made.api_key).status_code == 303
        assert c.get("/console/account").status_code == 200
        for data in ({"namespace": NS}, {"namespace": NS, "csrf": "x" * 32}):
            refused = c.post("/console/keys", data=data)
            assert refused.status_code == 403 and "security token" in refused.text
            assert "wk_live_" not in refused.text
        refused = c.post("/console/keys/revoke", data={"prefix": other.prefix})
        assert refused.status_code == 403
        assert c.get("/console/account").status_code == 200  # still signed in
    assert _active(live, made.account_id) == {made.key_prefix: True, other.prefix: True}


def test_refusals_are_said_inline_and_create_nothing(live: Server) -> None:
    made = accounts.create_account(live.rt.db, "keys-refused", credits_mc=0)
    with httpx.Client(base_url=live.url, timeout=30) as c:
        assert _login(c, made.api_key).status_code == 303
        csrf = _csrf(c.get("/console/account").text)
        cases = [
            ("", True, "needs that namespace"),
            ("a\x07b", False, "must not contain"),
            ("n" * 300, True, "1–255 UTF-8 bytes"),
            ("   ", False, "must not be blank"),
        ]
        for namespace, only, said in cases:
            answer = _create(c, csrf, namespace, only=only)
            assert answer.status_code == 422, namespace
            assert "Traceback" not in answer.text and 'data-testid="new-key"' not in answer.text
            card = _keys_card(answer.text)
            error = re.search(r'data-testid="key-error">(.*?)</p>', card, re.S)
            assert error is not None and said in error.group(1), (namespace, card)
            # The form comes back as it was filled, to be corrected.
            assert ("checked" in card) == only
        # Another account's key is no key of this one: not found, and not revoked.
        stranger = accounts.create_account(live.rt.db, "keys-stranger", credits_mc=0)
        theirs = c.post("/console/keys/revoke", data={"csrf": csrf, "prefix": stranger.key_prefix})
        assert theirs.status_code == 404 and "no API key with prefix" in theirs.text
    assert list(_active(live, made.account_id)) == [made.key_prefix]
    assert _active(live, stranger.account_id) == {stranger.key_prefix: True}


def test_revoking_stops_the_key_and_revoking_the_session_s_own_key_signs_out(
    live: Server,
) -> None:
    made = accounts.create_account(live.rt.db, "keys-revoke", credits_mc=100_000)
    with httpx.Client(base_url=live.url, timeout=30) as c:
        assert _login(c, made.api_key).status_code == 303
        page = c.get("/console/account")
        spare = _new_key(_create(c, _csrf(page.text), NS))
        spare_prefix = spare[: len(made.key_prefix)]
        with _rest(live, spare) as http:
            assert http.get("/v1/check_balance").status_code == 200

        done = c.post(
            "/console/keys/revoke", data={"csrf": _csrf(page.text), "prefix": spare_prefix}
        )
        assert done.status_code == 200
        revoked = f'Revoked <code class="cmd">{spare_prefix}</code>: agents using it stop working'
        assert revoked in done.text
        row = _keys_card(done.text)
        row = row[row.index(f'data-prefix="{spare_prefix}"') :]
        assert "revoked" in row[: row.index("</tr>")]
        assert _stops_authenticating(live, spare)
        again = c.post(
            "/console/keys/revoke", data={"csrf": _csrf(page.text), "prefix": spare_prefix}
        )
        assert again.status_code == 200 and "was already revoked" in again.text

        own = c.post(
            "/console/keys/revoke", data={"csrf": _csrf(page.text), "prefix": made.key_prefix}
        )
        # The session ended with its key: the answer is the sign-in page, saying so.
        assert own.status_code == 200 and 'action="/console/login"' in own.text
        assert "Your console session ended with it" in own.text
        assert c.get("/console/account").headers["location"] == "/console/login"
    assert _active(live, made.account_id) == {made.key_prefix: False, spare_prefix: False}


def test_a_link_session_ends_with_any_revoked_key_and_says_so_first(live: Server) -> None:
    """Revoking any key of the account ends its sign-in-link sessions (no key vouches for
    them any more): the form warns before, the sign-in page says so after."""
    from walkeep.service.operators import console as svc

    made = accounts.create_account(live.rt.db, "keys-link", credits_mc=0)
    token, _ = svc.create_console_link(live.rt.db, made.account_id, minutes=15)
    with httpx.Client(base_url=live.url, timeout=30) as c:
        link = c.get(f"/console/link/{token}")
        assert c.post("/console/link", data={"token": token, "csrf": _csrf(link.text)}).is_redirect
        page = c.get("/console/account")
        assert "opened with a sign-in link) ends" in _keys_card(page.text)
        out = c.post(
            "/console/keys/revoke", data={"csrf": _csrf(page.text), "prefix": made.key_prefix}
        )
        assert out.status_code == 200 and "Your console session ended with it" in out.text
        assert c.get("/console/account").headers["location"] == "/console/login"


def test_an_admin_manages_the_keys_of_an_account_from_its_page(live: Server) -> None:
    made = accounts.create_account(live.rt.db, "keys-admin", credits_mc=0)
    with httpx.Client(base_url=live.url, timeout=30) as c:
        assert _login(c, ADMIN).status_code == 303
        page = c.get(f"/console/accounts/{made.account_id}")
        assert page.status_code == 200 and made.key_prefix in _keys_card(page.text)
        csrf = _csrf(page.text)
        created = _create(c, csrf, NS, only=True, account_id=made.account_id)
        assert created.status_code == 200
        key = _new_key(created)
        with _rest(live, key) as http:
            assert http.get("/v1/export", params={"namespace": OTHER}).status_code == 403
        prefix = key[: len(made.key_prefix)]
        revoked = c.post(
            "/console/keys/revoke",
            data={"csrf": csrf, "prefix": prefix, "account_id": made.account_id},
        )
        assert revoked.status_code == 200 and f'Revoked <code class="cmd">{prefix}' in revoked.text
        assert c.get("/console/admin").status_code == 200  # an admin session stays
        nowhere = _create(c, csrf, account_id="acct_nope")
        assert nowhere.status_code == 404 and "Traceback" not in nowhere.text
    assert _active(live, made.account_id) == {made.key_prefix: True, prefix: False}
