"""Identifier formats, in one place so every layer agrees on them.

Ids are random, prefixed by kind (``acct_``, ``mem_``, …) so a human reading a
log line or an agent reading a result can tell what they are holding.
"""

from __future__ import annotations

import hashlib
import secrets
import unicodedata

from walkeep.errors import ValidationError

_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"  # Crockford base32, lower case


def _token(n_chars: int) -> str:
    # 5 random bits per character, from one call to the OS CSPRNG.
    raw = int.from_bytes(secrets.token_bytes((n_chars * 5 + 7) // 8), "big")
    return "".join(_ALPHABET[(raw >> (5 * i)) & 31] for i in range(n_chars))


def new_account_id() -> str:
    return "acct_" + _token(20)


def new_memory_id() -> str:
    return "mem_" + _token(26)


def new_key_id() -> str:
    return "key_" + _token(20)


def new_job_id() -> str:
    return "job_" + _token(26)


def new_checkout_id() -> str:
    return "tu_" + _token(24)


API_KEY_PREFIXES = ("wk_live_", "wk_test_")
API_KEY_DISPLAY_CHARS = 8


def new_api_key(prefix: str = "wk_live_") -> str:
    """An API key with 256 bits of entropy (URL-safe base64 body)."""
    if prefix not in API_KEY_PREFIXES:
        raise ValueError(f"unknown API key prefix {prefix!r}")
    return prefix + secrets.token_urlsafe(32)


def api_key_hash(key: str) -> str:
    """SHA-256 hex: the only form of a key the database ever holds."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def api_key_display_prefix(key: str) -> str:
    """The short, non-secret part of a key shown in listings and used to revoke it."""
    for p in API_KEY_PREFIXES:
        if key.startswith(p):
            return key[: len(p) + API_KEY_DISPLAY_CHARS]
    raise ValueError("not a Walkeep API key")


# --- text clients choose (request ids, namespaces, ids they pass back, metadata) ----------
#
# PostgreSQL refuses NUL in text (SQLite stores it), and neither database can encode a lone
# surrogate as UTF-8; both surfaced as INTERNAL. Checking here, before any query, makes both
# databases answer the same VALIDATION_ERROR naming the field. Identifiers also refuse the
# other control characters: nothing legitimate needs them, and they hide in logs and UIs.


# Bidirectional formatting characters (embeddings, overrides, isolates, marks): in an
# identifier they make one id display as another ("Trojan Source"), in the console, in
# logs and in an agent's transcript. Content may hold them; identifiers may not.
_BIDI_CONTROLS = frozenset([0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A)])


def _bad_char(value: str, *, controls: bool) -> str | None:
    """A description of the first character the databases (or ids) can't take, or None."""
    for i, ch in enumerate(value):
        code = ord(ch)
        if code == 0:
            return f"a NUL character (U+0000) at position {i}"
        if 0xD800 <= code <= 0xDFFF:
            return f"an unpaired surrogate (U+{code:04X}) at position {i}"
        if controls and unicodedata.category(ch) == "Cc":
            return f"a control character (U+{code:04X}) at position {i}"
        if controls and code in _BIDI_CONTROLS:
            return f"a bidirectional control character (U+{code:04X}) at position {i}"
    return None


def check_identifier(value: str, field: str) -> str:
    """Refuse NUL, other control characters, bidirectional controls and unpaired
    surrogates in an identifier."""
    bad = _bad_char(value, controls=True)
    if bad:
        raise ValidationError(
            f"{field} must not contain {bad}",
            {"field": field, "reason": "control_character"},
        )
    return value


def check_text(value: str, field: str) -> str:
    """Refuse what no database can store in text: NUL and unpaired surrogates."""
    bad = _bad_char(value, controls=False)
    if bad:
        raise ValidationError(
            f"{field} must not contain {bad}", {"field": field, "reason": "unstorable_character"}
        )
    return value
