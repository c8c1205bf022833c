"""Accounts and API keys (operator-side; agents never call these).

Keys are shown once, at creation. The database keeps only their SHA-256 and a
short display prefix, so a leaked database does not leak working keys.

A key's last use is recorded to within a minute, never per request: a lookup (each
process caches a looked-up key for a few seconds, walkeep/api/auth.py) writes the time
only when the stored one is older than ``LAST_USED_EVERY``, so a busy key costs at most
one small update a minute, and that update never waits for SQLite's write lock.

A key's default namespace is the operator's choice and names what the agent files under,
so it is kept sealed (``sealed.seal_key_namespace``, under the account's field key): the
functions that write or show it take the master key. A key may be *confined* to that
namespace (``only_namespace``): the tools' entry points then refuse any other
(``walkeep/service/tools/confine.py``), and the console refuses its sign-in.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import ColumnElement, func, or_, select, update
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session

from walkeep import ids, ledger, nowait
from walkeep.db import Database
from walkeep.db.models import Account, ApiKey, ConsoleSession
from walkeep.errors import NotFound, Unauthorized, ValidationError
from walkeep.ledger import Kind
from walkeep.service import sealed
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
    only_namespace: bool = False


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: the account an API key resolves to, the key's default namespace
    (opened), and whether the key is confined to it."""

    account_id: str
    key_id: str
    default_namespace: str | None
    only_namespace: bool = False


def create_account(
    db: Database,
    name: str,
    *,
    credits_mc: int = 0,
    grant_reason: str = "initial credits",
    default_namespace: str | None = None,
    only_namespace: bool = False,
    master_key: bytes | None = None,
) -> CreatedAccount:
    """The account and its first key. ``master_key`` seals the key's default namespace:
    needed when one is given."""
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
            key, prefix, _ = _add_key(
                s, account_id, _KeyScope(default_namespace, only_namespace, master_key), now
            )
    except IntegrityError as exc:
        raise ValidationError(f"an account named {name!r} already exists", {"name": name}) from exc
    return CreatedAccount(account_id=account_id, name=name, api_key=key, key_prefix=prefix)


def create_key(
    db: Database,
    account_id: str,
    *,
    default_namespace: str | None = None,
    only_namespace: bool = False,
    master_key: bytes | None = None,
) -> CreatedKey:
    """Another key for the account. ``only_namespace`` confines it to ``default_namespace``
    (which it then requires); ``master_key`` seals that namespace (needed when given)."""
    scope = _KeyScope(default_namespace, only_namespace, master_key)
    with db.begin() as s:
        if s.get(Account, account_id) is None:
            raise NotFound(f"unknown account {account_id}", {"account_id": account_id})
        key, prefix, key_id = _add_key(s, account_id, scope, db.clock.now())
    return CreatedKey(key_id, account_id, key, prefix, scope.namespace(), only_namespace)


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


def revoke_key(db: Database, key: str, *, account_id: str | None = None) -> RevokedKey:
    """Revoke the key given by its display prefix or whole.

    Whole keys are matched by their hash (what the database keeps), so an operator can
    paste the key a leak exposed without working out its prefix first. With
    ``account_id`` (the console: an operator acts on their own account only), a key of
    another account is not found, word for word as one that does not exist.
    """
    match, missing = _key_match(key)
    if account_id is not None:
        match = match & (ApiKey.account_id == account_id)
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
    """One key as ``walkeep key list`` and the console show it (never the key itself);
    ``key_id`` tells the console which key its session was opened with."""

    key_id: str
    prefix: str
    default_namespace: str | None
    only_namespace: bool
    created_at: datetime
    last_used_at: datetime | None  # to within a minute (LAST_USED_EVERY)
    revoked_at: datetime | None


def list_keys(db: Database, account_id: str, master_key: bytes) -> list[KeyView]:
    """The account's keys, oldest first, revoked ones included (marked); default
    namespaces opened with ``master_key``."""
    with db.read() as s:
        if s.get(Account, account_id) is None:
            raise NotFound(f"unknown account {account_id}", {"account_id": account_id})
        rows = s.execute(
            select(
                ApiKey.id,
                ApiKey.prefix,
                ApiKey.default_namespace,
                ApiKey.only_namespace,
                ApiKey.created_at,
                ApiKey.last_used_at,
                ApiKey.revoked_at,
            )
            .where(ApiKey.account_id == account_id)
            .order_by(ApiKey.created_at, ApiKey.prefix)
        ).all()
    return [
        KeyView(
            key_id=r.id,
            prefix=r.prefix,
            default_namespace=sealed.open_key_namespace(
                master_key, account_id, r.default_namespace
            ),
            only_namespace=bool(r.only_namespace),
            created_at=r.created_at,
            last_used_at=r.last_used_at,
            revoked_at=r.revoked_at,
        )
        for r in rows
    ]


def authenticate(db: Database, api_key: str, master_key: bytes) -> Principal:
    """Resolve a presented key to its account; revoked or unknown keys are refused. The
    key's default namespace is opened with ``master_key``: the tools take names."""
    if not api_key or not api_key.startswith(ids.API_KEY_PREFIXES):
        raise Unauthorized("missing or malformed API key")
    with db.read() as s:
        row = s.execute(
            select(
                ApiKey.id,
                ApiKey.account_id,
                ApiKey.default_namespace,
                ApiKey.only_namespace,
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
        account_id=row.account_id,
        key_id=row.id,
        default_namespace=sealed.open_key_namespace(
            master_key, row.account_id, row.default_namespace
        ),
        only_namespace=bool(row.only_namespace),
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


@dataclass(frozen=True, slots=True)
class _KeyScope:
    """What a new key is given beyond its account: a default namespace, whether it is
    confined to it, and the master key that seals it."""

    default_namespace: str | None
    only_namespace: bool
    master_key: bytes | None

    def namespace(self) -> str | None:
        """The default namespace, validated; refuses a confinement without one."""
        if self.default_namespace is None:
            if self.only_namespace:
                raise ValidationError(
                    "a key confined to a namespace needs that namespace: give a default "
                    "namespace, or leave the key unconfined",
                    {"field": "default_namespace"},
                )
            return None
        return validate_namespace(self.default_namespace, "default_namespace")

    def sealed_namespace(self, account_id: str) -> str | None:
        name = self.namespace()
        if name is None:
            return None
        if self.master_key is None:  # a caller's mistake, never an operator's
            raise TypeError("a key's default namespace is sealed: pass master_key")
        return sealed.seal_key_namespace(self.master_key, account_id, name)


def _add_key(s: Session, account_id: str, scope: _KeyScope, now: datetime) -> tuple[str, str, str]:
    stored = scope.sealed_namespace(account_id)
    key = ids.new_api_key()
    prefix = ids.api_key_display_prefix(key)
    key_id = ids.new_key_id()
    s.add(
        ApiKey(
            id=key_id,
            account_id=account_id,
            key_hash=ids.api_key_hash(key),
            prefix=prefix,
            default_namespace=stored,
            only_namespace=scope.only_namespace,
            created_at=now,
        )
    )
    s.flush()
    return key, prefix, key_id
