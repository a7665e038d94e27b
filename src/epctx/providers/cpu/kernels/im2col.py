"""The im2col columns of a strided 2-D conv of one image, built from a phase split of its input.

The plain im2col copy reads the padded input through a window view whose innermost axis steps by the stride,
one value at a time, and needs the padded copy of the input first (a zeroed buffer and a copy). With the input
split into stride x stride phases (``P[c, a, b, m, n] = padded[c, a + s * m, b + s * n]``, written straight
from the input, zeros only where padding lands), every column row of a kernel offset (p, q) is a plain 2-D
slice of one phase, ``P[c, p % s, q % s, p // s :, q // s :]``, copied a contiguous row at a time. A network's
first conv (3 -> 16 channels, 3x3, stride 2, 224x224, HardSwish, handing over to a depthwise conv): 552-582 us
a call with the window copy, 529-548 with the phase split (one thread, min of 300, alternating processes,
load 4.5).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from epctx.providers.cpu import parallel
from epctx.providers.cpu.kernels.windows import SCRATCH, Geometry, pad_input, release_padded, window_view

__all__ = [
    "Columns",
    "banded_columns",
    "biased_weights",
    "im2col_gemm",
    "phase_cols",
    "phase_cols_fit",
]

_ALL = slice(None)


def phase_cols_fit(x_shape: tuple[int, ...], geo: Geometry) -> bool:
    """A 2-D conv of one image with a stride above 1 on both axes and no dilation."""
    return (
        len(x_shape) == 4
        and x_shape[0] == 1
        and len(geo.out) == 2
        and all(s > 1 for s in geo.strides)
        and all(d == 1 for d in geo.dilations)
    )


def _range(begin: int, size: int, phase: int, stride: int, extent: int) -> tuple[int, int]:
    """The positions [m0, m1) of phase ``phase`` (of ``extent``) that hold input values: padded index
    ``phase + stride * m`` is input index ``phase + stride * m - begin``, inside [0, size)."""
    m0 = max(0, -(-(begin - phase) // stride))
    m1 = min(extent, (size - 1 + begin - phase) // stride + 1)
    return m0, max(m0, m1)


def _phases(x: np.ndarray, geo: Geometry) -> np.ndarray:
    """The phase split ``P`` (C, SH, SW, HQ, WQ) of ``x`` (1, C, H, W), from SCRATCH (give it back)."""
    c, h, w = x.shape[1:]
    (sh, sw), (kh, kw), (oh, ow) = geo.strides, geo.kernel, geo.out
    hq, wq = oh + (kh - 1) // sh, ow + (kw - 1) // sw
    top, left = geo.pad_begin
    phases = SCRATCH.take((c, sh, sw, hq, wq), x.dtype)
    for a in range(sh):
        m0, m1 = _range(top, h, a, sh, hq)
        for b in range(sw):
            n0, n1 = _range(left, w, b, sw, wq)
            plane = phases[:, a, b]
            plane[:, :m0] = 0
            plane[:, m1:] = 0
            plane[:, m0:m1, :n0] = 0
            plane[:, m0:m1, n1:] = 0
            if m1 > m0 and n1 > n0:
                rows = x[0, :, a + sh * m0 - top :: sh, b + sw * n0 - left :: sw]
                plane[:, m0:m1, n0:n1] = rows[:, : m1 - m0, : n1 - n0]
    return phases


def phase_cols(x: np.ndarray, geo: Geometry, cols: np.ndarray) -> None:
    """Fills ``cols`` (C * KH * KW, OH * OW), rows ordered as a (C, KH, KW) window view's, for ``x`` (1, C, H, W)
    (``phase_cols_fit``)."""
    source = Columns(x, geo)
    source.fill(cols, 0, geo.out[0])
    source.release()


class Columns:
    """The im2col columns of one image ``x`` (1, C, *spatial), filled a band of output rows at a time (a
    band's columns built and multiplied by the thread that takes it, ``im2col_gemm``): from a phase split of
    the input where the conv is strided (``phase_cols_fit``), else from the padded input's window view."""

    __slots__ = ("geo", "phases", "view", "x", "xp")

    def __init__(self, x: np.ndarray, geo: Geometry) -> None:
        self.geo, self.x = geo, x
        self.phases = _phases(x, geo) if phase_cols_fit(x.shape, geo) else None
        self.xp = pad_input(x, geo) if self.phases is None else None
        self.view = None if self.xp is None else window_view(self.xp, geo)[0]  # (C, *K, *out)

    def fill(self, cols: np.ndarray, r0: int, r1: int) -> None:
        """``cols`` (C * prod(K), (r1 - r0) * prod(out[1:])): the columns of output rows [r0, r1)."""
        geo = self.geo
        if self.view is not None:
            view = self.view[(_ALL,) * (1 + len(geo.kernel)) + (slice(r0, r1),)]
            np.copyto(cols.reshape(view.shape), view)
            return
        phases, (sh, sw), (kh, kw), ow = self.phases, geo.strides, geo.kernel, geo.out[1]
        assert phases is not None
        out = cols.reshape(phases.shape[0], kh, kw, r1 - r0, ow)
        for p in range(kh):
            for q in range(kw):
                rows = slice(p // sh + r0, p // sh + r1)
                out[:, p, q] = phases[:, p % sh, q % sw, rows, q // sw : q // sw + ow]

    def release(self) -> None:
        if self.phases is not None:
            SCRATCH.give(self.phases)
        if self.xp is not None:
            release_padded(self.x, self.xp)


def biased_weights(prep: dict[str, np.ndarray], bias: np.ndarray) -> np.ndarray:
    """The weights (M, K) with the bias (M,) as a last column, (M, K + 1), kept in ``prep`` (whose bias it is:
    a constant bias, scaled with the weights where they are)."""
    w2b = prep.get("w2_bias")
    if w2b is None:
        w2 = prep["w2"]
        w2b = prep["w2_bias"] = np.concatenate([w2, bias.reshape(-1, 1).astype(w2.dtype)], 1)
    return w2b


def im2col_gemm(
    x: np.ndarray,
    geo: Geometry,
    w2b: np.ndarray,
    out_shape: tuple[int, ...],
    shared: bool,
    activation: Callable[[np.ndarray], None] | None = None,
) -> np.ndarray:
    """A dense conv of one image (1, C, *spatial) as W (M, K + 1) times its columns (K + 1, L), the bias the
    last weight column against a row of ones (no pass over the result to add it); columns from a phase split
    where the conv is strided (``Columns``). YOLO's stem, 3 -> 16 channels, 3x3, stride 2 at 320x320: the
    window copy (its inner axis stepping by the stride) and the bias's pass over (16, 25600) took 1148 us of
    the conv's 1348 with SiLU (one thread, load 4, measured here). A ``shared`` conv (large) is computed in bands
    of output rows, one per runner, each building its columns, multiplying them and applying ``activation`` (in
    place, or None) to its part of the result while it is in cache (``parallel``)."""
    length, m = math.prod(geo.out), w2b.shape[0]
    y = np.empty(out_shape, dtype=np.result_type(w2b.dtype, x.dtype))
    flat = y.reshape(m, length)
    few = shared and length < 2 * parallel.MIN_BLOCK_COLUMNS  # few columns: one band, the GEMM's rows split

    def product(cols: np.ndarray, a: int, b: int) -> None:
        out = flat[:, a:b]
        if few:
            parallel.matmul_columns(w2b, cols, out)
        else:
            np.matmul(w2b, cols, out=out)
        if activation is not None:
            activation(out)

    banded_columns(x, geo, w2b.shape[1], shared and not few, product)
    return y


def banded_columns(
    x: np.ndarray, geo: Geometry, rows: int, shared: bool, product: Callable[[np.ndarray, int, int], None]
) -> None:
    """The im2col columns of ``x`` (1, C, *spatial), ``rows`` of them (C * prod(K), and a last row of ones where
    ``rows`` is one more: a bias in the GEMM), built a band of output rows at a time and handed to ``product(cols,
    a, b)``, which computes result columns [a, b) from them: one band, or, ``shared``, one per runner
    (``parallel``), each built and multiplied by the thread that takes it."""
    k, source = x.shape[1] * math.prod(geo.kernel), Columns(x, geo)
    per_row = math.prod(geo.out) // max(1, geo.out[0])

    def band(r0: int, r1: int) -> None:
        cols = SCRATCH.take((rows, (r1 - r0) * per_row), x.dtype)
        source.fill(cols[:k], r0, r1)
        if rows > k:
            cols[k] = 1
        product(cols, r0 * per_row, r1 * per_row)
        SCRATCH.give(cols)

    if shared:
        parallel.split_ranges(geo.out[0], band, _band_rows(per_row), per_runner=1)
    else:
        band(0, geo.out[0])
    source.release()


def _band_rows(per_row: int) -> int:
    """The fewest output rows of a shared band: at least ``parallel.MIN_BLOCK_COLUMNS`` columns."""
    return -(-parallel.MIN_BLOCK_COLUMNS // max(1, per_row))
