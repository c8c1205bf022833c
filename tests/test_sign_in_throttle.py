"""Issue 39: the console's sign-in throttle against a real ``walkeep serve``.

Junk credentials must never push the right admin token into 429: failures are counted
after the credential is checked, per client and kind of credential (the admin token, or
an API key), so other clients' junk cannot lock the admin out. And the client is the
connection's peer: ``X-Forwarded-For`` is believed only from the proxies the operator names
(``WALKEEP_FORWARDED_ALLOW_IPS``); uvicorn's default believed it from 127.0.0.1, so a
caller there chose the address its guesses were counted under.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.live_serve import Served, walkeep_serve
from walkeep.api.console import COOKIE

ADMIN = "the-right-admin-token-0123456789"


def _in_one_window(seconds: float = 20.0) -> None:
    """Start a run of guesses with ``seconds`` left in the server's one-minute counting
    window (fixed windows on the wall clock of a separate process, which no test clock
    reaches): a run that crossed a minute boundary was counted in two windows, and its
    11th guess was refused no longer. Waits at most ``seconds`` (a third of runs): the runs take 1–3 s."""
    left = 60.0 - time.time() % 60.0
    if left < seconds:
        time.sleep(left + 0.05)


def _sign_in(served: Served, credential: str, *, client: str | None = None) -> int:
    """One browser-like sign-in (page, then form) as ``client`` (an X-Forwarded-For)."""
    headers = {"X-Forwarded-For": client} if client else {}
    with httpx.Client(base_url=served.url, headers=headers, timeout=30) as http:
        page = http.get("/console/login")
        csrf = re.search(r'name="csrf" value="([^"]+)"', page.text)
        assert csrf is not None, page.text
        http.cookies.set(COOKIE, page.cookies[COOKIE])
        done = http.post(
            "/console/login",
            data={"credential": credential, "csrf": csrf.group(1)},
            follow_redirects=False,
        )
        return done.status_code


@pytest.fixture
def behind_a_proxy(tmp_path: Path, db_url: str) -> Iterator[Served]:
    """The operator names its proxy (here the test itself, at 127.0.0.1)."""
    with walkeep_serve(
        tmp_path,
        db_url,
        ["--no-worker"],
        WALKEEP_ADMIN_TOKEN=ADMIN,
        WALKEEP_FORWARDED_ALLOW_IPS="127.0.0.1",
    ) as served:
        yield served


def test_junk_from_others_never_holds_up_the_right_admin_token(behind_a_proxy: Served) -> None:
    """Regression: every attempt was counted before it was checked, in a bucket per target,
    so anyone's ten wrong guesses a minute answered the admin's right token 429."""
    served = behind_a_proxy
    attacker = "203.0.113.9"
    _in_one_window()  # both runs of twelve below, and the checks after them
    codes = [_sign_in(served, f"wrong-admin-token-{i:04d}xx", client=attacker) for i in range(12)]
    assert codes == [401] * 10 + [429] * 2, codes
    # Junk API keys from another address too (another kind of credential).
    junk_keys = [
        _sign_in(served, f"wk_live_{i:08d}{'x' * 35}", client="203.0.113.10") for i in range(12)
    ]
    assert junk_keys == [401] * 10 + [429] * 2, junk_keys
    assert _sign_in(served, ADMIN, client="198.51.100.7") == 303  # the admin, elsewhere
    # The attacker's own address is held up for admin tokens only: a valid API key from
    # there still signs in (per kind of credential).
    assert _sign_in(served, served.api_key, client=attacker) == 303
    assert _sign_in(served, ADMIN, client=attacker) == 429  # its own guesses: its turn waits


def test_x_forwarded_for_is_not_believed_unless_the_proxy_is_named(
    tmp_path: Path, db_url: str
) -> None:
    """Regression: from 127.0.0.1 each guess could claim another address and another
    key prefix, and so was never counted twice."""
    with walkeep_serve(tmp_path, db_url, ["--no-worker"], WALKEEP_ADMIN_TOKEN=ADMIN) as served:
        _in_one_window()
        codes = [
            _sign_in(served, f"wk_live_{i:08d}{'y' * 35}", client=f"198.51.100.{i}")
            for i in range(12)
        ]
        assert codes == [401] * 10 + [429] * 2, codes
        # …and the admin, from another address the server can actually see, is not held up
        # by them (here the same peer, 127.0.0.1, but another kind of credential).
        assert _sign_in(served, ADMIN) == 303
