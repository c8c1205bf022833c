"""The one error hierarchy every layer raises and every transport renders.

Codes are the contract (seeds/walkeep-tool-reference.txt): agents branch on
``code`` and read ``data`` for what to do next, so every error carries both.
Transports turn these into MCP ``isError`` results or REST bodies with the same
``{code, message, data}`` envelope; nothing else (no traceback, no secret)
ever reaches a client.
"""

from __future__ import annotations

from typing import Any, ClassVar


class WalkeepError(Exception):
    """Base class: a typed, client-safe failure."""

    code: ClassVar[str] = "INTERNAL"
    http_status: ClassVar[int] = 500

    def __init__(self, message: str, data: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.data: dict[str, Any] = dict(data or {})

    def body(self) -> dict[str, Any]:
        """The wire envelope shared by MCP and REST."""
        return {"code": self.code, "message": self.message, "data": self.data}

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return f"{type(self).__name__}({self.message!r}, {self.data!r})"


class InsufficientBalance(WalkeepError):
    """Credits can't cover the operation; nothing happened."""

    code = "INSUFFICIENT_BALANCE"
    http_status = 402


class NotFound(WalkeepError):
    """Unknown id for this account (never reveals other accounts' ids)."""

    code = "NOT_FOUND"
    http_status = 404


class Forbidden(WalkeepError):
    """The API key is confined to one namespace and the call named another; nothing
    happened. ``data.namespace`` is the one the key may use. Beside the reference's codes:
    operators confine keys (``walkeep key create --only-namespace``)."""

    code = "FORBIDDEN"
    http_status = 403


class QuotaExceeded(WalkeepError):
    """Over a per-account limit; ``data`` carries the limit."""

    code = "QUOTA_EXCEEDED"
    http_status = 429


class RelayerUnavailable(WalkeepError):
    """Storage backend unreachable; nothing stored or billed."""

    code = "RELAYER_UNAVAILABLE"
    http_status = 503


class ValidationError(WalkeepError):
    """Malformed input past schema validation."""

    code = "VALIDATION_ERROR"
    http_status = 422


class PaymentsUnavailable(WalkeepError):
    """The payment provider is unreachable; nothing was recorded as final."""

    code = "PAYMENTS_UNAVAILABLE"
    http_status = 503


class Unauthorized(WalkeepError):
    """Missing, unknown or revoked API key."""

    code = "UNAUTHORIZED"
    http_status = 401


class RateLimited(WalkeepError):
    """Too many calls of one tool by one account; ``data.retry_after_seconds`` says when.

    Beside the reference's codes: a per-key token bucket (README "Limits")
    keeps one key from monopolising the server. Nothing happened; retry later
    with the same arguments (and the same request_id).
    """

    code = "RATE_LIMITED"
    http_status = 429


class ServiceUnavailable(WalkeepError):
    """Walkeep's own database is unreachable; nothing happened, retry later.

    ``data.retry`` is always true: the call is safe to repeat unchanged.
    """

    code = "SERVICE_UNAVAILABLE"
    http_status = 503

    def __init__(self, message: str, data: dict[str, Any] | None = None) -> None:
        super().__init__(message, {"retry": True, **(data or {})})


class Internal(WalkeepError):
    """An unexpected failure; details are logged, never returned."""

    code = "INTERNAL"
    http_status = 500


class ConfigurationError(Exception):
    """The process is misconfigured and must not start.

    Not a WalkeepError: it is raised at boot, to an operator, never to an agent.
    """


ALL_CODES: tuple[str, ...] = (
    InsufficientBalance.code,
    NotFound.code,
    Forbidden.code,
    QuotaExceeded.code,
    RelayerUnavailable.code,
    ValidationError.code,
    PaymentsUnavailable.code,
    Unauthorized.code,
    RateLimited.code,
    ServiceUnavailable.code,
    Internal.code,
)

_BY_CODE: dict[str, type[WalkeepError]] = {
    cls.code: cls
    for cls in (
        InsufficientBalance,
        NotFound,
        Forbidden,
        QuotaExceeded,
        RelayerUnavailable,
        ValidationError,
        PaymentsUnavailable,
        Unauthorized,
        Internal,
    )
}


# JSON-RPC error codes for failures answered before an MCP request reaches its tool
# (server-defined range -32000..-32099). The typed code is in ``error.data.code``.
JSONRPC_CODES: dict[str, int] = {
    "UNAUTHORIZED": -32001,
    "SERVICE_UNAVAILABLE": -32002,
    "RATE_LIMITED": -32003,
    "VALIDATION_ERROR": -32602,
}


def jsonrpc_body(err: WalkeepError, request_id: Any = None) -> dict[str, Any]:
    """``err`` as a JSON-RPC error response, for ``/mcp`` answers outside any tool.

    Why: MCP clients (the official SDK among them) surface only JSON-RPC error
    objects from a non-2xx answer; a bare ``{code, message, data}`` became "Server
    returned an error response" and the explanation was lost. ``error.message`` is
    the human text and ``error.data`` the same envelope REST returns.
    """
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "error": {
            "code": JSONRPC_CODES.get(err.code, -32000),
            "message": err.message,
            "data": err.body(),
        },
    }


def envelope_of(body: object) -> dict[str, Any] | None:
    """The ``{code, message, data}`` envelope in a REST body or a JSON-RPC error, or None."""
    if not isinstance(body, dict):
        return None
    error = body.get("error")
    if body.get("jsonrpc") == "2.0" and isinstance(error, dict):
        data = error.get("data")
        if isinstance(data, dict) and "code" in data:
            return data
        return {"code": "INTERNAL", "message": str(error.get("message") or ""), "data": {}}
    return body if "code" in body else None


def from_body(body: dict[str, Any]) -> WalkeepError:
    """The typed error for a wire envelope (``walkeep.client`` raises these).

    An unknown code (a newer server) still becomes a WalkeepError carrying it.
    """
    code = str(body.get("code") or "INTERNAL")
    message = str(body.get("message") or code)
    data = body.get("data") if isinstance(body.get("data"), dict) else {}
    cls = _BY_CODE.get(code)
    if cls is not None:
        return cls(message, data)
    err = WalkeepError(message, data)
    err.code = code  # type: ignore[misc]
    return err
