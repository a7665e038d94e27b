"""A small 1-D convolution of one signal as one GEMM over a strided window view (silero-vad's STFT and encoder:
(1, 129, 3) by (128, 129, 3) was 31 us a call through the general plan for a 1.5 us GEMM).

Everything but the input is bound once: the padded extent, the window view's shape and strides, the weights
as (M, C * K), the bias column and the activation. A call pads into a fresh buffer (no scratch pool, so calls
from several threads share nothing), takes the windows as a view of it (``np.ndarray`` over the buffer: no
``as_strided`` wrapper), copies them into the GEMM's operand and multiplies once; an unpadded contiguous input
is read in place.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["SHORT_MACS", "short_conv", "short_fits"]

# At most this many multiply-adds: OpenBLAS runs the GEMM on one thread itself (blas_serial.py), so the call
# needs no thread gate and Python overhead is most of its cost.
SHORT_MACS = 1 << 18


def short_fits(x_shape: tuple[int, ...], w_shape: tuple[int, ...], geo: Any, group: int) -> bool:
    """A dense (group 1) 1-D conv of one signal with at most ``SHORT_MACS`` multiply-adds."""
    if len(x_shape) != 3 or x_shape[0] != 1 or group != 1 or len(geo.out) != 1:
        return False
    macs = w_shape[0] * w_shape[1] * geo.kernel[0] * geo.out[0]
    return 0 < macs <= SHORT_MACS and math.prod(x_shape) > 0


def short_conv(
    x_shape: tuple[int, ...],
    geo: Any,
    w2: np.ndarray,
    bias: np.ndarray | None,
    activation: Callable[[np.ndarray], None] | None,
) -> Callable[[np.ndarray], tuple[np.ndarray]]:
    """The conv of inputs of shape ``x_shape`` (1, C, L): ``w2`` (M, C * K), ``bias`` (M, 1) or None."""
    _, c, length = x_shape
    (k,), (d,), (s,), (out,) = geo.kernel, geo.dilations, geo.strides, geo.out
    begin = geo.pad_begin[0]
    extent = max(geo.padded[0], begin + length)
    padded = begin > 0 or extent > length
    m = w2.shape[0]
    cols_shape, y_shape = (c * k, out), (1, m, out)

    def run(x: np.ndarray) -> tuple[np.ndarray]:
        dtype = w2.dtype if x.dtype == w2.dtype else np.result_type(w2.dtype, x.dtype)
        if padded:
            xp = np.zeros((c, extent), dtype=x.dtype)
            xp[:, begin : begin + length] = x[0]
        else:
            xp = np.ascontiguousarray(x[0])
        row, col = xp.strides
        view = np.ndarray((c, k, out), xp.dtype, buffer=xp, strides=(row, col * d, col * s))
        y = np.empty(y_shape, dtype=dtype)
        np.matmul(w2, view.reshape(cols_shape), out=y[0])
        if bias is not None:
            y[0] += bias
        if activation is not None:
            activation(y)
        return (y,)

    return run
