"""MaxPool without a padded copy of its input: the window maximum one axis at a time (max is separable), each
kernel tap a maximum over the outputs whose windows it lands inside the input, so padding is never read.

Where every window holds an input value along every axis (each pad below the kernel, the last window starting
inside the input) and there is no dilation, padding with -inf changes nothing, so the copy is pure cost: ResNet's
stem pool (3x3, stride 2, pads 1 on 64 x 112 x 112) spent 337 us of its 1090 on it. The last axis, where a stride
would make every maximum step through memory, is maxed with stride 1 over the flattened rows (contiguous runs) and
then cropped to every s-th column once; the other axes are reduced first, which shrinks what the last axis reads.
A block of channels at a time (``_BLOCK_VALUES``), so that each pass reads what the previous one wrote from cache:
this machine reads a multi-megabyte array at ~0.3 ns a value a pass. Used where it pays (``UnpaddedMax.pays``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from epctx.providers.cpu.kernels.windows import Geometry

__all__ = ["UnpaddedMax"]

_ALL = slice(None)
# Input values a block of channels holds at most: its passes stay in cache (512 KB of float32).
_BLOCK_VALUES = 1 << 17
# Inputs with fewer values take the padded form (``UnpaddedMax.pays``).
_LEAST_VALUES = 1 << 17

# (first output, end output, first input, step) of one kernel tap along one axis
Tap = tuple[int, int, int, int]


def _taps(n: int, k: int, s: int, p: int, out: int) -> list[Tap]:
    """The taps of a window of ``k`` (stride ``s``, ``p`` padding before, ``out`` outputs) over ``n`` inputs:
    output o reads input o * s - p + t, kept only where that lies in [0, n). The first tap covers every output
    (``UnpaddedMax.fits`` checks one does)."""
    taps = []
    for t in range(k):
        lo = max(0, -(-(p - t) // s))
        hi = min(out, (n - 1 + p - t) // s + 1)
        if hi > lo:
            taps.append((lo, hi, lo * s - p + t, s))
    taps.sort(key=lambda tap: tap[0] != 0 or tap[1] != out)
    return taps


class UnpaddedMax:
    """The max pool of one geometry and input shape (N, C, *spatial), laid out once."""

    __slots__ = ("axes", "last", "out")

    @staticmethod
    def pays(geo: Geometry, shape: tuple[int, ...]) -> bool:
        """Whether this form is the faster one for an input of ``shape``: a strided pool with padding over at
        least ``_LEAST_VALUES`` values, one that ``fits``. Without padding the padded form copies nothing; with
        stride 1 it maxes whole flattened rows with no edge columns to redo; on small inputs its few calls win
        (3x3, stride 2, pads 1, one thread: 64 x 112 x 112 1281 -> 681 us, 32 x 150 x 150 1134 -> 477, 64 x 56 x 56
        277 -> 195, 128 x 28 x 28 140 -> 102, 96 x 27 x 27 90 either way, 2 x 16 x 15 x 16 21 -> 40; 5x5 stride 1
        pads 2 on 128 x 20 x 20 137 -> 232; 2x2 stride 2 without pads 692 -> 959)."""
        if not geo.needs_pad or all(s == 1 for s in geo.strides) or math.prod(shape) < _LEAST_VALUES:
            return False
        return UnpaddedMax.fits(geo, shape[2:])

    @staticmethod
    def fits(geo: Geometry, spatial: tuple[int, ...]) -> bool:
        """No dilation, and every window holds an input value along every axis, one tap covering all outputs."""
        if any(d != 1 for d in geo.dilations) or not all(geo.out) or not all(spatial):
            return False
        for n, k, s, p, out in zip(spatial, geo.kernel, geo.strides, geo.pad_begin, geo.out):
            if p >= k or (out - 1) * s >= n:  # (the last axis's positions o * s lie in the row)
                return False
            taps = _taps(n, k, s, p, out)
            if not taps or taps[0][:2] != (0, out):
                return False
        return True

    def __init__(self, geo: Geometry, spatial: tuple[int, ...]) -> None:
        rank = len(spatial)
        self.out = geo.out
        args = list(zip(spatial, geo.kernel, geo.strides, geo.pad_begin, geo.out))
        self.axes = [(2 + i, _taps(*args[i])) for i in range(rank - 1)]
        n, k, s, p, out = args[-1]
        # the last axis with stride 1 over the positions o * s (then every s-th kept)
        self.last = (_taps(n, k, 1, p, (out - 1) * s + 1), s, out)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """The pool of ``x`` (N, C, *spatial), a block of whole channels at a time (``_BLOCK_VALUES``)."""
        n, c = x.shape[:2]
        y = np.empty((n, c, *self.out), dtype=x.dtype)
        per = max(1, _BLOCK_VALUES // max(1, math.prod(x.shape[2:])))
        for i in range(n):
            for c0 in range(0, c, per):
                self._block(x[i : i + 1, c0 : c0 + per], y[i : i + 1, c0 : c0 + per])
        return y

    def _block(self, x: np.ndarray, y: np.ndarray) -> None:
        a = x
        for axis, taps in self.axes:
            a = _reduce(a, axis, taps)
        taps, s, out = self.last
        a = _last_axis(np.ascontiguousarray(a), taps, (out - 1) * s + 1)
        np.copyto(y, a[..., : s * (out - 1) + 1 : s])


def _reduce(a: np.ndarray, axis: int, taps: list[Tap]) -> np.ndarray:
    """The maximum over ``taps`` along ``axis`` of ``a`` (a new array): rows of the later axes at a time."""
    index: list[Any] = [_ALL] * a.ndim

    def part(lo: int, hi: int, first: int, step: int) -> np.ndarray:
        index[axis] = slice(first, first + step * (hi - lo - 1) + 1, step)
        return a[tuple(index)]

    lo, hi, first, step = taps[0]
    y = np.array(part(lo, hi, first, step), copy=True)
    for lo, hi, first, step in taps[1:]:
        index[axis] = slice(lo, hi)
        target = y[tuple(index)]
        np.maximum(target, part(lo, hi, first, step), out=target)
    return y


def _last_axis(a: np.ndarray, taps: list[Tap], positions: int) -> np.ndarray:
    """The maximum over ``taps`` (stride 1) along the last axis of the contiguous ``a``, for its first
    ``positions`` columns (the rest of each row unspecified). Each tap is one maximum over the flattened rows (a
    contiguous run): right for the columns where every tap lands in the row; the columns at the row ends, where a
    tap would read the neighbouring row, are computed again from their valid taps alone."""
    size, flat = a.size, a.reshape(-1)
    y = np.empty_like(a)
    out = y.reshape(-1)
    shifts = [first - lo for lo, _hi, first, _step in taps]
    d = shifts[0]
    np.copyto(out[max(0, -d) : size - max(0, d)], flat[max(0, d) : size + min(0, d)])
    for d in shifts[1:]:
        b, e = max(0, -d), size - max(0, d)
        np.maximum(out[b:e], flat[b + d : e + d], out=out[b:e])
    inner = (max(lo for lo, *_ in taps), min(hi for _lo, hi, *_ in taps))
    for j in [*range(inner[0]), *range(max(inner), positions)]:
        valid = [a[..., j + d] for (lo, hi, *_), d in zip(taps, shifts) if lo <= j < hi]
        column = y[..., j]
        np.copyto(column, valid[0])
        for v in valid[1:]:
            np.maximum(column, v, out=column)
    return y
