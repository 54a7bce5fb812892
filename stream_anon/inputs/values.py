"""Values of a source record that are not plain data: a value the decoder could not read, and a value the
source itself marks invalid. The mapping turns either into a dead letter naming the field when that field is
mapped (an undecodable value even when the field is ``optional``: optional means absent is fine, not unreadable).
"""
from __future__ import annotations

import math
import struct
from dataclasses import dataclass


@dataclass(frozen=True)
class Undecodable:
    """A value present in the message that cannot be read; ``why`` never holds the raw value."""
    why: str


@dataclass(frozen=True)
class Invalid:
    """A value the source marks invalid (Tesla's ``Value.invalid``): no value, on the source's word."""


INVALID = Invalid()


def float32(x: float) -> float:
    """A float32 as the shortest decimal that reads back as the same float32 (what protojson writes), so the
    binary and JSON forms of one message give the same number: float32(40.712799072265625) == 40.7128.
    Non-finite values stay as they are.

    >>> float32(40.712799072265625), float32(0.1), float32(3.0)
    (40.7128, 0.1, 3.0)
    """
    if not math.isfinite(x):
        return x
    x = struct.unpack("<f", struct.pack("<f", x))[0]
    for digits in range(1, 10):
        s = float(f"{x:.{digits}g}")
        if struct.unpack("<f", struct.pack("<f", s))[0] == x:
            return s
    return x
