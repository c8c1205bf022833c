"""Settings: one typed object, read from ``WALKEEP_*`` environment variables.

With no configuration at all Walkeep runs the embedded default: a SQLite file
in ``~/.walkeep``, the local Walrus/Sui model, local test-mode payments. Every
knob below is documented in the README's configuration table.
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

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

    # --- product limits -------------------------------------------------------------
    max_memory_bytes: int = Field(default=256 * 1024, ge=1)
    max_total_bytes: int = Field(default=1024 * 1024 * 1024, ge=1)
    max_stores_per_day: int = Field(default=10_000, ge=1)
    max_metadata_keys: int = Field(default=32, ge=0)
    max_metadata_key_chars: int = Field(default=64, ge=1)
    max_metadata_value_chars: int = Field(default=1024, ge=1)
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
        description="Calls per minute per account and tool (token bucket refill); 0 = off.",
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

    # --- worker ------------------------------------------------------------------------
    complete_writes_interval_seconds: float = Field(default=30, gt=0)
    renew_interval_seconds: float = Field(default=60, gt=0)
    sweep_interval_seconds: float = Field(default=600, gt=0)
    reconcile_payments_interval_seconds: float = Field(default=120, gt=0)
    reconcile_renewals_interval_seconds: float = Field(default=60, gt=0)

    # --- serving -----------------------------------------------------------------------
    public_url: str = "http://127.0.0.1:8080"
    allowed_hosts: str = Field(
        default="", description="Comma-separated extra Host names accepted on /mcp."
    )
    api_key: str | None = None
    namespace: str | None = None

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


def load_settings(**overrides: object) -> Settings:
    """Settings from the environment, with explicit overrides winning."""
    return Settings(**overrides)  # type: ignore[arg-type]
