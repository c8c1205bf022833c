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
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from sqlalchemy import select

from walkeep import ledger
from walkeep.db import Database
from walkeep.db.models import Account, LedgerEntry
from walkeep.errors import NotFound, ValidationError
from walkeep.ledger import CREDIT_KINDS, Kind

MAX_DAYS = 366 * 5


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
    if kind == Kind.DEBIT:
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


def statement(db: Database, account_id: str, start: date, end: date) -> Statement:
    lo, hi = period(start, end)
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
        rows = s.scalars(
            select(LedgerEntry)
            .where(
                LedgerEntry.account_id == account_id,
                LedgerEntry.created_at >= lo,
                LedgerEntry.created_at < hi,
            )
            .order_by(LedgerEntry.id)
        ).all()
        lines_src = [
            (r.created_at, r.kind, r.ref, r.memo, r.amount_mc, r.balance_after_mc, r.held_after_mc)
            for r in rows
        ]
    opening_bal, opening_held = (int(before[0]), int(before[1])) if before else (0, 0)
    bal, held = opening_bal, opening_held
    reconciled = True
    lines: list[StatementLine] = []
    totals: dict[str, int] = {}
    for at, kind, ref, memo, amount, bal_after, held_after in lines_src:
        d_bal, d_held = effects(kind, int(amount))
        bal += d_bal
        held += d_held
        if bal != bal_after or held != held_after:
            reconciled = False
            bal, held = int(bal_after), int(held_after)  # follow the ledger, flag the gap
        totals[kind] = totals.get(kind, 0) + d_bal
        lines.append(
            StatementLine(at, kind, ref, memo, int(amount), d_bal, d_held, bal_after, held_after)
        )
    return Statement(
        account_id=account_id,
        account_name=name,
        start=start,
        end=end,
        opening_balance_mc=opening_bal,
        opening_held_mc=opening_held,
        closing_balance_mc=bal,
        closing_held_mc=held,
        lines=lines,
        totals_by_kind=totals,
        reconciled=reconciled,
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


def to_csv(st: Statement) -> str:
    """One row per entry, framed by opening and closing rows, so a spreadsheet can
    check that the opening balance plus the changes equals the closing balance."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_HEADER)
    w.writerow(
        [
            f"{st.start.isoformat()}T00:00:00+00:00",
            "opening",
            "",
            _cell(f"statement {st.account_name} ({st.account_id}) {st.start} to {st.end}"),
            "",
            "",
            "",
            credits_str(st.opening_balance_mc),
            credits_str(st.opening_held_mc),
            credits_str(st.opening_balance_mc - st.opening_held_mc),
        ]
    )
    for line in st.lines:
        w.writerow(
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
    w.writerow(
        [
            f"{(st.end + timedelta(days=1)).isoformat()}T00:00:00+00:00",
            "closing",
            "",
            "reconciled" if st.reconciled else "NOT RECONCILED: the ledger has a gap",
            "",
            credits_str(st.net_change_mc, signed=True),
            credits_str(st.closing_held_mc - st.opening_held_mc, signed=True),
            credits_str(st.closing_balance_mc),
            credits_str(st.closing_held_mc),
            credits_str(st.closing_balance_mc - st.closing_held_mc),
        ]
    )
    return buf.getvalue()
