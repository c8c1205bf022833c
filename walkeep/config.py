"""Settings: one typed object, read from ``WALKEEP_*`` environment variables.

With no configuration at all Walkeep runs the embedded default: a SQLite file
in ``~/.walkeep``, the local Walrus/Sui model, local test-mode payments. Every
knob below is documented in the README's configuration table.
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import AliasChoices, Field, field_validator
from pydantic import ValidationError as PydanticValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from walkeep.errors import ConfigurationError

if TYPE_CHECKING:
    from walkeep.egress import EgressPolicy

Network = Literal["local", "testnet", "mainnet"]
RelayerKind = Literal["local", "walrus", "memwal"]


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="WALKEEP_", extra="ignore", populate_by_name=True, frozen=False
    )

    # --- storage of Walkeep's own state ---------------------------------------
    data_dir: Path = Field(default=Path("~/.walkeep"), description="Where state lives.")
    database_url: str | None = Field(
        default=None,
        description="SQLAlchemy URL; default sqlite:///<data_dir>/walkeep.db. "
        "Use postgresql+psycopg://user@host/db for production.",
    )

    # --- networks -----------------------------------------------------------------
    network: Network = "local"
    relayer: RelayerKind = "local"
    local_epoch_seconds: int = Field(default=3600, ge=1)
    local_write_latency_ms: int = Field(default=200, ge=0)
    local_storage_price_frost: int = Field(
        default=11_000, ge=0, description="Local model's storage price per MiB unit per epoch."
    )
    master_key: str | None = Field(
        default=None, description="base64 32-byte key wrapping per-account data keys."
    )

    walrus_publisher_url: str | None = None
    walrus_aggregator_url: str | None = None
    walrus_publisher_jwt: str | None = None
    memwal_url: str | None = None
    memwal_delegate_key: str | None = Field(default=None, description="hex Ed25519 seed")
    memwal_account_id: str | None = None
    sui_private_key: str | None = Field(default=None, description="suiprivkey1…")
    sui_grpc_url: str | None = None
    sui_wal_coin_type: str | None = None
    sui_system_object_id: str | None = None
    embedder: Literal["auto", "minilm", "hash"] = "auto"
    recall_ranking: Literal["hybrid", "dense", "lexical"] = Field(
        default="hybrid",
        description="How recall ranks: words (BM25) and meaning (embeddings) blended, or one alone.",
    )
    index_cache_mb: int = Field(
        default=2048,
        ge=16,
        description="Search indexes a process keeps open, in MiB across accounts (LRU).",
    )

    # --- product limits -------------------------------------------------------------
    max_memory_bytes: int = Field(default=256 * 1024, ge=1)
    max_total_bytes: int = Field(default=1024 * 1024 * 1024, ge=1)
    max_stores_per_day: int = Field(default=10_000, ge=1)
    max_metadata_keys: int = Field(default=32, ge=0)
    max_metadata_key_chars: int = Field(default=64, ge=1)
    max_metadata_value_chars: int = Field(default=1024, ge=1)
    max_metadata_bytes: int = Field(
        default=16 * 1024,
        ge=2,
        description="A memory's metadata as compact UTF-8 JSON, in bytes (all keys together).",
    )
    promo_credits_usd: str = Field(default="1.00", description="Credits for a new default account.")
    topup_max_usd: str = "10000"
    export_page_size: int = Field(
        default=100, ge=1, le=1000, description="Memories per export page unless asked for fewer."
    )
    export_page_max_bytes: int = Field(
        default=4 * 1024 * 1024,
        ge=1,
        description="Content bytes per export page (a page always holds at least one memory).",
    )
    rate_limit_per_minute: int = Field(
        default=600,
        ge=0,
        description="Calls per minute per account and tool (token bucket refill); "
        "0 = off for every tool, rate_limits included.",
    )
    rate_limit_burst: int = Field(
        default=60, ge=1, description="Calls one account may make at once per tool (bucket size)."
    )
    rate_limits: dict[str, int] = Field(
        default_factory=lambda: {"recall": 120, "export": 30, "top_up": 30},
        description="Per-tool calls per minute overriding rate_limit_per_minute, as JSON.",
    )

    # --- pricing (integer millicredits; 1 credit = 1 US cent = 1000 mc) --------------
    store_price_mc_per_64kib: int = Field(default=1000, ge=0)
    renewal_price_mc_per_unit_epoch: int = Field(
        default=1, ge=0, description="Per MiB of encoded storage per epoch (a tiny memory is 63)."
    )

    # --- lifecycle -------------------------------------------------------------------
    initial_epochs: int = Field(default=5, ge=1, le=53)
    renew_threshold_epochs: int = Field(default=2, ge=0, le=52)
    target_runway_epochs: int = Field(default=5, ge=1, le=53)
    renew_batch: int = Field(default=200, ge=1, le=800)
    completion_deadline_seconds: int = Field(default=900, ge=1)
    max_write_backlog: int = Field(
        default=20_000,
        ge=0,
        description="Accepted writes still completing before new stores are refused "
        "(RELAYER_UNAVAILABLE, retry later); 0 = no limit. Self-run relayers only.",
    )
    stale_hold_seconds: int = Field(default=86_400, ge=60)

    # --- quilts (many small memories of one account in one Walrus blob) --------------
    quilts: Literal["on", "off"] = Field(
        default="on", description="Pack small memories into Walrus quilts (walrus/local)."
    )
    quilt_window_seconds: float = Field(
        default=5.0,
        ge=0,
        le=3600,
        description="How long an account's accepted writes gather before they are packed.",
    )
    quilt_max_bytes: int = Field(
        default=16 * 2**20,
        ge=1024,
        description="A quilt is written as soon as this many bytes are waiting.",
    )

    # --- worker ------------------------------------------------------------------------
    complete_writes_interval_seconds: float = Field(default=30, gt=0)
    renew_interval_seconds: float = Field(default=60, gt=0)
    sweep_interval_seconds: float = Field(default=600, gt=0)
    purge_within_hours: int = Field(
        default=24,
        ge=1,
        description="A departed (forgotten, superseded, expired, lapsed or failed) memory's "
        "derived data (hash, metadata, index rows) leaves the database and every index file "
        "within this many hours (walkeep/service/jobs/purge.py).",
    )
    reconcile_payments_interval_seconds: float = Field(default=120, gt=0)
    reconcile_renewals_interval_seconds: float = Field(default=60, gt=0)
    reindex_interval_seconds: float = Field(
        default=300, gt=0, description="Backfill of older memories' search terms (batch per run)."
    )

    # --- automatic top-up (walkeep/service/autocharge.py) -----------------------------------
    auto_top_up_interval_seconds: float = Field(
        default=60,
        gt=0,
        description="How often the rule is evaluated (and at least twice an epoch).",
    )
    auto_top_up_min_interval_seconds: int = Field(
        default=3600, ge=0, description="At most one automatic charge per account this often."
    )
    auto_top_up_retry_seconds: int = Field(
        default=3600,
        ge=1,
        description="Wait after a declined charge, doubling per decline (disabled at the third).",
    )

    # --- alerts (walkeep/service/alerts.py) -----------------------------------------------
    deliver_alerts_interval_seconds: float = Field(default=15, gt=0)
    alert_timeout_seconds: float = Field(
        default=10.0,
        gt=0,
        le=60,
        description="Total per delivery: DNS, connect, send and the receiver's answer.",
    )
    alert_max_response_bytes: int = Field(
        default=4096, ge=1, le=1024 * 1024, description="Bytes of a receiver's answer read."
    )
    alert_concurrency: int = Field(
        default=8,
        ge=1,
        le=256,
        description="Shared delivery slots (one delivery per account at a time); a delivery "
        "slower than half a second moves aside, up to 4x as many (walkeep/service/alerts.py).",
    )
    alert_batch_per_account: int = Field(
        default=10,
        ge=1,
        le=1000,
        description="Events one account may have sent per job run (the rest wait their turn).",
    )
    alert_egress_allow: str | None = Field(
        default=None,
        description="Non-public addresses alert webhooks may reach: comma-separated CIDRs "
        "or host names, `loopback`, or `none`. Default: `loopback` on the local network, "
        "`none` elsewhere (walkeep/egress.py).",
    )
    alert_max_attempts: int = Field(
        default=16, ge=1, description="Delivery attempts per event before it is dropped."
    )
    alert_backoff_cap_seconds: int = Field(
        default=3600, ge=1, description="Longest wait between two attempts (30 s, 60 s, … cap)."
    )

    # --- serving -----------------------------------------------------------------------
    public_url: str = "http://127.0.0.1:8080"
    allowed_hosts: str = Field(
        default="", description="Comma-separated extra Host names accepted on /mcp."
    )
    body_read_seconds: float = Field(
        default=30.0,
        gt=0,
        le=600,
        description="A request body must arrive within this long (408 otherwise).",
    )
    guest_body_read_seconds: float = Field(
        default=10.0,
        gt=0,
        le=600,
        description="The same for callers without a valid API key: a shorter deadline.",
    )
    header_read_seconds: float = Field(
        default=10.0,
        gt=0,
        le=600,
        description="A connection must finish a request's headers within this long "
        "(counted from its opening, or from the previous answer); else it is closed.",
    )
    max_guest_requests: int = Field(
        default=64,
        ge=1,
        description="Bodies read at once from callers without a valid API key, per size "
        "class (tool calls; small forms and webhooks); 503 beyond.",
    )
    max_body_bytes_per_key: int = Field(
        default=32 * 2**20,
        ge=1,
        description="Request-body bytes one API key may have in flight (429 beyond).",
    )
    forwarded_allow_ips: str = Field(
        default="",
        description="Proxies whose X-Forwarded-For/-Proto are trusted (comma-separated "
        "addresses or CIDRs, `*` for any); empty: none, the client is the peer address.",
    )
    access_log: Literal["auto", "on", "off"] = Field(
        default="auto",
        description="One log line per request: auto = on unless stderr is a terminal.",
    )
    api_key: str | None = None
    namespace: str | None = None
    log_format: Literal["auto", "json", "text"] = Field(
        default="auto",
        description="auto: readable text on a terminal, one JSON object per line otherwise.",
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        default="info", description="Log level for `walkeep serve` and `walkeep worker`."
    )

    # --- operator console (/console) ---------------------------------------------------
    admin_token: str | None = Field(
        default=None,
        min_length=16,
        description="Signs an admin into /console (16+ characters); unset = admins use "
        "`walkeep console-link --admin` only.",
    )
    console_secret: str | None = Field(
        default=None,
        description="Signs console session cookies; default: <data_dir>/console.secret (0600). "
        "Give every web process the same one.",
    )
    console_link_minutes: int = Field(default=15, ge=1, le=1440)
    console_session_hours: int = Field(default=12, ge=1, le=24 * 30)

    # --- payments (Stripe's own variable names are honoured) ---------------------------
    stripe_secret_key: str | None = Field(
        default=None,
        validation_alias=AliasChoices("STRIPE_SECRET_KEY", "WALKEEP_STRIPE_SECRET_KEY"),
    )
    stripe_webhook_secret: str | None = Field(
        default=None,
        validation_alias=AliasChoices("STRIPE_WEBHOOK_SECRET", "WALKEEP_STRIPE_WEBHOOK_SECRET"),
    )
    stripe_api_base: str | None = Field(
        default=None, validation_alias=AliasChoices("STRIPE_API_BASE", "WALKEEP_STRIPE_API_BASE")
    )

    @field_validator("data_dir", mode="after")
    @classmethod
    def _expand(cls, v: Path) -> Path:
        return v.expanduser()

    @field_validator("alert_egress_allow", mode="after")
    @classmethod
    def _egress(cls, v: str | None) -> str | None:
        from walkeep.egress import EgressPolicy

        if v is not None:
            EgressPolicy.parse(v)  # ValueError names the bad entry
        return v

    @property
    def egress_policy(self) -> EgressPolicy:
        """Where alert webhooks may go beyond public addresses (walkeep/egress.py)."""
        from walkeep.egress import EgressPolicy

        spec = self.alert_egress_allow
        if spec is None:
            spec = "loopback" if self.network == "local" else ""
        return EgressPolicy.parse(spec)

    @cached_property
    def db_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{self.data_dir / 'walkeep.db'}"

    @property
    def allowed_host_list(self) -> list[str]:
        return [h.strip() for h in self.allowed_hosts.split(",") if h.strip()]

    @property
    def localnet_dir(self) -> Path:
        return self.data_dir / "localnet"

    @property
    def payments_provider(self) -> Literal["stripe", "local"]:
        return "stripe" if self.stripe_secret_key else "local"


# Values never echoed back in an error message.
_SECRET_FIELDS = frozenset(
    {
        "database_url",
        "master_key",
        "walrus_publisher_jwt",
        "memwal_delegate_key",
        "sui_private_key",
        "api_key",
        "stripe_secret_key",
        "stripe_webhook_secret",
    }
)


def env_name(field: str) -> str:
    """The environment variable an operator sets for ``field`` (Stripe's own names win)."""
    info = Settings.model_fields.get(field)
    alias = info.validation_alias if info is not None else None
    if isinstance(alias, AliasChoices) and alias.choices:
        return str(alias.choices[0])
    return "WALKEEP_" + field.upper()


def describe_errors(exc: PydanticValidationError) -> str:
    """One line per bad variable: its name, the value given, and what is allowed.

    Why: pydantic's own text starts "1 validation error for Settings" and names the Python
    field, not what the operator typed.
    """
    parts = []
    for err in exc.errors(include_url=False):
        field = str(err["loc"][0]) if err["loc"] else ""
        name = env_name(field) if field else "configuration"
        value = "(hidden)" if field in _SECRET_FIELDS else repr(err.get("input"))
        allowed = err["msg"].removeprefix("Input should be ").removeprefix("Value error, ")
        parts.append(
            f"{name}={value} is invalid: must be {allowed}"
            if allowed != err["msg"]
            else f"{name}={value} is invalid: {allowed}"
        )
    return "; ".join(parts)


def load_settings(**overrides: object) -> Settings:
    """Settings from the environment, with explicit overrides winning.

    Raises ConfigurationError naming each bad variable (see :func:`describe_errors`).
    """
    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    except PydanticValidationError as exc:
        raise ConfigurationError(f"invalid configuration: {describe_errors(exc)}") from None
