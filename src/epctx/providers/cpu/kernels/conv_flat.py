"""Convolutions computed without an im2col copy: on the padded input flattened per channel (stride-1 2-D
dense convs with M <= C and depthwise convs) or channels-last through one einsum (depthwise, many channels)."""

from __future__ import annotations

import math

import numpy as np

from epctx.providers.cpu import parallel
from epctx.providers.cpu.kernels.windows import ALL as _ALL
from epctx.providers.cpu.kernels.windows import SCRATCH, Geometry

__all__ = [
    "DepthwiseChannelsLast",
    "DepthwiseFlat",
    "FlatGemm",
    "channels_last_fits",
    "flat_fits",
    "flat_gemm_fits",
]

# Stride-1 2-D depthwise convs with at least this many output pixels (or few channels) run on flattened rows.
_FLAT_MIN_PIXELS = 1024


def flat_fits(x_shape: tuple[int, ...], w_shape: tuple[int, ...], geo: Geometry) -> bool:
    if len(geo.out) != 2 or geo.strides != (1, 1) or w_shape[0] != x_shape[1]:
        return False
    return x_shape[1] < _CHANNELS_LAST_MIN or math.prod(geo.out) >= _FLAT_MIN_PIXELS


class FlatLayout:
    """The padded input of a stride-1 2-D conv flattened per channel: output row i, column j reads
    ``flat[(i + ki * dh) * Wp + j + kj * dw]``, so each kernel offset is one shifted run of ``oh * Wp`` values;
    the ``Wp - ow`` extra columns of each output row are cropped at the end."""

    __slots__ = ("geo", "length", "shifts", "size")

    def __init__(self, geo: Geometry) -> None:
        (hp, wp), (dh, dw) = geo.padded, geo.dilations
        self.geo = geo
        self.length = geo.out[0] * wp
        self.size = hp * wp + (geo.kernel[1] - 1) * dw  # the last shifted run ends past the padded plane
        self.shifts = [ki * dh * wp + kj * dw for ki in range(geo.kernel[0]) for kj in range(geo.kernel[1])]

    def padded(self, x: np.ndarray) -> np.ndarray:
        """(N, C, size) from SCRATCH: give it back when done."""
        geo = self.geo
        n, c = x.shape[0], x.shape[1]
        hp, wp = geo.padded
        bh, bw = geo.pad_begin
        buf = SCRATCH.take((n, c, self.size), x.dtype)
        buf.fill(0)
        plane = buf[:, :, : hp * wp].reshape(n, c, hp, wp)
        plane[:, :, bh : bh + x.shape[2], bw : bw + x.shape[3]] = x
        return buf

    def crop(self, y: np.ndarray) -> np.ndarray:
        geo = self.geo
        return np.ascontiguousarray(y.reshape(*y.shape[:2], geo.out[0], geo.padded[1])[..., : geo.out[1]])


def flat_gemm_fits(x_shape: tuple[int, ...], w_shape: tuple[int, ...], geo: Geometry, group: int) -> bool:
    """Dense stride-1 2-D convs with no more output than input channels: one GEMM per kernel offset on shifted
    runs (added up: M values per output pixel and offset) costs less than copying the im2col matrix (C)."""
    if group != 1 or len(geo.out) != 2 or geo.strides != (1, 1) or math.prod(geo.kernel) == 1:
        return False
    return w_shape[0] <= x_shape[1]


class FlatGemm:
    """A dense stride-1 2-D conv without an im2col copy: for each kernel offset k, ``W_k (M, C)`` times the
    shifted runs ``(C, oh * Wp)`` of the flattened padded input (a strided operand BLAS reads in place), summed.
    Column blocks are shared with helper threads (``parallel.split_columns``). Measured on PP-OCRv4 det's
    96 -> 24 channel 3x3 conv at 80x80, one thread: 9.9 ms with the im2col copy."""

    __slots__ = ("layout",)

    def __init__(self, geo: Geometry) -> None:
        self.layout = FlatLayout(geo)

    def run(self, x: np.ndarray, wk: np.ndarray) -> np.ndarray:
        layout = self.layout
        n, m, length = x.shape[0], wk.shape[1], layout.length
        buf = layout.padded(x)
        dt = np.result_type(x.dtype, wk.dtype)
        y = np.empty((n, m, length), dtype=dt)
        tmp = SCRATCH.take((m, length), dt)
        for i in range(n):
            xi, yi = buf[i], y[i]

            def block(lo: int, hi: int, xi: np.ndarray = xi, yi: np.ndarray = yi) -> None:
                for k, shift in enumerate(layout.shifts):
                    src = xi[:, shift + lo : shift + hi]
                    if k == 0:
                        np.matmul(wk[0], src, out=yi[:, lo:hi])
                    else:
                        part = tmp[:, lo:hi]
                        np.matmul(wk[k], src, out=part)
                        yi[:, lo:hi] += part

            parallel.split_columns(length, block)
        SCRATCH.give(buf, tmp)
        return layout.crop(y)


class DepthwiseFlat:
    """A stride-1 2-D depthwise conv on the flattened padded input (``FlatLayout``): one shifted
    multiply-add per kernel offset, with rows ``oh * Wp`` long. Measured here on 64 channels at 56x56, 3x3:
    560 us, against 910 for the channels-last einsum."""

    __slots__ = ("layout",)

    def __init__(self, geo: Geometry) -> None:
        self.layout = FlatLayout(geo)

    def run(self, x: np.ndarray, wd: np.ndarray) -> np.ndarray:
        layout = self.layout
        n, c, length = x.shape[0], x.shape[1], layout.length
        buf = layout.padded(x)
        dt = np.result_type(x.dtype, wd.dtype)
        y = np.empty((n, c, length), dtype=dt)
        tmp = SCRATCH.take((n, c, length), dt)
        # Channels in blocks whose input, output and temporary rows stay in cache across the kernel offsets
        # (32 channels at 112x112: 1.8 ms in one block, 0.73 ms in blocks of 512 KB, measured here).
        block = max(1, _CACHE_BYTES // (3 * length * y.itemsize))
        for i in range(n):
            for c0 in range(0, c, block):
                rows = slice(c0, c0 + block)
                src, out, part = buf[i, rows], y[i, rows], tmp[i, rows]
                for k, shift in enumerate(layout.shifts):
                    if k == 0:
                        np.multiply(src[:, shift : shift + length], wd[k][rows], out=out)
                    else:
                        np.multiply(src[:, shift : shift + length], wd[k][rows], out=part)
                        out += part
        SCRATCH.give(buf, tmp)
        return layout.crop(y)


_CACHE_BYTES = 1 << 19


# Depthwise convolutions with at least this many channels run channels-last (one einsum over a strided window
# view, the channels innermost); with fewer, the windows' rows are too short for that to pay off.
_CHANNELS_LAST_MIN = 32


class DepthwiseChannelsLast:
    """A depthwise conv as one einsum over an (N, *out, *K, C) window view of the input, padded channels-last:
    the inner loop runs over the channels (contiguous), with no per-offset temporaries. Measured here against
    the offset-by-offset form: 576 channels at 7x7, 5x5 kernel: 107 us vs 892 us.

    When the padding rows are a large part of the windows (few rows: PP-OCR's direction classifier runs 5x5
    depthwise convs on 2 or 3 rows of 96 columns), the output rows are computed in bands that share the kernel
    rows that land inside the input (``row_bands``), one einsum each, skipping the products with padding:
    200 channels at 2x96, 5x5: 126 -> 64 us for the einsums, measured here."""

    __slots__ = ("bands", "eq", "geo", "out_nchw", "padded_shape", "to_nhwc", "view_shape")

    def __init__(self, x_shape: tuple[int, ...], w_shape: tuple[int, ...], geo: Geometry) -> None:
        nd = len(geo.out)
        self.geo = geo
        self.padded_shape = (x_shape[0], *geo.padded, x_shape[1])
        self.view_shape = (x_shape[0], *geo.out, *geo.kernel, x_shape[1])
        out, ker = "ijk"[:nd], "pqr"[:nd]
        self.eq = f"n{out}{ker}c,{ker}cm->n{out}cm"
        self.out_nchw = (0, nd + 1, *range(1, nd + 1))
        self.to_nhwc = (0, *range(2, nd + 2), 1)
        self.bands = row_bands(x_shape[2], geo)

    def run(self, x: np.ndarray, wl: np.ndarray) -> np.ndarray:
        geo = self.geo
        n, c = x.shape[0], x.shape[1]
        nd = len(geo.out)
        buf = SCRATCH.take(self.padded_shape, x.dtype)
        _zero_border(buf, geo, x.shape[2:])
        inner = (_ALL,) + tuple(slice(b, b + s) for b, s in zip(geo.pad_begin, x.shape[2:])) + (_ALL,)
        buf[inner] = x.transpose(self.to_nhwc)
        st = buf.strides
        strides = (
            st[0],
            *(st[1 + i] * geo.strides[i] for i in range(nd)),
            *(st[1 + i] * geo.dilations[i] for i in range(nd)),
            st[-1],
        )
        if self.bands is None:
            view = _window(buf, 0, self.view_shape, strides)
            y = np.einsum(self.eq, view, wl)  # (N, *out, C, multiplier)
        else:
            y = self._banded(buf, wl, strides)
        SCRATCH.give(buf)
        y = y.reshape((n, *geo.out, c * wl.shape[-1]))
        return np.ascontiguousarray(y.transpose(self.out_nchw))

    def _banded(self, buf: np.ndarray, wl: np.ndarray, strides: tuple[int, ...]) -> np.ndarray:
        """The einsum band by band of output rows, each over its kernel rows inside the input only."""
        geo = self.geo
        nd = len(geo.out)
        y = np.empty((*self.view_shape[: 1 + nd], *wl.shape[nd:]), dtype=np.result_type(buf.dtype, wl.dtype))
        for r0, r1, k0, k1 in self.bands or ():
            if k1 <= k0:  # every kernel row of these output rows is padding
                y[:, r0:r1] = 0
                continue
            first = (r0 * geo.strides[0] + k0 * geo.dilations[0]) * buf.strides[1]  # the band's first row
            shape = (
                self.view_shape[0],
                r1 - r0,
                *self.view_shape[2 : 1 + nd],
                k1 - k0,
                *self.view_shape[2 + nd :],
            )
            view = _window(buf, first, shape, strides)
            np.einsum(self.eq, view, wl[k0:k1], out=y[:, r0:r1])
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


# The banded form pays off when at most this share of the kernel rows read lies inside the input.
_BANDED_MAX_INSIDE = 0.75


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


def channels_last_fits(x_shape: tuple[int, ...]) -> bool:
    return x_shape[1] >= _CHANNELS_LAST_MIN
