"""The credits ledger: append-only entries, a cached balance, no way below zero.

Units: 1 credit = 1 US cent = 1000 millicredits (mc). Everything is an ``int``
in millicredits so sub-cent renewal prices stay exact; floats never touch money.

Every operation runs inside the caller's transaction (a ``Session`` from
``Database.begin()``) so the service layer can make "capture the hold and
register the memory" one atomic step. Every operation is idempotent on a
``ref`` that is UNIQUE per account: replaying it returns the original entry
and changes nothing.

Concurrency. ``hold`` and ``debit`` are a single conditional UPDATE
(``… WHERE balance_mc - held_mc >= :amount``): the database evaluates the
condition against the latest committed row under its row lock (PostgreSQL)
or the database write lock taken by ``BEGIN IMMEDIATE`` (SQLite), so two
racing holds can never both spend the same credits. CHECK constraints on
``accounts`` back this up. A hold is settled (captured or released) at most
once, enforced by the UNIQUE ``settles_id`` column.

Why one file: every statement that moves money, so an auditor reads all of them in one
sitting and the invariants above are checked in one place.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import ROUND_CEILING, Decimal, InvalidOperation
from enum import StrEnum
from typing import Any

from sqlalchemy import (
    CTE,
    BindParameter,
    ColumnElement,
    Insert,
    Select,
    Update,
    bindparam,
    case,
    insert,
    literal,
    select,
    tuple_,
    update,
)
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from walkeep.db import Prepared, Tx
from walkeep.db.models import Account, LedgerEntry, table
from walkeep.errors import InsufficientBalance, NotFound, ValidationError

MC_PER_CREDIT = 1000
CREDITS_PER_USD = 100
MC_PER_USD = MC_PER_CREDIT * CREDITS_PER_USD


class Kind(StrEnum):
    TOPUP = "topup"
    GRANT = "grant"
    ADJUSTMENT = "adjustment"
    HOLD = "hold"
    CAPTURE = "capture"
    RELEASE = "release"
    DEBIT = "debit"
    # A saved card charged automatically (walkeep/service/autocharge.py).
    AUTO_TOPUP = "auto_topup"
    # Credits taken back because the payment behind them was refunded or disputed.
    REVERSAL = "reversal"


CREDIT_KINDS = frozenset({Kind.TOPUP, Kind.GRANT, Kind.ADJUSTMENT, Kind.AUTO_TOPUP})
DEBIT_KINDS = frozenset({Kind.DEBIT, Kind.REVERSAL})


class LedgerConflict(Exception):
    """A ref was reused for a different operation, or a hold was already settled
    the other way. A programming error, not a client error."""


@dataclass(frozen=True, slots=True)
class Entry:
    id: int
    account_id: str
    kind: str
    amount_mc: int
    ref: str
    settles_id: int | None
    balance_after_mc: int
    held_after_mc: int
    memo: str | None
    created_at: datetime
    replayed: bool = False

    @classmethod
    def of(cls, row: LedgerEntry, replayed: bool = False) -> Entry:
        return cls(
            id=row.id,
            account_id=row.account_id,
            kind=row.kind,
            amount_mc=row.amount_mc,
            ref=row.ref,
            settles_id=row.settles_id,
            balance_after_mc=row.balance_after_mc,
            held_after_mc=row.held_after_mc,
            memo=row.memo,
            created_at=row.created_at,
            replayed=replayed,
        )


@dataclass(frozen=True, slots=True)
class Balance:
    balance_mc: int
    held_mc: int

    @property
    def available_mc(self) -> int:
        return self.balance_mc - self.held_mc


# --- unit conversions (exact) ------------------------------------------------------


def usd_to_mc(amount: str | int | Decimal, *, max_decimals: int = 2) -> int:
    """Parse a US-dollar amount exactly; more than ``max_decimals`` decimals is an error."""
    try:
        d = Decimal(str(amount)) if not isinstance(amount, Decimal) else amount
    except InvalidOperation as exc:
        raise ValidationError(f"not a number: {amount!r}", {"field": "amount_usd"}) from exc
    if not d.is_finite():
        raise ValidationError("amount must be a finite number", {"field": "amount_usd"})
    exponent = d.normalize().as_tuple().exponent
    if isinstance(exponent, int) and exponent < -max_decimals:
        raise ValidationError(
            f"amount has more than {max_decimals} decimal places",
            {"field": "amount_usd", "max_decimals": max_decimals},
        )
    return int(d * MC_PER_USD)


def credits_to_mc(credits: int) -> int:
    return credits * MC_PER_CREDIT


def mc_to_credits_ceil(mc: int) -> int:
    """Whole credits needed to cover ``mc`` (what an agent must top up)."""
    return -(-mc // MC_PER_CREDIT)


def credits_display(mc: int) -> int | float:
    """Credits as a JSON number for humans and agents.

    Whole credits are an ``int``; otherwise a float with at most three
    decimals, which round-trips exactly. Display only: arithmetic stays in mc.
    """
    return mc // MC_PER_CREDIT if mc % MC_PER_CREDIT == 0 else mc / MC_PER_CREDIT


def mc_to_usd_str(mc: int) -> str:
    """Dollars with two decimals, rounded down to the cent (never overstates a balance)."""
    cents = mc // MC_PER_CREDIT
    return f"{cents // 100}.{cents % 100:02d}"


def mc_to_usd_ceil(mc: int) -> Decimal:
    return (Decimal(mc) / MC_PER_USD).quantize(Decimal("0.01"), rounding=ROUND_CEILING)


# --- reads -------------------------------------------------------------------------------


def balance(session: Session, account_id: str) -> Balance:
    row = session.execute(
        select(Account.balance_mc, Account.held_mc).where(Account.id == account_id)
    ).one_or_none()
    if row is None:
        raise NotFound(f"unknown account {account_id}", {"account_id": account_id})
    return Balance(balance_mc=row[0], held_mc=row[1])


def find(session: Session, account_id: str, ref: str) -> Entry | None:
    row = session.scalar(
        select(LedgerEntry).where(LedgerEntry.account_id == account_id, LedgerEntry.ref == ref)
    )
    return Entry.of(row, replayed=True) if row else None


def open_holds(session: Session, account_id: str) -> list[Entry]:
    settled = select(LedgerEntry.settles_id).where(
        LedgerEntry.account_id == account_id, LedgerEntry.settles_id.is_not(None)
    )
    rows = session.scalars(
        select(LedgerEntry)
        .where(
            LedgerEntry.account_id == account_id,
            LedgerEntry.kind == Kind.HOLD,
            LedgerEntry.id.not_in(settled),
        )
        .order_by(LedgerEntry.id)
    )
    return [Entry.of(r) for r in rows]


def recompute(session: Session, account_id: str) -> Balance:
    """The balance derived from entries alone (audits and tests compare it to the cache)."""
    bal = held = 0
    for kind, amount in session.execute(
        select(LedgerEntry.kind, LedgerEntry.amount_mc).where(LedgerEntry.account_id == account_id)
    ):
        if kind in CREDIT_KINDS:
            bal += amount
        elif kind in DEBIT_KINDS:
            bal -= amount
        elif kind == Kind.HOLD:
            held += amount
        elif kind == Kind.CAPTURE:
            bal -= amount
            held -= amount
        elif kind == Kind.RELEASE:
            held -= amount
    return Balance(balance_mc=bal, held_mc=held)


# --- writes ------------------------------------------------------------------------------
#
# The statements are built once, with bound parameters. A ledger write sits on
# the store path of every request; constructing an UPDATE/INSERT per call and
# deriving its cache key cost more than executing it (≈0.5 ms of interpreter
# time per post, measured with bench/store.py), all of it under the GIL.

_A = table(Account)
_E = table(LedgerEntry)
_ACCOUNT = _A.c.id == bindparam("p_account")
_AMOUNT: BindParameter[int] = bindparam("p_amount")
_COVERS = _A.c.balance_mc - _A.c.held_mc >= _AMOUNT
_AFTER = (_A.c.balance_mc, _A.c.held_mc)

_CREDIT = update(_A).where(_ACCOUNT).values(balance_mc=_A.c.balance_mc + _AMOUNT).returning(*_AFTER)
_HOLD = (
    update(_A).where(_ACCOUNT, _COVERS).values(held_mc=_A.c.held_mc + _AMOUNT).returning(*_AFTER)
)
_DEBIT = (
    update(_A)
    .where(_ACCOUNT, _COVERS)
    .values(balance_mc=_A.c.balance_mc - _AMOUNT)
    .returning(*_AFTER)
)
_CAPTURE = (
    update(_A)
    .where(_ACCOUNT)
    .values(balance_mc=_A.c.balance_mc - _AMOUNT, held_mc=_A.c.held_mc - _AMOUNT)
    .returning(*_AFTER)
)
_RELEASE = update(_A).where(_ACCOUNT).values(held_mc=_A.c.held_mc - _AMOUNT).returning(*_AFTER)
# Every entry is one of these; on SQLite it runs on the raw cursor (walkeep.db.Prepared).
_APPEND = Prepared(
    insert(_E).returning(_E.c.id),
    keys=(
        "account_id",
        "kind",
        "amount_mc",
        "ref",
        "settles_id",
        "balance_after_mc",
        "held_after_mc",
        "memo",
        "created_at",
    ),
)
_APPEND_ROWS = insert(_E)
# The same with the new ids, in parameter order: one statement ("insertmanyvalues").
_APPEND_MANY = _APPEND_ROWS.returning(_E.c.id, sort_by_parameter_order=True)
# By exact (account, ref), the UNIQUE index; the kind is checked in Python (as a condition
# it can steer PostgreSQL to the (account_id, kind, …) index, which reads every hold the
# account ever had). The refs are rendered into the SQL, so it is never a prepared
# statement whose generic plan was chosen while the ledger was small.
_HOLD_ROWS = select(_E.c.ref, _E.c.id, _E.c.amount_mc, _E.c.kind).where(
    _E.c.account_id == bindparam("p_account"),
    _E.c.ref.in_(bindparam("p_refs", expanding=True, literal_execute=True)),
)
# The same for one hold of each of several accounts: exact (account_id, ref) pairs.
_HOLD_PAIRS = select(_E.c.account_id, _E.c.ref, _E.c.id, _E.c.amount_mc, _E.c.kind).where(
    tuple_(_E.c.account_id, _E.c.ref).in_(
        bindparam("p_pairs", expanding=True, literal_execute=True)
    )
)
_HOLD_ROW = select(_E.c.id, _E.c.amount_mc).where(
    _E.c.account_id == bindparam("p_account"),
    _E.c.ref == bindparam("p_ref"),
    _E.c.kind == str(Kind.HOLD),
)


def credit(
    session: Session,
    account_id: str,
    amount_mc: int,
    *,
    ref: str,
    kind: Kind = Kind.TOPUP,
    memo: str | None = None,
) -> Entry:
    """Add credits (top-up, grant, positive adjustment)."""
    if kind not in CREDIT_KINDS:
        raise ValueError(f"{kind} is not a credit kind")
    _positive(amount_mc)
    return _post(session, account_id, kind, amount_mc, ref, memo, _CREDIT)


def hold(
    session: Session, account_id: str, amount_mc: int, *, ref: str, memo: str | None = None
) -> Entry:
    """Reserve credits; raises InsufficientBalance (writing nothing) if available < amount."""
    _positive(amount_mc)
    return _post(session, account_id, Kind.HOLD, amount_mc, ref, memo, _HOLD)


def hold_statement(
    *, where: Sequence[ColumnElement[bool]] = (), values: Mapping[str, Any]
) -> Update:
    """A hold's account UPDATE that also checks ``where`` and sets ``values`` on the same
    row in the same statement — for callers that must change other account counters
    atomically with the hold (the store path counts usage quotas this way).

    Build it once, at import: see the note on prebuilt statements above."""
    return (
        update(_A)
        .where(_ACCOUNT, _COVERS, *where)
        .values(held_mc=_A.c.held_mc + _AMOUNT, **values)
        .returning(*_AFTER)
    )


def try_hold_new(
    session: Tx,
    account_id: str,
    amount_mc: int,
    *,
    ref: str,
    memo: str | None,
    stmt: Prepared,
    params: Mapping[str, Any],
) -> Entry | None:
    """Place a hold with ``stmt`` (from ``hold_statement``) under a ``ref`` that cannot
    exist yet, or return None, having written nothing, when ``stmt`` matched no row (not
    enough credits, or the caller's own condition failed: the caller finds out which).

    The fast path of a store: one UPDATE and one INSERT, no savepoint and no pre-read.
    A savepoint only exists to turn a duplicate ref into a replay; a ref derived from
    a new id cannot be a duplicate, so a collision here is a bug and aborts the
    caller's transaction, as it should."""
    _positive(amount_mc)
    rows = stmt.run(session, {"p_account": account_id, "p_amount": amount_mc, **params})
    if not rows:
        return None
    row = rows[0]
    return _append(session, account_id, Kind.HOLD, amount_mc, ref, (int(row[0]), int(row[1])), memo)


_HOLD_ENTRY_COLUMNS = ("account_id", "amount_mc", "ref", "memo", "created_at")


def hold_entry_from(after: CTE) -> Insert:
    """The INSERT of a hold's ledger entry whose balances come from ``after``, a CTE of
    ``hold_statement(...)`` (PostgreSQL runs data-modifying CTEs): the hold and its entry
    then commit in ONE statement, with the account's row lock held for that statement
    only. Its parameters come from ``hold_entry_params``; nothing is inserted if the
    UPDATE matched no row."""
    values = [bindparam(f"l_{c}", type_=_E.c[c].type) for c in _HOLD_ENTRY_COLUMNS]
    rows = select(
        *values, literal(str(Kind.HOLD)), after.c.balance_mc, after.c.held_mc
    ).select_from(after)
    names = [*_HOLD_ENTRY_COLUMNS, "kind", "balance_after_mc", "held_after_mc"]
    return insert(_E).from_select(names, rows)


def hold_entry_params(
    account_id: str, amount_mc: int, *, ref: str, memo: str | None, now: datetime
) -> dict[str, Any]:
    """Parameters of ``hold_entry_from`` and of its ``hold_statement`` CTE."""
    _positive(amount_mc)
    return {
        "p_account": account_id,
        "p_amount": amount_mc,
        "l_account_id": account_id,
        "l_amount_mc": amount_mc,
        "l_ref": ref,
        "l_memo": memo,
        "l_created_at": now,
    }


def debit(
    session: Session,
    account_id: str,
    amount_mc: int,
    *,
    ref: str,
    memo: str | None = None,
    kind: Kind = Kind.DEBIT,
) -> Entry:
    """Spend credits directly (no hold); refuses to touch held credits."""
    if kind not in DEBIT_KINDS:
        raise ValueError(f"{kind} is not a debit kind")
    _positive(amount_mc)
    return _post(session, account_id, kind, amount_mc, ref, memo, _DEBIT)


def capture(
    session: Session,
    account_id: str,
    hold_ref: str,
    *,
    ref: str | None = None,
    memo: str | None = None,
) -> Entry:
    """Turn a hold into a charge. Applied once; excludes ``release`` of the same hold."""
    return _settle(session, account_id, hold_ref, Kind.CAPTURE, ref or f"{hold_ref}:capture", memo)


def capture_holds(session: Session, account_id: str, holds: Sequence[tuple[str, str]]) -> int:
    """Capture several holds of one account, given as (hold ref, memo): one read of the
    holds, one account UPDATE, one multi-row INSERT — the cost of registering a landed
    quilt's members no longer grows by five statements per member.

    The same guarantees as ``capture``: each hold is captured once and never both
    captured and released (the UNIQUE ``settles_id`` and refs), the account never goes
    below zero (its CHECKs). Unlike ``capture`` it does not tell a replay from a
    conflict: any duplicate raises (IntegrityError) and aborts the caller's transaction;
    callers fall back to ``capture`` one hold at a time, which does.
    Returns how many holds were captured."""
    if not holds:
        return 0
    refs = [ref for ref, _ in holds]
    found = {
        row.ref: (int(row.id), int(row.amount_mc))
        for row in session.execute(_HOLD_ROWS, {"p_account": account_id, "p_refs": refs})
        if row.kind == Kind.HOLD
    }
    missing = [ref for ref in refs if ref not in found]
    if missing:
        raise NotFound(f"no hold {missing[0]!r}", {"hold_ref": missing[0]})
    total = sum(amount for _, amount in found.values())
    after = _apply(session, _CAPTURE, account_id, total)
    if after is None:
        raise NotFound(f"unknown account {account_id}", {"account_id": account_id})
    # Entries are in the given order; each records the balance right after it.
    balance_after, held_after = after[0] + total, after[1] + total
    now = _now(session)
    rows = []
    for ref, memo in holds:
        hold_id, amount = found[ref]
        balance_after, held_after = balance_after - amount, held_after - amount
        rows.append(
            _entry_row(
                account_id,
                Kind.CAPTURE,
                amount,
                f"{ref}:capture",
                (balance_after, held_after),
                hold_id,
                memo,
                now,
            )
        )
    session.execute(_APPEND_ROWS, rows)
    return len(rows)


def release(
    session: Session,
    account_id: str,
    hold_ref: str,
    *,
    ref: str | None = None,
    memo: str | None = None,
) -> Entry:
    """Give a hold back. Applied once; excludes ``capture`` of the same hold."""
    return _settle(session, account_id, hold_ref, Kind.RELEASE, ref or f"{hold_ref}:release", memo)


# --- batches: one UPDATE and one INSERT for many accounts ----------------------------------
#
# The renewal pass holds, then captures, a batch's cost for every account that
# owns one of its blobs: up to ``renew_batch`` accounts per transaction. Per
# account, ``hold``/``capture`` cost a savepoint, an UPDATE and an INSERT (and
# a lookup per capture): most of a batch's round trips on PostgreSQL. The
# batch forms write the same rows with one statement per step. Like
# ``try_hold_new`` they take no savepoint: they are for refs that cannot exist
# yet, so a collision is a bug and aborts the caller's transaction.


def hold_new_many(
    session: Session, holds: Sequence[tuple[str, int, str]], *, memo: str | None = None
) -> list[Entry]:
    """Hold ``amount_mc`` on each ``(account_id, amount_mc, ref)`` (one per account) under
    refs derived from a new id, e.g. ``renewal:<new renewal id>:<account>``.

    Raises InsufficientBalance if any account cannot cover its hold, *after*
    the others were written: the caller's transaction must then be rolled back
    (the renewal pass reads what each account can cover under its row lock
    first, so it never gets here).
    """
    accounts = [a for a, _, _ in holds]
    if len(set(accounts)) != len(accounts):
        raise ValueError("one hold per account")
    if not holds:
        return []
    for _account, amount, _ref in holds:
        _positive(amount)
    delta = case({a: amount for a, amount, _ in holds}, value=_A.c.id)
    stmt = (
        update(_A)
        .where(_A.c.id.in_(_in_id_order(accounts)), _A.c.balance_mc - _A.c.held_mc >= delta)
        .values(held_mc=_A.c.held_mc + delta)
        .returning(_A.c.id, *_AFTER)
    )
    after = {r[0]: (int(r[1]), int(r[2])) for r in session.execute(stmt)}
    short = [(a, amount) for a, amount, _ in holds if a not in after]
    if short:
        bal = balance(session, short[0][0])  # NotFound for an unknown account
        raise InsufficientBalance(
            "not enough credits",
            {"needed_mc": short[0][1], "available_mc": bal.available_mc},
        )
    return _append_many(
        session, [(a, Kind.HOLD, amount, ref, after[a], None) for a, amount, ref in holds], memo
    )


def capture_many(
    session: Session, holds: Sequence[tuple[str, str]], *, memo: str | None = None
) -> list[Entry]:
    """Capture each ``(account_id, hold_ref)``, one hold per account (several holds of
    one account: ``capture_holds``), under default capture refs. The caller has
    serialised their settlement (the renewal pass holds its renewal's row lock and
    has seen it still an intent), so none can be settled yet.

    NotFound for a missing hold. A hold settled anyway violates UNIQUE
    ``settles_id`` and aborts the caller's transaction, as it should.
    """
    accounts = [a for a, _ in holds]
    if len(set(accounts)) != len(accounts):
        raise ValueError("one capture per account")
    if not holds:
        return []
    found = {
        (r.account_id, r.ref): (int(r.id), int(r.amount_mc))
        for r in session.execute(_HOLD_PAIRS, {"p_pairs": [tuple(h) for h in holds]})
        if r.kind == Kind.HOLD
    }
    for hold_key in holds:
        if hold_key not in found:
            raise NotFound(f"no hold {hold_key[1]!r}", {"hold_ref": hold_key[1]})
    amounts = {a: found[(a, ref)][1] for a, ref in holds}
    delta = case(amounts, value=_A.c.id)
    stmt = (
        update(_A)
        .where(_A.c.id.in_(_in_id_order(accounts)))
        .values(balance_mc=_A.c.balance_mc - delta, held_mc=_A.c.held_mc - delta)
        .returning(_A.c.id, *_AFTER)
    )
    after = {r[0]: (int(r[1]), int(r[2])) for r in session.execute(stmt)}
    return _append_many(
        session,
        [
            (a, Kind.CAPTURE, amounts[a], f"{ref}:capture", after[a], found[(a, ref)][0])
            for a, ref in holds
        ],
        memo,
    )


# --- internals ---------------------------------------------------------------------------


def _in_id_order(accounts: Sequence[str]) -> Select[tuple[str]]:
    """``accounts``, row-locked in id order (PostgreSQL) by the statement that selects
    from this. An UPDATE of several accounts otherwise locks them in its plan's order —
    on a sequential scan the table's physical order, which every update reshuffles — and
    two such statements over the same accounts (a renewal batch's capture and the next
    batch's claim, which overlap) could each hold a row the other waits for. The renewal
    claim locks its accounts in id order too. SQLite has one writer: no row locks."""
    return (
        select(_A.c.id)
        .where(_A.c.id.in_(accounts))
        .order_by(_A.c.id)
        .with_for_update(key_share=True)
    )


def _positive(amount_mc: int) -> None:
    if not isinstance(amount_mc, int) or isinstance(amount_mc, bool):
        raise TypeError("ledger amounts are integer millicredits")
    if amount_mc <= 0:
        raise ValidationError("amount must be positive", {"amount_mc": amount_mc})


def _check_replay(existing: Entry, kind: str, amount_mc: int | None) -> Entry:
    if existing.kind != kind or (amount_mc is not None and existing.amount_mc != amount_mc):
        raise LedgerConflict(
            f"ledger ref {existing.ref!r} already used for {existing.kind} of {existing.amount_mc} mc"
        )
    return existing


def _post(
    session: Session,
    account_id: str,
    kind: Kind,
    amount_mc: int,
    ref: str,
    memo: str | None,
    stmt: Update,
) -> Entry:
    """Run ``stmt`` (a conditional account UPDATE … RETURNING balance, held) and append
    the entry, in a savepoint; the UNIQUE (account_id, ref) makes a replay return the
    original.

    No pre-select: the common case (a new ref) costs one UPDATE and one INSERT.
    """
    try:
        with session.begin_nested():
            after = _apply(session, stmt, account_id, amount_mc)
            if after is None:
                # Nothing was written. A replay of an entry posted when the
                # balance allowed it is still a replay, not a refusal.
                existing = find(session, account_id, ref)
                if existing:
                    return _check_replay(existing, kind, amount_mc)
                bal = balance(session, account_id)  # raises NotFound
                raise InsufficientBalance(
                    "not enough credits",
                    {"needed_mc": amount_mc, "available_mc": bal.available_mc},
                )
            return _append(session, account_id, kind, amount_mc, ref, after, memo)
    except IntegrityError:
        # The ref exists (a replay, or a concurrent poster won): ours was rolled back.
        existing = find(session, account_id, ref)
        if existing is None:
            raise
        return _check_replay(existing, kind, amount_mc)


def _settle(
    session: Session, account_id: str, hold_ref: str, kind: Kind, ref: str, memo: str | None
) -> Entry:
    """Capture or release a hold: one UPDATE … RETURNING and one INSERT in a savepoint.

    The UNIQUE ``settles_id`` makes a second settlement of the same hold fail;
    we then tell a replay (same ref) from a conflict (settled the other way).
    """
    hold_row = session.execute(_HOLD_ROW, {"p_account": account_id, "p_ref": hold_ref}).first()
    if hold_row is None:
        raise NotFound(f"no hold {hold_ref!r}", {"hold_ref": hold_ref})
    hold_id, amount = int(hold_row[0]), int(hold_row[1])
    stmt = _CAPTURE if kind == Kind.CAPTURE else _RELEASE
    try:
        with session.begin_nested():
            after = _apply(session, stmt, account_id, amount)
            if after is None:
                raise NotFound(f"unknown account {account_id}", {"account_id": account_id})
            return _append(session, account_id, kind, amount, ref, after, memo, settles_id=hold_id)
    except IntegrityError:
        # This exact settlement was posted before (a replay), or the hold was
        # settled the other way (a conflict), or a CHECK refused the update
        # because a concurrent settlement already moved the balance.
        existing = find(session, account_id, ref)
        if existing is not None:
            return _check_replay(existing, kind, None)
        _raise_if_settled(session, hold_id, hold_ref)
        raise


def _append(
    session: Tx,
    account_id: str,
    kind: str,
    amount_mc: int,
    ref: str,
    after: tuple[int, int],
    memo: str | None,
    *,
    settles_id: int | None = None,
) -> Entry:
    """Insert one ledger entry recording the account's new (balance, held)."""
    now = _now(session)
    row = _entry_row(account_id, kind, amount_mc, ref, after, settles_id, memo, now)
    ((entry_id,),) = _APPEND.run(session, row)
    return Entry(
        entry_id, account_id, str(kind), amount_mc, ref, settles_id, after[0], after[1], memo, now
    )


def _entry_row(
    account_id: str,
    kind: str,
    amount_mc: int,
    ref: str,
    after: tuple[int, int],
    settles_id: int | None,
    memo: str | None,
    now: datetime,
) -> dict[str, Any]:
    """A ``ledger_entries`` row recording the account's (balance, held) after it."""
    return {
        "account_id": account_id,
        "kind": str(kind),
        "amount_mc": amount_mc,
        "ref": ref,
        "settles_id": settles_id,
        "balance_after_mc": after[0],
        "held_after_mc": after[1],
        "memo": memo,
        "created_at": now,
    }


def _append_many(
    session: Session,
    rows: Sequence[tuple[str, str, int, str, tuple[int, int], int | None]],
    memo: str | None,
) -> list[Entry]:
    """Insert ledger entries ``(account, kind, amount, ref, (balance, held) after,
    settles_id)`` in one statement; the Entries in the same order."""
    now = _now(session)
    params = [
        _entry_row(account_id, kind, amount_mc, ref, after, settles_id, memo, now)
        for account_id, kind, amount_mc, ref, after, settles_id in rows
    ]
    ids = session.execute(_APPEND_MANY, params).scalars().all()
    return [
        Entry(entry_id, a, str(k), amt, ref, settles, after[0], after[1], memo, now)
        for entry_id, (a, k, amt, ref, after, settles) in zip(ids, rows, strict=True)
    ]


def _apply(
    session: Session, stmt: Update, account_id: str, amount_mc: int
) -> tuple[int, int] | None:
    """Run a prebuilt account UPDATE; the new (balance, held), or None if it matched nothing."""
    row = session.execute(stmt, {"p_account": account_id, "p_amount": amount_mc}).first()
    return (int(row[0]), int(row[1])) if row is not None else None


def _raise_if_settled(session: Session, hold_id: int, hold_ref: str) -> None:
    settled = session.scalar(select(LedgerEntry).where(LedgerEntry.settles_id == hold_id))
    if settled is not None:
        raise LedgerConflict(
            f"hold {hold_ref!r} was already settled by {settled.kind} {settled.ref!r}"
        )


def _now(session: Tx) -> datetime:
    clock = session.info.get("clock")
    if clock is not None:
        return clock.now()  # type: ignore[no-any-return]
    from walkeep.clock import utcnow

    return utcnow()
