"""Accounts and API keys (operator-side; agents never call these).

Keys are shown once, at creation. The database keeps only their SHA-256 and a
short display prefix, so a leaked database does not leak working keys.

A key's last use is recorded to within a minute, never per request: a lookup (each
process caches a looked-up key for a few seconds, walkeep/api/auth.py) writes the time
only when the stored one is older than ``LAST_USED_EVERY``, so a busy key costs at most
one small update a minute, and that update never waits for SQLite's write lock.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import ColumnElement, func, or_, select, update
from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from walkeep import ids, ledger, nowait
from walkeep.db import Database
from walkeep.db.models import Account, ApiKey, ConsoleSession
from walkeep.errors import NotFound, Unauthorized, ValidationError
from walkeep.ledger import Kind
from walkeep.service.namespaces import validate_namespace
from walkeep.service.pausing import Reach, resume_paused

log = logging.getLogger(__name__)

# A lookup records the key's use when the stored time is older than this. With lookups
# cached for at most a few seconds, the recorded time is within a minute of the last use.
LAST_USED_EVERY = timedelta(seconds=50)


@dataclass(frozen=True, slots=True)
class CreatedAccount:
    account_id: str
    name: str
    api_key: str
    key_prefix: str


@dataclass(frozen=True, slots=True)
class CreatedKey:
    key_id: str
    account_id: str
    api_key: str
    prefix: str
    default_namespace: str | None


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: the account an API key resolves to."""

    account_id: str
    key_id: str
    default_namespace: str | None


def create_account(
    db: Database,
    name: str,
    *,
    credits_mc: int = 0,
    grant_reason: str = "initial credits",
    default_namespace: str | None = None,
) -> CreatedAccount:
    name = name.strip()
    if not name or len(name) > 200:
        raise ValidationError("account name must be 1–200 characters", {"field": "name"})
    if credits_mc < 0:
        raise ValidationError("credits must not be negative", {"field": "credits"})
    account_id = ids.new_account_id()
    now = db.clock.now()
    try:
        with db.begin() as s:
            s.add(Account(id=account_id, name=name, created_at=now))
            s.flush()
            if credits_mc:
                ledger.credit(
                    s,
                    account_id,
                    credits_mc,
                    ref="grant:initial",
                    kind=Kind.GRANT,
                    memo=grant_reason,
                )
            key, prefix, _ = _add_key(s, account_id, default_namespace, now)
    except IntegrityError as exc:
        raise ValidationError(f"an account named {name!r} already exists", {"name": name}) from exc
    return CreatedAccount(account_id=account_id, name=name, api_key=key, key_prefix=prefix)


def create_key(
    db: Database, account_id: str, *, default_namespace: str | None = None
) -> CreatedKey:
    with db.begin() as s:
        if s.get(Account, account_id) is None:
            raise NotFound(f"unknown account {account_id}", {"account_id": account_id})
        key, prefix, key_id = _add_key(s, account_id, default_namespace, db.clock.now())
    return CreatedKey(key_id, account_id, key, prefix, default_namespace)


def _key_match(key: str) -> tuple[ColumnElement[bool], str]:
    """The row condition for a key given whole (matched by its hash) or by its display
    prefix, and the words for "not found" (never repeating a key's secret part)."""
    key = key.strip()
    if key.startswith(ids.API_KEY_PREFIXES) and len(key) > len(ids.api_key_display_prefix(key)):
        shown = ids.api_key_display_prefix(key)
        return ApiKey.key_hash == ids.api_key_hash(key), (
            f"no API key is the key given (it starts {shown!r}); give the whole key or its "
            "prefix, as `walkeep key list --account NAME` shows it"
        )
    return ApiKey.prefix == key, f"no API key with prefix {key!r}"


@dataclass(frozen=True, slots=True)
class RevokedKey:
    account_id: str
    prefix: str
    already: bool  # it had been revoked before: nothing changed


def revoke_key(db: Database, key: str) -> RevokedKey:
    """Revoke the key given by its display prefix or whole.

    Whole keys are matched by their hash (what the database keeps), so an operator can
    paste the key a leak exposed without working out its prefix first.
    """
    match, missing = _key_match(key)
    with db.begin() as s:
        row = s.scalar(select(ApiKey).where(match))
        if row is None:
            raise NotFound(missing, {})
        already = row.revoked_at is not None
        if not already:
            row.revoked_at = db.clock.now()
            # Its console sessions end with it, and the account's link sessions too: no
            # key vouches for them any more (a revocation is how an operator answers a
            # leak). Sessions opened with the account's other keys stay.
            s.execute(
                update(ConsoleSession)
                .where(
                    ConsoleSession.account_id == row.account_id,
                    ConsoleSession.ended_at.is_(None),
                    (ConsoleSession.key_id == row.id) | ConsoleSession.key_id.is_(None),
                )
                .values(ended_at=row.revoked_at)
            )
        return RevokedKey(row.account_id, row.prefix, already)


@dataclass(frozen=True, slots=True)
class KeyView:
    """One key as ``walkeep key list`` shows it (never the key itself)."""

    prefix: str
    default_namespace: str | None
    created_at: datetime
    last_used_at: datetime | None  # to within a minute (LAST_USED_EVERY)
    revoked_at: datetime | None


def list_keys(db: Database, account_id: str) -> list[KeyView]:
    """The account's keys, oldest first, revoked ones included (marked)."""
    with db.read() as s:
        if s.get(Account, account_id) is None:
            raise NotFound(f"unknown account {account_id}", {"account_id": account_id})
        rows = s.execute(
            select(
                ApiKey.prefix,
                ApiKey.default_namespace,
                ApiKey.created_at,
                ApiKey.last_used_at,
                ApiKey.revoked_at,
            )
            .where(ApiKey.account_id == account_id)
            .order_by(ApiKey.created_at, ApiKey.prefix)
        ).all()
    return [KeyView(*row) for row in rows]


def authenticate(db: Database, api_key: str) -> Principal:
    """Resolve a presented key to its account; revoked or unknown keys are refused."""
    if not api_key or not api_key.startswith(ids.API_KEY_PREFIXES):
        raise Unauthorized("missing or malformed API key")
    with db.read() as s:
        row = s.execute(
            select(
                ApiKey.id,
                ApiKey.account_id,
                ApiKey.default_namespace,
                ApiKey.revoked_at,
                ApiKey.last_used_at,
                Account.disabled_at,
            )
            .join(Account, Account.id == ApiKey.account_id)
            .where(ApiKey.key_hash == ids.api_key_hash(api_key))
        ).one_or_none()
    if row is None or row.revoked_at is not None or row.disabled_at is not None:
        raise Unauthorized("unknown or revoked API key")
    _note_use(db, row.id, row.last_used_at)
    return Principal(
        account_id=row.account_id, key_id=row.id, default_namespace=row.default_namespace
    )


def _note_use(db: Database, key_id: str, last_used_at: datetime | None) -> None:
    """Record that the key was used now, if the stored time is older than
    ``LAST_USED_EVERY``. Best effort: it never waits for SQLite's write lock (busy: the
    next lookup records it) and a failure is logged, never the caller's."""
    now = db.clock.now()
    stale = now - LAST_USED_EVERY
    if last_used_at is not None and last_used_at > stale:
        return
    try:
        with nowait.no_wait(), db.begin() as s:
            s.execute(
                update(ApiKey)
                .where(
                    ApiKey.id == key_id,
                    or_(ApiKey.last_used_at.is_(None), ApiKey.last_used_at <= stale),
                )
                .values(last_used_at=now)
            )
    except nowait.WouldWait:
        return
    except SQLAlchemyError as exc:
        log.warning("could not record an API key's last use: %s", type(exc).__name__)


def key_state_mark(db: Database) -> tuple[object, ...]:
    """A mark that changes whenever the set of valid keys may have: a key created or
    revoked, an account disabled or enabled. Cheap aggregates, so a web process can ask
    every few seconds and reload :func:`valid_key_hashes` only when it moved."""
    with db.read() as s:
        keys = s.execute(
            select(
                func.count(),
                func.max(ApiKey.created_at),
                func.count(ApiKey.revoked_at),
                func.max(ApiKey.revoked_at),
            ).select_from(ApiKey)
        ).one()
        disabled = s.execute(
            select(func.count(Account.disabled_at), func.max(Account.disabled_at))
        ).one()
    return (*keys, *disabled)


def valid_key_hashes(db: Database) -> list[str]:
    """The hashes of every key :func:`authenticate` would accept now."""
    with db.read() as s:
        return list(
            s.scalars(
                select(ApiKey.key_hash)
                .join(Account, Account.id == ApiKey.account_id)
                .where(ApiKey.revoked_at.is_(None), Account.disabled_at.is_(None))
            )
        )


def grant(
    db: Database,
    account_id: str,
    amount_mc: int,
    *,
    reason: str,
    ref: str | None = None,
    current_epoch: Reach | int | None = None,
) -> ledger.Entry:
    """Credit an account; its paused memories resume at once when ``current_epoch`` is
    given (only those still within their paid runway), else on the next renewal pass.
    Given as ``pausing.renewal_reach``, ``memories.resumed`` can tell the memories a
    renewal reaches in time from those that end first (an epoch alone: cautiously)."""
    if amount_mc <= 0:
        raise ValidationError("grant amount must be positive", {"field": "usd"})
    if not reason.strip():
        raise ValidationError("a grant needs a reason", {"field": "reason"})
    with db.begin() as s:
        if s.get(Account, account_id) is None:
            raise NotFound(f"unknown account {account_id}", {"account_id": account_id})
        entry = ledger.credit(
            s,
            account_id,
            amount_mc,
            ref=ref or f"grant:{ids.new_key_id()[4:]}",
            kind=Kind.GRANT,
            memo=reason.strip()[:500],
        )
        resume_paused(s, account_id, current_epoch)
    return entry


@dataclass(frozen=True, slots=True)
class AccountBalance:
    account_id: str
    name: str
    balance_mc: int
    held_mc: int
    created_at: datetime

    @property
    def available_mc(self) -> int:
        return self.balance_mc - self.held_mc


def get_account(db: Database, account_id: str) -> AccountBalance:
    with db.read() as s:
        row = s.get(Account, account_id)
        if row is None:
            raise NotFound(f"unknown account {account_id}", {"account_id": account_id})
        return AccountBalance(row.id, row.name, row.balance_mc, row.held_mc, row.created_at)


def find_account_by_name(db: Database, name: str) -> str | None:
    with db.read() as s:
        return s.scalar(select(Account.id).where(Account.name == name))


def _add_key(
    s, account_id: str, default_namespace: str | None, now: datetime
) -> tuple[str, str, str]:  # type: ignore[no-untyped-def]
    if default_namespace is not None:
        default_namespace = validate_namespace(default_namespace, "default_namespace")
    key = ids.new_api_key()
    prefix = ids.api_key_display_prefix(key)
    key_id = ids.new_key_id()
    s.add(
        ApiKey(
            id=key_id,
            account_id=account_id,
            key_hash=ids.api_key_hash(key),
            prefix=prefix,
            default_namespace=default_namespace,
            created_at=now,
        )
    )
    s.flush()
    return key, prefix, key_id
