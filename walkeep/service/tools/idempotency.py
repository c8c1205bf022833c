"""Exactly-once per (account, tool, request_id).

A request row is claimed with an INSERT under a UNIQUE constraint: the first
caller wins, every later caller (a replay, or a racer) finds the row and gets
the original outcome. The row stores a fingerprint of the arguments, so the
same request_id with different arguments is refused instead of silently
returning an unrelated result. The fingerprint is keyed (walkeep/service/digests.py):
a copy of the database cannot confirm a guess of a call's arguments.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from walkeep import ids
from walkeep.db.models import Request
from walkeep.errors import ValidationError
from walkeep.service import digests
from walkeep.service.runtime import Runtime

REQUEST_ID_MAX = 255


def validate_request_id(request_id: str) -> str:
    if not isinstance(request_id, str) or not request_id.strip():
        raise ValidationError("request_id is required", {"field": "request_id"})
    if len(request_id) > REQUEST_ID_MAX:
        raise ValidationError(
            f"request_id must be at most {REQUEST_ID_MAX} characters",
            {"field": "request_id", "max_length": REQUEST_ID_MAX},
        )
    return ids.check_identifier(request_id, "request_id")


@dataclass(frozen=True, slots=True)
class Fingerprint:
    """A call's arguments, digested: ``keyed`` is what a new row stores; ``bare`` is what a
    row stored before digests were keyed holds, until the worker rewrites it."""

    keyed: str
    bare: str


def fingerprint(rt: Runtime, account_id: str, **args: Any) -> Fingerprint:
    """A stable digest of a call's arguments (key order and whitespace don't matter)."""
    canonical = json.dumps(args, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    sha = digests.bare(canonical.encode("utf-8"))
    return Fingerprint(digests.keyed(rt, account_id, digests.REQUEST, sha), sha.hex())


def find(session: Session, account_id: str, tool: str, request_id: str) -> Request | None:
    return session.scalar(
        select(Request).where(
            Request.account_id == account_id,
            Request.tool == tool,
            Request.request_id == request_id,
        )
    )


def check_fingerprint(row: Request, fp: Fingerprint) -> None:
    if row.fingerprint not in (fp.keyed, fp.bare):
        raise ValidationError(
            "request_id was already used with different arguments; use a new request_id "
            "for a different call, or replay the original arguments",
            {"field": "request_id", "request_id": row.request_id, "tool": row.tool},
        )
