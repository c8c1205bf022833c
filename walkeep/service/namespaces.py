"""Namespaces: one normal form, one size limit, the same answer on SQLite and PostgreSQL.

Every tool that takes a namespace (store, recall, export) and the operator's default
namespace on a key validate it here, so "é" typed precomposed or decomposed is one
namespace everywhere.
"""

from __future__ import annotations

import unicodedata

from walkeep import ids
from walkeep.errors import ValidationError

NAMESPACE_MAX_BYTES = 255


def validate_namespace(namespace: str, field: str = "namespace") -> str:
    """The namespace as stored and compared: NFC-normalised, so "é" typed precomposed or
    decomposed is one namespace. Refuses blank ones and characters the databases can't
    store (the same answer on SQLite and PostgreSQL). Callers must use the returned value.
    """
    if not isinstance(namespace, str):
        raise ValidationError(f"{field} must be a string", {"field": field})
    ids.check_identifier(namespace, field)
    namespace = unicodedata.normalize("NFC", namespace)
    n = len(namespace.encode("utf-8"))
    if n < 1 or n > NAMESPACE_MAX_BYTES:
        raise ValidationError(
            f"{field} must be 1–{NAMESPACE_MAX_BYTES} UTF-8 bytes (got {n})",
            {"field": field, "min_bytes": 1, "max_bytes": NAMESPACE_MAX_BYTES, "bytes": n},
        )
    if not namespace.strip():
        raise ValidationError(
            f"{field} must not be blank (whitespace only)", {"field": field, "reason": "blank"}
        )
    return namespace
