"""walkeep.protocol.b58 spells digests exactly as the ``base58`` package does."""

from __future__ import annotations

import random

import base58
import pytest

from walkeep.protocol.b58 import b58decode, b58encode


def _samples() -> list[bytes]:
    rng = random.Random(14)
    out = [b"", b"\0", b"\0\0\0", b"\0\1", b"\xff" * 32, b"\0" * 31 + b"\1"]
    for _ in range(3000):
        body = rng.randbytes(rng.choice([1, 2, 3, 31, 32, 33, 64]))
        out.append(b"\0" * rng.choice([0, 0, 0, 1, 2]) + body)
    return out


def test_same_strings_as_the_base58_package() -> None:
    for data in _samples():
        expected = base58.b58encode(data).decode()
        assert b58encode(data) == expected, data
        assert b58decode(expected) == data


def test_decode_refuses_characters_outside_the_alphabet() -> None:
    for bad in ("0", "O", "I", "l", "abc+", "1 1"):
        with pytest.raises(ValueError):
            b58decode(bad)
