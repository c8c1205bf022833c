"""Operator checks: ``walkeep doctor`` and ``walkeep smoke``.

``doctor`` answers "will this configuration work?" without changing
anything: every check names what to set when it fails. ``smoke`` runs the
product's whole promise once, for real — store, wait for the write to land,
renew it, print the renewal's explorer URL — against the configured network
(the local one offline; testnet on a machine with internet).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from walkeep import ids
from walkeep.config import Settings

log = logging.getLogger(__name__)


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""


@dataclass
class DoctorReport:
    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def add(self, name: str, fn: Callable[[], str], fix: str = "") -> Any:
        try:
            detail = fn()
            self.checks.append(Check(name, True, detail))
            return True
        except Exception as exc:  # every failure becomes one line with a fix
            msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            self.checks.append(Check(name, False, msg, fix))
            return False


def doctor(settings: Settings) -> DoctorReport:
    from walkeep.bootstrap import build_runtime, check_config
    from walkeep.db import Database, redact
    from walkeep.db import migrate as migrations

    report = DoctorReport()
    problems = check_config(settings)
    for p in problems:
        report.checks.append(Check(f"config {p.setting}", False, p.message, f"set {p.setting}"))
    if not problems:
        report.checks.append(
            Check(
                "config",
                True,
                f"network={settings.network} relayer={settings.relayer} "
                f"payments={settings.payments_provider}",
            )
        )

    db = Database(settings.db_url)

    def database() -> str:
        db.ping()
        heads = migrations.current_heads(settings.db_url)
        from alembic.script import ScriptDirectory

        script = ScriptDirectory.from_config(migrations.alembic_config(settings.db_url))
        head = script.get_current_head()
        if heads != {head}:
            raise RuntimeError(f"schema at {sorted(heads) or 'nothing'}, code expects {head}")
        return f"{redact(settings.db_url)} ({db.dialect}, schema at {head})"

    report.add("database", database, "check WALKEEP_DATABASE_URL, then run `walkeep migrate`")
    db.dispose()

    def master_key() -> str:
        from walkeep.crypto import load_master_key, master_key_id

        key = load_master_key(settings)
        source = (
            "WALKEEP_MASTER_KEY" if settings.master_key else str(settings.data_dir / "master.key")
        )
        note = ""
        if not settings.master_key and not settings.db_url.startswith("sqlite"):
            note = " — with a shared database, give every process the same WALKEEP_MASTER_KEY"
        return f"key {master_key_id(key)} from {source}{note}"

    if settings.relayer != "memwal":
        report.add(
            "encryption key", master_key, "set WALKEEP_MASTER_KEY to base64 of 32 random bytes"
        )

    if problems:
        return report  # the runtime can't be built; the config lines say why
    try:
        rt = build_runtime(settings, with_completer=False)
    except Exception as exc:
        report.checks.append(Check("runtime", False, str(exc).splitlines()[0], "see the message"))
        return report

    def chain() -> str:
        detail = (
            f"{rt.chain.network}: Walrus epoch {rt.chain.current_epoch()}, server wallet "
            f"{rt.chain.owner_address()}, storage price {rt.chain.storage_price_frost()} FROST/MiB/epoch"
        )
        if rt.chain.network == "local":
            # doctor reads the network as the running server set it; it never reconfigures it.
            seconds = rt.chain.epoch_info().duration_seconds
            detail += f", epoch length {seconds} s"
            explicit = "local_epoch_seconds" in settings.model_fields_set
            if explicit and seconds != settings.local_epoch_seconds:
                detail += (
                    f" (set by the server; WALKEEP_LOCAL_EPOCH_SECONDS={settings.local_epoch_seconds}"
                    " here takes effect only when `walkeep serve`/`worker` start with it)"
                )
            elif not explicit:
                detail += " (WALKEEP_LOCAL_EPOCH_SECONDS not set here)"
        return detail

    report.add(
        "chain",
        chain,
        "check WALKEEP_SUI_GRPC_URL and that the node is reachable"
        if settings.network != "local"
        else "check WALKEEP_DATA_DIR is writable",
    )

    def backend() -> str:
        h = rt.relayer.health()
        if not h.ok:
            raise RuntimeError(f"{rt.relayer.name} unhealthy: {h.detail or 'unreachable'}")
        return f"{rt.relayer.name}: writes {h.writes}" + (f" ({h.detail})" if h.detail else "")

    fix = {
        "walrus": "check WALKEEP_WALRUS_PUBLISHER_URL / WALKEEP_WALRUS_AGGREGATOR_URL",
        "memwal": "check WALKEEP_MEMWAL_URL and the delegate key registration",
    }.get(settings.relayer, "check WALKEEP_DATA_DIR")
    report.add("storage backend", backend, fix)

    embedder = rt.extras.get("embedder")
    if embedder is not None:

        def embed() -> str:
            from walkeep.index.embedder import embedder_status

            embedder.embed(["doctor check"])
            st = embedder_status()
            fb = f" (fallback: {st.fallback_reason})" if st and st.fallback_reason else ""
            return f"{embedder.model_id}, dim {embedder.dim}{fb}"

        report.add(
            "embedder", embed, "install onnxruntime/tokenizers, or set WALKEEP_EMBEDDER=hash"
        )

    def payments() -> str:
        if rt.payments.provider == "local":
            if settings.network != "local":
                raise RuntimeError("local TEST MODE payments on a real network give credits away")
            return "local TEST MODE checkout (no Stripe keys set)"
        client = rt.payments.client  # type: ignore[attr-defined]
        client.v1.checkout.sessions.list(params={"limit": 1})
        return (
            "Stripe reachable; webhook endpoint: "
            + settings.public_url.rstrip("/")
            + "/webhooks/stripe"
        )

    report.add("payments", payments, "set STRIPE_SECRET_KEY and STRIPE_WEBHOOK_SECRET")
    return report


SMOKE_ACCOUNT = "smoke"
SMOKE_GRANT_MC = 100_000  # $1.00: a store plus a few renewals, taken back afterwards
SERVER_FILE = "server.json"


def record_server(settings: Settings) -> None:
    """``walkeep serve`` notes its public URL in the data dir (mode 0600).

    Why: the local network's explorer is served by the running server, and a
    ``walkeep smoke`` started in another shell does not know its ``--port``. Only on the
    local network (elsewhere explorers are public sites), and best effort: a read-only
    data dir must not stop the server.
    """
    if settings.network != "local":
        return
    path = settings.data_dir / SERVER_FILE
    data = json.dumps({"public_url": settings.public_url.rstrip("/"), "pid": os.getpid()})
    try:
        settings.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(data + "\n")
    except OSError as exc:
        log.warning("could not record the server address in %s: %s", path, exc)


def server_public_url(settings: Settings) -> str:
    """Where the operator's Walkeep server answers: WALKEEP_PUBLIC_URL if set, else the
    address the last ``walkeep serve`` on this data dir recorded, else the default."""
    if "public_url" not in settings.model_fields_set:
        try:
            recorded = json.loads((settings.data_dir / SERVER_FILE).read_text())["public_url"]
            if isinstance(recorded, str) and recorded.startswith(("http://", "https://")):
                return recorded.rstrip("/")
        except (OSError, ValueError, KeyError, TypeError):
            pass
    return settings.public_url.rstrip("/")


@dataclass
class SmokeResult:
    memory_id: str
    blob_id: str
    blob_object_id: str
    digest: str
    explorer_url: str
    end_epoch_before: int
    end_epoch_after: int
    seconds: float
    account_id: str = ""
    explorer_reachable: bool | None = None  # None: not checked (a public explorer)
    cleanup: list[str] = field(default_factory=list)


def smoke(
    settings: Settings,
    *,
    timeout_seconds: float = 600,
    say: Callable[[str], None] = print,
    clock: Any = None,
) -> SmokeResult:
    """Store → land → renew one epoch → explorer URL, through the real service code.

    Runs as a dedicated ``smoke`` account granted $1.00 for the run. Afterwards
    it cleans up and says so: the test memory is forgotten (never renewed
    again, so it costs nothing more) and whatever is left of the grant is
    taken back, so no funded test account stays in the operator's database.
    The memory is stored with one epoch of runway, so it is immediately due
    and the ordinary renewal pass extends it (target runway: two epochs).
    On the local network the explorer URL is the running server's (see
    :func:`server_public_url`) and is checked to answer.
    """
    from walkeep.bootstrap import build_runtime
    from walkeep.db import Database
    from walkeep.db import migrate as migrations
    from walkeep.service.operators import accounts

    public_url = server_public_url(settings)
    settings = settings.model_copy(
        update={
            "initial_epochs": 1,
            "renew_threshold_epochs": 1,
            "target_runway_epochs": 2,
            "public_url": public_url,
            # One memory: write its quilt at once instead of waiting for neighbours.
            "quilt_window_seconds": 0,
        }
    )
    from walkeep.bootstrap import refuse_bad_config

    refuse_bad_config(settings)  # a wrong combination is refused before the first change
    migrations.upgrade(settings.db_url)
    db = Database(settings.db_url, clock=clock) if clock is not None else None
    rt = build_runtime(settings, clock=clock, database=db, with_completer=False)
    account_id = accounts.find_account_by_name(rt.db, SMOKE_ACCOUNT)
    if account_id is None:
        account_id = accounts.create_account(rt.db, SMOKE_ACCOUNT).account_id
        say(f"created account '{SMOKE_ACCOUNT}' ({account_id}) for smoke tests")
    grant_ref = f"smoke:{ids.new_key_id()[4:]}"
    accounts.grant(rt.db, account_id, SMOKE_GRANT_MC, reason="walkeep smoke", ref=grant_ref)
    cleanup: list[str] = []
    try:
        result = _smoke_run(rt, account_id, timeout_seconds, say, on_stored=cleanup.append)
    finally:
        cleanup_notes = _smoke_cleanup(rt, account_id, grant_ref, cleanup[:1])
        for note in cleanup_notes:
            say(f"cleanup: {note}")
    result.cleanup = cleanup_notes
    result.account_id = account_id
    if rt.chain.network == "local":
        result.explorer_reachable = _answers(result.explorer_url)
        if not result.explorer_reachable:
            say(
                f"note: nothing answers at {public_url} — the local explorer is served by "
                "`walkeep serve`; start it (or set WALKEEP_PUBLIC_URL to its address) to open "
                "the URL below"
            )
    return result


def _answers(url: str) -> bool:
    import httpx

    try:
        return httpx.get(url, params={"format": "json"}, timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def _smoke_run(
    rt: Any,
    account_id: str,
    timeout_seconds: float,
    say: Callable[[str], None],
    *,
    on_stored: Callable[[str], None],
) -> SmokeResult:
    from sqlalchemy import select

    from walkeep.db.models import Blob, Memory
    from walkeep.service.jobs import completion, renew
    from walkeep.service.tools import runway, store

    started = time.monotonic()
    say(f"network {rt.chain.network}, storage {rt.relayer.name}, wallet {rt.chain.owner_address()}")
    text = f"Walkeep smoke test memory written at {rt.clock.now().isoformat()}"
    receipt = store.store(
        rt, account_id, content=text, request_id=f"smoke-{int(time.time() * 1000)}"
    )
    on_stored(receipt.memory_id)
    say(f"stored: {receipt.memory_id} ({receipt.status}); waiting for the write to land…")
    delay = 0.5
    while True:
        outcome = completion.settle(rt, receipt.memory_id)
        if outcome == completion.Outcome.LANDED or outcome == completion.Outcome.SETTLED:
            break
        if outcome == completion.Outcome.FAILED or time.monotonic() - started > timeout_seconds:
            raise RuntimeError(f"the write did not land ({outcome}); see the worker logs")
        say(f"  still storing after {time.monotonic() - started:.0f}s")
        time.sleep(delay)
        delay = min(delay * 2, 10)
    before = runway.check_runway(rt, account_id, receipt.memory_id).memories[0]
    if before.status != "active":
        raise RuntimeError(f"memory is {before.status}, expected active")
    say(f"landed: end_epoch {before.end_epoch} (runway {before.runway_epochs}); renewing…")
    report = renew.renew(rt, max_batches=5)
    after = runway.check_runway(rt, account_id, receipt.memory_id).memories[0]
    if not after.last_renewal_tx or after.renewals_performed < 1:
        raise RuntimeError(
            f"no renewal happened (report: {report}); check the wallet's WAL and SUI balance"
        )
    with rt.db.read() as s:
        blob_id, object_id = s.execute(
            select(Blob.blob_id, Blob.blob_object_id)
            .join(Memory, Memory.blob_pk == Blob.id)
            .where(Memory.id == receipt.memory_id)
        ).one()
    return SmokeResult(
        memory_id=receipt.memory_id,
        blob_id=blob_id,
        blob_object_id=object_id,
        digest=after.last_renewal_tx,
        explorer_url=rt.chain.explorer_tx_url(after.last_renewal_tx),
        end_epoch_before=before.end_epoch or 0,
        end_epoch_after=after.end_epoch or 0,
        seconds=time.monotonic() - started,
    )


def _smoke_cleanup(rt: Any, account_id: str, grant_ref: str, memory_ids: list[str]) -> list[str]:
    """Forget the test memory and take back what is left of this run's grant."""
    from walkeep import ledger
    from walkeep.errors import WalkeepError
    from walkeep.service.operators import accounts
    from walkeep.service.tools import forget

    notes: list[str] = []
    for mid in memory_ids:
        try:
            forget.forget(rt, account_id, memory_id=mid, request_id=f"{grant_ref}:forget")
            notes.append(f"memory {mid} forgotten (no further renewals; it lapses on its own)")
        except WalkeepError as exc:
            notes.append(f"could not forget memory {mid}: {exc.message}")
    available = accounts.get_account(rt.db, account_id).available_mc
    back = min(available, SMOKE_GRANT_MC)
    if back > 0:
        with rt.db.begin() as s:
            ledger.debit(s, account_id, back, ref=f"{grant_ref}:return", memo="walkeep smoke")
    left = accounts.get_account(rt.db, account_id)
    notes.append(
        f"account '{SMOKE_ACCOUNT}' ({account_id}): {ledger.credits_display(back)} unused test "
        f"credits taken back; balance now {ledger.credits_display(left.balance_mc)} credits"
        + (f" ({ledger.credits_display(left.held_mc)} held)" if left.held_mc else "")
    )
    return notes
