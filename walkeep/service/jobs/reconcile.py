"""Settle renewal intents that a crash or an unknown outcome left behind.

A renewal records its chain transaction as an *intent* before submitting it
(walkeep/service/jobs/renew.py). If the worker dies between submit and record, or the
chain's answer never arrived, the intent stays. Once it is older than
``INTENT_GRACE_SECONDS`` (it may still be in flight in the worker that made it), this
asks the chain about its digest: applied → record and capture exactly once; not
applied (and no longer able to land) → release the holds. A digest the chain does
not know while every blob already shows the extension is left waiting: the money
was spent on chain, so nothing is released.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import select

from walkeep.backends.base import ChainError
from walkeep.db.models import Blob, Renewal, RenewalItem
from walkeep.service.jobs import renew
from walkeep.service.runtime import Runtime

log = logging.getLogger(__name__)

# An intent younger than this may still be in flight in the worker that made it.
INTENT_GRACE_SECONDS = 120


@dataclass
class ReconcileReport:
    confirmed: int = 0
    abandoned: int = 0
    waiting: int = 0


def reconcile_renewals(
    rt: Runtime, *, grace_seconds: int = INTENT_GRACE_SECONDS
) -> ReconcileReport:
    """Settle intents a crash (or an unknown outcome) left behind, by asking the chain."""
    report = ReconcileReport()
    cutoff = rt.clock.now() - timedelta(seconds=grace_seconds)
    with rt.db.read() as s:
        intents = list(
            s.execute(
                select(Renewal.id, Renewal.digest).where(
                    Renewal.status == "intent", Renewal.created_at <= cutoff
                )
            )
        )
    for renewal_id, digest in intents:
        try:
            effects = rt.chain.get_transaction(digest)
        except ChainError as exc:
            log.warning("cannot look up %s yet: %s", digest, exc)
            report.waiting += 1
            continue
        if effects is not None and effects.success:
            if renew.record(rt, renewal_id, effects):
                report.confirmed += 1
            continue
        # Unknown digest: confirm from the blobs themselves before releasing.
        with rt.db.read() as s:
            items = list(
                s.execute(
                    select(
                        Blob.blob_object_id, RenewalItem.old_end_epoch, RenewalItem.new_end_epoch
                    )
                    .join(Blob, Blob.id == RenewalItem.blob_pk)
                    .where(RenewalItem.renewal_id == renewal_id)
                )
            )
            tx_bytes = s.scalar(select(Renewal.tx_bytes).where(Renewal.id == renewal_id))
        if effects is None and tx_bytes and rt.chain.can_still_land(tx_bytes):
            report.waiting += 1  # signed and maybe in flight: judge it after it expires
            continue
        applied = True
        for object_id, _old_end, new_end in items:
            obj = rt.chain.get_blob(object_id)
            if obj is None or obj.end_epoch < new_end:
                applied = False
                break
        if applied and items and effects is None:
            # Every blob shows the extension yet the digest is unknown: do not
            # release (the money was spent on chain); wait for the digest.
            report.waiting += 1
            continue
        if renew.abandon(rt, renewal_id, "not applied on chain (reconciled)", backoff=False):
            report.abandoned += 1
    return report
