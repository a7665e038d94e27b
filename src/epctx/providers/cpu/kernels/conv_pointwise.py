"""A 1x1 conv of one image as (H * W, C) times W^T (C, M), its result channels-last (1, H, W, M), contiguous.

From channels-last memory both operands are row-major: 72 -> 24 channels at 28x28 24 us, where W x over the
transposed operand takes 33 (W x from NCHW: 20; measured here, one thread). A constant bias is written under
the product, which the GEMM adds to it (``cblas``, beta 1: a write pass instead of a pass reading and writing
the result, 18-27 us a conv on 56x56 and larger maps). A large conv (``shared``) is computed in bands of pixel
rows, one per runner (``parallel``), each band writing its bias, multiplying and applying the epilogue's
activation while its rows are in cache.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from epctx.providers.cpu import fusion, parallel
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
    shared: bool,
) -> Callable[[np.ndarray], np.ndarray]:
    """The conv's call: ``w2t`` W^T (C, M) contiguous, ``pixels`` the input's (H * W, C) matrix, ``out`` the
    output's spatial shape, ``bias`` (M,) constant or None, ``activation`` applied in place or None."""
    (c, m), rows = w2t.shape, pixels.length
    shape, flat = (1, *out, m), (rows, m)
    gemm = gemm_for(w2t.dtype)
    if bias is not None:
        row, (tiles, width) = bias_rows(bias.astype(w2t.dtype), rows)
    else:
        row, (tiles, width) = None, (rows, m)
    tile = width // m  # pixels a row of the tiled bias spans: bands begin and end on them
    add = None if bias is None else channels_last_bias(bias, rows)
    weights = w2t.ctypes.data  # its address, taken once (0.8 us an access): w2t lives as long as this closure
    item, beta = w2t.itemsize, 0.0 if bias is None else 1.0

    def band(a: np.ndarray, y: np.ndarray, lo: int, hi: int) -> None:
        """Pixel rows [lo * tile, hi * tile) of ``y`` (rows, M): the bias written, the product added to it."""
        if row is not None:
            np.copyto(y.reshape(tiles, width)[lo:hi], row)
        p0, p1 = lo * tile, hi * tile
        assert gemm is not None
        gemm(
            p1 - p0,
            m,
            c,
            a.ctypes.data + p0 * c * item,
            c,
            weights,
            m,
            beta,
            y.ctypes.data + p0 * m * item,
            m,
        )
        if activation is not None:
            activation(y[p0:p1])

    least = -(-parallel.MIN_BLOCK_COLUMNS // tile)  # the fewest rows of the tiled bias a shared band holds

    def run(x: np.ndarray) -> np.ndarray:
        dtype = w2t.dtype if x.dtype == w2t.dtype else np.result_type(w2t.dtype, x.dtype)
        y = np.empty(shape, dtype=dtype)
        a = pixels(x)
        y2 = y.reshape(flat)
        if gemm is not None and a.dtype == dtype and a.flags.c_contiguous:
            if shared:
                parallel.split_ranges(tiles, lambda lo, hi: band(a, y2, lo, hi), least, per_runner=1)
            else:
                band(a, y2, 0, tiles)
            return y
        np.matmul(a, w2t, out=y2)
        if add is not None:
            add(y)
        if activation is not None:
            activation(y)
        return y

    return run
