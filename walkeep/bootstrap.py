"""The composition root: settings → a wired ``Runtime``.

The only module that knows every adapter. It validates the configuration
first and refuses to boot a wrong combination with a message that says what
to set — never "starts, then fails every call".
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from walkeep.backends.base import BlobStore, Chain, Faults, Relayer
from walkeep.clock import Clock, SystemClock
from walkeep.config import Settings
from walkeep.db import Database
from walkeep.errors import ConfigurationError
from walkeep.payments.base import Payments
from walkeep.pressure import Pressure
from walkeep.service.runtime import Runtime

if TYPE_CHECKING:
    from walkeep.backends.localnet.engine import LocalNetwork

log = logging.getLogger(__name__)

# Public Walrus endpoints (notes/walrus-sui.md §1.5). Mainnet has no public
# publisher: a mainnet deployment runs its own and must set the URL.
WALRUS_DEFAULTS: dict[str, dict[str, str]] = {
    "testnet": {
        "publisher": "https://publisher.walrus-testnet.walrus.space",
        "aggregator": "https://aggregator.walrus-testnet.walrus.space",
    },
    "mainnet": {"aggregator": "https://aggregator.walrus-mainnet.walrus.space"},
}


def walrus_urls(settings: Settings) -> tuple[str | None, str | None]:
    defaults = WALRUS_DEFAULTS.get(settings.network, {})
    return (
        settings.walrus_publisher_url or defaults.get("publisher"),
        settings.walrus_aggregator_url or defaults.get("aggregator"),
    )


@dataclass(frozen=True)
class ConfigProblem:
    setting: str
    message: str

    def __str__(self) -> str:
        return f"{self.setting}: {self.message}"


def check_config(settings: Settings) -> list[ConfigProblem]:
    """Every reason this configuration cannot run, each naming what to set."""
    p: list[ConfigProblem] = []
    net, relayer = settings.network, settings.relayer
    if net == "local" and relayer == "memwal":
        p.append(
            ConfigProblem(
                "WALKEEP_NETWORK",
                "the memwal relayer stores on a real Walrus network; set WALKEEP_NETWORK=testnet or mainnet",
            )
        )
    if net != "local" and relayer == "local":
        p.append(
            ConfigProblem(
                "WALKEEP_RELAYER",
                f"the local blob store cannot hold blobs for {net}; set WALKEEP_RELAYER=walrus (or memwal)",
            )
        )
    if relayer == "walrus":
        publisher, aggregator = walrus_urls(settings)
        if not publisher:
            hint = " (mainnet has no public publisher: run your own)" if net == "mainnet" else ""
            p.append(
                ConfigProblem(
                    "WALKEEP_WALRUS_PUBLISHER_URL", "required with WALKEEP_RELAYER=walrus" + hint
                )
            )
        if not aggregator:
            p.append(
                ConfigProblem(
                    "WALKEEP_WALRUS_AGGREGATOR_URL", "required with WALKEEP_RELAYER=walrus"
                )
            )
    if relayer == "memwal":
        for name, value in (
            ("WALKEEP_MEMWAL_URL", settings.memwal_url),
            ("WALKEEP_MEMWAL_DELEGATE_KEY", settings.memwal_delegate_key),
            ("WALKEEP_MEMWAL_ACCOUNT_ID", settings.memwal_account_id),
        ):
            if not value:
                p.append(ConfigProblem(name, "required with WALKEEP_RELAYER=memwal"))
        if settings.memwal_delegate_key:
            key = settings.memwal_delegate_key.removeprefix("0x")
            if len(key) != 64 or any(c not in "0123456789abcdefABCDEF" for c in key):
                p.append(
                    ConfigProblem(
                        "WALKEEP_MEMWAL_DELEGATE_KEY", "must be a 32-byte Ed25519 seed in hex"
                    )
                )
    if net != "local" and not settings.sui_private_key:
        p.append(
            ConfigProblem(
                "WALKEEP_SUI_PRIVATE_KEY",
                f"renewing on {net} needs the server wallet's key (suiprivkey1…); it must hold WAL and SUI",
            )
        )
    if settings.stripe_secret_key and not settings.stripe_webhook_secret:
        p.append(
            ConfigProblem(
                "STRIPE_WEBHOOK_SECRET",
                "required with STRIPE_SECRET_KEY (whsec_… of the endpoint <public url>/webhooks/stripe)",
            )
        )
    if net != "local" and settings.payments_provider == "local":
        # The TEST MODE checkout credits for free; on a real network those credits
        # buy real WAL and gas. Testnet uses Stripe test keys (sk_test_…) instead.
        hint = (
            "sk_live_… on mainnet" if net == "mainnet" else "a Stripe test key sk_test_… on testnet"
        )
        p.append(
            ConfigProblem(
                "STRIPE_SECRET_KEY",
                f"{net} needs Stripe ({hint}): the local TEST MODE checkout hands out free "
                "credits that would buy real WAL",
            )
        )
    if settings.renew_threshold_epochs >= settings.target_runway_epochs:
        p.append(
            ConfigProblem(
                "WALKEEP_TARGET_RUNWAY_EPOCHS",
                "must be greater than WALKEEP_RENEW_THRESHOLD_EPOCHS, or renewals would add nothing",
            )
        )
    return p


def refuse_bad_config(settings: Settings) -> None:
    """ConfigurationError listing every :func:`check_config` problem, or nothing."""
    problems = check_config(settings)
    if problems:
        raise ConfigurationError(
            "configuration refused:\n  " + "\n  ".join(str(x) for x in problems)
        )


def planned_epoch_seconds(settings: Settings) -> int | None:
    """The epoch length the local network will have once a process that runs it
    (``serve``, ``worker``) has started: the one set explicitly, else the one it has,
    else a new network's default. Read without opening the network, so a start can be
    checked against it and refused before anything is changed. None off the local
    network (only the chain knows; ask it once the runtime is built)."""
    if settings.network != "local":
        return None
    if "local_epoch_seconds" in settings.model_fields_set:
        return settings.local_epoch_seconds
    from walkeep.backends.localnet.engine import DEFAULT_EPOCH_SECONDS, LocalNetwork

    recorded = LocalNetwork.recorded_epoch_seconds(settings.localnet_dir)
    return recorded if recorded is not None else DEFAULT_EPOCH_SECONDS


def open_local_network(
    settings: Settings, clock: Clock, *, owner: bool, faults: Faults | None = None
) -> LocalNetwork:
    """Open the local network under the data dir.

    Only the process that runs it (``owner``: ``walkeep serve``, ``worker``,
    ``devnet``) may change its epoch length or storage price, and only with a value
    set explicitly (``WALKEEP_LOCAL_EPOCH_SECONDS`` / ``_STORAGE_PRICE_FROST``): a
    default is no reason to rewrite a network another process is running (a
    ``walkeep devnet`` started without the variable turned a 60 s network into a
    3600 s one and froze its epoch). A new network takes the defaults.
    """
    from walkeep.backends.localnet.engine import LocalNetwork

    explicit = settings.model_fields_set
    return LocalNetwork(
        settings.localnet_dir,
        clock,
        epoch_seconds=settings.local_epoch_seconds if "local_epoch_seconds" in explicit else None,
        storage_price_frost=settings.local_storage_price_frost
        if "local_storage_price_frost" in explicit
        else None,
        faults=faults,
        configure=owner,
    )


def build_runtime(
    settings: Settings,
    *,
    clock: Clock | None = None,
    with_completer: bool = True,
    database: Database | None = None,
    configure_network: bool = False,
) -> Runtime:
    """Wire a runtime for ``settings``.

    ``configure_network``: only the processes that run the local network
    (``walkeep serve`` and ``walkeep worker``; ``walkeep devnet`` opens it
    itself) apply ``WALKEEP_LOCAL_*`` to it. Everything else — ``doctor``,
    ``smoke``, tests — opens the network as it is, so a command started in
    another shell can never change a running server's epoch length.
    """
    refuse_bad_config(settings)
    clock = clock or SystemClock()
    pressure = Pressure()
    db = database or Database(settings.db_url, clock=clock)
    extras: dict[str, object] = {}
    chain: Chain
    relayer: Relayer
    payments: Payments

    # --- chain ----------------------------------------------------------------------
    if settings.network == "local":
        from walkeep.backends.localnet.chain import LocalChain

        faults = Faults()
        network = open_local_network(settings, clock, owner=configure_network, faults=faults)
        chain = LocalChain(network, public_url=settings.public_url.rstrip("/"))
        extras["localnet"] = network
        extras["faults"] = faults
    else:
        from walkeep.backends.sui import SuiChain

        chain = SuiChain(settings, clock=clock)

    # --- relayer --------------------------------------------------------------------
    from walkeep.crypto import load_master_key

    # Read once: it wraps the data keys (self-run relayer) and keys every digest (all).
    master_key = load_master_key(settings)
    if settings.relayer in ("local", "walrus"):
        from walkeep.backends.self_relayer import SelfRelayer
        from walkeep.crypto import Keyring
        from walkeep.index.embedder import MiniLMEmbedder, load_embedder
        from walkeep.index.search import SearchIndex

        store: BlobStore
        if settings.relayer == "local":
            from walkeep.backends.localnet.blobstore import LocalBlobStore

            store = LocalBlobStore(extras["localnet"])  # type: ignore[arg-type]
        else:
            from walkeep.backends.walrus import WalrusBlobStore

            publisher, aggregator = walrus_urls(settings)
            store = WalrusBlobStore(
                publisher or "", aggregator or "", jwt=settings.walrus_publisher_jwt
            )
        embedder = load_embedder(settings)
        if isinstance(embedder, MiniLMEmbedder):  # the only one worth pausing
            embedder.between_batches = pressure.step_aside
        extras["embedder"] = embedder
        keyring = Keyring(db, master_key)
        relayer = SelfRelayer(
            db,
            clock,
            store,
            keyring,
            SearchIndex(
                db,
                embedder,
                keyring.terms_key,
                keyring.vector_cipher,
                root=settings.data_dir / "index",
                ranking=settings.recall_ranking,
                cache_bytes=settings.index_cache_mb * 2**20,
            ),
            chain.owner_address(),
            latency_ms=settings.local_write_latency_ms if settings.relayer == "local" else 0,
            max_backlog=settings.max_write_backlog,
            quilts=settings.quilts == "on",
            quilt_window_seconds=settings.quilt_window_seconds,
            quilt_max_bytes=settings.quilt_max_bytes,
        )
    else:
        from walkeep.backends.memwal import MemWalRelayer

        relayer = MemWalRelayer(
            settings.memwal_url or "",
            settings.memwal_delegate_key or "",
            settings.memwal_account_id or "",
            clock=clock,
            # Landed blobs are looked up on chain: only objects the server wallet
            # owns can be renewed, so only those are registered.
            chain=chain,
        )

    # --- payments ---------------------------------------------------------------------
    if settings.payments_provider == "stripe":
        from walkeep.payments.stripe import StripePayments

        payments = StripePayments(settings)
    else:
        from walkeep.payments.local import LocalPayments

        payments = LocalPayments(db, settings)

    rt = Runtime(
        settings=settings,
        db=db,
        clock=clock,
        chain=chain,
        relayer=relayer,
        payments=payments,
        pressure=pressure,
        extras=extras,
    )
    from walkeep.service import digests

    digests.prime(rt, master_key)  # every store digests its content and arguments under it
    if with_completer:
        from walkeep.service.jobs.completion import Completer

        rt.completer = Completer(rt)
    return rt
