"""What operators and admins see: account summaries, the account and admin views,
one-time console sign-in links, and the worker's last job runs.

Transport-free: the web console (``walkeep/api/console.py``) and the CLI
(``walkeep account list``) render these objects; neither computes anything.
Every figure comes from the same tables the tools read (ledger, memories,
blobs, renewals, checkout sessions), so the console can never disagree with
``check_balance`` or ``check_runway``.

Why one file: everything the console shows and the sessions that gate it, answered from
the database in one place; the pages (walkeep/api/console.py) only render.
"""

from __future__ import annotations

import hashlib
import math
import secrets
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import case, func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from walkeep import ids, ledger, lifecycle
from walkeep.db import Database, rowcount
from walkeep.db.models import (
    Account,
    ApiKey,
    Blob,
    CheckoutSession,
    ConsoleLink,
    ConsoleSession,
    JobRun,
    LedgerEntry,
    Memory,
    Renewal,
    RenewalItem,
    SignInAttempts,
)
from walkeep.errors import NotFound, Unauthorized, ValidationError
from walkeep.lifecycle import LISTED, BlobStatus, MemoryStatus
from walkeep.service import sealed
from walkeep.service.renewal_price import renewal_burn_mc_per_epoch
from walkeep.service.runtime import Runtime
from walkeep.service.tools.balance import check_balance

MEMORIES_PAGE_SIZE = 25
RECENT_ROWS = 20
HISTORY_MAX_ENTRIES = 2000
ADMIN_DAYS = 30
LINK_PREFIX = "wkc_"
# The console shows these statuses, in this order (a failed write is not a memory).
STATUS_ORDER = (
    MemoryStatus.ACTIVE,
    MemoryStatus.PAUSED,
    MemoryStatus.NO_RENEW,
    MemoryStatus.EXPIRED,
    MemoryStatus.STORING,
)


# --- account summaries (admin table and `walkeep account list`) ---------------------------


@dataclass(frozen=True, slots=True)
class AccountSummary:
    account_id: str
    name: str
    balance_mc: int
    held_mc: int
    memories: int
    by_status: dict[str, int]
    min_runway_epochs: int | None
    last_renewal_at: datetime | None
    last_renewal_tx: str | None
    disabled: bool
    # Expired memories that were paid for (not forgotten): their runway ran out.
    lapsed: int = 0

    @property
    def available_mc(self) -> int:
        return self.balance_mc - self.held_mc

    @property
    def paused(self) -> int:
        return self.by_status.get(MemoryStatus.PAUSED, 0)

    @property
    def needs_action(self) -> bool:
        """Lapsed or paused memories: an operator must top up (and maybe re-store)."""
        return bool(self.lapsed or self.paused)

    def to_json(self) -> dict[str, object]:
        return {
            "account_id": self.account_id,
            "name": self.name,
            "balance_credits": ledger.credits_display(self.available_mc),
            "balance_usd": ledger.mc_to_usd_str(self.available_mc),
            "held_credits": ledger.credits_display(self.held_mc),
            "memories": self.memories,
            "active": self.by_status.get(MemoryStatus.ACTIVE, 0),
            "paused": self.paused,
            "no_renew": self.by_status.get(MemoryStatus.NO_RENEW, 0),
            "expired": self.by_status.get(MemoryStatus.EXPIRED, 0),
            "lapsed": self.lapsed,
            "storing": self.by_status.get(MemoryStatus.STORING, 0),
            "min_runway_epochs": self.min_runway_epochs,
            "last_renewal_at": self.last_renewal_at.isoformat() if self.last_renewal_at else None,
            "last_renewal_tx": self.last_renewal_tx,
            "disabled": self.disabled,
        }


def worst_first_key(a: AccountSummary) -> tuple[int, int, int, str]:
    """What an operator must act on first: accounts with lapsed or paused memories, then
    the least runway, then the smallest balance. (An account whose memories had all
    lapsed has no runway left to compare, and used to sort below a healthy one.)"""
    runway = a.min_runway_epochs if a.min_runway_epochs is not None else 1 << 30
    return (0 if a.needs_action else 1, runway, a.available_mc, a.name)


def account_summaries(rt: Runtime, account_id: str | None = None) -> list[AccountSummary]:
    """Every account (or one) with balance, memories by status, minimum runway and last
    renewal, worst first. Four grouped queries, whatever the number of accounts."""
    current = rt.chain.current_epoch()
    with rt.db.read() as s:
        acct_q = select(Account.id, Account.name, Account.balance_mc, Account.held_mc).add_columns(
            Account.disabled_at
        )
        if account_id is not None:
            acct_q = acct_q.where(Account.id == account_id)
        accounts = s.execute(acct_q).all()
        if account_id is not None and not accounts:
            raise NotFound(f"unknown account {account_id}", {"account_id": account_id})
        scope = [a[0] for a in accounts] if account_id is not None else None

        # Status as check_runway shows it: a blob past its end_epoch is expired now.
        lapsed = (Blob.end_epoch <= current) & Memory.status.in_(
            [MemoryStatus.ACTIVE, MemoryStatus.PAUSED, MemoryStatus.NO_RENEW]
        )
        # Let go by choice: forgotten, or past the expiry it was stored with (an expiry is
        # asked for; only a lapse needs an operator).
        forgotten = Memory.forgotten_at.is_not(None) | (
            Memory.expires_at.is_not(None) & (Memory.expires_at <= rt.clock.now())
        )
        counts_q = (
            select(Memory.account_id, Memory.status, lapsed, forgotten, func.count())
            .outerjoin(Blob, Blob.id == Memory.blob_pk)
            .where(Memory.status.in_(list(LISTED)))
            .group_by(Memory.account_id, Memory.status, lapsed, forgotten)
        )
        runway_q = (
            select(Memory.account_id, func.min(Blob.end_epoch))
            .join(Blob, Blob.id == Memory.blob_pk)
            .where(
                Memory.status.in_([MemoryStatus.ACTIVE, MemoryStatus.PAUSED]),
                Blob.end_epoch > current,
            )
            .group_by(Memory.account_id)
        )
        renewal_q = (
            select(RenewalItem.account_id, func.max(Renewal.id))
            .join(Renewal, Renewal.id == RenewalItem.renewal_id)
            .where(Renewal.status == "confirmed", RenewalItem.account_id.is_not(None))
            .group_by(RenewalItem.account_id)
        )
        if scope is not None:
            counts_q = counts_q.where(Memory.account_id.in_(scope))
            runway_q = runway_q.where(Memory.account_id.in_(scope))
            renewal_q = renewal_q.where(RenewalItem.account_id.in_(scope))
        by_status: dict[str, dict[str, int]] = defaultdict(dict)
        lapsed_paid: dict[str, int] = defaultdict(int)
        for acct, status, is_lapsed, was_forgotten, n in s.execute(counts_q):
            st = MemoryStatus.EXPIRED if is_lapsed else status
            by_status[acct][st] = by_status[acct].get(st, 0) + int(n)
            if st == MemoryStatus.EXPIRED and not was_forgotten:
                lapsed_paid[acct] += int(n)
        min_end = {acct: int(end) for acct, end in s.execute(runway_q) if end is not None}
        last_ids = {acct: rid for acct, rid in s.execute(renewal_q)}
        renewal_info: dict[int, tuple[datetime | None, str]] = {}
        if last_ids:
            for rid, settled, digest in s.execute(
                select(Renewal.id, Renewal.settled_at, Renewal.digest).where(
                    Renewal.id.in_(list(set(last_ids.values())))
                )
            ):
                renewal_info[rid] = (settled, digest)
    out = []
    for acct, name, bal, held, disabled in accounts:
        statuses = by_status.get(acct, {})
        last = renewal_info.get(last_ids[acct]) if acct in last_ids else None
        out.append(
            AccountSummary(
                account_id=acct,
                name=name,
                balance_mc=int(bal),
                held_mc=int(held),
                memories=sum(statuses.values()),
                by_status=statuses,
                min_runway_epochs=lifecycle.runway(min_end[acct], current)
                if acct in min_end
                else None,
                last_renewal_at=last[0] if last else None,
                last_renewal_tx=last[1] if last else None,
                disabled=disabled is not None,
                lapsed=lapsed_paid.get(acct, 0),
            )
        )
    out.sort(key=worst_first_key)
    return out


# --- the account page ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MemoryRow:
    memory_id: str
    namespace: str
    size_bytes: int
    status: str
    end_epoch: int | None
    runway_epochs: int | None
    last_renewal_tx: str | None
    last_renewal_url: str | None
    last_renewal_at: datetime | None


@dataclass(frozen=True, slots=True)
class RenewalRow:
    digest: str
    network: str
    status: str
    explorer_url: str
    at: datetime
    blobs: int
    cost_mc: int
    epochs_added: int


@dataclass(frozen=True, slots=True)
class TopUpRow:
    checkout_id: str
    amount_usd: str
    status: str
    created_at: datetime
    url: str | None  # still payable


@dataclass(frozen=True, slots=True)
class Point:
    at: datetime
    mc: int


@dataclass
class AccountView:
    summary: AccountSummary
    current_epoch: int
    epoch_seconds: int
    runway_words: str
    burn_mc_per_epoch: int
    funded_epochs: int | None  # renewals the balance pays for, at current usage
    paid_until: datetime | None  # when the least-runway memory lapses if never renewed again
    funded_until: datetime | None  # when the balance stops paying renewals, at current usage
    history: list[Point]
    projection: list[Point]
    memories: list[MemoryRow]
    page: int
    pages: int
    renewals: list[RenewalRow]
    topups: list[TopUpRow]
    now: datetime


def account_view(rt: Runtime, account_id: str, *, page: int = 1) -> AccountView:
    """Everything on an account's console page, read in a few bounded queries."""
    summary = account_summaries(rt, account_id)[0]
    now = rt.clock.now()
    info = rt.chain.epoch_info()
    current = info.epoch
    words = check_balance(rt, account_id).est_runway_funded
    burn, min_runway = renewal_burn_mc_per_epoch(rt, account_id)
    available = summary.available_mc
    epoch = timedelta(seconds=info.duration_seconds)
    funded = available // burn if burn > 0 else None
    paid_until = now + epoch * min_runway if min_runway is not None else None
    funded_until = now + epoch * funded if funded is not None else None

    with rt.db.read() as s:
        history_rows = s.execute(
            select(LedgerEntry.created_at, LedgerEntry.balance_after_mc, LedgerEntry.held_after_mc)
            .where(LedgerEntry.account_id == account_id)
            .order_by(LedgerEntry.id.desc())
            .limit(HISTORY_MAX_ENTRIES)
        ).all()
        total = (
            s.scalar(
                select(func.count())
                .select_from(Memory)
                .where(Memory.account_id == account_id, Memory.status.in_(list(LISTED)))
            )
            or 0
        )
        pages = max(1, -(-total // MEMORIES_PAGE_SIZE))
        page = min(max(1, page), pages)
        mem_rows = s.execute(
            select(Memory, Blob, Renewal.settled_at)
            .outerjoin(Blob, Blob.id == Memory.blob_pk)
            .outerjoin(Renewal, Renewal.digest == Blob.last_renewal_tx)
            .where(Memory.account_id == account_id, Memory.status.in_(list(LISTED)))
            .order_by(Memory.accepted_at.desc(), Memory.id)
            .offset((page - 1) * MEMORIES_PAGE_SIZE)
            .limit(MEMORIES_PAGE_SIZE)
        ).all()
        renewal_rows = s.execute(
            select(
                Renewal.digest,
                Renewal.network,
                Renewal.status,
                Renewal.explorer_url,
                func.coalesce(Renewal.settled_at, Renewal.created_at),
                func.count(RenewalItem.id),
                func.sum(RenewalItem.cost_mc),
                func.max(RenewalItem.epochs),
            )
            .join(RenewalItem, RenewalItem.renewal_id == Renewal.id)
            .where(RenewalItem.account_id == account_id)
            .group_by(
                Renewal.id,
                Renewal.digest,
                Renewal.network,
                Renewal.status,
                Renewal.explorer_url,
                Renewal.settled_at,
                Renewal.created_at,
            )
            .order_by(Renewal.id.desc())
            .limit(RECENT_ROWS)
        ).all()
        topup_rows = s.scalars(
            select(CheckoutSession)
            .where(CheckoutSession.account_id == account_id)
            .order_by(CheckoutSession.created_at.desc(), CheckoutSession.id)
            .limit(RECENT_ROWS)
        ).all()
        topups = [
            TopUpRow(
                checkout_id=t.id,
                amount_usd=f"{t.amount_cents // 100}.{t.amount_cents % 100:02d}",
                status=t.status,
                created_at=t.created_at,
                url=t.url if t.status == "open" and t.expires_at > now else None,
            )
            for t in topup_rows
        ]

    history = [Point(at, int(bal) - int(held)) for at, bal, held in reversed(history_rows)]
    if history:
        history.append(Point(now, available))
    projection = _projection(now, available, burn, min_runway or 0, epoch)

    memories = []
    names = sealed.namespace_names(rt, account_id, {m.namespace for m, _, _ in mem_rows})
    for m, b, renewed_at in mem_rows:
        status = m.status
        if (
            b is not None
            and status in (MemoryStatus.ACTIVE, MemoryStatus.PAUSED, MemoryStatus.NO_RENEW)
            and b.end_epoch <= current
        ):
            status = MemoryStatus.EXPIRED
        memories.append(
            MemoryRow(
                memory_id=m.id,
                namespace=names[m.namespace],
                size_bytes=m.size_bytes,
                status=status,
                end_epoch=b.end_epoch if b else None,
                runway_epochs=lifecycle.runway(b.end_epoch, current) if b else None,
                last_renewal_tx=b.last_renewal_tx if b else None,
                last_renewal_url=rt.chain.explorer_tx_url(b.last_renewal_tx)
                if b and b.last_renewal_tx
                else None,
                last_renewal_at=renewed_at,
            )
        )
    renewals = [
        RenewalRow(
            digest=digest,
            network=network,
            status=status,
            explorer_url=url or rt.chain.explorer_tx_url(digest),
            at=at,
            blobs=int(n),
            cost_mc=int(cost or 0),
            epochs_added=int(k or 0),
        )
        for digest, network, status, url, at, n, cost, k in renewal_rows
    ]
    return AccountView(
        summary=summary,
        current_epoch=current,
        epoch_seconds=info.duration_seconds,
        runway_words=words,
        burn_mc_per_epoch=burn,
        funded_epochs=funded,
        paid_until=paid_until,
        funded_until=funded_until,
        history=history,
        projection=projection,
        memories=memories,
        page=page,
        pages=pages,
        renewals=renewals,
        topups=topups,
        now=now,
    )


def _projection(
    now: datetime, available: int, burn: int, min_runway: int, epoch: timedelta
) -> list[Point]:
    """The balance from now on if usage stays as it is: it falls by ``burn`` per epoch
    until it can no longer pay a renewal; already-paid runway then still counts down."""
    if burn <= 0:
        return [Point(now, available), Point(now + epoch * max(5, min_runway), available)]
    funded = available // burn
    points = [Point(now, available)]
    end = now + epoch * funded
    points.append(Point(end, available - funded * burn))
    if min_runway:
        points.append(Point(end + epoch * min_runway, available - funded * burn))
    return points


# --- the admin page ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DayTotal:
    day: str  # YYYY-MM-DD, UTC
    renewals: int
    blobs: int
    wal_frost: int
    cost_mc: int


@dataclass(frozen=True, slots=True)
class HoldRow:
    account_name: str
    ref: str
    amount_mc: int
    created_at: datetime


@dataclass(frozen=True, slots=True)
class OrphanRow:
    blob_object_id: str
    blob_id: str
    end_epoch: int
    account_id: str | None


@dataclass(frozen=True, slots=True)
class FailedWriteRow:
    memory_id: str
    account_name: str
    reason: str | None
    at: datetime


@dataclass(frozen=True, slots=True)
class JobRunRow:
    name: str
    ran: bool
    ok: bool
    finished_at: datetime | None
    duration_ms: int | None
    summary: str | None
    last_ok_at: datetime | None
    worker: str | None


@dataclass
class AdminView:
    accounts: list[AccountSummary]
    days: list[DayTotal]
    open_holds: int
    open_holds_mc: int
    holds: list[HoldRow]
    orphans: int
    orphan_rows: list[OrphanRow]
    failed_writes: int
    failed_rows: list[FailedWriteRow]
    jobs: list[JobRunRow]
    current_epoch: int
    network: str
    now: datetime


def admin_view(rt: Runtime, job_names: list[str] | None = None) -> AdminView:
    """The whole deployment at a glance; each list is bounded."""
    now = rt.clock.now()
    summaries = account_summaries(rt)
    since = datetime(now.year, now.month, now.day, tzinfo=UTC) - timedelta(days=ADMIN_DAYS - 1)
    with rt.db.read() as s:
        per_day: dict[str, list[int]] = {}
        for at, blobs, wal, cost in s.execute(
            select(Renewal.settled_at, Renewal.blob_count, Renewal.wal_cost_frost, Renewal.cost_mc)
            .where(Renewal.status == "confirmed", Renewal.settled_at >= since)
            .order_by(Renewal.settled_at)
        ):
            if at is None:
                continue
            d = per_day.setdefault(at.astimezone(UTC).date().isoformat(), [0, 0, 0, 0])
            d[0] += 1
            d[1] += int(blobs)
            d[2] += int(wal or 0)
            d[3] += int(cost)
        days = []
        for i in range(ADMIN_DAYS):
            key = (since + timedelta(days=i)).date().isoformat()
            r, b, w, c = per_day.get(key, [0, 0, 0, 0])
            days.append(DayTotal(key, r, b, w, c))

        settled = select(LedgerEntry.settles_id).where(LedgerEntry.settles_id.is_not(None))
        open_hold = (LedgerEntry.kind == ledger.Kind.HOLD) & LedgerEntry.id.not_in(settled)
        n_holds, sum_holds = s.execute(
            select(func.count(), func.coalesce(func.sum(LedgerEntry.amount_mc), 0)).where(open_hold)
        ).one()
        holds = [
            HoldRow(name, ref, int(amount), at)
            for name, ref, amount, at in s.execute(
                select(Account.name, LedgerEntry.ref, LedgerEntry.amount_mc, LedgerEntry.created_at)
                .join(Account, Account.id == LedgerEntry.account_id)
                .where(open_hold)
                .order_by(LedgerEntry.id)
                .limit(RECENT_ROWS)
            )
        ]
        n_orphans = (
            s.scalar(select(func.count()).select_from(Blob).where(Blob.status == BlobStatus.ORPHAN))
            or 0
        )
        orphans = [
            OrphanRow(oid, bid, int(end), acct)
            for oid, bid, end, acct in s.execute(
                select(Blob.blob_object_id, Blob.blob_id, Blob.end_epoch, Blob.account_id)
                .where(Blob.status == BlobStatus.ORPHAN)
                .order_by(Blob.id.desc())
                .limit(RECENT_ROWS)
            )
        ]
        n_failed = (
            s.scalar(
                select(func.count()).select_from(Memory).where(Memory.status == MemoryStatus.FAILED)
            )
            or 0
        )
        failed = [
            FailedWriteRow(mid, name, reason, at)
            for mid, name, reason, at in s.execute(
                select(Memory.id, Account.name, Memory.failure_reason, Memory.status_changed_at)
                .join(Account, Account.id == Memory.account_id)
                .where(Memory.status == MemoryStatus.FAILED)
                .order_by(Memory.status_changed_at.desc())
                .limit(RECENT_ROWS)
            )
        ]
        runs = {r.name: r for r in s.scalars(select(JobRun))}
    names = list(job_names or []) + sorted(set(runs) - set(job_names or []))
    jobs = []
    for name in names:
        run = runs.get(name)
        jobs.append(
            JobRunRow(
                name=name,
                ran=run is not None,
                ok=bool(run and run.ok),
                finished_at=run.finished_at if run else None,
                duration_ms=run.duration_ms if run else None,
                summary=run.summary if run else None,
                last_ok_at=run.last_ok_at if run else None,
                worker=run.worker if run else None,
            )
        )
    return AdminView(
        accounts=summaries,
        days=days,
        open_holds=int(n_holds),
        open_holds_mc=int(sum_holds),
        holds=holds,
        orphans=int(n_orphans),
        orphan_rows=orphans,
        failed_writes=int(n_failed),
        failed_rows=failed,
        jobs=jobs,
        current_epoch=rt.chain.current_epoch(),
        network=rt.chain.network,
        now=now,
    )


# --- job runs (written by the worker, read by the admin page) --------------------------------


def record_job_run(
    db: Database,
    name: str,
    *,
    started_at: datetime,
    duration_ms: int,
    ok: bool,
    summary: str | None,
    worker: str | None,
) -> None:
    """Upsert the latest run of ``name``: update first, insert when it is the first run."""
    finished = db.clock.now()
    values = {
        "worker": (worker or "")[:100] or None,
        "started_at": started_at,
        "finished_at": finished,
        "ok": ok,
        "duration_ms": max(0, int(duration_ms)),
        "summary": (summary or "")[:1000] or None,
    }
    if ok:
        values["last_ok_at"] = finished
    for _ in range(2):
        with db.begin() as s:
            if rowcount(s.execute(update(JobRun).where(JobRun.name == name).values(**values))):
                return
        try:
            with db.begin() as s:
                s.add(JobRun(name=name, **values))
            return
        except IntegrityError:
            continue  # another worker inserted it first: update on the next pass


# --- one-time sign-in links ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ConsoleLinkGrant:
    """Who a redeemed link signs in: an account's operator, or (account_id None) an admin."""

    account_id: str | None

    @property
    def admin(self) -> bool:
        return self.account_id is None


def _link_hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def create_console_link(
    db: Database, account_id: str | None, *, minutes: int
) -> tuple[str, datetime]:
    """A fresh single-use token (only its hash is stored) and when it expires."""
    if minutes < 1:
        raise ValidationError("a link must live at least a minute", {"field": "minutes"})
    token = LINK_PREFIX + secrets.token_urlsafe(32)
    now = db.clock.now()
    expires = now + timedelta(minutes=minutes)
    with db.begin() as s:
        if account_id is not None and s.get(Account, account_id) is None:
            raise NotFound(f"unknown account {account_id}", {"account_id": account_id})
        s.add(
            ConsoleLink(
                id="cl_" + ids.new_key_id()[4:],
                token_hash=_link_hash(token),
                account_id=account_id,
                created_at=now,
                expires_at=expires,
                used_at=None,
            )
        )
    return token, expires


def redeem_console_link(db: Database, token: str) -> ConsoleLinkGrant:
    """Spend a link: one conditional UPDATE, so it signs in exactly once even under a race.

    Unknown, used and expired links all get the same Unauthorized: the answer
    must not help anyone guess.
    """
    if not isinstance(token, str) or not token.startswith(LINK_PREFIX) or len(token) > 200:
        raise Unauthorized("this sign-in link is invalid, used or expired")
    digest = _link_hash(token)
    now = db.clock.now()
    with db.begin() as s:
        spent = rowcount(
            s.execute(
                update(ConsoleLink)
                .where(
                    ConsoleLink.token_hash == digest,
                    ConsoleLink.used_at.is_(None),
                    ConsoleLink.expires_at > now,
                )
                .values(used_at=now)
            )
        )
        if spent != 1:
            raise Unauthorized("this sign-in link is invalid, used or expired")
        account_id = s.scalar(
            select(ConsoleLink.account_id).where(ConsoleLink.token_hash == digest)
        )
        if account_id is not None:
            disabled = s.scalar(select(Account.disabled_at).where(Account.id == account_id))
            if disabled is not None:
                raise Unauthorized("this account is disabled")
    return ConsoleLinkGrant(account_id)


def open_session(
    db: Database, account_id: str | None, *, hours: int, key_id: str | None = None
) -> str:
    """Record a new signed-in session (``account_id`` None: admin; ``key_id`` None: by a
    sign-in link); returns its id, which the signed cookie carries."""
    sid = "cs_" + secrets.token_urlsafe(30)
    now = db.clock.now()
    with db.begin() as s:
        s.add(
            ConsoleSession(
                id=sid,
                account_id=account_id,
                key_id=key_id,
                created_at=now,
                expires_at=now + timedelta(hours=hours),
                ended_at=None,
            )
        )
    return sid


SIGN_IN_PER_MINUTE = 10  # failed sign-ins per client address and credential kind
_SIGN_IN_WINDOW = 60


def sign_in_wait(db: Database, bucket: str) -> int:
    """0, or the seconds before ``bucket`` may try again: it has failed
    ``SIGN_IN_PER_MINUTE`` times in this one-minute window. Read only: asking costs
    nothing, so only failures use up a client's tries (see :func:`sign_in_failed`)."""
    now = db.clock.time()
    window = int(now // _SIGN_IN_WINDOW) * _SIGN_IN_WINDOW
    with db.read() as s:
        failed = s.scalar(
            select(SignInAttempts.attempts).where(
                SignInAttempts.bucket == _bucket_key(bucket),
                SignInAttempts.window_start == window,
            )
        )
    if failed is None or failed < SIGN_IN_PER_MINUTE:
        return 0
    return max(1, math.ceil(window + _SIGN_IN_WINDOW - now))


def sign_in_failed(db: Database, buckets: Sequence[str]) -> list[int]:
    """Count one failed sign-in in each bucket; each bucket's failures this minute.

    Counted in ``sign_in_attempts`` (fixed one-minute windows), not in the process:
    every web process sees the same counts, so N processes allow no more guesses
    than one. One upsert per bucket, each in its own transaction: a transaction
    never holds two of these rows, so attempts and the sweep's pruning cannot
    deadlock on PostgreSQL.
    """
    window = int(db.clock.time() // _SIGN_IN_WINDOW) * _SIGN_IN_WINDOW
    counts = []
    for bucket in buckets:
        with db.begin() as s:
            counts.append(_count_attempt(s, _bucket_key(bucket), window))
    return counts


def _bucket_key(bucket: str) -> str:
    """Stored as its SHA-256: the table never holds a client's address."""
    return hashlib.sha256(bucket.encode()).hexdigest()


def _count_attempt(s: Session, bucket: str, window: int) -> int:
    from sqlalchemy.dialects.postgresql import insert as pg_insert
    from sqlalchemy.dialects.sqlite import insert as sqlite_insert

    pg = s.get_bind().dialect.name == "postgresql"
    stmt = (pg_insert if pg else sqlite_insert)(SignInAttempts).values(
        bucket=bucket, window_start=window, attempts=1
    )
    same_window = SignInAttempts.window_start == stmt.excluded.window_start
    counted = stmt.on_conflict_do_update(
        index_elements=[SignInAttempts.bucket],
        set_={
            "attempts": case((same_window, SignInAttempts.attempts + 1), else_=1),
            "window_start": stmt.excluded.window_start,
        },
    ).returning(SignInAttempts.attempts)
    return int(s.execute(counted).scalar_one())


def end_session(db: Database, sid: str) -> None:
    """Sign-out: the session ends here, whatever copies of its cookie exist."""
    with db.begin() as s:
        s.execute(
            update(ConsoleSession)
            .where(ConsoleSession.id == sid, ConsoleSession.ended_at.is_(None))
            .values(ended_at=db.clock.now())
        )


def session_open(db: Database, sid: str | None) -> bool:
    """Whether the session row exists, has not ended and has not expired."""
    if not sid:
        return False
    with db.read() as s:
        row = s.execute(
            select(ConsoleSession.ended_at, ConsoleSession.expires_at).where(
                ConsoleSession.id == sid
            )
        ).one_or_none()
    return row is not None and row[0] is None and row[1] > db.clock.now()


def session_still_valid(
    db: Database, account_id: str, key_id: str | None, sid: str | None = None
) -> bool:
    """A console session lives only while its row is open (:func:`session_open`), its
    account is enabled and, when it was opened with an API key, while that key is not
    revoked (revoking a key signs its sessions out)."""
    if not session_open(db, sid):
        return False
    with db.read() as s:
        disabled = s.execute(
            select(Account.disabled_at).where(Account.id == account_id)
        ).one_or_none()
        if disabled is None or disabled[0] is not None:
            return False
        if key_id is None:
            return True
        revoked = s.execute(
            select(ApiKey.revoked_at).where(ApiKey.id == key_id, ApiKey.account_id == account_id)
        ).one_or_none()
        return revoked is not None and revoked[0] is None


def renewal_touches_account(db: Database, digest: str, account_id: str) -> bool:
    """Whether the renewal with this digest extended a blob of ``account_id`` (so its
    operator may audit it in the console)."""
    with db.read() as s:
        return (
            s.scalar(
                select(RenewalItem.id)
                .join(Renewal, Renewal.id == RenewalItem.renewal_id)
                .where(Renewal.digest == digest, RenewalItem.account_id == account_id)
                .limit(1)
            )
            is not None
        )
