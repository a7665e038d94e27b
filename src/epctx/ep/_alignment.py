"""Byte-level helpers for EPs that lay payloads out at absolute offsets in a context binary."""

from __future__ import annotations

import numpy as np

__all__ = ["align", "same_bytes"]

_CHUNK = 8 << 20  # bytes compared at a time


def align(value: int, alignment: int) -> int:
    """``value`` rounded up to a multiple of ``alignment``."""
    return (value + alignment - 1) // alignment * alignment


def same_bytes(a: memoryview, b: memoryview) -> bool:
    """Whether two buffers hold the same bytes (compared in chunks, no copy)."""
    if a.nbytes != b.nbytes:
        return False
    x, y = np.frombuffer(a, np.uint8), np.frombuffer(b, np.uint8)
    return all(np.array_equal(x[i : i + _CHUNK], y[i : i + _CHUNK]) for i in range(0, x.size, _CHUNK))
