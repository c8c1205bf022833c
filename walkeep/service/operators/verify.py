"""``walkeep verify``: check Walkeep's renewal records against the chain, fact by fact.

An auditor should not have to trust Walkeep's database. For a renewal digest
this fetches the transaction bytes *from the chain*, recomputes the digest
(``base58(blake2b256("TransactionData::" ‖ bytes))``), decodes every
``system::extend_blob`` call with the same decoder the Sui adapter uses, and
compares each call with the records (``renewals`` + ``renewal_items`` +
``blobs``): package, function, System object, Blob object, epochs (u32), old →
new end epoch from the effects, the effects' status and the sender (the server
wallet). For a memory it walks the whole renewal history of the memory's blob.

The money side is checked to the millicredit: each item's bill against the price rule —
for a quilt, its recorded kept shares, which with the unbilled rest sum exactly to the
quilt's apportioned shares (walkeep/pricing.py says how a quilt's cost is apportioned) —
and the chain's WAL charge against the storage price. A quilt renewal billed before
exact apportionment (migration 0019) is checked by the rule that billed it.

Transport-free: the CLI prints the facts, and the console can render the same
:class:`VerifyReport` as a page.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import asdict, dataclass, field
from itertools import pairwise
from typing import Any

from sqlalchemy import func, select

from walkeep import pricing
from walkeep.backends.base import ChainError, TxEffects
from walkeep.backends.sui.codec import tx_digest
from walkeep.backends.sui.ptb import DecodedExtend, decode_extend_tx
from walkeep.db.models import Blob, Memory, Renewal, RenewalItem
from walkeep.errors import NotFound, ValidationError
from walkeep.protocol import walrus
from walkeep.protocol.b58 import b58decode
from walkeep.service.runtime import Runtime


@dataclass(frozen=True, slots=True)
class Fact:
    """One checked statement: PASS or FAIL, with what was expected and what was found."""

    name: str
    ok: bool
    detail: str = ""

    def line(self) -> str:
        return f"{'PASS' if self.ok else 'FAIL'} {self.name}" + (
            f": {self.detail}" if self.detail else ""
        )


@dataclass
class VerifyReport:
    subject: str  # a digest, or a memory id
    network: str
    facts: list[Fact] = field(default_factory=list)
    digests: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.facts) and all(f.ok for f in self.facts)

    def check(self, name: str, ok: bool, detail: str = "") -> bool:
        self.facts.append(Fact(name, bool(ok), detail))
        return bool(ok)

    def to_dict(self) -> dict[str, Any]:
        return {
            "subject": self.subject,
            "network": self.network,
            "ok": self.ok,
            "digests": self.digests,
            "facts": [asdict(f) for f in self.facts],
        }


@dataclass(frozen=True, slots=True)
class _Item:
    blob_object_id: str
    epochs: int
    old_end_epoch: int
    new_end_epoch: int
    cost_mc: int
    storage_size: int
    kind: str
    share_micro: int | None  # a quilt renewal's kept shares (NULL: before migration 0019)
    unbilled_micro: int | None
    blob_pk: int
    apportioned_micro: int | None  # the quilt's blobs.share_micro
    patch_count: int | None


def _items(rt: Runtime, renewal_id: int) -> list[_Item]:
    with rt.db.read() as s:
        rows = s.execute(
            select(
                Blob.blob_object_id,
                RenewalItem.epochs,
                RenewalItem.old_end_epoch,
                RenewalItem.new_end_epoch,
                RenewalItem.cost_mc,
                Blob.storage_size,
                Blob.kind,
                RenewalItem.share_micro,
                RenewalItem.unbilled_micro,
                Blob.id,
                Blob.share_micro,
                Blob.patch_count,
            )
            .join(Blob, Blob.id == RenewalItem.blob_pk)
            .where(RenewalItem.renewal_id == renewal_id)
            .order_by(RenewalItem.id)
        ).all()
    return [_Item(*tuple[Any, ...](r)) for r in rows]


def verify_digest(rt: Runtime, digest: str) -> VerifyReport:
    """Every fact about one renewal transaction (see the module docstring)."""
    digest = (digest or "").strip()
    if not is_digest(digest):
        # "hello" used to get a FAIL line as if it were a digest Walkeep had lost.
        raise ValidationError(
            f"{digest[:60]!r} is not a transaction digest: a digest is base58 of 32 bytes "
            "(43-44 characters, as check_runway's last_renewal_tx); for a memory use "
            "--memory mem_…",
            {"digest": digest[:100]},
        )
    report = VerifyReport(subject=digest, network=rt.chain.network, digests=[digest])
    _verify_into(rt, digest, report, prefix="")
    return report


def is_digest(text: str) -> bool:
    """A Sui transaction digest: base58 of exactly 32 bytes."""
    if not 32 <= len(text) <= 44:
        return False
    try:
        return len(b58decode(text)) == 32
    except ValueError:
        return False


def _verify_into(
    rt: Runtime,
    digest: str,
    report: VerifyReport,
    *,
    prefix: str,
    only_object: str | None = None,
) -> None:
    """Check one renewal into ``report``. ``only_object``: list the calls of that Blob
    object fact by fact and fold the batch's other calls into one counted fact (a memory
    audit printed ~70 lines of other blobs' calls); any failing fact is still listed."""
    p = prefix
    with rt.db.read() as s:
        rec = s.execute(
            select(
                Renewal.id,
                Renewal.status,
                Renewal.network,
                Renewal.tx_bytes,
                Renewal.blob_count,
                Renewal.cost_mc,
                Renewal.wal_cost_frost,
            ).where(Renewal.digest == digest)
        ).first()
    if not report.check(
        f"{p}renewal record",
        rec is not None,
        f"{digest} is renewal #{rec[0]} ({rec[1]})"
        if rec
        else f"Walkeep has no renewal with digest {digest}",
    ):
        return
    assert rec is not None
    renewal_id, status, network, recorded_bytes, blob_count, cost_mc, wal_cost = rec
    report.check(
        f"{p}network",
        network == rt.chain.network,
        f"recorded {network}, checking {rt.chain.network}",
    )
    try:
        chain_b64 = rt.chain.get_transaction_bytes(digest)
    except ChainError as exc:
        report.check(f"{p}transaction on chain", False, f"could not fetch it: {exc}")
        return
    if status != "confirmed":
        # A failed or abandoned intent must not exist on chain (nothing was billed for it);
        # an intent still in flight cannot be judged yet.
        if status == "intent":
            report.check(f"{p}renewal settled", False, "still an intent: run it again later")
        else:
            report.check(
                f"{p}not on chain",
                chain_b64 is None,
                f"recorded as {status} (holds released); the chain "
                + ("has it: MISMATCH" if chain_b64 else "does not know it"),
            )
        return
    if not report.check(
        f"{p}transaction on chain",
        chain_b64 is not None,
        "fetched its bytes" if chain_b64 else "the chain does not know this digest",
    ):
        return
    assert chain_b64 is not None
    try:
        raw = base64.b64decode(chain_b64, validate=True)
    except (ValueError, binascii.Error):
        report.check(f"{p}transaction bytes", False, "the chain returned bytes that are not base64")
        return
    recomputed = tx_digest(raw)
    report.check(
        f"{p}digest",
        recomputed == digest,
        f"base58(blake2b256('TransactionData::' ‖ bytes)) = {recomputed}",
    )
    report.check(
        f"{p}recorded bytes",
        recorded_bytes == chain_b64,
        "Walkeep's intent holds the same bytes"
        if recorded_bytes == chain_b64
        else "Walkeep's intent recorded different bytes",
    )
    try:
        tx: DecodedExtend | None = decode_extend_tx(raw)
    except ValueError as exc:
        report.check(f"{p}decode", False, str(exc))
        tx = None
    if tx is None:
        return
    owner = rt.chain.owner_address()
    report.check(f"{p}sender", tx.sender == owner, f"{tx.sender} (server wallet {owner})")
    try:
        effects = rt.chain.get_transaction(digest)
    except ChainError as exc:
        report.check(f"{p}effects", False, f"could not fetch them: {exc}")
        effects = None
    if effects is not None:
        report.check(
            f"{p}effects status",
            effects.success,
            "success" if effects.success else f"failed: {effects.error}",
        )
    targets = getattr(rt.chain, "walrus_targets", None)
    system_id, packages = targets() if targets else (None, ())
    report.check(
        f"{p}calls",
        tx.other_commands == 0 and len(tx.calls) > 0,
        f"{len(tx.calls)} extend_blob call(s), {tx.other_commands} other command(s)",
    )
    items = _items(rt, renewal_id)
    report.check(
        f"{p}call count",
        len(tx.calls) == len(items),
        f"{len(tx.calls)} on chain, {len(items)} in Walkeep's records",
    )
    extensions = {e.blob_object_id: e for e in effects.extensions} if effects else {}
    mine = report
    others = VerifyReport(subject=digest, network=report.network)
    _check_money(rt, mine, others, only_object, p, renewal_id, items, blob_count, cost_mc)
    _wal_cost(rt, mine, p, items, wal_cost, effects)
    for i, call in enumerate(tx.calls):
        c = f"{p}call {i}"
        report = mine if only_object in (None, call.blob_object_id) else others
        if packages:
            report.check(
                f"{c} package",
                call.package_id in packages,
                f"{call.package_id}" + ("" if call.package_id in packages else " is not Walrus's"),
            )
        report.check(
            f"{c} function",
            (call.module, call.function) == ("system", "extend_blob"),
            f"{call.module}::{call.function}",
        )
        if system_id:
            report.check(
                f"{c} System object",
                call.system_object_id == system_id and call.system_mutable,
                f"{call.system_object_id} (&mut: {call.system_mutable})",
            )
        item = items[i] if i < len(items) else None
        if item is None:
            report.check(f"{c} record", False, f"no record for blob {call.blob_object_id}")
            continue
        report.check(
            f"{c} blob object",
            call.blob_object_id == item.blob_object_id,
            f"chain {call.blob_object_id}, record {item.blob_object_id}",
        )
        report.check(
            f"{c} epochs",
            call.epochs == item.epochs,
            f"u32 {call.epochs} on chain, {item.epochs} in the record",
        )
        ext = extensions.get(call.blob_object_id)
        if effects is not None:
            report.check(
                f"{c} end epoch",
                ext is not None
                and (ext.old_end_epoch, ext.new_end_epoch)
                == (item.old_end_epoch, item.new_end_epoch)
                and item.new_end_epoch == item.old_end_epoch + item.epochs,
                (f"chain {ext.old_end_epoch} → {ext.new_end_epoch}" if ext else "chain: none")
                + f", record {item.old_end_epoch} → {item.new_end_epoch}",
            )
    if others.facts:
        calls = len(tx.calls) - sum(1 for c in tx.calls if c.blob_object_id == only_object)
        held = sum(f.ok for f in others.facts)
        mine.check(
            f"{p}other calls",
            others.ok,
            f"{calls} call(s) for other blobs in this batch: {held}/{len(others.facts)} "
            "facts hold (`walkeep verify <digest>` lists them)",
        )
        mine.facts.extend(f for f in others.facts if not f.ok)


def _check_money(
    rt: Runtime,
    report: VerifyReport,
    others: VerifyReport,
    only_object: str | None,
    p: str,
    renewal_id: int,
    items: list[_Item],
    blob_count: int,
    cost_mc: int,
) -> None:
    """The money side of one renewal: what was billed (the chain's charge: ``_wal_cost``).

    - ``blob count``: the renewal's recorded count is its items' count;
    - ``billed``: the renewal's cost is the sum of its items' costs;
    - ``call N cost``: a plain blob's item costs exactly price × size units × epochs; a
      quilt's item costs exactly its recorded kept shares' part, rounded down
      (``pricing.share_renewal_cost_mc``) — so all members kept is the whole quilt's
      price to the millicredit;
    - ``call N shares`` (quilts): the kept shares billed and the unbilled rest sum exactly
      to the quilt's apportioned shares, fixed when it landed; those are at most its
      units on chain, and its members' fixed shares sum to no more than them;

    A quilt renewal recorded before exact apportionment (migration 0019: no kept shares
    recorded) was billed by the rule then in force — each share rounded up, and the sum
    again — and is checked against that rule's bound, saying by how much it exceeded the
    whole quilt; such a renewal must come before every renewal recorded with its shares.

    Every comparison is between integers, so equal figures are never a mismatch. An
    audit of one memory (``only_object``) lists its own item's cost; the others' go
    into ``others``, which the caller sums up in one line.
    """
    price = rt.settings.renewal_price_mc_per_unit_epoch
    report.check(
        f"{p}blob count",
        blob_count == len(items),
        f"recorded {blob_count}, {len(items)} item(s)",
    )
    billed = sum(i.cost_mc for i in items)
    report.check(f"{p}billed", billed == cost_mc, f"recorded {cost_mc} mc, items sum {billed} mc")
    first_exact: int | None = None
    if any(i.kind == "quilt" and i.share_micro is None for i in items):
        with rt.db.read() as s:
            first_exact = s.scalar(
                select(func.min(RenewalItem.renewal_id)).where(RenewalItem.share_micro.is_not(None))
            )
    for n, item in enumerate(items):
        into = report if only_object in (None, item.blob_object_id) else others
        c = f"{p}call {n}"
        if item.kind != "quilt":
            full = pricing.renewal_cost_mc(item.storage_size, item.epochs, price)
            into.check(
                f"{c} cost",
                item.cost_mc == full and item.share_micro is None and item.unbilled_micro is None,
                f"{item.cost_mc} mc billed, price × units × epochs = {full} mc"
                + ("" if item.share_micro is None else "; a plain blob has no quilt shares"),
            )
        elif item.share_micro is None:
            into.check(f"{c} cost", *_legacy_quilt_cost(item, price, renewal_id, first_exact))
        else:
            _check_quilt(rt, into, c, item, price)


def _units(micro: int) -> str:
    """Millionths of a unit as units with six decimals (``63.000000``), exactly."""
    sign = "-" if micro < 0 else ""
    return f"{sign}{abs(micro) // pricing.MICRO}.{abs(micro) % pricing.MICRO:06d}"


def _check_quilt(rt: Runtime, report: VerifyReport, c: str, item: _Item, price: int) -> None:
    """A quilt renewal under exact apportionment (walkeep/pricing.py), to the unit."""
    assert item.share_micro is not None
    kept, unbilled = item.share_micro, item.unbilled_micro
    whole = walrus.storage_units(item.storage_size) * pricing.MICRO
    full = pricing.renewal_cost_mc(item.storage_size, item.epochs, price)
    expected = pricing.share_renewal_cost_mc(kept, item.epochs, price)
    report.check(
        f"{c} cost",
        item.cost_mc == expected,
        f"{item.cost_mc} mc billed, ⌊{_units(kept)} kept units × {item.epochs} epochs × "
        f"{price} mc⌋ = {expected} mc (whole quilt {full} mc)",
    )
    apportioned = whole if item.apportioned_micro is None else item.apportioned_micro
    with rt.db.read() as s:
        patches = (
            select(Memory.blob_id, func.max(Memory.share_micro).label("share"))
            .where(Memory.blob_pk == item.blob_pk, Memory.share_micro.is_not(None))
            .group_by(Memory.blob_id)
            .subquery()
        )
        members = int(s.scalar(select(func.coalesce(func.sum(patches.c.share), 0))) or 0)
    # A quilt landed from a write recorded before exact apportionment has no apportioned
    # total: its whole units stand in, and its members' shares are the older, rounded-up
    # ones (the renewal billed at most the whole quilt; the bill is still exact).
    older = item.apportioned_micro is None
    ok = (
        unbilled is not None
        and kept >= 0
        and unbilled >= 0
        and kept + unbilled == apportioned <= whole
        and (older or members <= apportioned)
    )
    report.check(
        f"{c} shares",
        ok,
        f"kept {_units(kept)} + unbilled "
        + (_units(unbilled) if unbilled is not None else "(none recorded)")
        + f" = the quilt's {_units(apportioned)} apportioned units"
        + (
            f" (its {_units(whole)} on chain)"
            if apportioned <= whole
            else f": MORE than its {_units(whole)} on chain"
        )
        + f"; its members' fixed shares sum to {_units(members)}"
        + (" (shares from before exact apportionment: its units stand in)" if older else ""),
    )


def _legacy_quilt_cost(
    item: _Item, price: int, renewal_id: int, first_exact: int | None
) -> tuple[bool, str]:
    """A quilt renewal billed before exact apportionment, checked by that rule's bound.

    Then each kept member's share was rounded up (by less than a millionth of a unit
    each) and the sum rounded up again, so the bill was at most
    ``⌈(units + patches − 1) × epochs × price⌉`` — and could exceed the whole quilt's
    cost by a millicredit or so. The shares it counted were not recorded, so only this
    bound can be checked; the detail says what the whole quilt cost beside it."""
    whole = walrus.storage_units(item.storage_size) * pricing.MICRO
    patches = max(1, item.patch_count or 1)
    bound = -(-(whole + patches - 1) * item.epochs * price // pricing.MICRO)
    full = pricing.renewal_cost_mc(item.storage_size, item.epochs, price)
    over = item.cost_mc - full
    detail = (
        f"{item.cost_mc} mc billed by the rule before exact apportionment (shares rounded "
        f"up; the kept shares were not recorded): at most {bound} mc by that rule; whole "
        f"quilt {full} mc" + (f", {over} mc above it" if over > 0 else "")
    )
    if first_exact is not None and renewal_id > first_exact:
        return False, (
            f"no kept shares recorded, yet this renewal (#{renewal_id}) came after exact "
            f"apportionment began (renewal #{first_exact})"
        )
    return 0 <= item.cost_mc <= bound, detail


def _wal_cost(
    rt: Runtime,
    report: VerifyReport,
    p: str,
    items: list[_Item],
    wal_cost: int | None,
    effects: TxEffects | None,
) -> None:
    """``WAL cost``: what the chain charged, against the record and against the storage
    price applied to the items' sizes and epochs (the chain's side of the money)."""
    if effects is None or effects.wal_cost_frost is None:
        return
    try:
        price_frost = rt.chain.storage_price_frost()
    except ChainError:
        price_frost = None
    expected = (
        sum(walrus.walrus_storage_cost_frost(i.storage_size, i.epochs, price_frost) for i in items)
        if price_frost is not None
        else None
    )
    charged = effects.wal_cost_frost
    report.check(
        f"{p}WAL cost",
        charged == wal_cost and (expected is None or charged == expected),
        f"chain charged {charged} FROST, recorded {wal_cost}"
        + (f", sizes × epochs × price = {expected}" if expected is not None else ""),
    )


def verify_memory(rt: Runtime, memory_id: str) -> VerifyReport:
    """Every renewal of the memory's blob, in order, plus the continuity of its end epochs."""
    memory_id = (memory_id or "").strip()
    with rt.db.read() as s:
        row = s.execute(
            select(
                Blob.id,
                Blob.blob_object_id,
                Blob.end_epoch,
                Blob.renewals_performed,
                Blob.last_renewal_tx,
                Blob.storage_size,
            )
            .join(Memory, Memory.blob_pk == Blob.id)
            .where(Memory.id == memory_id)
        ).first()
        if row is None:
            raise NotFound("unknown memory, or it has no blob yet", {"memory_id": memory_id})
        blob_pk, object_id, end_epoch, performed, last_tx, storage_size = row
        history = s.execute(
            select(
                Renewal.digest,
                Renewal.status,
                RenewalItem.old_end_epoch,
                RenewalItem.new_end_epoch,
            )
            .join(Renewal, Renewal.id == RenewalItem.renewal_id)
            .where(RenewalItem.blob_pk == blob_pk)
            .order_by(Renewal.id, RenewalItem.id)
        ).all()
    report = VerifyReport(subject=memory_id, network=rt.chain.network)
    report.check("blob", True, f"{memory_id} is held by blob object {object_id}")
    confirmed = [h for h in history if h[1] == "confirmed"]
    # The blob's own tally (what check_runway reports) against the renewals recorded for
    # it: a renewal record moved to another blob, or dropped, leaves them disagreeing.
    report.check(
        "renewal count",
        len(confirmed) == performed
        and (confirmed[-1][0] if confirmed else None) == (last_tx if performed else None),
        f"{len(confirmed)} confirmed renewal{'' if len(confirmed) == 1 else 's'} recorded "
        "for this blob"
        + (f", the last {confirmed[-1][0]}" if confirmed else "")
        + f"; the blob says {performed}"
        + (f", the last {last_tx}" if performed else ""),
    )
    if not history:
        report.check("renewals", True, "never renewed yet: nothing to verify on chain")
    for digest in dict.fromkeys(h[0] for h in history):
        report.digests.append(digest)
        _verify_into(rt, digest, report, prefix=f"[{digest[:10]}…] ", only_object=object_id)
    for prev, cur in pairwise(confirmed):
        report.check(
            f"[{cur[0][:10]}…] continuity",
            cur[2] == prev[3],
            f"starts at {cur[2]}, previous renewal ended at {prev[3]}",
        )
    try:
        obj = rt.chain.get_blob(object_id)
    except ChainError as exc:
        report.check("blob on chain", False, f"could not fetch it: {exc}")
        return report
    if confirmed:
        last = confirmed[-1][3]
        report.check(
            "end epoch",
            obj is not None and obj.end_epoch == last == end_epoch,
            f"chain {obj.end_epoch if obj else 'missing'}, record {end_epoch}, last renewal {last}",
        )
    # What every renewal of this blob was priced on: its encoded size, as the chain has it.
    report.check(
        "storage size",
        obj is not None and obj.storage_size == storage_size,
        f"chain {obj.storage_size if obj else 'missing'} bytes encoded, record {storage_size}",
    )
    return report
