"""A 1x1 conv of one image as (H * W, C) times W^T (C, M), its result channels-last (1, H, W, M), contiguous.

From channels-last memory both operands are row-major: 72 -> 24 channels at 28x28 24 us, where W x over the
transposed operand takes 33 (W x from NCHW: 20; measured here, one thread). A constant bias is written under
the product, which the GEMM adds to it (``cblas``, beta 1: a write pass instead of a pass reading and writing
the result, 18-27 us a conv on 56x56 and larger maps), then the epilogue's activation. One GEMM call (on one
BLAS thread under ``blas_serial.SERIAL_MACS``, else on OpenBLAS's own threads), not bands shared with a helper
thread (``parallel``): with one call to split, OpenBLAS's spinning threads start sooner than a sleeping helper
(two threads, median: 480 -> 480 channels at 6x80 838 us against 1103 in two bands; 128 -> 128 at 56x56 507
against 929; measured here).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from epctx.providers.cpu import blas_serial as blas
from epctx.providers.cpu import fusion, native
from epctx.providers.cpu.cblas import gemm_for
from epctx.providers.cpu.kernels.channel_rows import PixelRows
from epctx.providers.cpu.kernels.conv_direct import bias_rows, channels_last_bias

__all__ = ["pointwise_last"]


def pointwise_last(
    w2t: np.ndarray,
    pixels: PixelRows,
    out: tuple[int, ...],
    bias: np.ndarray | None,
    activation: fusion.Activation | None,
) -> Callable[[np.ndarray], np.ndarray]:
    """The conv's call: ``w2t`` W^T (C, M) contiguous, ``pixels`` the input's (H * W, C) matrix, ``out`` the
    output's spatial shape, ``bias`` (M,) constant or None, ``activation`` applied in place or None."""
    (c, m), rows = w2t.shape, pixels.length
    shape, flat = (1, *out, m), (rows, m)
    gemm = gemm_for(w2t.dtype)
    # the bias tiled along rows of the result (``bias_rows``), written before the GEMM adds its product
    row, tiled = bias_rows(bias.astype(w2t.dtype), rows) if bias is not None else (None, flat)
    add = None if bias is None else channels_last_bias(bias, rows)
    weights = w2t.ctypes.data  # its address, taken once (0.8 us an access): w2t lives as long as this closure
    beta = 0.0 if bias is None else 1.0
    # a GEMM OpenBLAS splits over its threads: the native pool's spinning workers leave it the cores
    rest = native.rest if rows * m * c >= blas.SERIAL_MACS else None

    def run(x: np.ndarray) -> np.ndarray:
        dtype = w2t.dtype if x.dtype == w2t.dtype else np.result_type(w2t.dtype, x.dtype)
        y = np.empty(shape, dtype=dtype)
        a = pixels(x)
        if rest is not None:
            rest()
        if gemm is not None and a.dtype == dtype and a.flags.c_contiguous:
            if row is not None:
                np.copyto(y.reshape(tiled), row)
            gemm(rows, m, c, a.ctypes.data, c, weights, m, beta, y.ctypes.data, m)
        else:
            np.matmul(a, w2t, out=y.reshape(flat))
            if add is not None:
                add(y)
        if activation is not None:
            activation(y)
        return y

    return run
