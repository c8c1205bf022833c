"""The server wallet key and the pysui gRPC client (notes §3.2, §3.4).

Kept apart from the adapter so the two things an operator can get wrong — the
key and the node URL — fail in one place with one clear message.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from grpclib.const import Status
from pysui import GroupProtocol, NetworkType, PysuiConfiguration, client_factory
from pysui.sui.sui_crypto import SuiKeyPair, keypair_from_keystring

from walkeep.backends.sui.codec import address_from_public_key
from walkeep.errors import ConfigurationError

# gRPC statuses that mean "the node refused this request as such": for an
# execution, the transaction was not (and will not be) applied.
REFUSED = frozenset({Status.INVALID_ARGUMENT, Status.FAILED_PRECONDITION, Status.PERMISSION_DENIED})


class RpcFailed(Exception):
    """pysui returned ``is_ok() == False``: a gRPC status from the node, or a local error."""

    def __init__(self, status: Status | None, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message

    @classmethod
    def from_result(cls, result_string: Any) -> RpcFailed:
        # pysui stores GRPCError.args, i.e. (Status, message, details), as the result string.
        if isinstance(result_string, tuple) and result_string:
            head = result_string[0]
            if isinstance(head, Status):
                msg = result_string[1] if len(result_string) > 1 else None
                return cls(head, str(msg or head.name))
            return cls(None, " ".join(str(p) for p in result_string if p is not None))
        return cls(None, str(result_string or "request failed"))

    def __str__(self) -> str:
        return f"{self.status.name}: {self.message}" if self.status else self.message


def load_keypair(key_string: str | None) -> tuple[SuiKeyPair, str]:
    """Parse ``WALKEEP_SUI_PRIVATE_KEY`` (``suiprivkey1…`` or base64 keystore) → (keypair, address).

    Raises ConfigurationError with a one-line message that never echoes the key
    (pysui's own messages may quote it, so they are dropped).
    """
    if not key_string or not key_string.strip():
        raise ConfigurationError(
            "WALKEEP_SUI_PRIVATE_KEY is not set: the Sui chain needs the server wallet key"
            " (suiprivkey1…)"
        )
    try:
        keypair = keypair_from_keystring(key_string.strip())
        address = address_from_public_key(bytes(keypair.public_key.scheme_and_key()))
    except Exception:
        raise ConfigurationError(
            "WALKEEP_SUI_PRIVATE_KEY is not a valid Sui private key"
            " (expected suiprivkey1… or a base64 keystore entry)"
        ) from None
    return keypair, address


def make_grpc_client(*, url: str, key_string: str, network: str) -> Any:
    """A pysui ``GrpcProtocolClient`` for ``url`` (TLS, ``host:port``), nothing secret on disk.

    pysui insists on a configuration folder; the bootstrap file it writes holds
    no key, the group carrying the key is kept in memory (``persist=False``),
    and the folder is deleted before returning. Call it on the event loop that
    will use the client: grpclib binds its channel to the loop current at
    construction.
    """
    with tempfile.TemporaryDirectory(prefix="walkeep-pysui-") as tmp:
        cfg = PysuiConfiguration.initialize_config(
            in_folder=Path(tmp), init_groups=[{"name": "bootstrap"}]
        )
        cfg.new_group(
            group_name="walkeep",
            group_protocol=GroupProtocol.GRPC,
            make_group_active=True,
            key_block=[{"key_string": key_string, "alias": "walkeep-server"}],
            profile_block=[
                {
                    "profile_name": network,
                    "url": url,
                    "network_type": NetworkType.PRODUCTION
                    if network == "mainnet"
                    else NetworkType.TEST,
                    "make_active": True,
                }
            ],
            active_address_index=0,
            persist=False,
        )
        return client_factory(cfg)
