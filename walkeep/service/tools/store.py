"""``store``: accept a memory fast, finish it in the background, bill only what landed.

Ordering (seeds/walkeep-tool-reference.txt, "Semantics that keep you safe"):

1. validate, then the size quota (stateless, so it can't depend on history);
2. idempotency: a replay of a known request_id returns its outcome (a settled
   store replays as ``stored``; an in-flight one is joined, never written
   twice; a terminally failed one is retried under the same request_id);
3. usage quotas (total bytes, stores per day) and the balance check, which
   places a *hold* for the price (fail closed: INSUFFICIENT_BALANCE writes
   nothing) — all in one transaction with the request claim;
4. relayer accept — the tool returns here with ``status: "storing"``;
5. background (``completion.settle``): wait for the write to land, then
   capture the hold and register the memory in one transaction; a terminal
   failure releases the hold.

Usage quotas are checked after the idempotency lookup (a deviation from a
literal reading of the reference's "quota → idempotency") so that replaying a
store that already succeeded can never be refused because the daily limit
was reached since: a replay is not a new store.

A storage outage at accept (RELAYER_UNAVAILABLE) releases the hold and
deletes the claim, so nothing is billed and the same request_id simply
retries.

On PostgreSQL, with the self-run relayer, steps 2–4 are ONE statement
(``_claim_at_once``): same order and outcomes, but the account's row lock lasts
that statement only; claims that queue behind one in flight go out together, as one
transaction in account order (walkeep/db/together.py). On SQLite they are one transaction on the
driver's connection, without a Session (``_claim_direct``). Either falls back to the
general path when the account refuses, so that path alone says which limit.

Why one file: the ordering above, end to end, with its three claim paths (general,
SQLite direct, PostgreSQL one-statement) that must give the same outcomes; split, they
would drift.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from sqlalchemy import CTE, bindparam, delete, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from walkeep import ids, ledger, lifecycle, nowait, pricing, usage
from walkeep.db import Prepared, Tx, rowcount
from walkeep.db.models import LedgerEntry, Memory, Request, WriteJob, table
from walkeep.errors import (
    InsufficientBalance,
    NotFound,
    QuotaExceeded,
    RelayerUnavailable,
    ValidationError,
    WalkeepError,
)
from walkeep.lifecycle import MemoryStatus
from walkeep.service import digests, sealed
from walkeep.service.instants import parse_instant
from walkeep.service.namespaces import validate_namespace
from walkeep.service.pipeline import SETTLED, fail_attempt, hold_ref, job_key
from walkeep.service.runtime import Runtime
from walkeep.service.tools import idempotency
from walkeep.service.tools.schemas import StoreResult
from walkeep.service.tools.topup import MIN_CENTS as TOPUP_MIN_CENTS
from walkeep.service.tools.views import resolve

log = logging.getLogger(__name__)

TOOL = "store"
# How long a racer waits for the winner of its request_id to finish accepting.
JOIN_WAIT_SECONDS = 20.0
# Claims of a request_id that no row explains before giving up (see store()).
CLAIM_TRIES = 3


@dataclass(slots=True)
class Claimed:
    """A memory as a store claims it: the row it inserts, and what the receipt says.

    Plain, not an ORM ``Memory``: building one cost ~0.1 ms of instrumentation per store
    on the event loop, for an object that is never loaded, flushed or refreshed."""

    id: str
    account_id: str
    namespace: str
    metadata_: str  # sealed (walkeep/service/sealed.py)
    size_bytes: int
    content_hash: str
    status: str
    cost_mc: int
    attempt: int
    accepted_at: datetime
    deadline_at: datetime
    status_changed_at: datetime
    job_id: str | None = None
    supersedes: str | None = None
    expires_at: datetime | None = None
    expires_epoch: int | None = None
    epochs: int = 0  # the write's epochs, fixed at accept (0: the initial epochs)


# A memory being accepted: just claimed, or a failed one retried (loaded, so ORM).
AnyMemory = Memory | Claimed


def validate_metadata(rt: Runtime, metadata: dict[str, str] | None) -> dict[str, str]:
    s = rt.settings
    md = dict(metadata or {})
    if len(md) > s.max_metadata_keys:
        raise ValidationError(
            f"metadata has {len(md)} keys; at most {s.max_metadata_keys} are allowed",
            {"field": "metadata", "max_keys": s.max_metadata_keys},
        )
    for k, v in md.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise ValidationError("metadata must map strings to strings", {"field": "metadata"})
        _storable_metadata(k, v)
        if not k or len(k) > s.max_metadata_key_chars:
            raise ValidationError(
                f"metadata keys must be 1–{s.max_metadata_key_chars} characters",
                {"field": "metadata", "key": k[:80], "max_key_chars": s.max_metadata_key_chars},
            )
        if len(v) > s.max_metadata_value_chars:
            raise ValidationError(
                f"metadata value for {k!r} exceeds {s.max_metadata_value_chars} characters",
                {"field": "metadata", "key": k, "max_value_chars": s.max_metadata_value_chars},
            )
    # Per-key limits alone allow 32 × 1,088 characters (up to ~140 KB of UTF-8) per memory,
    # kept in the database at the operator's cost: bound the whole map as it is stored.
    n = metadata_bytes(md)
    if n > s.max_metadata_bytes:
        raise ValidationError(
            f"metadata is {n} bytes as JSON; at most {s.max_metadata_bytes} are allowed",
            {"field": "metadata", "max_bytes": s.max_metadata_bytes, "bytes": n},
        )
    return md


def metadata_bytes(md: dict[str, str]) -> int:
    """A metadata map's size as stored: compact UTF-8 JSON."""
    return len(json.dumps(md, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))


def _storable_metadata(key: str, value: str) -> None:
    """Keys are identifiers (no control characters); values are text (no NUL or unpaired
    surrogates, which PostgreSQL refuses and SQLite would have stored)."""
    checks = (
        (key, ids.check_identifier, "metadata key"),
        (value, ids.check_text, f"metadata value for key {key[:80]!r}"),
    )
    for text, check, what in checks:
        try:
            check(text, "metadata")
        except ValidationError as exc:
            raise ValidationError(
                exc.message.replace("metadata", what, 1), {**exc.data, "key": key[:80]}
            ) from None


def may_run_inline(rt: Runtime) -> bool:
    """Whether a transport may try ``store`` on its event loop, through
    ``rt.db.on_loop`` inside ``nowait.no_wait()`` (walkeep/nowait.py): with the self-run
    relayer the only waits on its path are the database's — SQLite's in-process calls,
    PostgreSQL's round trips, which ``on_loop`` awaits — and each other thing that could
    wait refuses to instead. A remote relayer is an HTTP call: a thread."""
    return getattr(rt.relayer, "stage", None) is not None


def store(
    rt: Runtime,
    account_id: str,
    *,
    content: str,
    request_id: str,
    namespace: str = "default",
    metadata: dict[str, str] | None = None,
    supersedes: str | None = None,
    expires_at: str | datetime | None = None,
    confined_to: str | None = None,
) -> StoreResult:
    """``confined_to``: the calling key is confined to this namespace (the entry points
    have already refused any other), so ``supersedes`` resolves only inside it."""
    s = rt.settings
    idempotency.validate_request_id(request_id)
    if supersedes is not None or expires_at is not None:
        # Both read the registry or the chain before the claim: not on the event loop.
        nowait.refuse("a store that supersedes or expires")
    if not isinstance(content, str) or not content.strip():
        raise ValidationError("content must be a non-empty string", {"field": "content"})
    size = len(content.encode("utf-8"))
    if size > s.max_memory_bytes:
        raise QuotaExceeded(
            f"memory is {size} bytes; the limit is {s.max_memory_bytes} bytes",
            {"limit": "max_memory_bytes", "limit_bytes": s.max_memory_bytes, "size_bytes": size},
        )
    namespace = validate_namespace(namespace)
    md = validate_metadata(rt, metadata)
    bound = _bound(rt, expires_at)
    # Only the arguments given: a store without them keeps the fingerprint it always had.
    extra: dict[str, str] = {}
    if supersedes is not None:
        supersedes = ids.check_identifier(_text(supersedes, "supersedes"), "supersedes")
        extra["supersedes"] = supersedes
    if bound is not None:
        extra["expires_at"] = bound.at.isoformat()
    fp = idempotency.fingerprint(
        rt, account_id, content=content, namespace=namespace, metadata=md, **extra
    )
    cost_mc = pricing.store_cost_for_epochs_mc(
        size, s.store_price_mc_per_64kib, _epochs(rt, bound), s.initial_epochs
    )
    life = _Life(None, bound)
    # The row holds the namespace's token and the metadata sealed (walkeep/service/sealed.py);
    # the receipt names the namespace as the caller did.
    result = _store(
        rt,
        account_id,
        request_id,
        content,
        size,
        fp,
        sealed.remember_namespace(rt, account_id, namespace),
        sealed.seal_metadata(rt, account_id, md),
        cost_mc,
        supersedes,
        life,
        None if confined_to is None else sealed.namespace_token(rt, account_id, confined_to),
    )
    return result.model_copy(update={"namespace": namespace})


def _store(
    rt: Runtime,
    account_id: str,
    request_id: str,
    content: str,
    size: int,
    fp: idempotency.Fingerprint,
    namespace: str,
    md: str,
    cost_mc: int,
    supersedes: str | None,
    life: _Life,
    within: str | None,
) -> StoreResult:
    deadline = time.monotonic() + JOIN_WAIT_SECONDS
    # Optimistic: a new request_id is the common case, so claim first; the
    # UNIQUE constraint tells us (cheaply) when it is a replay instead.
    try:
        if supersedes is not None:
            # NOT_FOUND / VALIDATION_ERROR before anything is written or billed — unless
            # this is a replay, which answers as it did (below) whatever happened since.
            life = _Life(supersede_target(rt, account_id, supersedes, within), life.bound)
        claimed = _claim(
            rt, account_id, request_id, fp, namespace, md, size, content, cost_mc, life
        )
    except (RelayerUnavailable, NotFound, ValidationError):
        # The backend is down — but a replay of a known request must still get
        # its original answer, which needs no backend.
        with rt.db.read() as sess:
            if idempotency.find(sess, account_id, TOOL, request_id) is None:
                raise
        claimed = None
    if claimed is not None:
        return _accept(rt, *claimed, content, attempt=1)
    tries = 0
    while True:
        with rt.db.read() as sess:
            existing = idempotency.find(sess, account_id, TOOL, request_id)
            memory = (
                sess.get(Memory, existing.memory_id) if existing and existing.memory_id else None
            )
        if existing is None:
            # Either a racer's claim was undone (its accept failed) or the claim
            # fails for another reason; the last try lets that error surface
            # (logged, INTERNAL) instead of spinning here for ever.
            tries += 1
            claimed = _claim(
                rt,
                account_id,
                request_id,
                fp,
                namespace,
                md,
                size,
                content,
                cost_mc,
                life,
                strict=tries >= CLAIM_TRIES,
            )
            if claimed is None:
                continue  # lost the race for this request_id: replay as the loser
            return _accept(rt, *claimed, content, attempt=1)

        idempotency.check_fingerprint(existing, fp)
        if memory is None:
            raise WalkeepError(f"request {request_id!r} has no memory")  # cannot happen
        status = MemoryStatus(memory.status)
        if status == MemoryStatus.STORING:
            return _result(
                memory,
                "storing",
                "Already accepted under this request_id; "
                "the write is completing in the background (joined, not repeated).",
            )
        if status in SETTLED:
            return _result(
                memory,
                "stored",
                "A store with this request_id already completed; "
                "nothing was written or charged again.",
            )
        if status == MemoryStatus.FAILED:
            if memory.supersedes is not None:
                # A correction that lost its race (or whose write failed): retried only
                # if the memory it corrects is still in service, else that answer.
                supersede_target(rt, account_id, memory.supersedes, within)
            retried = _reclaim_failed(rt, memory, fp, content, cost_mc)
            if retried is None:
                continue
            return _accept(rt, *retried, content, attempt=retried[0].attempt)
        # ACCEPTING: another call is between claim and relayer accept. Wait for it.
        if time.monotonic() > deadline:
            raise RelayerUnavailable(
                "an earlier call with this request_id is still being accepted; "
                "retry with the same request_id",
                {"request_id": request_id, "retry": True},
            )
        nowait.refuse("an earlier call with this request_id")
        time.sleep(0.02)


@dataclass(frozen=True, slots=True)
class _Bound:
    """A store's ``expires_at``: the instant, the epoch holding it, and the current epoch
    when it was read (so the price and the write's epochs come from one reading)."""

    at: datetime
    epoch: int
    current: int


@dataclass(frozen=True, slots=True)
class _Life:
    """What a store says about the memory's life beyond its content: the memory it
    corrects (a resolved ``mem_`` id) and when it stops mattering."""

    supersedes: str | None
    bound: _Bound | None


def _text(value: object, field: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValidationError(f"{field} must be a non-empty string", {"field": field})
    return value.strip()


def _bound(rt: Runtime, expires_at: str | datetime | None) -> _Bound | None:
    """``expires_at`` checked (in the future) and placed in its epoch, or None."""
    if expires_at is None:
        return None
    at = parse_instant(expires_at, "expires_at", date_is_end_of_day=True)
    now = rt.clock.now()
    if at <= now:
        raise ValidationError(
            "expires_at must be in the future",
            {"field": "expires_at", "expires_at": at.isoformat(), "now": now.isoformat()},
        )
    info = rt.chain.epoch_info()
    started = info.started_at or now
    epoch = lifecycle.epoch_at(info.epoch, started, info.duration_seconds, at)
    # An epoch beyond a 32-bit column is beyond any renewal anyone will run: stored as
    # the largest, it caps nothing.
    return _Bound(at, min(max(epoch, info.epoch), _MAX_EPOCH), info.epoch)


_MAX_EPOCH = 2**31 - 2


def _epochs(rt: Runtime, bound: _Bound | None) -> int:
    """Epochs the new write buys (what the price counts)."""
    initial = rt.settings.initial_epochs
    if bound is None:
        return initial
    return lifecycle.epochs_needed(bound.current, bound.epoch, initial)


def _write_epochs(rt: Runtime, memory: AnyMemory) -> int:
    """Epochs to write a memory for: the initial epochs, or to the end of the epoch
    holding its expiry if that comes first (a memory is never lost before it expires)."""
    initial = rt.settings.initial_epochs
    if memory.expires_epoch is None:
        return initial
    if isinstance(memory, Claimed) and memory.epochs:
        return memory.epochs
    return lifecycle.epochs_needed(rt.chain.current_epoch(), memory.expires_epoch, initial)


def retired_state(m: Memory, now: datetime) -> str | None:
    """Why a memory is out of service — superseded, forgotten or expired — or None."""
    if m.superseded_by is not None:
        return "superseded"
    if m.forgotten_at is not None or m.status == MemoryStatus.NO_RENEW:
        return "forgotten"
    if m.status == MemoryStatus.EXPIRED or (m.expires_at is not None and m.expires_at <= now):
        return "expired"
    return None


def supersede_target(rt: Runtime, account_id: str, ident: str, within: str | None = None) -> str:
    """The memory a store corrects, by memory_id or blob_id (of identical copies, the
    newest still in service): NOT_FOUND if none (or none in namespace token ``within``),
    VALIDATION_ERROR naming its state (and its successor, if any) if it is already
    forgotten, superseded or expired."""
    now = rt.clock.now()
    with rt.db.read() as sess:
        rows = resolve(sess, account_id, ident, namespace=within)
    in_service = [m for m, _ in rows if retired_state(m, now) is None]
    if in_service:
        return in_service[-1].id
    m = rows[-1][0]
    state = retired_state(m, now)
    data: dict[str, object] = {
        "field": "supersedes",
        "supersedes": ident,
        "memory_id": m.id,
        "state": state,
    }
    hint = ""
    if m.superseded_by is not None:
        data["superseded_by"] = m.superseded_by
        hint = f" by {m.superseded_by}; supersede that one instead"
    raise ValidationError(f"memory {m.id} is already {state}{hint}", data)


def _claim(
    rt: Runtime,
    account_id: str,
    request_id: str,
    fp: idempotency.Fingerprint,
    namespace: str,
    md: str,
    size: int,
    content: str,
    cost_mc: int,
    life: _Life,
    *,
    strict: bool = False,
) -> tuple[Claimed, float] | None:
    """Claim the request id, check usage quotas and hold the price, atomically.

    Returns None if the request id already exists (a replay, or a racer won);
    ``strict`` re-raises that IntegrityError instead.
    The request row is inserted first so that a replay is recognised before
    any quota or balance check could refuse it.
    """
    now = rt.clock.now()
    memory_id = ids.new_memory_id()
    staged = _stage(rt, account_id, namespace, content)
    memory = Claimed(
        id=memory_id,
        account_id=account_id,
        namespace=namespace,
        metadata_=md,
        size_bytes=size,
        content_hash=digests.content_hash(rt, account_id, content),
        status=MemoryStatus.ACCEPTING,
        cost_mc=cost_mc,
        attempt=1,
        accepted_at=now,
        deadline_at=now + timedelta(seconds=rt.settings.completion_deadline_seconds),
        status_changed_at=now,
        supersedes=life.supersedes,
        expires_at=life.bound.at if life.bound else None,
        expires_epoch=life.bound.epoch if life.bound else None,
        epochs=_epochs(rt, life.bound),
    )
    request = {
        "account_id": account_id,
        "tool": TOOL,
        "request_id": request_id,
        "fingerprint": fp.keyed,
        "status": "in_progress",
        "memory_id": memory_id,
        "created_at": now,
        "updated_at": now,
    }
    try:
        # PostgreSQL: one statement. If the account refuses it (quota, credits) or is
        # unknown, the transaction below writes the same rows one at a time and says
        # which, or succeeds if the account changed meanwhile.
        at_once = rt.db.is_postgres and staged is not None
        if at_once and _claim_at_once(rt, request, memory, staged, now):
            return memory, _due_in(staged)
        if rt.db.is_sqlite and _claim_direct(rt, request, memory, staged, now):
            return memory, _due_in(staged)
        with rt.db.begin() as sess:
            _INSERT_REQUEST.run(sess, request)
            _accept_in(rt, sess, memory, staged, 1)
            _INSERT_MEMORY.run(sess, _row(memory))
            # Last: this takes the account's row lock (PostgreSQL), held to commit.
            _reserve(rt, sess, account_id, memory_id, 1, size, cost_mc, now)
        return memory, _due_in(staged)
    except IntegrityError:
        if strict:
            raise
        return None  # the request id exists: replay


class _Refused(Exception):
    """The account refused the fast claim (quota, credits, unknown): roll it back."""


def _claim_direct(
    rt: Runtime, request: dict[str, object], memory: Claimed, staged: object, now: datetime
) -> bool:
    """SQLite: the claim's statements in one transaction on the driver's connection
    (``Database.begin_direct``), without a Session. False, having written nothing, if
    the account refuses it; the Session path then says which limit, as on PostgreSQL."""
    try:
        with rt.db.begin_direct() as tx:
            _INSERT_REQUEST.run(tx, request)
            _accept_in(rt, tx, memory, staged, 1)
            _INSERT_MEMORY.run(tx, _row(memory))
            if not _try_reserve(
                rt, tx, memory.account_id, memory.id, 1, memory.size_bytes, memory.cost_mc, now
            ):
                raise _Refused
    except _Refused:
        memory.job_id, memory.status = None, MemoryStatus.ACCEPTING
        return False
    return True


def _claim_at_once(
    rt: Runtime, request: dict[str, object], memory: Claimed, staged: object, now: datetime
) -> bool:
    """PostgreSQL: the whole claim — request row, write job, memory, usage quotas, hold and
    its ledger entry — as ONE statement in autocommit. The account's row lock is then
    held for the duration of one statement on the server, never across a round trip
    from a busy Python process (where waiting for the GIL before the next statement
    or the COMMIT used to keep every other store of the account queued behind it).

    Every insert selects from the account UPDATE, so if the account refuses (quota,
    credits) nothing is written and this returns False; a request id that exists
    raises IntegrityError (a replay) and nothing is written either. On the event loop,
    claims that arrive while one is in flight share one transaction, in account order
    (``Database.run_together``); each still gets its own outcome."""
    job = rt.relayer.job_row(  # type: ignore[attr-defined]
        staged, idempotency_key=job_key(memory.id, 1), epochs=_write_epochs(rt, memory)
    )
    memory.job_id, memory.status = str(job["id"]), MemoryStatus.STORING
    params: dict[str, object] = {
        **ledger.hold_entry_params(
            memory.account_id,
            memory.cost_mc,
            ref=hold_ref(memory.id, 1),
            memo=f"store {memory.id}",
            now=now,
        ),
        **_counting(rt, memory.size_bytes, now),
        **{f"r_{k}": v for k, v in request.items()},
        **{f"j_{k}": v for k, v in job.items()},
        **{f"m_{k}": v for k, v in _row(memory).items()},
    }
    try:
        if rt.db.run_together(_claim_statement(tuple(job)), params, key=memory.account_id):
            return True
    except BaseException:
        memory.job_id, memory.status = None, MemoryStatus.ACCEPTING
        raise
    memory.job_id, memory.status = None, MemoryStatus.ACCEPTING
    return False


@functools.cache
def _claim_statement(job_columns: tuple[str, ...]) -> Prepared:
    """``_claim_at_once``'s statement (built once per set of job columns):

    WITH reserve AS (UPDATE accounts … RETURNING balance_mc, held_mc),
         req AS (INSERT INTO requests … SELECT … FROM reserve), job AS (…), mem AS (…)
    INSERT INTO ledger_entries … SELECT … FROM reserve RETURNING id
    """
    reserve = _RESERVE.cte("reserve")

    def insert_from(model: type, columns: Iterable[str], prefix: str, name: str) -> CTE:
        t = table(model)
        cols = list(columns)
        values = [bindparam(f"{prefix}{c}", type_=t.c[c].type) for c in cols]
        rows = select(*values).select_from(reserve)
        return insert(t).from_select(cols, rows, include_defaults=False).cte(name)

    parts = (
        insert_from(Request, _REQUEST_COLUMNS, "r_", "req"),
        insert_from(WriteJob, job_columns, "j_", "job"),
        insert_from(Memory, _MEMORY_COLUMNS, "m_", "mem"),
    )
    entry = ledger.hold_entry_from(reserve)
    return Prepared(entry.add_cte(*parts).returning(table(LedgerEntry).c.id))


_REQUEST_COLUMNS = (
    "account_id",
    "tool",
    "request_id",
    "fingerprint",
    "status",
    "memory_id",
    "created_at",
    "updated_at",
)


def _row(m: Claimed) -> dict[str, object]:
    """The new memory's row, keyed by column (for ``_INSERT_MEMORY``)."""
    return {c: getattr(m, "metadata_" if c == "metadata" else c) for c in _MEMORY_COLUMNS}


_MEMORY_COLUMNS = (
    "supersedes",
    "expires_at",
    "expires_epoch",
    "id",
    "account_id",
    "namespace",
    "metadata",
    "size_bytes",
    "content_hash",
    "status",
    "cost_mc",
    "attempt",
    "job_id",
    "accepted_at",
    "deadline_at",
    "status_changed_at",
)

# Built once: the claim runs on every store (see ledger.py on why that matters). On
# SQLite they run on the raw cursor (walkeep.db.Prepared): the store is on the event loop.
_INSERT_REQUEST = Prepared(insert(table(Request)), keys=_REQUEST_COLUMNS)
_INSERT_MEMORY = Prepared(insert(table(Memory)), keys=_MEMORY_COLUMNS)


def _reclaim_failed(
    rt: Runtime, memory: Memory, fp: idempotency.Fingerprint, content: str, cost_mc: int
) -> tuple[AnyMemory, float] | None:
    """Retry a terminally failed store under the same request_id (never poisoned)."""
    now = rt.clock.now()
    attempt = memory.attempt + 1
    staged = _stage(rt, memory.account_id, memory.namespace, content)
    with rt.db.begin() as sess:
        res = sess.execute(
            update(Memory)
            .where(
                Memory.id == memory.id,
                Memory.status == MemoryStatus.FAILED,
                Memory.attempt == memory.attempt,
            )
            .values(
                status=MemoryStatus.ACCEPTING,
                attempt=attempt,
                job_id=None,
                failure_reason=None,
                accepted_at=now,
                deadline_at=now + timedelta(seconds=rt.settings.completion_deadline_seconds),
                status_changed_at=now,
            )
        )
        if rowcount(res) != 1:
            return None  # someone else is retrying it
        _reserve(rt, sess, memory.account_id, memory.id, attempt, memory.size_bytes, cost_mc, now)
        sess.execute(
            update(Request)
            .where(Request.account_id == memory.account_id, Request.memory_id == memory.id)
            .values(status="in_progress", response=None, updated_at=now)
        )
        fresh = sess.get(Memory, memory.id)
        assert fresh is not None
        _accept_in(rt, sess, fresh, staged, attempt)
        return fresh, _due_in(staged)


def _stage(rt: Runtime, account_id: str, namespace: str, content: str) -> object | None:
    """Prepare a write outside any transaction (encryption, key creation, health).

    Relayers that keep their jobs in Walkeep's own database (the self-run
    relayer) then accept *inside* the claim transaction: claim, hold and
    accept commit together, so there is no window in which a claim exists
    without its write.
    """
    stage = getattr(rt.relayer, "stage", None)
    return stage(account_id=account_id, namespace=namespace, content=content) if stage else None


def _accept_in(
    rt: Runtime, sess: Tx, memory: AnyMemory, staged: object | None, attempt: int
) -> None:
    if staged is None:
        return
    memory.job_id = rt.relayer.accept_staged(  # type: ignore[attr-defined]
        sess, staged, idempotency_key=job_key(memory.id, attempt), epochs=_write_epochs(rt, memory)
    )
    memory.status = MemoryStatus.STORING


def _due_in(staged: object | None) -> float:
    """Seconds until a write accepted in the claim transaction is due (0: now)."""
    return float(getattr(staged, "due_in_seconds", 0.0))


def _accept(
    rt: Runtime, memory: AnyMemory, due_in: float, content: str, *, attempt: int
) -> StoreResult:
    """Hand the write to the relayer; on failure undo the claim so nothing is billed.

    ``due_in``: for a write already accepted in the claim transaction, when it becomes
    due, so the completer is only woken for writes it would otherwise sleep past."""
    note = (
        "Accepted — the memory is being written to Walrus and will be billed once it lands. "
        "It becomes recallable shortly; check_runway(memory_id) confirms durability."
    )
    if memory.status == MemoryStatus.STORING:  # accepted within the claim transaction
        if rt.completer is not None:
            rt.completer.submit(memory.id, delay=due_in)
        return _result(memory, "storing", note)
    try:
        job_id = rt.relayer.accept(
            account_id=memory.account_id,
            namespace=memory.namespace,
            content=content,
            idempotency_key=job_key(memory.id, attempt),
            epochs=_write_epochs(rt, memory),
        )
    except WalkeepError as exc:
        _undo_claim(rt, memory, attempt, str(exc))
        raise
    except Exception as exc:
        log.exception("relayer accept crashed for %s", memory.id)
        _undo_claim(rt, memory, attempt, repr(exc))
        raise RelayerUnavailable(
            "the storage backend failed to accept the write; nothing was stored or billed — "
            "retry with the same request_id",
            {"retry": True},
        ) from exc
    now = rt.clock.now()
    with rt.db.begin() as sess:
        sess.execute(
            update(Memory)
            .where(Memory.id == memory.id, Memory.status == MemoryStatus.ACCEPTING)
            .values(status=MemoryStatus.STORING, job_id=job_id, status_changed_at=now)
        )
    if rt.completer is not None:
        rt.completer.submit(memory.id)
    return _result(memory, "storing", note)


def _undo_claim(rt: Runtime, memory: AnyMemory, attempt: int, reason: str) -> None:
    """The relayer refused the write: bill nothing. A first attempt leaves no trace
    (the same request_id simply retries); a retry goes back to failed."""
    now = rt.clock.now()
    with rt.db.begin() as sess:
        if attempt > 1:
            fail_attempt(sess, memory, attempt, reason, now, from_status=None)
            return
        ledger.release(sess, memory.account_id, hold_ref(memory.id, attempt))
        usage.release(sess, memory.account_id, memory.size_bytes)
        sess.execute(
            delete(Request).where(
                Request.account_id == memory.account_id, Request.memory_id == memory.id
            )
        )
        sess.execute(delete(Memory).where(Memory.id == memory.id))


# Usage quotas and the hold in ONE account UPDATE: on PostgreSQL the row lock it takes is
# held to commit and every store of the account queues for it, so the fewer statements
# after it the better (one INSERT of the hold's ledger entry, then COMMIT).
_RESERVE = ledger.hold_statement(where=usage.FITS, values=usage.COUNT)
_RESERVE_PREPARED = Prepared(_RESERVE)


def _reserve(
    rt: Runtime,
    sess: Session,
    account_id: str,
    memory_id: str,
    attempt: int,
    size: int,
    cost_mc: int,
    now: datetime,
) -> None:
    """Count the store against the usage quotas and hold its price, or refuse it having
    done neither: QUOTA_EXCEEDED (checked first, as the reference orders it) or
    INSUFFICIENT_BALANCE."""
    if _try_reserve(rt, sess, account_id, memory_id, attempt, size, cost_mc, now):
        return
    # Refused (or the row changed meanwhile): the one-check-at-a-time path names the
    # limit, or finds that both now pass and does the work itself.
    _check_usage(rt, sess, account_id, size, now)
    _hold(rt, sess, account_id, memory_id, attempt, cost_mc)


def _try_reserve(
    rt: Runtime,
    tx: Tx,
    account_id: str,
    memory_id: str,
    attempt: int,
    size: int,
    cost_mc: int,
    now: datetime,
) -> bool:
    """``_reserve``'s one UPDATE and one INSERT; False, having done nothing, if refused."""
    held = ledger.try_hold_new(
        tx,
        account_id,
        cost_mc,
        ref=hold_ref(memory_id, attempt),
        memo=f"store {memory_id}",
        stmt=_RESERVE_PREPARED,
        params=_counting(rt, size, now),
    )
    return held is not None


def _counting(rt: Runtime, size: int, now: datetime) -> dict[str, int]:
    """The usage-quota parameters of one store of ``size`` bytes (``usage.FITS``/``COUNT``)."""
    s = rt.settings
    return usage.counting(
        size, now, max_total_bytes=s.max_total_bytes, max_stores_per_day=s.max_stores_per_day
    )


def _hold(
    rt: Runtime, sess: Session, account_id: str, memory_id: str, attempt: int, cost_mc: int
) -> None:
    try:
        ledger.hold(
            sess, account_id, cost_mc, ref=hold_ref(memory_id, attempt), memo=f"store {memory_id}"
        )
    except InsufficientBalance as exc:
        available = int(exc.data.get("available_mc", 0))
        short_mc = cost_mc - available
        suggested = max(
            ledger.mc_to_usd_ceil(short_mc), ledger.mc_to_usd_ceil(500 * ledger.MC_PER_CREDIT)
        )
        # Advise an amount top_up accepts: the shortfall is often a cent, below its minimum.
        minimum = max(ledger.mc_to_usd_ceil(max(short_mc, 0)), Decimal(TOPUP_MIN_CENTS) / 100)
        raise InsufficientBalance(
            "not enough credits for this store; nothing was stored or charged",
            {
                "needed_credits": ledger.credits_display(cost_mc),
                "available_credits": ledger.credits_display(max(available, 0)),
                "top_up": {
                    "tool": "top_up",
                    "arguments": {"amount_usd": float(suggested)},
                    "then": "replay store with the same request_id",
                    "minimum_usd": float(minimum),
                },
            },
        ) from exc


def _check_usage(rt: Runtime, sess: Session, account_id: str, size: int, now: datetime) -> None:
    usage.check_and_add(
        sess,
        account_id,
        size,
        now,
        max_total_bytes=rt.settings.max_total_bytes,
        max_stores_per_day=rt.settings.max_stores_per_day,
    )


def _result(memory: AnyMemory, status: str, note: str) -> StoreResult:
    return StoreResult(
        memory_id=memory.id,
        status=status,  # type: ignore[arg-type]
        namespace=memory.namespace,
        cost_credits=ledger.credits_display(memory.cost_mc),
        note=note,
    )
