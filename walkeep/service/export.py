"""``export``: take your memories with you — on-chain identifiers, content where the
backend can list it, and the address that owns the blobs.

With a backend that has no bulk-content list (MemWal) the export falls back to
Walkeep's registry: every identifier is still there and ``content_included``
is false. It never fails with NOT_SUPPORTED.
"""

from __future__ import annotations

from sqlalchemy import select

from walkeep.db.models import Blob, Memory
from walkeep.lifecycle import VISIBLE
from walkeep.service.accounts import validate_namespace
from walkeep.service.runtime import Runtime
from walkeep.service.schemas import ExportMemory, ExportResult, OwnershipProof


def export(rt: Runtime, account_id: str, *, namespace: str | None = None) -> ExportResult:
    if namespace is not None:
        namespace = validate_namespace(namespace)
    q = (
        select(Memory, Blob)
        .join(Blob, Blob.id == Memory.blob_pk)
        .where(Memory.account_id == account_id, Memory.status.in_(list(VISIBLE)))
        .order_by(Memory.stored_at, Memory.id)
    )
    if namespace is not None:
        q = q.where(Memory.namespace == namespace)
    with rt.db.read() as s:
        rows = list(s.execute(q))

    contents: dict[str, str] | None = None
    if rt.relayer.content_listable:
        listed = rt.relayer.list_contents(
            account_id, namespace, list(dict.fromkeys(m.blob_id or b.blob_id for m, b in rows))
        )
        if listed is not None:
            contents = {item.blob_id: item.content for item in listed}
    memories = [
        ExportMemory(
            memory_id=m.id,
            content=contents.get(m.blob_id or b.blob_id) if contents is not None else None,
            namespace=m.namespace,
            blob_id=m.blob_id or b.blob_id,
            blob_object_id=b.blob_object_id,
            quilt_id=b.blob_id if b.kind == "quilt" else None,
            stored_at=m.stored_at or m.accepted_at,
        )
        for m, b in rows
    ]
    owner = rt.chain.owner_address()
    return ExportResult(
        memories=memories,
        content_included=contents is not None,
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
