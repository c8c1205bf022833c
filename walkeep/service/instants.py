"""Instants as the tools take them: RFC 3339, always with an offset, or a bare date.

One parser for every argument that names a moment (``store``'s ``expires_at``, the
``after``/``before`` filters of ``recall`` and ``export``), so that they accept and
refuse exactly the same spellings. A timestamp without an offset is refused rather than
guessed to be UTC: an agent in another zone would silently be hours off. A bare date is
a whole UTC day, and the caller says which end of it the argument means.
"""

from __future__ import annotations

from datetime import UTC, datetime

from walkeep import lifecycle
from walkeep.errors import ValidationError


def parse_instant(value: object, field: str, *, date_is_end_of_day: bool) -> datetime:
    """``value`` as an aware UTC instant; a VALIDATION_ERROR naming ``field`` if it is not
    an RFC 3339 timestamp with an offset or date. A date means the instant its UTC day
    begins, or with ``date_is_end_of_day`` the instant the next day begins."""
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValidationError(
                f"{field} needs a time zone offset (e.g. 2027-01-31T18:00:00Z)",
                {"field": field},
            )
        return value.astimezone(UTC)
    if not isinstance(value, str) or not value.strip():
        raise ValidationError(f"{field} must be a non-empty string", {"field": field})
    text = value.strip()
    try:
        if len(text) == 10:
            day = datetime.fromisoformat(text).replace(tzinfo=UTC)
            return lifecycle.end_of_day(day) if date_is_end_of_day else day
        if len(text) > 10 and text[10] in "Tt":  # RFC 3339 allows either case
            at = datetime.fromisoformat(f"{text[:10]}T{text[11:]}".replace("z", "Z"))
            if at.tzinfo is not None:
                return at.astimezone(UTC)
    except (ValueError, OverflowError):  # not a date, or past year 9999 once made UTC
        pass
    day_means = "the end of that day UTC" if date_is_end_of_day else "the start of that day UTC"
    raise ValidationError(
        f"{field} must be an RFC 3339 date (2027-01-31, meaning {day_means}) "
        "or timestamp with an offset (2027-01-31T18:00:00Z)",
        {"field": field, field: text[:80]},
    )
