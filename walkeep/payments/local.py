"""TEST MODE payments: Walkeep is its own payment provider (the embedded default).

With no Stripe key configured, a top-up still produces a working checkout
link: ``{public_url}/checkout/<checkout_id>`` is a page served by Walkeep,
labelled TEST MODE, whose Pay button credits the account. No money moves.

The provider's state *is* our ``checkout_sessions`` row (``payment_status``
flips to ``paid`` when the Pay button runs), so ``retrieve_session`` reads the
row and the service layer credits through the very same function it uses for
Stripe. There are no local webhooks: ``parse_webhook`` rejects everything, so
``POST /webhooks/stripe`` answers 400 when Stripe isn't configured.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select

from walkeep.config import Settings
from walkeep.db import Database
from walkeep.db.models import CheckoutSession
from walkeep.errors import NotFound
from walkeep.payments.base import (
    CheckoutRequest,
    InvalidSignature,
    PaymentEvent,
    ProviderSession,
)

SESSION_PREFIX = "cs_local_"


def local_session_id(checkout_id: str) -> str:
    return f"{SESSION_PREFIX}{checkout_id}"


def local_checkout_url(public_url: str, checkout_id: str) -> str:
    return f"{public_url.rstrip('/')}/checkout/{checkout_id}"


class LocalPayments:
    """The ``Payments`` port served by Walkeep itself, in TEST MODE."""

    provider = "local"

    def __init__(self, db: Database, settings: Settings) -> None:
        self._db = db
        self._public_url = settings.public_url

    def create_session(self, req: CheckoutRequest) -> ProviderSession:
        """Pure: the session is fully described by the request (nothing to call)."""
        return ProviderSession(
            session_id=local_session_id(req.checkout_id),
            url=local_checkout_url(self._public_url, req.checkout_id),
            status="open",
            payment_status="unpaid",
            amount_total=req.amount_cents,
            currency=req.currency.lower(),
            client_reference_id=req.account_id,
            metadata={
                "account_id": req.account_id,
                "request_id": req.request_id,
                "checkout_id": req.checkout_id,
            },
        )

    def retrieve_session(self, session_id: str) -> ProviderSession:
        with self._db.read() as s:
            row = s.scalar(
                select(CheckoutSession).where(CheckoutSession.provider_session_id == session_id)
            )
            if row is None and session_id.startswith(SESSION_PREFIX):
                row = s.get(CheckoutSession, session_id.removeprefix(SESSION_PREFIX))
            if row is None or row.provider != self.provider:
                raise NotFound("no such local checkout session", {"session_id": session_id})
            return self.session_from_row(row, self._db.clock.now())

    def session_from_row(self, row: CheckoutSession, now: datetime) -> ProviderSession:
        """What the local "provider" says about ``row`` at ``now``.

        Paid once the Pay button ran (even after the expiry time: the payment
        happened first); otherwise expired once ``expires_at`` has passed,
        exactly like a Stripe session.
        """
        paid = row.payment_status == "paid"
        if paid or row.status == "failed":
            status = "complete"
        elif row.status == "expired" or now >= row.expires_at:
            status = "expired"
        else:
            status = "open"
        return ProviderSession(
            session_id=row.provider_session_id or local_session_id(row.id),
            url=local_checkout_url(self._public_url, row.id) if status == "open" else None,
            status=status,
            payment_status="paid" if paid else "unpaid",
            amount_total=row.amount_cents,
            currency=row.currency,
            client_reference_id=row.account_id,
            metadata={
                "account_id": row.account_id,
                "request_id": row.request_id,
                "checkout_id": row.id,
            },
        )

    def parse_webhook(self, body: bytes, signature: str | None) -> PaymentEvent:
        raise InvalidSignature(
            "Stripe is not configured: local TEST MODE payments have no webhooks"
        )
