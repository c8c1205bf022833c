"""Pure Sui/Walrus encodings: addresses, blob ids, dynamic-field ids, digests, Move JSON.

Nothing here touches the network, so every formula can be checked against the
vectors in notes/walrus-sui.md (§1.6 blob ids, §2.4 dynamic-field ids, §3.2
addresses and digests) without a node.
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Sequence
from typing import Any, TypeVar

from walkeep.protocol.b58 import b58encode

T = TypeVar("T")

_HEX = frozenset("0123456789abcdef")
_ADDR_IN_TYPE = re.compile(r"0x[0-9a-fA-F]{1,64}")
U32_MAX = (1 << 32) - 1
U64_MAX = (1 << 64) - 1
U256_MAX = (1 << 256) - 1


class MoveShapeError(ValueError):
    """A node returned Move JSON that does not look like the struct we expect.

    The exact JSON rendering of the gRPC ``Object.json`` field has not been
    checked against a live node (notes §3.4), so the coercions below accept the
    plausible spellings and raise this when none fits.
    """


# --- addresses and types -------------------------------------------------------------------


def normalize_address(value: str) -> str:
    """``0x`` + 64 lowercase hex: the one spelling used for every comparison.

    Sui prints short forms (``0x2``) and full forms interchangeably; comparing
    un-normalized strings is a classic source of "object not owned by us" bugs.
    """
    s = value.strip().lower()
    if s.startswith("0x"):
        s = s[2:]
    if not s or len(s) > 64 or not set(s) <= _HEX:
        raise ValueError(f"not a Sui address/object id: {value!r}")
    return "0x" + s.rjust(64, "0")


def normalize_type(type_str: str) -> str:
    """Normalize every address inside a Move type string (``0x2::coin::Coin<0x…::wal::WAL>``)."""
    return _ADDR_IN_TYPE.sub(lambda m: normalize_address(m.group(0)), type_str.strip())


def address_from_public_key(scheme_and_key: bytes) -> str:
    """Sui address = blake2b-256(flag ‖ public key) (notes §3.2); flag 0 is Ed25519."""
    return "0x" + hashlib.blake2b(scheme_and_key, digest_size=32).hexdigest()


# --- blob ids (notes §1.6) -------------------------------------------------------------------


def blob_id_from_u256(n: int) -> str:
    """On-chain ``u256`` blob id → the 43-char URL-safe base64 string aggregators use.

    The u256 is the little-endian reading of the 32 blob-id bytes, which is why
    explorers show a decimal number unrelated-looking to the base64 form.
    """
    if not 0 <= n <= U256_MAX:
        raise ValueError("blob id must be a u256")
    return base64.urlsafe_b64encode(n.to_bytes(32, "little")).decode().rstrip("=")


def u256_from_blob_id(blob_id: str) -> int:
    """Inverse of :func:`blob_id_from_u256`."""
    raw = base64.urlsafe_b64decode(blob_id + "=" * (-len(blob_id) % 4))
    if len(raw) != 32:
        raise ValueError(f"a blob id is 32 bytes, got {len(raw)}")
    return int.from_bytes(raw, "little")


# --- dynamic fields (notes §2.4) --------------------------------------------------------------


def df_id_u64(parent: str, key: int) -> str:
    """Object id of ``dynamic_field(parent, name: u64 = key)``.

    ``blake2b256(0xf0 ‖ parent ‖ u64le(len(bcs(name))) ‖ bcs(name) ‖ bcs(TypeTag::U64))``.
    The Walrus System keeps its whole state in such a field keyed by
    ``System.version``; deriving the id locally saves a GetDynamicFields scan.
    """
    if not 0 <= key <= U64_MAX:
        raise ValueError("dynamic field key must be a u64")
    name = key.to_bytes(8, "little")
    preimage = (
        b"\xf0"
        + bytes.fromhex(normalize_address(parent)[2:])
        + len(name).to_bytes(8, "little")
        + name
        + b"\x02"  # TypeTag::U64
    )
    return "0x" + hashlib.blake2b(preimage, digest_size=32).hexdigest()


# --- transaction digests ----------------------------------------------------------------------


def tx_digest(tx_bytes: bytes) -> str:
    """Sui transaction digest: base58(blake2b-256(``TransactionData::`` ‖ BCS bytes)).

    Computed before submission so the renewal intent can be recorded with the
    digest the chain will report (DESIGN §3, renewals).
    """
    return b58encode(hashlib.blake2b(b"TransactionData::" + tx_bytes, digest_size=32).digest())


def pure_u32(value: int) -> bytes:
    """A ``u32`` Pure argument: exactly 4 little-endian bytes.

    pysui's ``PureInput.pure(int)`` emits *minimal-width* bytes (``5`` → one
    byte, notes §3.3), which Move rejects for a ``u32`` parameter. Encode fixed
    width here and never hand a bare int to the low-level builder.
    """
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= U32_MAX:
        raise ValueError(f"not a u32: {value!r}")
    return value.to_bytes(4, "little")


# --- batching -----------------------------------------------------------------------------------


def split_batches(items: Sequence[T], max_batch: int) -> list[list[T]]:
    """Cut ``items`` into consecutive batches of at most ``max_batch`` (order kept)."""
    if max_batch < 1:
        raise ValueError("max_batch must be >= 1")
    return [list(items[i : i + max_batch]) for i in range(0, len(items), max_batch)]


# --- Move JSON coercion -------------------------------------------------------------------------


def move_int(value: Any, field: str) -> int:
    """An integer from Move JSON: u64/u128/u256 usually arrive as strings, u8–u32 as numbers."""
    if isinstance(value, bool):
        raise MoveShapeError(f"{field}: expected an integer, got a bool")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    raise MoveShapeError(f"{field}: expected an integer, got {value!r}")


def move_id(value: Any, field: str) -> str:
    """An ``ID``/``UID``/``address``: a hex string, possibly wrapped as ``{"id": …}``/``{"bytes": …}``."""
    if isinstance(value, str):
        try:
            return normalize_address(value)
        except ValueError as exc:
            raise MoveShapeError(f"{field}: {exc}") from None
    if isinstance(value, dict):
        for key in ("id", "bytes"):
            if key in value:
                return move_id(value[key], field)
    raise MoveShapeError(f"{field}: expected an object id, got {value!r}")


def move_option(value: Any) -> Any | None:
    """``Option<T>``: ``null``/value, or the older ``{"vec": []}`` / ``[x]`` encodings."""
    if value is None:
        return None
    if isinstance(value, dict) and set(value) == {"vec"}:
        value = value["vec"]
    if isinstance(value, list):
        if not value:
            return None
        if len(value) == 1:
            return value[0]
        raise MoveShapeError(f"Option with {len(value)} elements")
    return value


def move_bool(value: Any, field: str) -> bool:
    if isinstance(value, bool):
        return value
    if value in ("true", "false"):
        return value == "true"
    raise MoveShapeError(f"{field}: expected a bool, got {value!r}")


def move_field(obj: Any, *path: str) -> Any:
    """``obj[path[0]][path[1]]…`` with a MoveShapeError naming the missing step."""
    cur = obj
    walked: list[str] = []
    for key in path:
        walked.append(key)
        if not isinstance(cur, dict) or key not in cur:
            raise MoveShapeError(f"missing field {'.'.join(walked)}")
        cur = cur[key]
    return cur
