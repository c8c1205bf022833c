"""The relational model (DESIGN §3), identical on SQLite and PostgreSQL.

Money is integer millicredits (1 credit = 1 US cent = 1000 mc); epochs are
integers. The database enforces what must never break even if code is wrong:
balances can't go negative (CHECK), a ledger reference is used once per
account (UNIQUE), a hold is settled at most once (UNIQUE ``settles_id``), a
request id is claimed once per account and tool (UNIQUE).

Schema changes go through Alembic migrations in ``migrations/versions``;
``tests/test_migrations.py`` fails if this module and the migrations drift.

Why one file: the whole schema in one place, read beside the migrations that build it;
split by table, the foreign keys between money, memories and blobs would be hidden.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.sql.expression import false
from sqlalchemy.types import TypeDecorator

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# Auto-increment primary keys: BIGINT on PostgreSQL, INTEGER (rowid alias) on SQLite.
BigId = BigInteger().with_variant(Integer(), "sqlite")


class UTCDateTime(TypeDecorator[datetime]):
    """Aware UTC datetimes in, aware UTC datetimes out, on every backend.

    SQLite has no time zones; storing naive UTC and re-attaching UTC on the
    way out keeps comparisons and arithmetic correct everywhere.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTCDateTime column")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
    type_annotation_map = {datetime: UTCDateTime(), dict[str, Any]: JSON()}


def table(model: type[Base]) -> Table:
    """A mapped class's Core table, for statements built once on hot paths
    (``Model.__table__`` is typed as a plain FromClause)."""
    return Base.metadata.tables[model.__tablename__]


class Account(Base):
    __tablename__ = "accounts"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    # Cached from ledger_entries, updated in the same transaction as each entry.
    balance_mc: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    held_mc: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    # Usage counters for quotas, updated in the same transaction as every memory
    # status change that alters what is stored (walkeep/usage.py), so quota
    # checks are O(1) under the account lock instead of scanning memories.
    usage_bytes: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    usage_day: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    usage_day_stores: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    created_at: Mapped[datetime]
    disabled_at: Mapped[datetime | None]

    __table_args__ = (
        CheckConstraint("balance_mc >= 0", name="balance_nonneg"),
        CheckConstraint("held_mc >= 0", name="held_nonneg"),
        CheckConstraint("held_mc <= balance_mc", name="held_le_balance"),
    )


class ApiKey(Base):
    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"), index=True)
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(32), unique=True)
    # Sealed (walkeep/service/sealed.py, migration 0025): room for 255 bytes of name.
    default_namespace: Mapped[str | None] = mapped_column(String(512))
    # Confined to default_namespace: the tools refuse any other (service/tools/confine.py).
    only_namespace: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    created_at: Mapped[datetime]
    revoked_at: Mapped[datetime | None]
    # To within a minute: written when a lookup finds it older than that (accounts.py).
    last_used_at: Mapped[datetime | None]


class LedgerEntry(Base):
    """Append-only. ``amount_mc`` is a positive magnitude; ``kind`` gives its effect."""

    __tablename__ = "ledger_entries"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"))
    kind: Mapped[str] = mapped_column(String(16))
    amount_mc: Mapped[int] = mapped_column(BigInteger)
    ref: Mapped[str] = mapped_column(String(200))
    # For capture/release: the hold it settles. UNIQUE => a hold settles once.
    settles_id: Mapped[int | None] = mapped_column(
        BigId, ForeignKey("ledger_entries.id"), unique=True
    )
    balance_after_mc: Mapped[int] = mapped_column(BigInteger)
    held_after_mc: Mapped[int] = mapped_column(BigInteger)
    memo: Mapped[str | None] = mapped_column(String(500))
    created_at: Mapped[datetime]

    __table_args__ = (
        UniqueConstraint("account_id", "ref"),
        CheckConstraint("amount_mc > 0", name="amount_positive"),
        Index(None, "account_id", "kind", "created_at"),
    )


class Blob(Base):
    """An on-chain Walrus Blob object owned by the server wallet: the unit of renewal."""

    __tablename__ = "blobs"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    account_id: Mapped[str | None] = mapped_column(ForeignKey("accounts.id"))
    blob_id: Mapped[str] = mapped_column(String(64))
    blob_object_id: Mapped[str] = mapped_column(String(80), unique=True)
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    storage_size: Mapped[int] = mapped_column(BigInteger)
    registered_epoch: Mapped[int] = mapped_column(Integer)
    end_epoch: Mapped[int] = mapped_column(Integer)
    # live | orphan | expired
    status: Mapped[str] = mapped_column(String(16))
    # blob: one object, one memory's content (shared by identical copies);
    # quilt: many memories' patches in one object, renewed as one.
    kind: Mapped[str] = mapped_column(String(8), default="blob", server_default="blob")
    patch_count: Mapped[int | None] = mapped_column(Integer)
    # A quilt's apportioned shares: the sum of its patches' fixed shares (millionths of a
    # unit, walkeep.pricing), fixed when it lands; its units or less. NULL for a blob.
    share_micro: Mapped[int | None] = mapped_column(BigInteger)
    renewals_performed: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    last_renewal_tx: Mapped[str | None] = mapped_column(String(100))
    next_renewal_epoch: Mapped[int | None] = mapped_column(Integer)
    # A renewal intent currently covering this blob (a lease other workers skip).
    pending_renewal_id: Mapped[int | None] = mapped_column(BigId, ForeignKey("renewals.id"))
    renew_not_before: Mapped[datetime | None]
    renew_failures: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # Its memories per kept status, kept by triggers on memories (migration 0013): "holds
    # an active memory" and the summary's lapsed counts read the blob alone. Never
    # written by the application.
    active_memories: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    paused_memories: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    no_renew_memories: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]

    __table_args__ = (
        # The due-for-renewal scan: in (end_epoch, id) order, so a batch is read
        # straight off the index and the scan stops at the batch size.
        Index(None, "status", "end_epoch", "id"),
        Index(None, "account_id", "blob_id"),
        # check_runway's summary: an account's live blobs in runway order, and its
        # blobs past end_epoch that the sweep has not expired yet, with their counts
        # (ids and sums off the index; migration 0013).
        Index(
            None,
            "account_id",
            "status",
            "end_epoch",
            "id",
            postgresql_include=["active_memories", "paused_memories", "no_renew_memories"],
        ),
        # Room for a renewal's lease as a HOT update (migration 0012).
        {"postgresql_with": {"fillfactor": 50}},
    )


class Memory(Base):
    __tablename__ = "memories"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"))
    namespace: Mapped[str] = mapped_column(String(255))
    metadata_: Mapped[dict[str, Any]] = mapped_column("metadata", JSON)
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    content_hash: Mapped[str] = mapped_column(String(64))
    # accepting | storing | active | paused | no-renew | expired | failed
    status: Mapped[str] = mapped_column(String(16))
    blob_pk: Mapped[int | None] = mapped_column(BigId, ForeignKey("blobs.id"))
    # The memory's public identifier once landed: its quilt patch id when packed,
    # else its blob's blob_id. What recall, check_runway, forget and export show.
    blob_id: Mapped[str | None] = mapped_column(String(64))
    # A packed memory's fixed share of its quilt's encoded units, in millionths
    # of a unit (walkeep.pricing.apportion_quilt_shares); None = pays its whole blob.
    share_micro: Mapped[int | None] = mapped_column(BigInteger)
    cost_mc: Mapped[int] = mapped_column(BigInteger)
    attempt: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    job_id: Mapped[str | None] = mapped_column(String(100))
    accepted_at: Mapped[datetime]
    deadline_at: Mapped[datetime]
    stored_at: Mapped[datetime | None]
    forgotten_at: Mapped[datetime | None]
    status_changed_at: Mapped[datetime]
    failure_reason: Mapped[str | None] = mapped_column(String(500))
    # The memory this one corrects (a mem_ id, fixed at accept) and, on the corrected
    # one, the memory that replaced it: set in the transaction that registers the new
    # write, conditionally, so two racing corrections cannot both win (migration 0023).
    supersedes: Mapped[str | None] = mapped_column(String(32))
    superseded_by: Mapped[str | None] = mapped_column(String(32))
    # When the memory stops mattering (it leaves recall and export at that instant),
    # and the Walrus epoch holding that instant: its blob is kept paid up to the end of
    # that epoch and no further (renewal caps at expires_epoch + 1).
    expires_at: Mapped[datetime | None]
    expires_epoch: Mapped[int | None] = mapped_column(Integer)

    __table_args__ = (
        Index(None, "account_id", "namespace", "status"),
        # "Does this blob hold an active memory?" (renewal) is one probe of this
        # index, whatever the planner's statistics say after a burst of inserts. It
        # carries each member's patch id and share so that a quilt's kept shares
        # (renewal_price.quilt_shares) are read off the index alone (migration 0017).
        Index(None, "blob_pk", "status", "blob_id", "share_micro"),
        Index(None, "status", "accepted_at"),
        Index(None, "account_id", "content_hash"),
        # recall's visibility check (status, scope, dates, blob, expiry) off the index alone
        # (migrations 0018, 0023): at a million memories its rows are mostly on disk.
        Index(
            "ix_memories_visibility",
            "account_id",
            "blob_id",
            "status",
            "namespace",
            "blob_pk",
            "stored_at",
            "accepted_at",
            "expires_at",
        ),
        # Writing one memory's quilt lands its neighbours: find them by job.
        Index(None, "job_id"),
        # The sweep finds memories whose expiry has passed (migration 0023).
        Index(None, "expires_at"),
        # check_runway's summary: the smallest memory ids of one status, and their
        # blobs, off the index alone.
        Index(None, "account_id", "status", "id", "blob_pk"),
        # The search index learns which memories were forgotten, lapsed or revived
        # since it last looked (walkeep/index/search.py).
        Index(None, "account_id", "status_changed_at"),
        # A filtered recall's candidate blobs by time, off the index alone (migration 0024).
        Index("ix_memories_stored", "account_id", "stored_at", "status", "namespace", "blob_id"),
    )


class MemoryTag(Base):
    """One ``name=value`` pair of a memory's metadata, as its keyed token
    (``crypto.metadata_tag``): what recall and export filter on, since the map itself is
    sealed. Written with the memory at accept; deleted when its metadata is purged."""

    __tablename__ = "memory_tags"

    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"), primary_key=True)
    tag: Mapped[str] = mapped_column(String(32), primary_key=True)
    memory_id: Mapped[str] = mapped_column(ForeignKey("memories.id"), primary_key=True)


class MemoryCounts(Base):
    """How many of an account's memories are in each listed status, exactly.

    Written ONLY by database triggers on ``memories`` (migration 0011), in the
    transaction that inserts, deletes or changes the status of a memory, so
    every code path keeps it exact without knowing it exists. ``check_runway``
    reads it instead of counting a million rows. ``accepting`` and ``failed``
    are not counted (not listed), nor ``storing`` (counted off the index by
    check_runway, bounded by the write backlog; see migration 0011 on why). A memory's account never changes; the
    triggers rely on that. One hot row per account on PostgreSQL, like the
    ``accounts`` row: concurrent status changes of one account serialize on it.
    """

    __tablename__ = "memory_counts"

    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"), primary_key=True)
    active: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    paused: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    no_renew: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    expired: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")


class Renewal(Base):
    """One chain transaction. Written as an intent (with its digest) before submission."""

    __tablename__ = "renewals"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    digest: Mapped[str] = mapped_column(String(100), unique=True)
    network: Mapped[str] = mapped_column(String(16))
    # Where an auditor checks this transaction (Suiscan, or the local explorer).
    explorer_url: Mapped[str | None] = mapped_column(String(300))
    # intent | confirmed | failed | abandoned
    status: Mapped[str] = mapped_column(String(16))
    walrus_epoch: Mapped[int] = mapped_column(Integer)
    blob_count: Mapped[int] = mapped_column(Integer)
    cost_mc: Mapped[int] = mapped_column(BigInteger)
    wal_cost_frost: Mapped[int | None] = mapped_column(BigInteger)
    gas_used: Mapped[int | None] = mapped_column(BigInteger)
    tx_bytes: Mapped[str | None] = mapped_column(Text)
    worker: Mapped[str | None] = mapped_column(String(100))
    error: Mapped[str | None] = mapped_column(String(1000))
    created_at: Mapped[datetime]
    submitted_at: Mapped[datetime | None]
    settled_at: Mapped[datetime | None]

    __table_args__ = (Index(None, "status", "created_at"),)


class RenewalItem(Base):
    __tablename__ = "renewal_items"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    renewal_id: Mapped[int] = mapped_column(BigId, ForeignKey("renewals.id"), index=True)
    blob_pk: Mapped[int] = mapped_column(BigId, ForeignKey("blobs.id"), index=True)
    account_id: Mapped[str | None] = mapped_column(ForeignKey("accounts.id"))
    epochs: Mapped[int] = mapped_column(Integer)
    old_end_epoch: Mapped[int] = mapped_column(Integer)
    new_end_epoch: Mapped[int] = mapped_column(Integer)
    cost_mc: Mapped[int] = mapped_column(BigInteger)
    hold_ref: Mapped[str | None] = mapped_column(String(200))
    # A quilt's renewal, in millionths of a unit: the kept members' shares it billed and
    # the rest of the quilt's apportioned shares (Walkeep's cost); the two sum to the
    # quilt's ``blobs.share_micro``. NULL for a plain blob, and for quilt renewals made
    # before migration 0019 (billed by the rule before; walkeep verify tells them apart).
    share_micro: Mapped[int | None] = mapped_column(BigInteger)
    unbilled_micro: Mapped[int | None] = mapped_column(BigInteger)


class Request(Base):
    """Idempotency record per (account, tool, request_id)."""

    __tablename__ = "requests"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"))
    tool: Mapped[str] = mapped_column(String(32))
    request_id: Mapped[str] = mapped_column(String(255))
    fingerprint: Mapped[str] = mapped_column(String(64))
    # in_progress | done | failed
    status: Mapped[str] = mapped_column(String(16))
    memory_id: Mapped[str | None] = mapped_column(String(32))
    response: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]

    __table_args__ = (
        UniqueConstraint("account_id", "tool", "request_id"),
        # Completion and failure update the request of a memory: without this,
        # each such update scanned all of the account's requests.
        Index(None, "account_id", "memory_id"),
    )


class CheckoutSession(Base):
    __tablename__ = "checkout_sessions"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"))
    request_id: Mapped[str] = mapped_column(String(255))
    amount_cents: Mapped[int] = mapped_column(BigInteger)
    currency: Mapped[str] = mapped_column(String(3))
    provider: Mapped[str] = mapped_column(String(16))
    provider_session_id: Mapped[str | None] = mapped_column(String(255), unique=True)
    url: Mapped[str | None] = mapped_column(Text)
    # creating | open | complete | expired | failed
    status: Mapped[str] = mapped_column(String(16))
    payment_status: Mapped[str | None] = mapped_column(String(32))
    idempotency_key: Mapped[str] = mapped_column(String(255))
    credited_entry_id: Mapped[int | None] = mapped_column(BigId, ForeignKey("ledger_entries.id"))
    # Local TEST MODE only: SHA-256 (hex) of the one-time token on the last rendered
    # checkout page; the Pay action must present it (cleared once used).
    pay_token_hash: Mapped[str | None] = mapped_column(String(64))
    # Automatic top-up (migration 0020): "payment" credits the amount; "setup" only saves a
    # card (amount 0). ``save_card``: the payment also saves the card for off-session use,
    # for ``customer_id`` (fixed here so a replay sends identical parameters). Local TEST
    # MODE keeps the saved test card's behaviour the operator picked on the page.
    mode: Mapped[str] = mapped_column(String(8), default="payment", server_default="payment")
    save_card: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    customer_id: Mapped[str | None] = mapped_column(String(255))
    test_card: Mapped[str | None] = mapped_column(String(32))
    card_saved_at: Mapped[datetime | None]
    expires_at: Mapped[datetime]
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]

    __table_args__ = (
        UniqueConstraint("account_id", "request_id"),
        Index(None, "status", "created_at"),
    )


class StripeEvent(Base):
    __tablename__ = "stripe_events"

    id: Mapped[str] = mapped_column(String(255), primary_key=True)
    type: Mapped[str] = mapped_column(String(100))
    session_id: Mapped[str | None] = mapped_column(String(255))
    received_at: Mapped[datetime]
    processed_at: Mapped[datetime | None]


class WriteJob(Base):
    """A write Walkeep runs itself (local and Walrus backends): encrypt → put → index.

    Holds the ciphertext until the blob has landed so an accepted write
    survives a crash; cleared once it has.
    """

    __tablename__ = "write_jobs"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"))
    namespace: Mapped[str] = mapped_column(String(255))
    idempotency_key: Mapped[str] = mapped_column(String(200), unique=True)
    ciphertext: Mapped[bytes | None] = mapped_column(LargeBinary)
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    epochs: Mapped[int] = mapped_column(Integer)
    # pending | uploaded | landed | failed | cancelled (a failed store's job: never uploads)
    status: Mapped[str] = mapped_column(String(16))
    not_before: Mapped[datetime]
    lease_until: Mapped[datetime | None]
    # The live process holding the lease; it renews ``lease_until`` by heartbeat.
    lease_owner: Mapped[str | None] = mapped_column(String(100))
    attempts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    result: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    error: Mapped[str | None] = mapped_column(String(1000))
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]

    __table_args__ = (
        Index(None, "status", "not_before"),
        Index(None, "status", "account_id"),
    )


class Embedding(Base):
    """One vector per chunk of a blob's plaintext, for Walkeep's own semantic index."""

    __tablename__ = "embeddings"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"))
    namespace: Mapped[str] = mapped_column(String(255))
    blob_id: Mapped[str] = mapped_column(String(64))
    chunk: Mapped[int] = mapped_column(Integer)
    model: Mapped[str] = mapped_column(String(64))
    dim: Mapped[int] = mapped_column(Integer)
    vector: Mapped[bytes] = mapped_column(LargeBinary)  # float32, L2-normalised
    # The chunk's distinct keyed term hashes and frequencies (walkeep/index/terms.py):
    # no readable word. NULL on rows from before the lexical index, until backfilled.
    terms: Mapped[bytes | None] = mapped_column(LargeBinary)
    created_at: Mapped[datetime]

    __table_args__ = (
        # "The account's newest row" on every recall, and "its rows after id N" when an
        # index catches up: one seek and one range, whatever the namespace.
        Index(None, "account_id", "model", "id"),
        UniqueConstraint("account_id", "blob_id", "model", "chunk"),
    )


class IndexState(Base):
    """How many times an account's index rows of one model were rewritten in place.

    Rows are otherwise append-only, so "the newest row id" tells a cached index what
    it lacks; a backfill or rebuild that rewrites rows bumps ``generation`` instead,
    and every process drops the indexes it built before.
    """

    __tablename__ = "index_state"

    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"), primary_key=True)
    model: Mapped[str] = mapped_column(String(64), primary_key=True)
    generation: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    updated_at: Mapped[datetime]


class NamespaceName(Base):
    """A namespace's name, sealed, for the token it is stored and matched as
    (walkeep/service/sealed.py): the tools show names, the database holds tokens."""

    __tablename__ = "namespace_names"

    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"), primary_key=True)
    token: Mapped[str] = mapped_column(String(32), primary_key=True)
    sealed: Mapped[str] = mapped_column(String(512))
    created_at: Mapped[datetime]


class DataKey(Base):
    """An account's data-encryption key, wrapped (AES-KW) by the master key."""

    __tablename__ = "data_keys"

    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"), primary_key=True)
    wrapped: Mapped[bytes] = mapped_column(LargeBinary)
    master_key_id: Mapped[str] = mapped_column(String(32))
    created_at: Mapped[datetime]


class ConsoleSession(Base):
    """A signed-in console session, so that it can end on the server.

    The cookie is signed, but a signature alone keeps working for its whole lifetime
    wherever the cookie is copied; the cookie names this row, and a session is good only
    while the row is open. Signing out ends it; revoking a key ends the sessions opened
    with that key and the account's sessions opened by sign-in link (a revocation is how
    an operator answers a leak). ``account_id`` NULL is an
    admin session; ``key_id`` is the API key it was opened with (NULL: a sign-in link).
    """

    __tablename__ = "console_sessions"

    id: Mapped[str] = mapped_column(String(48), primary_key=True)
    account_id: Mapped[str | None] = mapped_column(ForeignKey("accounts.id"), index=True)
    key_id: Mapped[str | None] = mapped_column(String(32))
    created_at: Mapped[datetime]
    expires_at: Mapped[datetime]
    ended_at: Mapped[datetime | None]


class ConsoleLink(Base):
    """A one-time console sign-in link (``walkeep console-link``).

    Only the SHA-256 of the token is kept, so a leaked database does not leak
    working links. ``account_id`` NULL means an admin link. A link is spent
    by setting ``used_at`` with a conditional UPDATE, so it signs in once even
    if two browsers race.
    """

    __tablename__ = "console_links"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    account_id: Mapped[str | None] = mapped_column(ForeignKey("accounts.id"))
    created_at: Mapped[datetime]
    expires_at: Mapped[datetime]
    used_at: Mapped[datetime | None]


class SignInAttempts(Base):
    """Console sign-in attempts per bucket in the current minute (``walkeep/service/operators/console.py``).

    A bucket is a client address or what it tries to open (the admin, a key's
    prefix), kept as its SHA-256. In the database, not in a process, so that N web
    processes allow the same 10 attempts a minute as one. ``window_start`` is unix
    seconds, a multiple of 60; an attempt in a later window starts the count anew,
    and the sweep deletes rows of windows long past.
    """

    __tablename__ = "sign_in_attempts"

    bucket: Mapped[str] = mapped_column(String(64), primary_key=True)
    window_start: Mapped[int] = mapped_column(BigInteger, index=True)
    attempts: Mapped[int] = mapped_column(Integer)


class JobRun(Base):
    """The latest run of each worker job, upserted by ``walkeep/scheduler/jobs.py``.

    The console runs in the web process and cannot see the worker's memory or
    metrics; this row is how an admin learns that renewals actually run.
    """

    __tablename__ = "job_runs"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    worker: Mapped[str | None] = mapped_column(String(100))
    started_at: Mapped[datetime]
    finished_at: Mapped[datetime]
    ok: Mapped[bool]
    duration_ms: Mapped[int] = mapped_column(Integer)
    summary: Mapped[str | None] = mapped_column(String(1000))
    last_ok_at: Mapped[datetime | None]


__all__ = [
    "Account",
    "ApiKey",
    "AutoCharge",
    "AutoTopUp",
    "Base",
    "Blob",
    "CheckoutSession",
    "ConsoleLink",
    "DataKey",
    "Embedding",
    "JobRun",
    "LedgerEntry",
    "Memory",
    "MemoryCounts",
    "Renewal",
    "RenewalItem",
    "Request",
    "StripeEvent",
    "UTCDateTime",
    "WriteJob",
]


class AlertSettings(Base):
    """An account's outbound webhook for alerts (walkeep/service/alerts.py)."""

    __tablename__ = "alert_settings"

    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"), primary_key=True)
    url: Mapped[str] = mapped_column(String(2000))
    # The HMAC signing secret. Shown once when set; kept to sign deliveries.
    secret: Mapped[str] = mapped_column(String(100))
    threshold_epochs: Mapped[int] = mapped_column(Integer)
    # Whether funded runway is currently below the threshold: balance.low
    # fires on the transition to low and re-arms on the way back up.
    balance_low: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]


class AlertEvent(Base):
    """The outbox: one row per event, inserted in the transaction that caused it.

    ``body`` is the exact JSON delivered (and signed) on every attempt, so a
    retry is byte-identical and receivers can deduplicate on the event id.
    """

    __tablename__ = "alert_events"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"))
    type: Mapped[str] = mapped_column(String(40))
    body: Mapped[str] = mapped_column(Text)
    # pending | delivered | failed (gave up after the last attempt)
    status: Mapped[str] = mapped_column(String(16))
    attempts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    next_attempt_at: Mapped[datetime]
    created_at: Mapped[datetime]
    delivered_at: Mapped[datetime | None]

    __table_args__ = (
        Index(None, "status", "next_attempt_at"),
        Index(None, "account_id", "created_at"),
    )


class AlertDelivery(Base):
    """One delivery attempt of one event: what the receiver answered, or why it failed."""

    __tablename__ = "alert_deliveries"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    event_id: Mapped[str] = mapped_column(ForeignKey("alert_events.id"), index=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"))
    url: Mapped[str] = mapped_column(String(2000))
    attempt: Mapped[int] = mapped_column(Integer)
    status_code: Mapped[int | None] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(String(500))
    duration_ms: Mapped[int] = mapped_column(Integer)
    attempted_at: Mapped[datetime]

    __table_args__ = (Index(None, "account_id", "attempted_at"),)


class AutoTopUp(Base):
    """An account's automatic top-up: the rule, the saved card and its consent, the state.

    ``status`` is off | active | action_required | disabled (walkeep/topup_rule.py). Never
    active without a card and a monthly cap; only an operator turns it on
    (walkeep/service/operators/autotopup.py). The card is the provider's payment method
    id, kept with what a person recognises (brand, last four) and the consent given when
    it was saved (when, which text, through what).
    """

    __tablename__ = "auto_top_ups"

    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"), primary_key=True)
    status: Mapped[str] = mapped_column(String(20), default="off", server_default="off")
    below_runway_epochs: Mapped[int | None] = mapped_column(Integer)
    to_runway_epochs: Mapped[int | None] = mapped_column(Integer)
    monthly_cap_cents: Mapped[int | None] = mapped_column(BigInteger)
    provider: Mapped[str | None] = mapped_column(String(16))
    customer_id: Mapped[str | None] = mapped_column(String(255))
    payment_method_id: Mapped[str | None] = mapped_column(String(255))
    card_brand: Mapped[str | None] = mapped_column(String(32))
    card_last4: Mapped[str | None] = mapped_column(String(4))
    consent_at: Mapped[datetime | None]
    consent_version: Mapped[str | None] = mapped_column(String(32))
    consent_source: Mapped[str | None] = mapped_column(String(100))
    consecutive_declines: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # Declined: no automatic retry before this (the back-off).
    next_attempt_at: Mapped[datetime | None]
    reason: Mapped[str | None] = mapped_column(String(500))
    # action_required: the charge whose authentication the card holder must complete.
    action_charge_id: Mapped[str | None] = mapped_column(String(32))
    # The UTC month (YYYY-MM) whose auto_top_up.cap_reached alert was sent (once a month).
    cap_alert_month: Mapped[str | None] = mapped_column(String(7))
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]

    __table_args__ = (Index(None, "status"), Index(None, "payment_method_id"))


class AutoCharge(Base):
    """One automatic charge of a saved card, claimed here *before* the provider is called.

    Every parameter the provider sees (amount, card, customer, idempotency key) is fixed
    in the row, so a retry after a crash or a timeout replays the identical request.
    ``pending_account_id`` is the account id while the charge is pending and NULL once it
    settles: UNIQUE, so an account has at most one pending charge on either database
    (both allow any number of NULLs). ``inputs`` are what the rule saw when it decided.
    """

    __tablename__ = "auto_charges"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"))
    pending_account_id: Mapped[str | None] = mapped_column(String(32), unique=True)
    amount_cents: Mapped[int] = mapped_column(BigInteger)
    currency: Mapped[str] = mapped_column(String(3))
    provider: Mapped[str] = mapped_column(String(16))
    customer_id: Mapped[str] = mapped_column(String(255))
    payment_method_id: Mapped[str] = mapped_column(String(255))
    idempotency_key: Mapped[str] = mapped_column(String(255), unique=True)
    payment_intent_id: Mapped[str | None] = mapped_column(String(255), unique=True)
    # pending | succeeded | declined | authentication_required | canceled (never sent)
    status: Mapped[str] = mapped_column(String(24))
    # declined | hard_declined | authentication_required
    failure: Mapped[str | None] = mapped_column(String(24))
    decline_code: Mapped[str | None] = mapped_column(String(64))
    message: Mapped[str | None] = mapped_column(String(500))
    trigger: Mapped[str] = mapped_column(String(16))  # schedule | renewal
    inputs: Mapped[dict[str, Any]] = mapped_column(JSON)
    credited_entry_id: Mapped[int | None] = mapped_column(BigId, ForeignKey("ledger_entries.id"))
    # Refunds and disputes the provider reported (cumulative), and what they took back:
    # debited from the balance, or recorded as a shortfall (the balance never goes below 0).
    refunded_cents: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    disputed_cents: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    reversed_mc: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    reversal_shortfall_mc: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    created_at: Mapped[datetime]
    submitted_at: Mapped[datetime | None]
    settled_at: Mapped[datetime | None]
    updated_at: Mapped[datetime]

    __table_args__ = (
        Index(None, "account_id", "created_at"),
        Index(None, "status", "created_at"),
    )
