"""The BCS primitives the Sui renewal codec, the local network and the quilt index share."""

from __future__ import annotations

import pytest

from walkeep.protocol.bcs import BcsError, BcsReader, BcsWriter

ULEBS = {0: "00", 127: "7f", 128: "8001", 300: "ac02", 2**32 - 1: "ffffffff0f"}


@pytest.mark.parametrize("n", sorted(ULEBS))
def test_uleb128_is_bcs_s(n: int) -> None:
    w = BcsWriter()
    w.uleb(n)
    assert w.buf.hex() == ULEBS[n]
    r = BcsReader(bytes(w.buf))
    assert r.uleb() == n
    r.done()


def test_values_round_trip_in_order() -> None:
    w = BcsWriter()
    w.u8(7)
    w.u16(0x1234)
    w.u32(0xDEADBEEF)
    w.u64(2**64 - 1)
    w.address("0x" + "ab" * 32)
    w.string("extend_blob")
    w.string("café ☕")
    w.raw(b"\x01\x02")
    r = BcsReader(bytes(w.buf))
    assert (r.u8(), r.u16(), r.u32(), r.u64()) == (7, 0x1234, 0xDEADBEEF, 2**64 - 1)
    assert r.address() == "0x" + "ab" * 32
    assert r.string() == "extend_blob"
    assert r.string() == "café ☕"
    assert r.take(2) == b"\x01\x02"
    r.done()


def test_bad_bytes_are_refused_not_misread() -> None:
    with pytest.raises(BcsError, match="truncated"):
        BcsReader(b"\x01\x02").u32()
    with pytest.raises(BcsError, match="64 bits"):
        BcsReader(bytes.fromhex("ff" * 10 + "01")).uleb()
    with pytest.raises(BcsError, match="UTF-8"):
        BcsReader(b"\x01\xff").string()
    r = BcsReader(b"\x00\x00")
    r.u8()
    with pytest.raises(BcsError, match="left over"):
        r.done()
    assert issubclass(BcsError, ValueError)  # what the codecs' callers catch
