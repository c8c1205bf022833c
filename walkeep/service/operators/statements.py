"""Account statements: every ledger entry of a period, with its running balance.

A statement reconciles by construction and is checked anyway: the opening
balance is the ``balance_after_mc`` of the last entry before the period, each
line's effect is derived from its kind, and every line must land exactly on
the ``balance_after_mc`` the ledger recorded — so opening + Σ effects =
closing, to the millicredit. A mismatch is reported, never papered over.

Days are UTC calendar days; ``end`` is inclusive.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from sqlalchemy import select

from walkeep import ledger
from walkeep.db import Database
from walkeep.db.models import Account, LedgerEntry
from walkeep.errors import NotFound, ValidationError
from walkeep.ledger import CREDIT_KINDS, DEBIT_KINDS, Kind

MAX_DAYS = 366 * 5
STREAM_ROWS = 1000  # rows fetched (and CSV lines sent) at a time


@dataclass(frozen=True, slots=True)
class StatementLine:
    at: datetime
    kind: str
    ref: str
    memo: str | None
    amount_mc: int  # the entry's magnitude
    balance_effect_mc: int  # signed change to the balance
    held_effect_mc: int  # signed change to held credits
    balance_after_mc: int
    held_after_mc: int

    @property
    def available_after_mc(self) -> int:
        return self.balance_after_mc - self.held_after_mc


@dataclass(frozen=True, slots=True)
class Statement:
    account_id: str
    account_name: str
    start: date
    end: date  # inclusive
    opening_balance_mc: int
    opening_held_mc: int
    closing_balance_mc: int
    closing_held_mc: int
    lines: list[StatementLine]
    totals_by_kind: dict[str, int]  # signed balance effect per kind
    reconciled: bool

    @property
    def net_change_mc(self) -> int:
        return sum(line.balance_effect_mc for line in self.lines)


def effects(kind: str, amount_mc: int) -> tuple[int, int]:
    """(balance effect, held effect) of one entry — the ledger's own rules."""
    if kind in CREDIT_KINDS:
        return amount_mc, 0
    if kind in DEBIT_KINDS:
        return -amount_mc, 0
    if kind == Kind.HOLD:
        return 0, amount_mc
    if kind == Kind.CAPTURE:
        return -amount_mc, -amount_mc
    if kind == Kind.RELEASE:
        return 0, -amount_mc
    raise ValueError(f"unknown ledger kind {kind!r}")


def parse_day(text: str, field: str) -> date:
    """A UTC calendar day written YYYY-MM-DD; anything else is a VALIDATION_ERROR."""
    try:
        return date.fromisoformat(text.strip())
    except (ValueError, AttributeError):
        raise ValidationError(
            f"{field} must be a date written YYYY-MM-DD (UTC), got {text!r}",
            {"field": field, "value": str(text)},
        ) from None


def period(start: date, end: date) -> tuple[datetime, datetime]:
    """[start 00:00 UTC, end+1 00:00 UTC): the inclusive day range as instants."""
    if end < start:
        raise ValidationError(
            f"the period ends ({end}) before it starts ({start})",
            {"from": start.isoformat(), "to": end.isoformat()},
        )
    if (end - start).days >= MAX_DAYS:
        raise ValidationError(f"a statement covers at most {MAX_DAYS} days", {"max_days": MAX_DAYS})
    lo = datetime(start.year, start.month, start.day, tzinfo=UTC)
    hi = datetime(end.year, end.month, end.day, tzinfo=UTC) + timedelta(days=1)
    return lo, hi


@dataclass
class StatementRun:
    """A statement being produced: the opening is known up front, the closing figures
    accumulate as lines stream past (so a year of a busy account never sits in memory)."""

    account_id: str
    account_name: str
    start: date
    end: date
    opening_balance_mc: int
    opening_held_mc: int
    closing_balance_mc: int
    closing_held_mc: int
    totals_by_kind: dict[str, int]
    reconciled: bool = True
    lines: int = 0

    @property
    def net_change_mc(self) -> int:
        return self.closing_balance_mc - self.opening_balance_mc


def open_statement(db: Database, account_id: str, start: date, end: date) -> StatementRun:
    """Validate the period and the account; read the opening balance."""
    lo, _ = period(start, end)
    with db.read() as s:
        name = s.scalar(select(Account.name).where(Account.id == account_id))
        if name is None:
            raise NotFound(f"unknown account {account_id}", {"account_id": account_id})
        before = s.execute(
            select(LedgerEntry.balance_after_mc, LedgerEntry.held_after_mc)
            .where(LedgerEntry.account_id == account_id, LedgerEntry.created_at < lo)
            .order_by(LedgerEntry.id.desc())
            .limit(1)
        ).one_or_none()
    bal, held = (int(before[0]), int(before[1])) if before else (0, 0)
    return StatementRun(account_id, name, start, end, bal, held, bal, held, {})


def iter_lines(db: Database, run: StatementRun) -> Iterator[StatementLine]:
    """The period's entries in ledger order, each checked against the ledger's own
    ``balance_after_mc``/``held_after_mc``; updates ``run``'s closing figures as it goes."""
    lo, hi = period(run.start, run.end)
    cols = (
        LedgerEntry.created_at,
        LedgerEntry.kind,
        LedgerEntry.ref,
        LedgerEntry.memo,
        LedgerEntry.amount_mc,
        LedgerEntry.balance_after_mc,
        LedgerEntry.held_after_mc,
    )
    query = (
        select(*cols)
        .where(
            LedgerEntry.account_id == run.account_id,
            LedgerEntry.created_at >= lo,
            LedgerEntry.created_at < hi,
        )
        .order_by(LedgerEntry.id)
        .execution_options(yield_per=STREAM_ROWS)
    )
    with db.read() as s:
        for at, kind, ref, memo, amount, bal_after, held_after in s.execute(query):
            d_bal, d_held = effects(kind, int(amount))
            bal = run.closing_balance_mc + d_bal
            held = run.closing_held_mc + d_held
            if bal != bal_after or held != held_after:
                run.reconciled = False  # follow the ledger, flag the gap
                bal, held = int(bal_after), int(held_after)
            run.closing_balance_mc, run.closing_held_mc = bal, held
            run.totals_by_kind[kind] = run.totals_by_kind.get(kind, 0) + d_bal
            run.lines += 1
            yield StatementLine(
                at, kind, ref, memo, int(amount), d_bal, d_held, int(bal_after), int(held_after)
            )


def statement(db: Database, account_id: str, start: date, end: date) -> Statement:
    """The whole statement in memory (CLI text output and tests)."""
    run = open_statement(db, account_id, start, end)
    lines = list(iter_lines(db, run))
    return Statement(
        account_id=run.account_id,
        account_name=run.account_name,
        start=run.start,
        end=run.end,
        opening_balance_mc=run.opening_balance_mc,
        opening_held_mc=run.opening_held_mc,
        closing_balance_mc=run.closing_balance_mc,
        closing_held_mc=run.closing_held_mc,
        lines=lines,
        totals_by_kind=dict(run.totals_by_kind),
        reconciled=run.reconciled,
    )


def credits_str(mc: int, *, signed: bool = False) -> str:
    """Exact credits with three decimals (1 credit = 1000 mc = 1 US cent)."""
    sign = "-" if mc < 0 else ("+" if signed and mc > 0 else "")
    whole, frac = divmod(abs(mc), ledger.MC_PER_CREDIT)
    return f"{sign}{whole}.{frac:03d}"


CSV_HEADER = [
    "time_utc",
    "kind",
    "reference",
    "memo",
    "amount_credits",
    "balance_change_credits",
    "held_change_credits",
    "balance_credits",
    "held_credits",
    "available_credits",
]


def _cell(text: str) -> str:
    """Text a spreadsheet will not run as a formula (memos and refs are free text)."""
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


def _row(values: list[str]) -> str:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow(values)
    return buf.getvalue()


def csv_chunks(db: Database, run: StatementRun) -> Iterator[str]:
    """The statement as CSV, streamed: one row per entry, framed by opening and closing
    rows, so a spreadsheet can check that opening + changes = closing."""
    yield _row(CSV_HEADER)
    yield _row(
        [
            f"{run.start.isoformat()}T00:00:00+00:00",
            "opening",
            "",
            _cell(f"statement {run.account_name} ({run.account_id}) {run.start} to {run.end}"),
            "",
            "",
            "",
            credits_str(run.opening_balance_mc),
            credits_str(run.opening_held_mc),
            credits_str(run.opening_balance_mc - run.opening_held_mc),
        ]
    )
    batch: list[str] = []
    for line in iter_lines(db, run):
        batch.append(
            _row(
                [
                    line.at.astimezone(UTC).isoformat(),
                    line.kind,
                    _cell(line.ref),
                    _cell(line.memo or ""),
                    credits_str(line.amount_mc),
                    credits_str(line.balance_effect_mc, signed=True),
                    credits_str(line.held_effect_mc, signed=True),
                    credits_str(line.balance_after_mc),
                    credits_str(line.held_after_mc),
                    credits_str(line.available_after_mc),
                ]
            )
        )
        if len(batch) >= STREAM_ROWS:
            yield "".join(batch)
            batch = []
    yield "".join(batch)
    yield _row(
        [
            f"{(run.end + timedelta(days=1)).isoformat()}T00:00:00+00:00",
            "closing",
            "",
            "reconciled" if run.reconciled else "NOT RECONCILED: the ledger has a gap",
            "",
            credits_str(run.net_change_mc, signed=True),
            credits_str(run.closing_held_mc - run.opening_held_mc, signed=True),
            credits_str(run.closing_balance_mc),
            credits_str(run.closing_held_mc),
            credits_str(run.closing_balance_mc - run.closing_held_mc),
        ]
    )


def to_csv(db: Database, account_id: str, start: date, end: date) -> str:
    return "".join(csv_chunks(db, open_statement(db, account_id, start, end)))
