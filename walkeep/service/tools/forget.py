"""``forget``: stop renewing a memory. Hidden from recall at once; lapses naturally.

Walrus has no hard delete for a blob someone paid for: the honest promise is
"we stop paying, it disappears from recall and export now, and the encrypted
bytes lapse at end_epoch". The note says what will really happen to the bytes, case
by case (``_note``):

- **its own blob** (and the identical copies that share it: forgetting a blob_id stops
  every memory of the account that shares it, since they share one renewal): it lapses
  at the blob's end epoch — or at the end a renewal already under way gives it;
- **packed in a quilt with active neighbours**: the quilt keeps renewing for them, so
  the patch stays on Walrus while it does (the account is no longer billed for it), until
  the quilt is re-packed without it or lapses; with only *paused* neighbours, the quilt
  is renewed again only if they resume, else it lapses at its end epoch; with none, it
  lapses at its end epoch like a blob;
- **still being written**: where it lands is not known yet. An identical memory the
  account keeps holds the same bytes, which stay while it is kept; a write that may be
  packed lands in a quilt whose other memories may keep it renewed; otherwise it lapses
  at the end of its initial paid epochs. The note says whichever of these can happen.

A key confined to a namespace (``confined_to``) forgets only inside it: an id from another
namespace is NOT_FOUND as an unknown one is, a shared blob_id stops only that namespace's
copies, and the note never names a memory of another namespace.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import ColumnElement, func, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from walkeep.backends.base import EpochInfo
from walkeep.db.models import Blob, Memory, RenewalItem, Request
from walkeep.lifecycle import MemoryStatus
from walkeep.service import sealed
from walkeep.service.leaving import Why, leave
from walkeep.service.namespaces import validate_namespace
from walkeep.service.runtime import Runtime
from walkeep.service.tools import idempotency
from walkeep.service.tools.schemas import ForgetResult
from walkeep.service.tools.views import approx_epoch_start, resolve

TOOL = "forget"


def forget(
    rt: Runtime,
    account_id: str,
    *,
    memory_id: str,
    request_id: str,
    confined_to: str | None = None,
) -> ForgetResult:
    idempotency.validate_request_id(request_id)
    fp = idempotency.fingerprint(rt, account_id, memory_id=memory_id)
    token = (
        None
        if confined_to is None
        else sealed.namespace_token(rt, account_id, validate_namespace(confined_to))
    )
    # Same account, and for a confined key the same namespace: the memories it may stop.
    mine = [Memory.account_id == account_id]
    if token is not None:
        mine.append(Memory.namespace == token)
    with rt.db.read() as s:
        if token is not None:
            # Before any replay: a request id another key of the account used on another
            # namespace's memory must not answer (and so reveal it) for this one.
            resolve(s, account_id, memory_id, namespace=token)
        prior = idempotency.find(s, account_id, TOOL, request_id)
    if prior is not None:
        idempotency.check_fingerprint(prior, fp)
        if prior.response:
            return ForgetResult.model_validate(prior.response)

    now = rt.clock.now()
    info = rt.chain.epoch_info()
    try:
        with rt.db.begin() as s:
            rows = resolve(s, account_id, memory_id, namespace=token)
            public = {m.blob_id for m, _ in rows if m.blob_id}
            ids_ = {m.id for m, _ in rows}
            # Every memory of this account with the same blob_id (identical content:
            # one blob, or one quilt patch) stops renewing; one still being written is
            # marked now and lands as no-renew (service/leaving.py).
            leave(
                s,
                [*mine, or_(Memory.blob_id.in_(public), Memory.id.in_(ids_))],
                now,
                Why.FORGOTTEN,
            )
            # Forgetting one that already lapsed acknowledges it (the console stops asking
            # an operator to act on it): marked too, its status unchanged.
            s.execute(
                update(Memory)
                .where(Memory.id.in_(ids_), Memory.forgotten_at.is_(None))
                .values(forgotten_at=now)
            )
            note = _note(_facts(rt, s, mine, rows, public), info, now)
            result = ForgetResult(memory_id=memory_id, status="no-renew", note=note)
            s.add(
                Request(
                    account_id=account_id,
                    tool=TOOL,
                    request_id=request_id,
                    fingerprint=fp.keyed,
                    status="done",
                    response=result.model_dump(mode="json"),
                    created_at=now,
                    updated_at=now,
                )
            )
    except IntegrityError:
        # A concurrent replay of the same request_id finished first.
        with rt.db.read() as s:
            prior = idempotency.find(s, account_id, TOOL, request_id)
        if prior is None or not prior.response:
            raise
        idempotency.check_fingerprint(prior, fp)
        return ForgetResult.model_validate(prior.response)
    return result


@dataclass(frozen=True, slots=True)
class _Facts:
    """What the note's promise rests on, read in the forget's own transaction."""

    stopped: int  # memories whose renewal is now stopped (this one and its copies)
    ends: list[int]  # end epochs of the blobs holding them (empty: still being written)
    extends_to: int | None  # the end a renewal already under way gives them
    quilt_active: int  # other active memories packed in the same quilt
    quilt_paused: int  # other paused memories packed in the same quilt
    kept_copy: str | None  # still being written: an identical memory the account keeps
    may_pack: bool  # still being written: the write may land packed in a quilt
    initial_epochs: int


def _facts(
    rt: Runtime,
    s: Session,
    mine: list[ColumnElement[bool]],
    rows: list[tuple[Memory, Blob | None]],
    public: set[str],
) -> _Facts:
    """``mine``: the memories the caller may see (the account's; a confined key's
    namespace's), so the note counts and names only those."""
    blobs = {b.id: b for _, b in rows if b is not None}
    stopped = (
        s.scalar(
            select(func.count())
            .select_from(Memory)
            .where(
                *mine,
                Memory.blob_id.in_(public),
                Memory.status == MemoryStatus.NO_RENEW,
            )
        )
        if public
        else len(rows)
    )
    quilts = [pk for pk, b in blobs.items() if b.kind == "quilt"]
    by_status: dict[str, int] = {}
    if quilts:
        by_status = dict(
            s.execute(
                select(Memory.status, func.count())
                .where(
                    Memory.blob_pk.in_(quilts),
                    Memory.status.in_([MemoryStatus.ACTIVE, MemoryStatus.PAUSED]),
                )
                .group_by(Memory.status)
            ).all()
        )
    pending = [b.pending_renewal_id for b in blobs.values() if b.pending_renewal_id is not None]
    extends_to = (
        s.scalar(
            select(func.max(RenewalItem.new_end_epoch)).where(
                RenewalItem.renewal_id.in_(pending), RenewalItem.blob_pk.in_(list(blobs))
            )
        )
        if pending
        else None
    )
    writing = [m for m, b in rows if b is None]
    kept_copy = None
    if writing:
        kept_copy = s.scalar(
            select(Memory.id)
            .where(
                *mine,
                Memory.content_hash.in_({m.content_hash for m in writing}),
                Memory.status.in_([MemoryStatus.ACTIVE, MemoryStatus.PAUSED]),
            )
            .limit(1)
        )
    packs = getattr(rt.relayer, "packs", None)
    return _Facts(
        stopped=int(stopped or 0),
        ends=[b.end_epoch for b in blobs.values()],
        extends_to=extends_to,
        quilt_active=int(by_status.get(MemoryStatus.ACTIVE, 0)),
        quilt_paused=int(by_status.get(MemoryStatus.PAUSED, 0)),
        kept_copy=kept_copy,
        may_pack=bool(packs and any(packs(m.size_bytes) for m in writing)),
        initial_epochs=rt.settings.initial_epochs,
    )


_QUILT_STAYS = (
    "its encrypted patch stays on Walrus while that quilt is renewed (you are no longer "
    "billed for it), until the quilt is re-packed without it or lapses"
)
_KEY = "Only someone holding your account's key can decrypt it."


def _note(f: _Facts, info: EpochInfo, now: datetime) -> str:
    copies = f"{f.stopped} memories sharing this blob" if f.stopped > 1 else "this memory"
    head = (
        f"Renewal stopped for {copies}; it no longer appears in recall or export. "
        "Walrus has no hard delete: the encrypted blob is not erased on chain"
    )
    if not f.ends:
        if f.kept_copy:
            return (
                f"{head}. It is still being written; an identical memory you keep "
                f"({f.kept_copy}) holds the same encrypted content, which stays on Walrus "
                f"while you keep that memory. {_KEY}"
            )
        lapse = (
            f"it lapses at the end of its initial paid epochs ({f.initial_epochs} epochs "
            "after it lands)"
        )
        if f.may_pack:
            return (
                f"{head}. It is still being written. If it lands packed in a Walrus quilt "
                "with other memories of yours, " + _QUILT_STAYS + " — the quilt is renewed "
                f"for as long as you keep any of them; otherwise {lapse}. {_KEY}"
            )
        return f"{head}; it is still being written and {lapse}. {_KEY}"
    if f.quilt_active:
        return (
            f"{head}. It is packed in a Walrus quilt with {f.quilt_active} other active "
            f"memories that are still renewed, so {_QUILT_STAYS}. {_KEY}"
        )
    end = max([*f.ends, f.extends_to or 0])
    when = approx_epoch_start(info, end, now).strftime("%Y-%m-%d %H:%M UTC")
    lapse = f"its paid storage ends at epoch {end} (about {when})" + (
        ", where a renewal already under way when you forgot it takes it"
        if f.extends_to and f.extends_to > max(f.ends)
        else ""
    )
    if f.quilt_paused:
        return (
            f"{head}. It is packed in a Walrus quilt with {f.quilt_paused} other paused "
            "memories: the quilt is renewed again only if they resume (when credits "
            f"arrive), and then {_QUILT_STAYS}; otherwise it stays retrievable by blob_id "
            f"until {lapse}, then lapses. {_KEY}"
        )
    return f"{head} — it stays retrievable by blob_id until {lapse}, then lapses. {_KEY}"
