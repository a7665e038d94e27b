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

from epctx.providers.cpu.kernels.windows import SCRATCH, Geometry, pad_input, release_padded, window_view

__all__ = ["biased_weights", "im2col_gemm", "phase_cols", "phase_cols_fit"]

MatMul = Callable[[np.ndarray, np.ndarray, np.ndarray], None]  # (a, b, out): out[...] = a @ b


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


def phase_cols(x: np.ndarray, geo: Geometry, cols: np.ndarray) -> None:
    """Fills ``cols`` (C * KH * KW, OH * OW), rows ordered as a (C, KH, KW) window view's, for ``x`` (1, C, H, W)
    (``phase_cols_fit``)."""
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
    out = cols.reshape(c, kh, kw, oh, ow)
    for p in range(kh):
        for q in range(kw):
            out[:, p, q] = phases[:, p % sh, q % sw, p // sh : p // sh + oh, q // sw : q // sw + ow]
    SCRATCH.give(phases)


def biased_weights(prep: dict[str, np.ndarray], bias: np.ndarray) -> np.ndarray:
    """The weights (M, K) with the bias (M,) as a last column, (M, K + 1), kept in ``prep`` (whose bias it is:
    a constant bias, scaled with the weights where they are)."""
    w2b = prep.get("w2_bias")
    if w2b is None:
        w2 = prep["w2"]
        w2b = prep["w2_bias"] = np.concatenate([w2, bias.reshape(-1, 1).astype(w2.dtype)], 1)
    return w2b


def im2col_gemm(
    x: np.ndarray, geo: Geometry, w2b: np.ndarray, out_shape: tuple[int, ...], matmul: MatMul
) -> np.ndarray:
    """A dense conv of one image (1, C, *spatial) as W (M, K + 1) times its columns (K + 1, L), the bias the
    last weight column against a row of ones (no pass over the result to add it); columns from a phase split
    where the conv is strided (``phase_cols``). YOLO's stem, 3 -> 16 channels, 3x3, stride 2 at 320x320: the
    window copy (its inner axis stepping by the stride) and the bias's pass over (16, 25600) took 1148 us of
    the conv's 1348 with SiLU (one thread, load 4, measured here)."""
    k, length = w2b.shape[1] - 1, math.prod(geo.out)
    cols = SCRATCH.take((k + 1, length), x.dtype)
    if phase_cols_fit(x.shape, geo):
        phase_cols(x, geo, cols[:k])
    else:
        xp = pad_input(x, geo)
        view = window_view(xp, geo)  # (1, C, *K, *out)
        np.copyto(cols[:k].reshape(view.shape), view)
        release_padded(x, xp)
    cols[k] = 1
    y = np.empty(out_shape, dtype=np.result_type(w2b.dtype, cols.dtype))
    matmul(w2b, cols, y.reshape(w2b.shape[0], length))
    SCRATCH.give(cols)
    return y
