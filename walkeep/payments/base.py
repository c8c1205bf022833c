"""The payments port: Checkout sessions for prepaid top-ups, and saved cards.

Two implementations: ``stripe`` (Stripe Checkout through the official SDK)
and ``local`` (a TEST MODE checkout page served by Walkeep itself, the
embedded default). Crediting is never done here: the service layer credits
the ledger exactly once per session, from whichever signal arrives first
(webhook, the local Pay button, or the reconcile job).

Automatic top-up adds a customer per account, checkouts that save a card (a payment
that also saves it, or a setup-mode session that only saves it), off-session charges
of the saved card, and what the provider says later about a charge (its outcome,
refunds, disputes). A refused charge is an *answer* (``ChargeResult`` with a
``failure`` class), not an exception; only an unknown outcome raises
(``PaymentsUnavailable``), and the caller then asks again by the same idempotency key
or payment id — never by minting a new charge.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal, Protocol, runtime_checkable

Failure = Literal["declined", "hard_declined", "authentication_required"]


@dataclass(frozen=True, slots=True)
class CheckoutRequest:
    """Everything needed to create a session, derived only from our stored row.

    Nothing here may depend on the current time, so a replay sends identical
    parameters under the same idempotency key.
    """

    checkout_id: str
    account_id: str
    request_id: str
    amount_cents: int
    currency: str
    idempotency_key: str
    expires_at: datetime
    success_url: str
    cancel_url: str
    # "payment" (credits) or "setup" (only saves a card; amount_cents is 0).
    mode: str = "payment"
    # Save the card for later off-session charges, for this customer, and show the
    # consent text next to the button.
    save_card: bool = False
    customer_id: str | None = None
    consent_text: str | None = None


@dataclass(frozen=True, slots=True)
class SavedCard:
    """A card saved for off-session use, as a person recognises it."""

    payment_method_id: str
    brand: str | None
    last4: str | None


@dataclass(frozen=True, slots=True)
class ProviderSession:
    session_id: str
    url: str | None
    status: str  # open | complete | expired
    payment_status: str  # paid | unpaid | no_payment_required
    amount_total: int | None
    currency: str | None
    client_reference_id: str | None = None
    metadata: dict[str, str] | None = None
    mode: str = "payment"
    customer_id: str | None = None
    # The card the session saved (save_card payments and setup sessions, once complete).
    card: SavedCard | None = None


@dataclass(frozen=True, slots=True)
class ChargeRequest:
    """An off-session charge, built from the stored charge row only (never from "now")."""

    charge_id: str
    account_id: str
    amount_cents: int
    currency: str
    customer_id: str
    payment_method_id: str
    idempotency_key: str
    description: str


@dataclass(frozen=True, slots=True)
class ChargeResult:
    """What the provider says about one charge.

    ``status``: succeeded (the money moved) | pending (still processing; ask again) |
    failed (``failure`` says how: declined — retry later; hard_declined — never retry
    this card; authentication_required — only the card holder can complete it).
    """

    payment_intent_id: str | None
    status: Literal["succeeded", "pending", "failed"]
    amount_cents: int | None
    currency: str | None
    failure: Failure | None = None
    decline_code: str | None = None
    message: str | None = None
    metadata: dict[str, str] | None = None


@dataclass(frozen=True, slots=True)
class Reversals:
    """Money the provider took back from one payment so far (cumulative, cents)."""

    refunded_cents: int
    disputed_cents: int


@dataclass(frozen=True, slots=True)
class PaymentEvent:
    event_id: str
    type: str
    session_id: str | None
    # The event's object (payment_intent, charge, dispute, payment_method, customer …):
    # its id, and the payment it concerns. Acted on after re-reading the provider.
    object_type: str | None = None
    object_id: str | None = None
    payment_intent_id: str | None = None
    customer_id: str | None = None


class InvalidSignature(Exception):
    """A webhook whose signature does not verify (or is stale): change nothing."""


class MalformedEvent(InvalidSignature):
    """A correctly signed delivery that is not a usable event (``[]``, no ``type`` …).

    Answered like a bad signature (400, nothing changes, logged) rather than 500: retrying
    the same bytes can never succeed.
    """


@runtime_checkable
class Payments(Protocol):
    provider: str  # "stripe" | "local"

    def create_session(self, req: CheckoutRequest) -> ProviderSession:
        """Raises PaymentsUnavailable if the provider can't be reached."""
        ...

    def retrieve_session(self, session_id: str) -> ProviderSession: ...

    def parse_webhook(self, body: bytes, signature: str | None) -> PaymentEvent:
        """Verify and parse; raises InvalidSignature."""
        ...

    # --- saved cards (automatic top-up) ---------------------------------------------

    def ensure_customer(self, account_id: str, idempotency_key: str) -> str:
        """The provider's customer for ``account_id`` (created under the key if new)."""
        ...

    def charge(self, req: ChargeRequest) -> ChargeResult:
        """Charge the saved card off-session. A refusal is returned; an unknown outcome
        raises PaymentsUnavailable (ask again with the same request)."""
        ...

    def retrieve_charge(self, payment_intent_id: str) -> ChargeResult:
        """The charge's current state; NotFound if the provider has none."""
        ...

    def find_charge(self, charge_id: str) -> ChargeResult | None:
        """A charge by our charge id (its metadata), when the payment id was never
        learned and the idempotency key may be forgotten; None if there is none."""
        ...

    def reversals(self, payment_intent_id: str) -> Reversals:
        """How much of the payment was refunded and disputed so far."""
        ...

    def default_card(self, customer_id: str) -> SavedCard | None:
        """The card the customer chose as default (e.g. in the provider's portal)."""
        ...

    def portal_url(self, customer_id: str, return_url: str) -> str | None:
        """A short-lived link to the provider's page for updating the card (None: the
        provider has none). Mint it when the operator clicks; never store or send it."""
        ...
