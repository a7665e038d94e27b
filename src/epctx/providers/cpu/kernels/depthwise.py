"""Depthwise convolutions channels-last: one einsum over a strided window view of the input, padded into an
(N, *padded, C) buffer, the inner loop running over contiguous memory with no per-offset temporaries.

Two refinements, both measured here on one thread:

* **Column blocks** (2-D, one output channel per group): for a kernel offset, the inputs of ``B`` consecutive
  output columns are one contiguous run of ``B * C`` values of a buffer row. With the filter tiled ``B`` times
  along that run (``(KH, KW, B * C)``, at most ``_TILE_FLOATS``, so it stays in cache), the einsum's inner loop
  is ``B * C`` long instead of ``C``: 32 channels at 6x96, 3x3: 90 -> 22 us; 16 at 56x56, 3x3: 409 -> 53 us;
  88 at 28x28, 3x3: 160 -> 73 us; 576 at 7x7, 5x5 (one column a block): 78 us either way. A column stride s
  splits the buffer's columns into s phases (``_ColumnBlocks``) so that the runs stay contiguous, the kernel
  zero-padded to a multiple of s columns: 16 channels at 112x112, 3x3, stride 2: 417 -> 245 us a call.
* **Row bands**: when padding rows are a large part of the windows (few rows: PP-OCR's direction classifier
  runs 5x5 depthwise convs on 2 or 3 rows of 96 columns), output rows are computed in bands that share the
  kernel rows landing inside the input, one einsum each, skipping the products with padding (200 channels at
  2x96, 5x5: 126 -> 64 us).
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from epctx.providers.cpu import parallel
from epctx.providers.cpu.kernels.windows import ALL as _ALL
from epctx.providers.cpu.kernels.windows import Geometry, ScratchPool

__all__ = [
    "DepthwiseChannelsLast",
    "channels_last_fits",
    "column_block",
    "copy_in_tiles",
    "row_bands",
]

# Depthwise convolutions with at least this many channels run channels-last without column blocks; with
# fewer, the windows' rows are too short for that to pay off.
_CHANNELS_LAST_MIN = 32
# The tiled filter of a column block holds at most this many values (128 KB of float32: stays in L2).
_TILE_FLOATS = 1 << 15
# The banded form pays off when at most this share of the kernel rows read lies inside the input.
_BANDED_MAX_INSIDE = 0.75


def column_block(x_shape: tuple[int, ...], w_shape: tuple[int, ...], geo: Geometry) -> int:
    """Output columns per block (a divisor of the output width), or 0 where blocks do not apply: not 2-D, more
    than one output channel per group, or both a column stride and a column dilation."""
    if len(geo.out) != 2 or w_shape[0] != x_shape[1] or w_shape[1] != 1:
        return 0
    if geo.strides[1] > 1 and geo.dilations[1] > 1:
        return 0
    taps, phases = _column_taps(geo)
    width, per_column = geo.out[1], geo.kernel[0] * taps * phases * x_shape[1]
    fits = [b for b in range(1, width + 1) if width % b == 0 and b * per_column <= _TILE_FLOATS]
    block = max(fits, default=1)
    # With a column stride, blocks of one column only add the zero taps (288 channels at 14x14, 5x5, stride 2:
    # 102 us without, 145 with): the plain view then.
    return 0 if phases > 1 and block == 1 else block


def _column_taps(geo: Geometry) -> tuple[int, int]:
    """(taps, phases): a column stride s splits the padded columns into s phases (column mod s), each kernel
    column ``u * s + v`` reading phase v at position ``j + u`` for output column j (the kernel zero-padded to
    a multiple of s); without a stride, one phase and the kernel's columns."""
    stride, kernel = geo.strides[1], geo.kernel[1]
    if stride == 1:
        return kernel, 1
    return -(-kernel // stride), stride


def channels_last_fits(x_shape: tuple[int, ...], w_shape: tuple[int, ...], geo: Geometry) -> bool:
    return column_block(x_shape, w_shape, geo) > 0 or x_shape[1] >= _CHANNELS_LAST_MIN


class _ColumnBlocks:
    """The padded input as (N, rows, phases, positions, C) and the window view (N, out rows, blocks, KH, taps,
    phases, B * C) over it; the filter tiled to (KH, taps, phases, B * C)."""

    __slots__ = ("block", "buf_shape", "geo", "phases", "positions", "taps", "view_shape")

    def __init__(self, x_shape: tuple[int, ...], geo: Geometry, block: int) -> None:
        n, c = x_shape[0], x_shape[1]
        self.geo, self.block = geo, block
        self.taps, self.phases = _column_taps(geo)
        reach = (self.taps - 1) * (geo.dilations[1] if self.phases == 1 else 1)
        self.positions = geo.out[1] + reach
        self.buf_shape = (n, geo.padded[0], self.phases, self.positions, c)
        kh = geo.kernel[0]
        self.view_shape = (n, geo.out[0], geo.out[1] // block, kh, self.taps, self.phases, block * c)

    def fill(self, buf: np.ndarray, x: np.ndarray, *, pad_rows: bool = True, zero: bool = True) -> None:
        """``x`` (N, C, H, W) into ``buf``, zeros around it (not in the padding rows unless ``pad_rows``: row
        bands never read them; PP-OCR cls's 200 channels at 2x96, 5x5: 4 of 6 rows; not at all unless ``zero``:
        a buffer whose padding is zero already, ``_PADDED``)."""
        geo, stride = self.geo, self.phases
        top, left = geo.pad_begin
        height, width = x.shape[2], x.shape[3]
        if pad_rows and zero:
            buf[:, :top] = 0
            buf[:, top + height :] = 0
        rows = buf[:, top : top + height]
        xt = x.transpose(0, 2, 3, 1)
        for phase in range(stride):
            first = (phase - left) % stride  # the first input column landing in this phase
            start = (first + left) // stride
            count = max(0, min(len(range(first, width, stride)), self.positions - start))
            if zero:
                rows[:, :, phase, :start] = 0
                rows[:, :, phase, start + count :] = 0
            if count:
                copy_in_tiles(rows[:, :, phase, start : start + count], xt[:, :, first::stride][:, :, :count])

    def strides(self, buf: np.ndarray) -> tuple[int, ...]:
        geo, st = self.geo, buf.strides
        tap = st[3] * (geo.dilations[1] if self.phases == 1 else 1)
        return (
            st[0],
            st[1] * geo.strides[0],
            st[3] * self.block,
            st[1] * geo.dilations[0],
            tap,
            st[2],
            st[4],
        )

    def tiled(self, wl: np.ndarray) -> np.ndarray:
        """(KH, KW, C, 1) -> (KH, taps, phases, B * C), zeros for the kernel columns past KW."""
        kh, kw, c = wl.shape[:3]
        padded = np.zeros((kh, self.taps * self.phases, c), dtype=wl.dtype)
        padded[:, :kw] = wl[..., 0]
        grid = padded.reshape(kh, self.taps, self.phases, 1, c)
        tiled = np.broadcast_to(grid, (kh, self.taps, self.phases, self.block, c))
        return np.ascontiguousarray(tiled).reshape(kh, self.taps, self.phases, self.block * c)


class DepthwiseChannelsLast:
    """A depthwise conv as one einsum (or one per row band) over a window view of the padded channels-last
    input: in column blocks (``_ColumnBlocks``) where they apply, else (N, *out, *K, C)."""

    __slots__ = (
        "_keys",
        "_layouts",
        "bands",
        "blocks",
        "eq",
        "geo",
        "inner",
        "k_axis",
        "out_nchw",
        "padded_shape",
        "shares",
        "tiled_key",
        "to_nhwc",
        "view_shape",
    )

    def __init__(self, x_shape: tuple[int, ...], w_shape: tuple[int, ...], geo: Geometry) -> None:
        nd = len(geo.out)
        n, c = x_shape[0], x_shape[1]
        self.geo = geo
        self.out_nchw = (0, nd + 1, *range(1, nd + 1))
        self.to_nhwc = (0, *range(2, nd + 2), 1)
        block = column_block(x_shape, w_shape, geo)
        self.blocks = _ColumnBlocks(x_shape, geo, block) if block else None
        self.padded_shape: tuple[int, ...]
        self.view_shape: tuple[int, ...]
        if self.blocks is not None:
            self.padded_shape = self.blocks.buf_shape
            self.view_shape = self.blocks.view_shape
            self.eq = "nibpuvJ,puvJ->nibJ"
            self.k_axis = 3
        else:
            out, ker = "ijk"[:nd], "pqr"[:nd]
            self.padded_shape = (n, *geo.padded, c)
            self.view_shape = (n, *geo.out, *geo.kernel, c)
            self.eq = f"n{out}{ker}c,{ker}cm->n{out}cm"
            self.k_axis = 1 + nd
        self.bands = row_bands(x_shape[2], geo)
        # whether an einsum of a call may be shared with helper threads (``_einsums``): only then does the call
        # need BLAS's thread count lowered around it (the conv's one-thread gate)
        self.shares = math.prod(self.view_shape) >= _SHARED_MACS
        # laid out once, not at each call: where the input lands in the buffer, the key of the tiled filter in
        # the prepared weights, the buffers' keys per dtype, the einsums per buffer layout and filter shape
        self.inner = (_ALL, *(slice(b, b + s) for b, s in zip(geo.pad_begin, x_shape[2:])), _ALL)
        self.tiled_key = None if self.blocks is None else f"wl_tiled_{block}_{self.blocks.phases}"
        self._keys: dict[np.dtype[Any], tuple[Any, ...]] = {}
        self._layouts: dict[tuple[tuple[int, ...], tuple[int, ...]], _Layout] = {}

    @property
    def block(self) -> int:
        return 0 if self.blocks is None else self.blocks.block

    def run(self, x: np.ndarray, prep: dict[str, np.ndarray]) -> np.ndarray:
        """``prep["wl"]``: the filter as (*K, C, multiplier); the tiled filter is kept in ``prep`` too."""
        y = self.run_channels_last(x, prep)
        out = np.empty(tuple(y.shape[i] for i in self.out_nchw), dtype=y.dtype)
        copy_in_tiles(out.transpose(self.to_nhwc), y)
        return out

    def run_channels_last(self, x: np.ndarray, prep: dict[str, np.ndarray]) -> np.ndarray:
        """The result as a contiguous (N, *out, C * multiplier) array (``run`` copies it to NCHW)."""
        key = self._keys.get(x.dtype)
        if key is None:
            key = self._keys[x.dtype] = self._key(x)
        buf = _PADDED.take(self.padded_shape, x.dtype, key=key)  # its padding zero
        if self.blocks is not None:
            self.blocks.fill(buf, x, pad_rows=self.bands is None, zero=False)
        else:
            buf[self.inner] = x.transpose(self.to_nhwc)
        y = self._einsums(buf, self._filter(prep))
        _PADDED.give(buf, key=key)
        return y

    def _key(self, x: np.ndarray) -> tuple[Any, ...]:
        """The key of ``_PADDED``'s buffers for ``x``'s dtype: buffers whose padding lies where this conv's does."""
        geo = self.geo
        return (self.padded_shape, x.dtype.str, x.shape[2:], geo.pad_begin, geo.strides, self.bands is None)

    def _filter(self, prep: dict[str, np.ndarray]) -> np.ndarray:
        if self.tiled_key is None:
            return prep["wl"]
        tiled = prep.get(self.tiled_key)
        if tiled is None:
            assert self.blocks is not None
            tiled = prep[self.tiled_key] = self.blocks.tiled(prep["wl"])
        return tiled

    def _strides(self, buf: np.ndarray) -> tuple[int, ...]:
        if self.blocks is not None:
            return self.blocks.strides(buf)
        geo, st = self.geo, buf.strides
        nd = len(geo.out)
        return (
            st[0],
            *(st[1 + i] * geo.strides[i] for i in range(nd)),
            *(st[1 + i] * geo.dilations[i] for i in range(nd)),
            st[-1],
        )

    def _einsums(self, buf: np.ndarray, w: np.ndarray) -> np.ndarray:
        """The einsum over every output row (band by band, each over its kernel rows inside the input only, when
        there are ``bands``), as laid out once per buffer layout and filter shape (``_Layout``); rows of a large
        band shared with helper threads (``parallel.split_ranges``: as many runners as BLAS has threads, so one
        under ``intra_op_num_threads=1``). The result (N, *out, C * multiplier), contiguous."""
        found = self._layouts.get((buf.strides, w.shape))
        if found is None:
            found = self._layouts[(buf.strides, w.shape)] = _Layout(self, buf, w)
        if found.whole is not None:
            return np.ascontiguousarray(
                _c_einsum(self.eq, _window(buf, 0, *found.whole), w).reshape(found.result)
            )
        y = np.empty(found.out_shape, dtype=np.result_type(buf.dtype, w.dtype))
        for r0, r1 in found.zero:  # every kernel row of these output rows is padding
            y[:, r0:r1] = 0
        for first, shape, strides, k0, k1, r0, r1 in found.bands:
            _c_einsum(self.eq, _window(buf, first, shape, strides), w[k0:k1], out=y[:, r0:r1])
        for r0, r1, k0, k1 in found.shared:
            parallel.split_ranges(r1 - r0, found.rows(buf, w, y, r0, k0, k1), per_runner=1)
        return y.reshape(found.result)


class _Layout:
    """What ``_einsums`` computes for one buffer layout (its strides) and filter shape, laid out once: the window
    (shape, strides) of one whole einsum, or per band its window (byte offset, shape, strides), filter rows and
    output rows; the bands of padding only (zeros); the bands large enough to share with helper threads."""

    __slots__ = ("bands", "conv", "out_shape", "result", "shared", "strides", "whole", "zero")

    def __init__(self, conv: DepthwiseChannelsLast, buf: np.ndarray, w: np.ndarray) -> None:
        geo, view, k_axis = conv.geo, conv.view_shape, conv.k_axis
        self.conv = conv
        self.strides = conv._strides(buf)
        kernel_axes = len(view) - k_axis - 1  # w's: (*K, C, M), or (KH, taps, phases, B * C)
        self.out_shape = view[:k_axis] + w.shape[kernel_axes:]
        self.result = (view[0], *geo.out, -1)  # (N, *out, C * multiplier)
        self.whole = (
            None if conv.bands is not None or math.prod(view) >= _SHARED_MACS else (view, self.strides)
        )
        self.zero: list[tuple[int, int]] = []
        self.bands: list[tuple[int, tuple[int, ...], tuple[int, ...], int, int, int, int]] = []
        self.shared: list[tuple[int, int, int, int]] = []
        # multiply-adds per output row and kernel row (the batch included)
        per_row = view[0] * math.prod(view[2:]) // geo.kernel[0]
        for r0, r1, k0, k1 in conv.bands or [(0, geo.out[0], 0, geo.kernel[0])]:
            if k1 <= k0:
                self.zero.append((r0, r1))
            elif per_row * (k1 - k0) * (r1 - r0) >= _SHARED_MACS:
                self.shared.append((r0, r1, k0, k1))
            else:
                window = (self.first(buf, r0, k0), self.shape(r1 - r0, k1 - k0), self.strides)
                self.bands.append((*window, k0, k1, r0, r1))

    def first(self, buf: np.ndarray, r: int, k: int) -> int:
        """The byte offset in ``buf`` of output row ``r``'s window from kernel row ``k`` on."""
        geo = self.conv.geo
        return (r * geo.strides[0] + k * geo.dilations[0]) * buf.strides[1]

    def shape(self, rows: int, kernel_rows: int) -> tuple[int, ...]:
        shape = list(self.conv.view_shape)
        shape[1], shape[self.conv.k_axis] = rows, kernel_rows
        return tuple(shape)

    def rows(
        self, buf: np.ndarray, w: np.ndarray, y: np.ndarray, r0: int, k0: int, k1: int
    ) -> Callable[[int, int], None]:
        """The einsum of output rows ``[r0 + lo, r0 + hi)`` of a shared band, for ``parallel.split_ranges``."""

        def rows(lo: int, hi: int) -> None:
            view = _window(buf, self.first(buf, r0 + lo, k0), self.shape(hi - lo, k1 - k0), self.strides)
            _c_einsum(self.conv.eq, view, w[k0:k1], out=y[:, r0 + lo : r0 + hi])

        return rows


# Padded channels-last buffers kept from call to call with their padding zero: a depthwise conv writes only where
# its input lands, so a buffer given back under a key (buffer shape, dtype, input size, padding, strides, rows
# padded) has zeros wherever another call under that key needs them, and the next call skips zeroing (3-5 us a
# call on MobileNetV3's maps; the strips are many small strided writes); fresh buffers are all zeros.
_PADDED = ScratchPool(64 << 20, fresh=np.zeros)


# A depthwise conv of at least this many multiply-adds shares its output rows with a helper thread, in one band
# per runner: a shared job costs ~40 us more than its work here (the helper's wake-up, its block's cold cache), so
# smaller convs lose (64 channels at 56x56, 3x3, 1.8M: 258 us whole, 241 in two bands, 289 in four; 32 at
# 112x112, 3.6M: 545 -> 453 in two bands, 493 in four; two threads, median, measured here).
_SHARED_MACS = 1 << 21


def _find_c_einsum() -> Callable[..., Any]:
    """numpy's einsum itself: ``np.einsum`` without ``optimize`` only passes its arguments on to it, through a
    Python function and the array-function dispatch (0.7 us a call, measured here)."""
    for module in ("numpy._core.multiarray", "numpy.core.multiarray"):  # numpy 2, numpy 1
        try:
            found: Callable[..., Any] = importlib.import_module(module).c_einsum
            return found
        except (ImportError, AttributeError):
            continue
    return np.einsum


_c_einsum = _find_c_einsum()


# A layout change (NCHW <-> NHWC) copies tiles of about this many values, which stay in cache between the
# strided reads and writes: 64 channels at 56x56: 171 -> 67 us, 256 at 14x14: 45 -> 18 us, measured here.
_TILE_VALUES = 1 << 13


def copy_in_tiles(dst: np.ndarray, src: np.ndarray) -> None:
    """``dst[...] = src`` for (N, H, W, C)-shaped arrays of which one is a transposed view, a few rows at a time
    where the writes are strided (a channels-last result copied back to NCHW). Where ``dst`` runs along C in
    memory (an input into the padded channels-last buffer, transposed or not, split into column phases or
    not) numpy's one copy takes the reads' strides as well and the tiles only add calls: one copy (NCHW into
    the buffer, 16 channels at 112x112: 130 -> 79 us, 64 at 56x56: 64 -> 49, 240 at 14x14: 16.5 -> 12.3; the
    copy back to NCHW: tiles 74 against 201 us at 64 channels 56x56, 35 against 64 at 256x14x14; measured here,
    numpy 2.4, one thread)."""
    per_row = math.prod(src.shape[2:])
    rows = max(1, _TILE_VALUES // max(1, per_row))
    along_c = dst.strides[-1] == dst.itemsize
    if along_c or rows >= src.shape[1] or src.size <= 4 * _TILE_VALUES:  # one copy costs less
        dst[...] = src
        return
    for r in range(0, src.shape[1], rows):
        dst[:, r : r + rows] = src[:, r : r + rows]


def _window(buf: np.ndarray, offset: int, shape: tuple[int, ...], strides: tuple[int, ...]) -> np.ndarray:
    """A read-only strided view of the contiguous ``buf`` from byte ``offset`` (numpy checks it stays inside
    ``buf``; cheaper than ``as_strided``, which costs ~20 us a call)."""
    view = np.ndarray(shape, dtype=buf.dtype, buffer=buf, offset=offset, strides=strides)
    view.flags.writeable = False
    return view


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
