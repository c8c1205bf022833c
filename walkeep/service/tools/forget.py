"""``forget``: stop renewing a memory. Hidden from recall at once; lapses naturally.

Walrus has no hard delete for a blob someone paid for: the honest promise is
"we stop paying, it disappears from recall and export now, and the encrypted
bytes lapse at end_epoch". The note says so, with the epoch and a date.
Forgetting a blob_id stops every memory of the account that shares it
(identical content), since they share one renewal. A memory packed in a quilt
shares its Blob object with other memories: the quilt keeps renewing while any
of them is active, and the note says so rather than promising a lapse date.
"""

from __future__ import annotations

from sqlalchemy import func, select, update
from sqlalchemy.exc import IntegrityError

from walkeep.db.models import Memory, Request
from walkeep.lifecycle import MemoryStatus
from walkeep.service.runtime import Runtime
from walkeep.service.tools import idempotency
from walkeep.service.tools.schemas import ForgetResult
from walkeep.service.tools.views import approx_epoch_start, resolve

TOOL = "forget"


def forget(rt: Runtime, account_id: str, *, memory_id: str, request_id: str) -> ForgetResult:
    idempotency.validate_request_id(request_id)
    fp = idempotency.fingerprint(memory_id=memory_id)
    with rt.db.read() as s:
        prior = idempotency.find(s, account_id, TOOL, request_id)
    if prior is not None:
        idempotency.check_fingerprint(prior, fp)
        if prior.response:
            return ForgetResult.model_validate(prior.response)

    now = rt.clock.now()
    info = rt.chain.epoch_info()
    try:
        with rt.db.begin() as s:
            rows = resolve(s, account_id, memory_id)
            public = {m.blob_id for m, _ in rows if m.blob_id}
            ids_ = {m.id for m, _ in rows}
            # Every memory of this account with the same blob_id (identical content:
            # one blob, or one quilt patch) stops renewing.
            if public:
                s.execute(
                    update(Memory)
                    .where(
                        Memory.account_id == account_id,
                        Memory.blob_id.in_(public),
                        Memory.status.in_([MemoryStatus.ACTIVE, MemoryStatus.PAUSED]),
                    )
                    .values(status=MemoryStatus.NO_RENEW, forgotten_at=now, status_changed_at=now)
                )
            # A memory still being written is marked now and lands as no-renew.
            s.execute(
                update(Memory)
                .where(Memory.id.in_(ids_), Memory.forgotten_at.is_(None))
                .values(forgotten_at=now)
            )
            ends = [b.end_epoch for _, b in rows if b is not None]
            stopped = (
                len(rows)
                if not public
                else s.query(Memory)
                .filter(Memory.account_id == account_id, Memory.blob_id.in_(public))
                .count()
            )
            quilt_pks = {b.id for _, b in rows if b is not None and b.kind == "quilt"}
            neighbours = (
                s.scalar(
                    select(func.count())
                    .select_from(Memory)
                    .where(
                        Memory.blob_pk.in_(quilt_pks),
                        Memory.status == MemoryStatus.ACTIVE,
                    )
                )
                if quilt_pks
                else 0
            )
            note = _note(ends, info, now, stopped, memory_id, neighbours=neighbours or 0)
            result = ForgetResult(memory_id=memory_id, status="no-renew", note=note)
            s.add(
                Request(
                    account_id=account_id,
                    tool=TOOL,
                    request_id=request_id,
                    fingerprint=fp,
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


def _note(ends: list[int], info, now, stopped: int, ident: str, *, neighbours: int = 0) -> str:  # type: ignore[no-untyped-def]
    copies = f"{stopped} memories sharing this blob" if stopped > 1 else "this memory"
    head = (
        f"Renewal stopped for {copies}; it no longer appears in recall or export. "
        "Walrus has no hard delete: the encrypted blob is not erased on chain"
    )
    if not ends:
        return (
            head
            + "; it is still being written and will lapse at the end of its initial paid epochs."
        )
    if neighbours:
        return (
            f"{head}. It is packed in a Walrus quilt with {neighbours} other active "
            "memories that are still renewed, so its encrypted patch stays on Walrus while "
            "that quilt is renewed (you are no longer billed for it), until the quilt is "
            "re-packed without it or lapses. Only someone holding your account's key can "
            "decrypt it."
        )
    end = max(ends)
    when = approx_epoch_start(info, end, now).strftime("%Y-%m-%d %H:%M UTC")
    return (
        f"{head} — it stays retrievable by blob_id until its paid storage ends at epoch {end} "
        f"(about {when}), then lapses. Only someone holding your account's key can decrypt it."
    )
