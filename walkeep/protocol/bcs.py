"""BCS primitives — Sui's canonical byte encoding — written and read by hand.

Two places need them where pysui's canoser types are too slow (a renewal's
transaction carries hundreds of calls): the Sui adapter's direct renewal reader and
writer (``sui/ptb.py``) and the local network's own transaction bytes
(``localnet/codec.py``), and the quilt index Walkeep writes into a quilt's first
columns (``quilt.py``). Strings are UTF-8 with a ULEB128 length.
"""

from __future__ import annotations


class BcsError(ValueError):
    """Bytes that do not parse: truncated, an over-long ULEB128, or bytes left over."""


class BcsWriter:
    __slots__ = ("buf",)

    def __init__(self) -> None:
        self.buf = bytearray()

    def uleb(self, n: int) -> None:
        if n < 0x80:  # one byte: the common case
            self.buf.append(n)
            return
        while True:
            byte = n & 0x7F
            n >>= 7
            self.buf.append(byte | (0x80 if n else 0))
            if not n:
                return

    def u8(self, n: int) -> None:
        self.buf.append(n)

    def u16(self, n: int) -> None:
        self.buf += n.to_bytes(2, "little")

    def u32(self, n: int) -> None:
        self.buf += n.to_bytes(4, "little")

    def u64(self, n: int) -> None:
        self.buf += n.to_bytes(8, "little")

    def raw(self, b: bytes) -> None:
        self.buf += b

    def address(self, a: str) -> None:
        """A normalised ``0x`` + 64 hex digits address, as its 32 bytes."""
        self.buf += bytes.fromhex(a[2:])

    def string(self, text: str) -> None:
        raw = text.encode("utf-8")
        self.uleb(len(raw))
        self.buf += raw


class BcsReader:
    __slots__ = ("data", "pos")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, n: int) -> bytes:
        end = self.pos + n
        if end > len(self.data):
            raise BcsError("truncated BCS bytes")
        out = self.data[self.pos : end]
        self.pos = end
        return out

    def uleb(self) -> int:
        pos = self.pos
        if pos < len(self.data) and self.data[pos] < 0x80:  # one byte: the common case
            self.pos = pos + 1
            return self.data[pos]
        value = shift = 0
        while True:
            byte = self.take(1)[0]
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7
            if shift > 63:
                raise BcsError("ULEB128 longer than 64 bits")

    def u8(self) -> int:
        return self.take(1)[0]

    def u16(self) -> int:
        return int.from_bytes(self.take(2), "little")

    def u32(self) -> int:
        return int.from_bytes(self.take(4), "little")

    def u64(self) -> int:
        return int.from_bytes(self.take(8), "little")

    def address(self) -> str:
        return "0x" + self.take(32).hex()

    def string(self) -> str:
        try:
            return self.take(self.uleb()).decode("utf-8")
        except UnicodeDecodeError:
            raise BcsError("a string that is not UTF-8") from None

    def done(self) -> None:
        if self.pos != len(self.data):
            raise BcsError("bytes left over after the value")
