"""``export``: take your memories with you — on-chain identifiers, content where the
backend can list it, and the address that owns the blobs.

Lapsed memories (paid runway ran out) and forgotten ones are omitted, as recall omits
them; ``check_runway`` still lists them (``expired``, ``no-renew``).

With a backend that has no bulk-content list (MemWal) the export falls back to
Walkeep's registry: every identifier is still there and ``content_included``
is false. It never fails with NOT_SUPPORTED.

Paged, so one call's work is bounded whatever the account holds: a page has
at most ``limit`` memories (default ``WALKEEP_EXPORT_PAGE_SIZE``) and at most
``WALKEEP_EXPORT_PAGE_MAX_BYTES`` of content (always at least one memory), in
(stored_at, memory_id) order. ``next_cursor`` continues after the page's last
memory (keyset, so stores and forgets between pages never shift or repeat
rows). The cursor is opaque and MACed with a key derived from the master key
over the account, namespace and filters: a cursor edited, or replayed by another
account or for another namespace or filter, is refused with VALIDATION_ERROR.

``after``, ``before`` and ``metadata`` keep only the memories that match
(walkeep/service/filters.py), as in recall.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from datetime import datetime

from sqlalchemy import and_, or_, select

from walkeep.db.models import Blob, Memory
from walkeep.errors import ValidationError
from walkeep.lifecycle import VISIBLE
from walkeep.service import filters, sealed
from walkeep.service.namespaces import validate_namespace
from walkeep.service.runtime import Runtime
from walkeep.service.tools.schemas import ExportMemory, ExportResult, OwnershipProof
from walkeep.service.tools.views import unexpired

PAGE_MAX = 1000
CURSOR_MAX_CHARS = 512
_KEY_EXTRA = "export_cursor_key"


def _cursor_key(rt: Runtime) -> bytes:
    key = rt.extras.get(_KEY_EXTRA)
    if key is None:
        from walkeep.crypto import load_master_key

        master = load_master_key(rt.settings)
        key = hmac.new(master, b"walkeep/export-cursor/v1", hashlib.sha256).digest()
        rt.extras[_KEY_EXTRA] = key
    assert isinstance(key, bytes)
    return key


def _mac(rt: Runtime, account_id: str, namespace: str | None, payload: bytes) -> bytes:
    """``namespace`` here is the page's whole scope: its namespace token, and with a
    filter, the filter too (``_scope``), so a cursor is refused under another one."""
    scope = json.dumps([account_id, namespace]).encode()
    return hmac.new(_cursor_key(rt), scope + b"\0" + payload, hashlib.sha256).digest()[:16]


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def encode_cursor(
    rt: Runtime, account_id: str, namespace: str | None, stored_at: datetime, memory_id: str
) -> str:
    payload = json.dumps([stored_at.isoformat(), memory_id], separators=(",", ":")).encode()
    return f"{_b64(payload)}.{_b64(_mac(rt, account_id, namespace, payload))}"


def decode_cursor(
    rt: Runtime, account_id: str, namespace: str | None, cursor: str
) -> tuple[datetime, str]:
    bad = ValidationError(
        "invalid export cursor: pass next_cursor from the previous page unchanged, "
        "with the same namespace and filters",
        {"field": "cursor"},
    )
    if not isinstance(cursor, str) or not 0 < len(cursor) <= CURSOR_MAX_CHARS:
        raise bad
    head, sep, tag = cursor.partition(".")
    try:
        payload, mac = _unb64(head), _unb64(tag)
    except (binascii.Error, ValueError):
        raise bad from None
    if not sep or not hmac.compare_digest(mac, _mac(rt, account_id, namespace, payload)):
        raise bad
    try:
        stored_at_text, memory_id = json.loads(payload)
        return datetime.fromisoformat(stored_at_text), str(memory_id)
    except (ValueError, TypeError):
        raise bad from None


def export(
    rt: Runtime,
    account_id: str,
    *,
    namespace: str | None = None,
    cursor: str | None = None,
    limit: int | None = None,
    after: str | datetime | None = None,
    before: str | datetime | None = None,
    metadata: object = None,
) -> ExportResult:
    if namespace is not None:
        # Matched as its token (walkeep/service/sealed.py).
        namespace = sealed.namespace_token(rt, account_id, validate_namespace(namespace))
    narrow = filters.parse(rt, account_id, after=after, before=before, metadata=metadata)
    scope = namespace if not narrow else json.dumps([namespace, narrow.key()])
    page_size = rt.settings.export_page_size if limit is None else limit
    if (
        isinstance(page_size, bool)
        or not isinstance(page_size, int)
        or not 1 <= page_size <= PAGE_MAX
    ):
        raise ValidationError(
            f"limit must be an integer from 1 to {PAGE_MAX}",
            {"field": "limit", "minimum": 1, "maximum": PAGE_MAX},
        )
    # As recall: stored, not forgotten, not lapsed. A memory whose blob is past its
    # end epoch is gone from Walrus even before the sweep marks it expired; listing it
    # would hand a migration identifiers that resolve to nothing.
    current = rt.chain.current_epoch()
    q = (
        select(Memory, Blob)
        .join(Blob, Blob.id == Memory.blob_pk)
        .where(
            Memory.account_id == account_id,
            Memory.status.in_(list(VISIBLE)),
            Blob.end_epoch > current,
            unexpired(rt.clock.now()),
            *narrow.where(account_id, by_time=True),
        )
        .order_by(Memory.stored_at, Memory.id)
        .limit(page_size + 1)
    )
    if namespace is not None:
        q = q.where(Memory.namespace == namespace)
    if cursor:
        after_at, after_id = decode_cursor(rt, account_id, scope, cursor)
        q = q.where(
            or_(
                Memory.stored_at > after_at,
                and_(Memory.stored_at == after_at, Memory.id > after_id),
            )
        )
    with rt.db.read() as s:
        rows: list[tuple[Memory, Blob]] = [(m, b) for m, b in s.execute(q)]

    budget = rt.settings.export_page_max_bytes
    page: list[tuple[Memory, Blob]] = []
    used = 0
    for m, b in rows[:page_size]:
        if page and used + m.size_bytes > budget:
            break
        page.append((m, b))
        used += m.size_bytes
    more = len(page) < len(rows)
    next_cursor = None
    if more:
        last = page[-1][0]
        next_cursor = encode_cursor(
            rt, account_id, scope, last.stored_at or last.accepted_at, last.id
        )

    contents: dict[str, str] | None = None
    if rt.relayer.content_listable:
        listed = rt.relayer.list_contents(
            account_id, namespace, list(dict.fromkeys(m.blob_id or b.blob_id for m, b in page))
        )
        if listed is not None:
            contents = {item.blob_id: item.content for item in listed}
    names = sealed.namespace_names(rt, account_id, {m.namespace for m, _ in page})
    memories = [
        ExportMemory(
            memory_id=m.id,
            content=contents.get(m.blob_id or b.blob_id) if contents is not None else None,
            namespace=names[m.namespace],
            blob_id=m.blob_id or b.blob_id,
            blob_object_id=b.blob_object_id,
            quilt_id=b.blob_id if b.kind == "quilt" else None,
            stored_at=m.stored_at or m.accepted_at,
            metadata=sealed.open_metadata(rt, account_id, m.metadata_),
            expires_at=m.expires_at,
            supersedes=m.supersedes,
        )
        for m, b in page
    ]
    owner = rt.chain.owner_address()
    return ExportResult(
        memories=memories,
        content_included=contents is not None,
        next_cursor=next_cursor,
        ownership_proof=OwnershipProof(
            owner_address=owner,
            note=(
                f"Every blob_object_id above is a Walrus Blob object owned by Sui address {owner} "
                f"(Walkeep's server wallet on {rt.chain.network}); check any of them at "
                f"{rt.chain.explorer_object_url('<blob_object_id>')}. The blob_id is the content "
                "address on Walrus; the bytes are encrypted with your account's key."
            ),
        ),
    )
