"""TEST MODE payments: Walkeep is its own payment provider (the embedded default).

With no Stripe key configured, a top-up still produces a working checkout
link: ``{public_url}/checkout/<checkout_id>`` is a page served by Walkeep,
labelled TEST MODE, whose Pay button credits the account. No money moves.

The provider's state *is* our ``checkout_sessions`` row (``payment_status``
flips to ``paid`` when the Pay button runs), so ``retrieve_session`` reads the
row and the service layer credits through the very same function it uses for
Stripe. There are no local webhooks: ``parse_webhook`` rejects everything, so
``POST /webhooks/stripe`` answers 400 when Stripe isn't configured.

Saved cards are TEST MODE cards too: the operator picks how one behaves — it
``succeeds``, ``declines`` (an ordinary, retryable decline) or needs
``authentication_required`` — on the checkout page of a ``save_card`` link, or with
``walkeep auto-top-up set --test-card``. The behaviour is written into the card's id
(``pm_test_<behaviour>_…``), so a charge's outcome is a pure function of its stored
row: charging twice, or asking again after a crash, gives the same answer, exactly as
an idempotency key does at Stripe. The last four digits are those of Stripe's test card
with the same behaviour (4242, 0002, 3184).
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select

from walkeep.config import Settings
from walkeep.db import Database
from walkeep.db.models import AutoCharge, CheckoutSession
from walkeep.errors import NotFound
from walkeep.payments.base import (
    ChargeRequest,
    ChargeResult,
    CheckoutRequest,
    Failure,
    InvalidSignature,
    PaymentEvent,
    ProviderSession,
    Reversals,
    SavedCard,
)

SESSION_PREFIX = "cs_local_"
CARD_PREFIX = "pm_test_"
CHARGE_PREFIX = "pi_local_"
# behaviour → (brand, last four of Stripe's test card that behaves so)
TEST_CARDS: dict[str, tuple[str, str]] = {
    "succeeds": ("visa", "4242"),
    "declines": ("visa", "0002"),
    "authentication_required": ("visa", "3184"),
}


def test_card(behaviour: str, suffix: str) -> SavedCard:
    """The TEST MODE card that ``behaviour``s (a key of ``TEST_CARDS``)."""
    brand, last4 = TEST_CARDS[behaviour]
    return SavedCard(f"{CARD_PREFIX}{behaviour}_{suffix}", brand, last4)


def test_card_behaviour(payment_method_id: str) -> str | None:
    """How a TEST MODE card behaves, from its id (None: not a TEST MODE card)."""
    if not payment_method_id.startswith(CARD_PREFIX):
        return None
    rest = payment_method_id.removeprefix(CARD_PREFIX)
    for behaviour in sorted(TEST_CARDS, key=len, reverse=True):
        if rest.startswith(behaviour + "_"):
            return behaviour
    return None


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
            mode=req.mode,
            customer_id=req.customer_id,
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
        saved = row.mode == "setup" and row.payment_status == "no_payment_required"
        if paid or saved or row.status == "failed":
            status = "complete"
        elif row.status == "expired" or now >= row.expires_at:
            status = "expired"
        else:
            status = "open"
        return ProviderSession(
            session_id=row.provider_session_id or local_session_id(row.id),
            url=local_checkout_url(self._public_url, row.id) if status == "open" else None,
            status=status,
            payment_status="paid" if paid else ("no_payment_required" if saved else "unpaid"),
            amount_total=row.amount_cents,
            currency=row.currency,
            client_reference_id=row.account_id,
            metadata={
                "account_id": row.account_id,
                "request_id": row.request_id,
                "checkout_id": row.id,
            },
            mode=row.mode,
            customer_id=row.customer_id,
            card=(
                test_card(row.test_card, row.id)
                if (paid or saved) and row.save_card and row.test_card in TEST_CARDS
                else None
            ),
        )

    def parse_webhook(self, body: bytes, signature: str | None) -> PaymentEvent:
        raise InvalidSignature(
            "Stripe is not configured: local TEST MODE payments have no webhooks"
        )

    # --- saved cards -----------------------------------------------------------------

    def ensure_customer(self, account_id: str, idempotency_key: str) -> str:
        return f"cus_local_{account_id}"

    def charge(self, req: ChargeRequest) -> ChargeResult:
        """Pure: the outcome follows from the card's behaviour (see the module doc)."""
        return _outcome(f"{CHARGE_PREFIX}{req.charge_id}", req.payment_method_id, req)

    def retrieve_charge(self, payment_intent_id: str) -> ChargeResult:
        charge_id = payment_intent_id.removeprefix(CHARGE_PREFIX)
        found = self.find_charge(charge_id) if payment_intent_id.startswith(CHARGE_PREFIX) else None
        if found is None:
            raise NotFound("no such local charge", {"payment_intent_id": payment_intent_id})
        return found

    def find_charge(self, charge_id: str) -> ChargeResult | None:
        with self._db.read() as s:
            row = s.get(AutoCharge, charge_id)
            if row is None or row.provider != self.provider or row.submitted_at is None:
                return None
            req = ChargeRequest(
                charge_id=row.id,
                account_id=row.account_id,
                amount_cents=row.amount_cents,
                currency=row.currency,
                customer_id=row.customer_id,
                payment_method_id=row.payment_method_id,
                idempotency_key=row.idempotency_key,
                description="",
            )
        return _outcome(f"{CHARGE_PREFIX}{charge_id}", req.payment_method_id, req)

    def reversals(self, payment_intent_id: str) -> Reversals:
        return Reversals(0, 0)  # TEST MODE money is never refunded or disputed

    def default_card(self, customer_id: str) -> SavedCard | None:
        return None

    def portal_url(self, customer_id: str, return_url: str) -> str | None:
        return None  # TEST MODE has no card portal: save another test card instead


def _outcome(payment_intent_id: str, payment_method_id: str, req: ChargeRequest) -> ChargeResult:
    behaviour = test_card_behaviour(payment_method_id)

    def result(
        failure: Failure | None = None, code: str | None = None, text: str = ""
    ) -> ChargeResult:
        return ChargeResult(
            payment_intent_id=payment_intent_id,
            status="failed" if failure else "succeeded",
            amount_cents=req.amount_cents,
            currency=req.currency,
            failure=failure,
            decline_code=code,
            message=text or None,
            metadata={"account_id": req.account_id, "walkeep_charge_id": req.charge_id},
        )

    if behaviour == "succeeds":
        return result()
    if behaviour == "authentication_required":
        return result(
            "authentication_required",
            "authentication_required",
            "This charge needs the card holder to authenticate (TEST MODE card).",
        )
    if behaviour == "declines":
        return result("declined", "generic_decline", "Your card was declined (TEST MODE card).")
    return result(
        "hard_declined", "unknown_card", "This is not a TEST MODE card; save a test card again."
    )
