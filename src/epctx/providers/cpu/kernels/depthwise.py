"""Depthwise convolutions channels-last: one einsum over a strided window view of the input, padded into an
(N, *padded, C) buffer, the inner loop running over contiguous memory with no per-offset temporaries.

Two refinements, both measured here on one thread:

* **Column blocks** (2-D, column stride 1, one output channel per group): for a kernel offset, the inputs of
  ``B`` consecutive output columns are one contiguous run of ``B * C`` values of a buffer row. With the filter
  tiled ``B`` times along that run (``(KH, KW, B * C)``, at most ``_TILE_FLOATS``, so it stays in cache), the
  einsum's inner loop is ``B * C`` long instead of ``C``: 32 channels at 6x96, 3x3: 90 -> 22 us; 16 at 56x56,
  3x3: 409 -> 53 us; 88 at 28x28, 3x3: 160 -> 73 us; 576 at 7x7, 5x5 (one column a block): 78 us either way.
* **Row bands**: when padding rows are a large part of the windows (few rows: PP-OCR's direction classifier
  runs 5x5 depthwise convs on 2 or 3 rows of 96 columns), output rows are computed in bands that share the
  kernel rows landing inside the input, one einsum each, skipping the products with padding (200 channels at
  2x96, 5x5: 126 -> 64 us).
"""

from __future__ import annotations

import numpy as np

from epctx.providers.cpu.kernels.windows import ALL as _ALL
from epctx.providers.cpu.kernels.windows import SCRATCH, Geometry

__all__ = ["DepthwiseChannelsLast", "channels_last_fits", "column_block", "row_bands"]

# Depthwise convolutions with at least this many channels run channels-last without column blocks; with
# fewer, the windows' rows are too short for that to pay off.
_CHANNELS_LAST_MIN = 32
# The tiled filter of a column block holds at most this many values (128 KB of float32: stays in L2).
_TILE_FLOATS = 1 << 15
# The banded form pays off when at most this share of the kernel rows read lies inside the input.
_BANDED_MAX_INSIDE = 0.75


def column_block(x_shape: tuple[int, ...], w_shape: tuple[int, ...], geo: Geometry) -> int:
    """Output columns per block (a divisor of the output width), or 0 where blocks do not apply: not 2-D, a
    column stride, or more than one output channel per group."""
    if len(geo.out) != 2 or geo.strides[1] != 1 or w_shape[0] != x_shape[1] or w_shape[1] != 1:
        return 0
    width, per_column = geo.out[1], geo.kernel[0] * geo.kernel[1] * x_shape[1]
    fits = [b for b in range(1, width + 1) if width % b == 0 and b * per_column <= _TILE_FLOATS]
    return max(fits, default=1)


def channels_last_fits(x_shape: tuple[int, ...], w_shape: tuple[int, ...], geo: Geometry) -> bool:
    return column_block(x_shape, w_shape, geo) > 0 or x_shape[1] >= _CHANNELS_LAST_MIN


class DepthwiseChannelsLast:
    """A depthwise conv as one einsum (or one per row band) over a window view of the padded channels-last
    input: (N, out rows, column blocks, KH, KW, B * C) with column blocks, else (N, *out, *K, C)."""

    __slots__ = ("bands", "block", "eq", "geo", "k_axis", "out_nchw", "padded_shape", "to_nhwc", "view_shape")

    def __init__(self, x_shape: tuple[int, ...], w_shape: tuple[int, ...], geo: Geometry) -> None:
        nd = len(geo.out)
        n, c = x_shape[0], x_shape[1]
        self.geo = geo
        self.padded_shape = (n, *geo.padded, c)
        self.out_nchw = (0, nd + 1, *range(1, nd + 1))
        self.to_nhwc = (0, *range(2, nd + 2), 1)
        self.block = column_block(x_shape, w_shape, geo)
        if self.block:
            self.view_shape = (n, geo.out[0], geo.out[1] // self.block, *geo.kernel, self.block * c)
            self.eq = "nibpqJ,pqJ->nibJ"
            self.k_axis = 3
        else:
            out, ker = "ijk"[:nd], "pqr"[:nd]
            self.view_shape = (n, *geo.out, *geo.kernel, c)
            self.eq = f"n{out}{ker}c,{ker}cm->n{out}cm"
            self.k_axis = 1 + nd
        self.bands = row_bands(x_shape[2], geo)

    def run(self, x: np.ndarray, prep: dict[str, np.ndarray]) -> np.ndarray:
        """``prep["wl"]``: the filter as (*K, C, multiplier); the tiled filter is kept in ``prep`` too."""
        geo = self.geo
        buf = SCRATCH.take(self.padded_shape, x.dtype)
        _zero_border(buf, geo, x.shape[2:])
        inner = (_ALL,) + tuple(slice(b, b + s) for b, s in zip(geo.pad_begin, x.shape[2:])) + (_ALL,)
        buf[inner] = x.transpose(self.to_nhwc)
        w = self._filter(prep)
        strides = self._strides(buf)
        if self.bands is None:
            y = np.einsum(self.eq, _window(buf, 0, self.view_shape, strides), w)
        else:
            y = self._banded(buf, w, strides)
        SCRATCH.give(buf)
        y = y.reshape((x.shape[0], *geo.out, -1))  # (N, *out, C * multiplier)
        return np.ascontiguousarray(y.transpose(self.out_nchw))

    def _filter(self, prep: dict[str, np.ndarray]) -> np.ndarray:
        if not self.block:
            return prep["wl"]
        key = f"wl_tiled_{self.block}"
        tiled = prep.get(key)
        if tiled is None:
            wl = prep["wl"]  # (KH, KW, C, 1)
            kh, kw, c = wl.shape[:3]
            tiled = np.broadcast_to(wl[:, :, None, :, 0], (kh, kw, self.block, c))
            tiled = prep[key] = np.ascontiguousarray(tiled).reshape(kh, kw, self.block * c)
        return tiled

    def _strides(self, buf: np.ndarray) -> tuple[int, ...]:
        geo, st = self.geo, buf.strides
        nd = len(geo.out)
        if self.block:
            sh, dh, dw = geo.strides[0], geo.dilations[0], geo.dilations[1]
            return (st[0], st[1] * sh, st[2] * self.block, st[1] * dh, st[2] * dw, st[3])
        return (
            st[0],
            *(st[1 + i] * geo.strides[i] for i in range(nd)),
            *(st[1 + i] * geo.dilations[i] for i in range(nd)),
            st[-1],
        )

    def _banded(self, buf: np.ndarray, w: np.ndarray, strides: tuple[int, ...]) -> np.ndarray:
        """The einsum band by band of output rows, each over its kernel rows inside the input only."""
        geo, k_axis = self.geo, self.k_axis
        out_shape = self.view_shape[:k_axis] + w.shape[len(geo.kernel) :]
        y = np.empty(out_shape, dtype=np.result_type(buf.dtype, w.dtype))
        for r0, r1, k0, k1 in self.bands or ():
            if k1 <= k0:  # every kernel row of these output rows is padding
                y[:, r0:r1] = 0
                continue
            first = (r0 * geo.strides[0] + k0 * geo.dilations[0]) * buf.strides[1]  # the band's first row
            shape = list(self.view_shape)
            shape[1], shape[k_axis] = r1 - r0, k1 - k0
            np.einsum(self.eq, _window(buf, first, tuple(shape), strides), w[k0:k1], out=y[:, r0:r1])
        return y


def _window(buf: np.ndarray, offset: int, shape: tuple[int, ...], strides: tuple[int, ...]) -> np.ndarray:
    """A read-only strided view of the contiguous ``buf`` from byte ``offset`` (numpy checks it stays inside
    ``buf``; cheaper than ``as_strided``, which costs ~20 us a call)."""
    view = np.ndarray(shape, dtype=buf.dtype, buffer=buf, offset=offset, strides=strides)
    view.flags.writeable = False
    return view


def _zero_border(buf: np.ndarray, geo: Geometry, in_shape: tuple[int, ...]) -> None:
    """Zeroes the padding of a channels-last (N, *padded, C) buffer, strip by strip, not the whole buffer."""
    for axis, (begin, size) in enumerate(zip(geo.pad_begin, in_shape), start=1):
        index: list[slice] = [_ALL] * buf.ndim
        if begin:
            index[axis] = slice(0, begin)
            buf[tuple(index)] = 0
        if begin + size < buf.shape[axis]:
            index[axis] = slice(begin + size, None)
            buf[tuple(index)] = 0


def row_bands(height: int, geo: Geometry) -> list[tuple[int, int, int, int]] | None:
    """Output rows ``[r0, r1)`` grouped by the kernel rows ``[k0, k1)`` that read inside the input (rows of
    the padded buffer ``r * stride + k * dilation``), or None when padding is too small a part to skip."""
    stride, dil, pad, kernel = geo.strides[0], geo.dilations[0], geo.pad_begin[0], geo.kernel[0]
    bands: list[tuple[int, int, int, int]] = []
    inside = 0
    for r in range(geo.out[0]):
        valid = [k for k in range(kernel) if 0 <= r * stride + k * dil - pad < height]
        k0, k1 = (valid[0], valid[-1] + 1) if valid else (0, 0)
        inside += k1 - k0
        if bands and bands[-1][1] == r and bands[-1][2:] == (k0, k1):
            bands[-1] = (bands[-1][0], r + 1, k0, k1)
        else:
            bands.append((r, r + 1, k0, k1))
    if inside > _BANDED_MAX_INSIDE * kernel * geo.out[0]:
        return None
    return bands
