"""Alerts: tell an operator's webhook *before* anything pauses, and when it does.

Events (``EVENT_TYPES``): ``balance.low`` (funded runway fell below the
account's threshold), ``memories.paused``, ``memories.resumed``,
``memories.expired`` (paid-for memories lapsed: their runway ran out while
paused), ``topup.credited``, ``renewal.failed``, ``alert.test`` (``walkeep
alerts test``), automatic top-up's ``auto_top_up.*`` and ``payment.reversed``
(a refund or dispute took credits back).

Design: an **outbox**. :func:`emit` inserts the event in the caller's
database transaction — the same one that pauses memories, resumes them,
credits a top-up or gives up on a renewal — so an event exists exactly when
its cause was committed: none is lost on a crash, none is invented by a
rolled-back change. Accounts without a webhook get no rows at all.

The worker job ``deliver_alerts`` (:func:`deliver_alerts`) first evaluates
``balance.low`` for every account with a webhook, then POSTs due events through
the egress policy (:mod:`walkeep.egress`: no private addresses unless the operator
allows them, the checked address is the one connected to, no redirects, one total
deadline per delivery, a few KiB read back). Accounts are delivered concurrently,
each account's events one after another (one in flight per account), and slots are
shared fairly (:class:`_Slots`): a delivery that does not finish promptly gives its slot
to the next account, so receivers that accept and never answer — even many, of one
tenant — hold back only their own accounts; a failure backs the whole account off
(30 s, 60 s, … capped), not just the event, and retries queue behind first attempts. At least once: a crash
after a send and before its record re-sends after a lease. Each attempt is
recorded in ``alert_deliveries`` with a coarse outcome (``delivered``, ``refused by
policy``, ``unreachable``, ``timed out``, ``HTTP 5xx``), never exception text: the
tenant reads it, and exception text would make the worker a port scanner.
Receivers deduplicate on the event id; the body is stored once, so every retry
sends the same bytes. Tool calls never wait for any of this.

Signature: ``Walkeep-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret,
"<t>." + body)>`` — Stripe's scheme, so receivers can reuse their code.

Why one file: one outbox, from settings and ``emit`` to the leased, signed delivery and
its back-off; the rows' states are read and written in one place so the settings page,
the test event and the delivery job can never disagree about them.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import secrets
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session

from walkeep import egress, ledger
from walkeep.db.models import Account, AlertDelivery, AlertEvent, AlertSettings
from walkeep.errors import NotFound, ValidationError
from walkeep.ids import _token
from walkeep.service.renewal_price import renewal_burn_mc_per_epoch
from walkeep.service.runtime import Runtime

log = logging.getLogger(__name__)

EVENT_TYPES = (
    "balance.low",
    "memories.paused",
    "memories.resumed",
    "memories.expired",
    "topup.credited",
    "renewal.failed",
    "alert.test",
    # Automatic top-up (walkeep/service/autotopup.py, autocharge.py): one per state change.
    "auto_top_up.enabled",
    "auto_top_up.succeeded",
    "auto_top_up.failed",
    "auto_top_up.action_required",
    "auto_top_up.disabled",
    "auto_top_up.cap_reached",
    "payment.reversed",
)
DEFAULT_THRESHOLD_EPOCHS = 4
MAX_THRESHOLD_EPOCHS = 52
MAX_URL_CHARS = 2000
SIGNATURE_HEADER = "Walkeep-Signature"
# First retry after this many seconds, doubling per failed attempt up to the cap.
BACKOFF_BASE_SECONDS = 30
# A claimed event is re-sent after this long if its sender died before recording.
LEASE_SECONDS = 300
# A delivery keeps a shared slot for this long at most (or half its deadline), then
# finishes in the slow lane, which holds SLOW_LANE_FACTOR × alert_concurrency (_Slots).
SLOT_SECONDS = 0.5
SLOW_LANE_FACTOR = 4


def new_event_id() -> str:
    return "evt_" + _token(26)


# --- settings -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AlertSettingsView:
    account_id: str
    url: str
    threshold_epochs: int
    secret_hint: str  # the secret's last characters, to tell which one a receiver holds
    balance_low: bool
    pending_events: int
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class DeliveryView:
    event_id: str
    type: str
    attempt: int
    ok: bool
    status_code: int | None
    error: str | None
    duration_ms: int
    attempted_at: datetime
    url: str
    event_status: str  # pending | delivered | failed

    @property
    def outcome(self) -> str:
        """All a tenant reads of the attempt (docs/security.md): ``delivered``, ``HTTP
        4xx``, ``unreachable``…, never the receiver's exact status or an exception."""
        return egress.DELIVERED if self.ok else (self.error or egress.UNREACHABLE)


def validate_url(url: object) -> str:
    """An absolute http(s) URL with a host and no credentials; VALIDATION_ERROR otherwise.

    Credentials in a URL end up in logs and in ``alerts show``; the signing
    secret is how a receiver authenticates Walkeep.
    """
    if not isinstance(url, str) or not url.strip():
        raise ValidationError("url is required", {"url": url})
    url = url.strip()
    if len(url) > MAX_URL_CHARS:
        raise ValidationError(f"url is longer than {MAX_URL_CHARS} characters", {})
    if any(ch.isspace() or ord(ch) < 32 or ord(ch) == 127 for ch in url):
        raise ValidationError("url must not contain spaces or control characters", {"url": url})
    try:
        parts = urlsplit(url)
        port = parts.port  # raises on a malformed port
    except ValueError as exc:
        raise ValidationError(f"url is malformed: {exc}", {"url": url}) from None
    if parts.scheme.lower() not in ("http", "https"):
        raise ValidationError("url must start with http:// or https://", {"url": url})
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        raise ValidationError(
            "url must not carry credentials (user:password@); receivers verify the "
            "Walkeep-Signature header instead",
            {},
        )
    if not parts.hostname:
        raise ValidationError("url needs a host", {"url": url})
    if port == 0:
        raise ValidationError("url has an invalid port", {"url": url})
    return url


def check_egress(rt: Runtime, url: str) -> None:
    """Save-time half of the egress policy: VALIDATION_ERROR for a receiver whose host is
    a refused address literal (or ``localhost``). Names are not looked up here, so saving
    does not tell a tenant which internal names exist; each delivery checks them.
    """
    try:
        egress.check_url(url, rt.settings.egress_policy)
    except egress.EgressRefused as exc:
        log.info("alert webhook refused at save time: %s", exc)
        raise ValidationError(
            "url is refused by policy: alert webhooks may only reach public addresses "
            "(the operator can allow private receivers with WALKEEP_ALERT_EGRESS_ALLOW)",
            {"url": url, "outcome": egress.REFUSED},
        ) from None


def _threshold(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError("threshold_epochs must be an integer", {"threshold_epochs": value})
    if not 1 <= value <= MAX_THRESHOLD_EPOCHS:
        raise ValidationError(
            f"threshold_epochs must be between 1 and {MAX_THRESHOLD_EPOCHS}",
            {"threshold_epochs": value},
        )
    return value


def _hint(secret: str) -> str:
    return "whsec_…" + secret[-4:]


def _master_key(rt: Runtime) -> bytes:
    key = rt.extras.get("master_key")
    if key is None:
        from walkeep.crypto import load_master_key

        key = rt.extras.setdefault("master_key", load_master_key(rt.settings))
    assert isinstance(key, bytes)
    return key


def _seal(rt: Runtime, account_id: str, secret: str) -> str:
    """Signing secrets are stored sealed under the master key (walkeep.crypto)."""
    from walkeep.crypto import seal_secret

    return seal_secret(_master_key(rt), secret, context=f"alert-secret:{account_id}")


def _open(rt: Runtime, account_id: str, stored: str) -> str:
    from walkeep.crypto import open_secret

    return open_secret(_master_key(rt), stored, context=f"alert-secret:{account_id}")


def set_alert_webhook(
    rt: Runtime, account_id: str, url: str, threshold_epochs: int | None = None
) -> str:
    """Set (or replace) the account's webhook; returns a NEW signing secret, shown once.

    ``threshold_epochs`` defaults to the current value (4 for a new webhook).
    Every call issues a fresh secret, so a leaked one is rotated by setting
    the webhook again. Events already pending go to the new URL, signed with
    the new secret.
    """
    url = validate_url(url)
    check_egress(rt, url)
    threshold = None if threshold_epochs is None else _threshold(threshold_epochs)
    secret = "whsec_" + secrets.token_urlsafe(32)
    sealed = _seal(rt, account_id, secret)
    now = rt.clock.now()
    with rt.db.begin() as s:
        if s.get(Account, account_id) is None:
            raise NotFound(f"unknown account {account_id}", {"account_id": account_id})
        row = s.get(AlertSettings, account_id, with_for_update=rt.db.is_postgres or None)
        if row is None:
            s.add(
                AlertSettings(
                    account_id=account_id,
                    url=url,
                    secret=sealed,
                    threshold_epochs=threshold or DEFAULT_THRESHOLD_EPOCHS,
                    balance_low=False,
                    created_at=now,
                    updated_at=now,
                )
            )
        else:
            row.url = url
            row.secret = sealed
            if threshold is not None and threshold != row.threshold_epochs:
                row.threshold_epochs = threshold
                row.balance_low = False  # re-evaluated against the new threshold
            row.updated_at = now
    return secret


def remove_alert_webhook(rt: Runtime, account_id: str) -> int:
    """Stop alerts for the account; pending events are dropped. Returns how many."""
    with rt.db.begin() as s:
        if s.get(AlertSettings, account_id) is None:
            raise NotFound("no alert webhook is set for this account", {"account_id": account_id})
        dropped = s.execute(
            update(AlertEvent)
            .where(AlertEvent.account_id == account_id, AlertEvent.status == "pending")
            .values(status="failed")
        )
        s.execute(delete(AlertSettings).where(AlertSettings.account_id == account_id))
        return int(dropped.rowcount or 0)  # type: ignore[attr-defined]


def get_alert_settings(rt: Runtime, account_id: str) -> AlertSettingsView | None:
    """The account's webhook (never the secret itself), or None if none is set."""
    with rt.db.read() as s:
        row = s.get(AlertSettings, account_id)
        if row is None:
            return None
        pending = s.scalar(
            select(func.count())
            .select_from(AlertEvent)
            .where(AlertEvent.account_id == account_id, AlertEvent.status == "pending")
        )
        return AlertSettingsView(
            account_id=row.account_id,
            url=row.url,
            threshold_epochs=row.threshold_epochs,
            secret_hint=_hint(_open(rt, account_id, row.secret)),
            balance_low=row.balance_low,
            pending_events=int(pending or 0),
            created_at=row.created_at,
            updated_at=row.updated_at,
        )


def recent_deliveries(rt: Runtime, account_id: str, limit: int = 20) -> list[DeliveryView]:
    """The account's latest delivery attempts, newest first."""
    limit = max(1, min(int(limit), 500))
    with rt.db.read() as s:
        rows = s.execute(
            select(
                AlertDelivery.event_id,
                AlertEvent.type,
                AlertDelivery.attempt,
                AlertDelivery.status_code,
                AlertDelivery.error,
                AlertDelivery.duration_ms,
                AlertDelivery.attempted_at,
                AlertDelivery.url,
                AlertEvent.status,
            )
            .join(AlertEvent, AlertEvent.id == AlertDelivery.event_id)
            .where(AlertDelivery.account_id == account_id)
            .order_by(AlertDelivery.attempted_at.desc(), AlertDelivery.id.desc())
            .limit(limit)
        ).all()
    return [
        DeliveryView(
            event_id=r[0],
            type=r[1],
            attempt=r[2],
            ok=r[3] is not None and 200 <= r[3] < 300,
            status_code=r[3],
            error=_coarse(r[3], r[4]),
            duration_ms=r[5],
            attempted_at=r[6],
            url=r[7],
            event_status=r[8],
        )
        for r in rows
    ]


def _coarse(status_code: int | None, error: str | None) -> str | None:
    """What a tenant may read of an attempt; rows written before the egress policy
    kept exception text (``ConnectError: [Errno 111] …``), shown here as unreachable."""
    if error is None or error in egress.COARSE_OUTCOMES:
        return error
    if status_code is not None:
        return egress.http_outcome(status_code)
    return egress.UNREACHABLE


# --- the outbox -------------------------------------------------------------------------------


def emit(s: Session, account_id: str, type_: str, data: dict[str, Any]) -> str | None:
    """Queue an event in ``s``'s transaction; returns its id (None: no webhook set).

    Call it from the transaction that makes the change the event reports, so
    the event commits or rolls back with it.
    """
    if type_ not in EVENT_TYPES:
        raise ValueError(f"unknown alert event type {type_!r}")
    if (
        s.scalar(select(AlertSettings.account_id).where(AlertSettings.account_id == account_id))
        is None
    ):
        return None
    now: datetime = s.info["clock"].now()
    event_id = new_event_id()
    body = json.dumps(
        {
            "id": event_id,
            "type": type_,
            "account_id": account_id,
            "created_at": now.isoformat().replace("+00:00", "Z"),
            "data": data,
        },
        separators=(",", ":"),
        sort_keys=True,
    )
    s.add(
        AlertEvent(
            id=event_id,
            account_id=account_id,
            type=type_,
            body=body,
            status="pending",
            attempts=0,
            next_attempt_at=now,
            created_at=now,
        )
    )
    return event_id


def send_test_event(rt: Runtime, account_id: str) -> str:
    """Queue an ``alert.test`` event; NOT_FOUND if the account has no webhook."""
    with rt.db.begin() as s:
        event_id = emit(
            s, account_id, "alert.test", {"note": "test event from `walkeep alerts test`"}
        )
    if event_id is None:
        raise NotFound("no alert webhook is set for this account", {"account_id": account_id})
    return event_id


# --- balance.low: fire on the crossing, re-arm on the way back ---------------------------------


def funded_runway_epochs(rt: Runtime, account_id: str) -> tuple[int | None, int, int]:
    """(epochs of renewals the available credits fund, available mc, burn mc per epoch).

    Epochs is None when nothing is kept for renewal (no burn: nothing can run
    out). Reuses check_balance's estimate: every live blob holding an active
    or paused memory, at its renewal price for one epoch.
    """
    burn, _min_runway = renewal_burn_mc_per_epoch(rt, account_id)
    with rt.db.read() as s:
        available = ledger.balance(s, account_id).available_mc
    return (available // burn if burn > 0 else None), available, burn


def check_low_balances(rt: Runtime) -> int:
    """Evaluate ``balance.low`` for every account with a webhook; returns events fired."""
    with rt.db.read() as s:
        account_ids = list(s.scalars(select(AlertSettings.account_id).order_by("account_id")))
    fired = 0
    for account_id in account_ids:
        epochs, available, burn = funded_runway_epochs(rt, account_id)
        with rt.db.begin() as s:
            row = s.get(AlertSettings, account_id, with_for_update=rt.db.is_postgres or None)
            if row is None:
                continue
            low = epochs is not None and epochs < row.threshold_epochs
            if low and not row.balance_low:
                row.balance_low = True
                emit(
                    s,
                    account_id,
                    "balance.low",
                    {
                        "funded_runway_epochs": epochs,
                        "threshold_epochs": row.threshold_epochs,
                        "available_mc": available,
                        "renewal_cost_mc_per_epoch": burn,
                        "note": "top up soon: renewals pause when credits cannot cover them",
                    },
                )
                fired += 1
            elif not low and row.balance_low:
                row.balance_low = False  # re-armed: the next crossing fires again
    return fired


# --- delivery ---------------------------------------------------------------------------------


def sign(secret: str, timestamp: int, body: bytes) -> str:
    """The ``Walkeep-Signature`` header value for ``body`` sent at ``timestamp``."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"t={timestamp},v1={mac.hexdigest()}"


def backoff_seconds(attempts: int, cap: int) -> int:
    """Delay before the next try after ``attempts`` failed ones: 30 s, 60 s, … up to ``cap``."""
    return int(min(cap, BACKOFF_BASE_SECONDS * 2 ** min(max(attempts - 1, 0), 20)))


@dataclass
class DeliverReport:
    low_balance_fired: int = 0
    attempted: int = 0
    delivered: int = 0
    retrying: int = 0
    gave_up: int = 0
    event_ids: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class _Due:
    event_id: str
    account_id: str
    body: str
    attempts: int
    url: str
    secret: str


def _claim(rt: Runtime, limit: int, event_id: str | None) -> list[_Due]:
    """Take due events and lease them, so another worker skips them meanwhile.

    At most ``alert_batch_per_account`` per account (each account's oldest first), so
    one account's flood of events neither fills the batch nor keeps a lease longer
    than its deliveries can take (10 × a 10 s deadline is well inside the lease).
    """
    now = rt.clock.now()
    due_now = (
        AlertEvent.id == event_id if event_id else AlertEvent.next_attempt_at <= now,
        AlertEvent.status == "pending",
    )
    order = (AlertEvent.next_attempt_at, AlertEvent.created_at, AlertEvent.id)
    ranked = (
        select(
            AlertEvent.id,
            func.row_number().over(partition_by=AlertEvent.account_id, order_by=order).label("n"),
        )
        .where(*due_now)
        .subquery()
    )
    q = (
        select(
            AlertEvent.id,
            AlertEvent.account_id,
            AlertEvent.body,
            AlertEvent.attempts,
            AlertSettings.url,
            AlertSettings.secret,
        )
        .join(AlertSettings, AlertSettings.account_id == AlertEvent.account_id)
        .where(
            *due_now,
            AlertEvent.id.in_(
                select(ranked.c.id).where(ranked.c.n <= rt.settings.alert_batch_per_account)
            ),
        )
        .order_by(*order)
        .limit(limit)
    )
    if rt.db.is_postgres:
        q = q.with_for_update(skip_locked=True, of=AlertEvent)
    with rt.db.begin() as s:
        due = [_Due(*row) for row in s.execute(q)]
        if due:
            s.execute(
                update(AlertEvent)
                .where(AlertEvent.id.in_([d.event_id for d in due]))
                .values(next_attempt_at=now + timedelta(seconds=LEASE_SECONDS))
            )
    return due


def _headers(rt: Runtime, due: _Due, body: bytes) -> dict[str, str]:
    return {
        "Content-Type": "application/json",
        "User-Agent": "Walkeep-Alerts/1",
        "Walkeep-Event-Id": due.event_id,
        SIGNATURE_HEADER: sign(_open(rt, due.account_id, due.secret), int(rt.clock.time()), body),
    }


def deliver_alerts(rt: Runtime, *, limit: int = 100, event_id: str | None = None) -> DeliverReport:
    """The ``deliver_alerts`` job: evaluate balance.low, then send what is due.

    With ``event_id``, send just that pending event now (``walkeep alerts test``).
    Runs its own event loop: it is called from the scheduler's thread and the CLI.
    """
    report = DeliverReport()
    if event_id is None:
        report.low_balance_fired = check_low_balances(rt)
    due = _claim(rt, limit, event_id)
    if due:
        asyncio.run(_deliver(rt, due, report))
    return report


class _Slots:
    """One run's delivery slots, shared fairly between accounts.

    A delivery starts in one of ``n`` shared slots (first come, first served; the run
    queues accounts whose receiver failed last time behind the others). Once it has
    taken ``prompt`` seconds it hands that slot to the next account and finishes in the
    slow lane (``SLOW_LANE_FACTOR × n``), or keeps the slot while the lane is full. With
    one delivery in flight per account, 24 accounts whose receivers accept and never
    answer delay another account's alert by ``prompt`` per ``n`` of them — not by their
    whole deadline (three 10-s waves with 8 slots) — and at most ``(1 +
    SLOW_LANE_FACTOR) × n`` connections are ever open.
    """

    def __init__(self, n: int, prompt: float) -> None:
        self.shared = asyncio.Semaphore(n)
        self.slow = asyncio.Semaphore(SLOW_LANE_FACTOR * n)
        self.prompt = prompt

    async def run(self, send: Coroutine[Any, Any, egress.Sent]) -> egress.Sent:
        await self.shared.acquire()
        task = asyncio.ensure_future(send)
        holds_shared, holds_slow = True, False
        try:
            await asyncio.wait({task}, timeout=self.prompt)
            if not task.done() and not self.slow.locked():
                await self.slow.acquire()  # a free slot: taken without waiting
                holds_slow = True
                self.shared.release()
                holds_shared = False
            return await task
        finally:
            task.cancel()  # a no-op once done; stops the send if this run is cancelled
            if holds_shared:
                self.shared.release()
            if holds_slow:
                self.slow.release()


async def _deliver(rt: Runtime, due: Sequence[_Due], report: DeliverReport) -> None:
    """Every account's events at once (fair slots, :class:`_Slots`), each account's in order.

    An account stops at its first failure: its other claimed events are released
    with the same back-off, so a receiver that is down is not sent N events in a row.
    """
    by_account: dict[str, list[_Due]] = {}
    for d in due:
        by_account.setdefault(d.account_id, []).append(d)
    deadline = rt.settings.alert_timeout_seconds
    slots = _Slots(rt.settings.alert_concurrency, min(SLOT_SECONDS, deadline / 2))
    policy = rt.settings.egress_policy

    async def account(events: list[_Due]) -> None:
        for i, d in enumerate(events):
            body = d.body.encode()
            sent = await slots.run(
                egress.send(
                    d.url,
                    body=body,
                    headers=_headers(rt, d, body),
                    policy=policy,
                    deadline_seconds=deadline,
                    max_response_bytes=rt.settings.alert_max_response_bytes,
                    transport=rt.extras.get("alert_transport"),
                )
            )
            if sent.detail:
                log.info(
                    "alert %s to account %s: %s (%s)",
                    d.event_id,
                    d.account_id,
                    sent.outcome,
                    sent.detail,
                )
            rest = [e.event_id for e in events[i + 1 :]]
            state = await asyncio.to_thread(_record, rt, d, sent, rest if not sent.ok else [])
            report.attempted += 1
            report.event_ids.append(d.event_id)
            if state == "delivered":
                report.delivered += 1
            elif state == "failed":
                report.gave_up += 1
            else:
                report.retrying += 1
            if not sent.ok:
                return

    # Accounts whose receiver failed last time (their first event is a retry) queue last.
    queue = sorted(by_account.values(), key=lambda events: events[0].attempts > 0)
    await asyncio.gather(*(account(events) for events in queue))


def _record(rt: Runtime, d: _Due, sent: egress.Sent, released: list[str]) -> str:
    """Record one attempt; on failure, back the account off. Returns the event's state:
    ``delivered``, ``retrying`` or ``failed`` (given up)."""
    now = rt.clock.now()
    attempt = d.attempts + 1
    values: dict[str, Any] = {"attempts": attempt}
    state = "retrying"
    delay = backoff_seconds(attempt, rt.settings.alert_backoff_cap_seconds)
    if sent.ok:
        values.update(status="delivered", delivered_at=now)
        state = "delivered"
    elif attempt >= rt.settings.alert_max_attempts:
        values.update(status="failed")
        state = "failed"
        log.error("alert %s dropped after %d attempts: %s", d.event_id, attempt, sent.outcome)
    else:
        values.update(next_attempt_at=now + timedelta(seconds=delay))
    with rt.db.begin() as s:
        s.add(
            AlertDelivery(
                event_id=d.event_id,
                account_id=d.account_id,
                url=d.url[:MAX_URL_CHARS],
                attempt=attempt,
                status_code=sent.status_code,
                error=None if sent.ok else sent.outcome,
                duration_ms=sent.duration_ms,
                attempted_at=now,
            )
        )
        s.execute(
            update(AlertEvent)
            .where(AlertEvent.id == d.event_id, AlertEvent.status == "pending")
            .values(**values)
        )
        if not sent.ok:
            # The receiver is failing: the account's other events wait as long as this
            # one (claimed ones give their lease back now; none is moved earlier).
            later = now + timedelta(seconds=delay)
            pending = (AlertEvent.account_id == d.account_id, AlertEvent.status == "pending")
            if released:
                s.execute(
                    update(AlertEvent)
                    .where(*pending, AlertEvent.id.in_(released))
                    .values(next_attempt_at=later)
                )
            s.execute(
                update(AlertEvent)
                .where(*pending, AlertEvent.id != d.event_id, AlertEvent.next_attempt_at < later)
                .values(next_attempt_at=later)
            )
    return state
