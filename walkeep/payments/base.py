"""The payments port: Checkout sessions for prepaid top-ups.

Two implementations: ``stripe`` (Stripe Checkout through the official SDK)
and ``local`` (a TEST MODE checkout page served by Walkeep itself, the
embedded default). Crediting is never done here: the service layer credits
the ledger exactly once per session, from whichever signal arrives first
(webhook, the local Pay button, or the reconcile job).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Protocol, runtime_checkable


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


@dataclass(frozen=True, slots=True)
class PaymentEvent:
    event_id: str
    type: str
    session_id: str | None


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
