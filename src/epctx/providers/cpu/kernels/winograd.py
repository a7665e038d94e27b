"""Winograd F(2x2, 3x3) for the CPU EP's Conv: 3x3 stride-1 convs as 16 GEMMs over 2x2 output tiles (2.25x
fewer multiplies), when BLAS runs one thread (``blas_single_threaded``)."""

from __future__ import annotations

import functools
import os
from typing import Any

import numpy as np

from epctx.providers.cpu.kernels.windows import SCRATCH, Geometry

__all__ = ["Winograd", "blas_single_threaded", "winograd_fits", "winograd_weight"]


_WINO_G = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0.0, 0.0, 1.0]])
_WINO_MIN_TILES = 36  # below this many tiles per GEMM, im2col + one GEMM is faster
_WINO_MIN_CHANNELS = 16


@functools.cache
def blas_single_threaded() -> bool:
    """True when numpy's BLAS runs one thread (thread-count variables set to 1, or a single CPU).

    Winograd's 16 small GEMMs only pay off then: a multi-threaded OpenBLAS synchronizes its threads on
    every call, which makes them slower than the one large im2col GEMM (measured 2x slower end to end).
    """
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS"):
        value = os.environ.get(var, "").strip()
        if value:
            return value == "1"
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return cpus == 1


def winograd_fits(x_shape: tuple[int, ...], w_shape: tuple[int, ...], geo: Geometry, group: int) -> bool:
    if group != 1 or len(geo.kernel) != 2 or geo.kernel != (3, 3) or not blas_single_threaded():
        return False
    if geo.strides != (1, 1) or geo.dilations != (1, 1):
        return False
    tiles = x_shape[0] * ((geo.out[0] + 1) // 2) * ((geo.out[1] + 1) // 2)
    return tiles >= _WINO_MIN_TILES and w_shape[0] >= _WINO_MIN_CHANNELS and w_shape[1] >= _WINO_MIN_CHANNELS


def winograd_weight(w: np.ndarray) -> np.ndarray:
    """(M, C, 3, 3) -> U (16, M, C) = G g G^T per filter, computed in float64."""
    gw = np.tensordot(_WINO_G, w.astype(np.float64), axes=(1, 2))  # (a, M, C, j)
    u = np.tensordot(gw, _WINO_G, axes=(3, 1)).transpose(0, 3, 1, 2)  # (a, b, M, C)
    return np.ascontiguousarray(u.reshape((16,) + w.shape[:2]).astype(w.dtype))


class Winograd:
    __slots__ = ("oh", "ow", "pad_h", "pad_w", "th", "tw")

    def __init__(self, x_shape: tuple[int, ...], w_shape: tuple[int, ...], geo: Geometry) -> None:
        self.oh, self.ow = geo.out
        self.th, self.tw = (self.oh + 1) // 2, (self.ow + 1) // 2
        self.pad_h, self.pad_w = geo.pad_begin

    def run(self, x: np.ndarray, u: np.ndarray) -> np.ndarray:
        n, c = x.shape[0], x.shape[1]
        m = u.shape[1]
        th, tw = self.th, self.tw
        dt = np.result_type(x.dtype, u.dtype)
        v = self._transform_input(x, dt)
        prod = SCRATCH.take((16, m, n * th * tw), dt)
        np.matmul(u, v.reshape(16, c, n * th * tw), out=prod)
        SCRATCH.give(v)
        mt = prod.reshape(4, 4, m, n, th, tw)
        # Y = A^T M A with A^T = [[1, 1, 1, 0], [0, 1, -1, -1]].
        p = SCRATCH.take((2, 4, m, n, th, tw), dt)
        np.add(mt[0], mt[1], out=p[0])
        p[0] += mt[2]
        np.subtract(mt[1], mt[2], out=p[1])
        p[1] -= mt[3]
        SCRATCH.give(prod)
        exact = n == 1 and 2 * th == self.oh and 2 * tw == self.ow
        y = np.empty((m, n, 2 * th, 2 * tw), dtype=dt) if exact else SCRATCH.take((m, n, 2 * th, 2 * tw), dt)
        for i in range(2):
            pr = p[i]
            np.add(pr[0], pr[1], out=y[:, :, i::2, 0::2])
            y[:, :, i::2, 0::2] += pr[2]
            np.subtract(pr[1], pr[2], out=y[:, :, i::2, 1::2])
            y[:, :, i::2, 1::2] -= pr[3]
        SCRATCH.give(p)
        if exact:
            return y.reshape(n, m, self.oh, self.ow)
        out = np.ascontiguousarray(y[:, :, : self.oh, : self.ow].transpose(1, 0, 2, 3))
        SCRATCH.give(y)
        return out

    def _transform_input(self, x: np.ndarray, dt: Any) -> np.ndarray:
        """V = B^T d B for every 4x4 input tile d, as (16, C, N, th, tw)."""
        n, c = x.shape[0], x.shape[1]
        th, tw = self.th, self.tw
        ph, pw = self.pad_h, self.pad_w
        rows = 2 * th + 2
        # Padded input, (C, N, rows, cols) with the even and odd columns de-interleaved into two planes
        # so that every tile column below is a unit-stride view.
        planes = SCRATCH.take((2, c, n, rows, tw + 1), dt)
        planes.fill(0)
        xt = x.transpose(1, 0, 2, 3)[:, :, : rows - ph]
        for parity in range(2):
            first = (parity - pw) % 2  # first input column landing on this parity
            src = xt[..., first::2]
            dst0 = (pw + first) // 2
            k = min(src.shape[-1], tw + 1 - dst0)
            planes[parity, :, :, ph : ph + src.shape[2], dst0 : dst0 + k] = src[..., :k]
        ev, od = planes[0], planes[1]
        q = (ev[..., :tw], od[..., :tw], ev[..., 1:], od[..., 1:])  # tile columns 0..3
        cols = SCRATCH.take((4, c, n, rows, tw), dt)
        np.subtract(q[0], q[2], out=cols[0])
        np.add(q[1], q[2], out=cols[1])
        np.subtract(q[2], q[1], out=cols[2])
        np.subtract(q[1], q[3], out=cols[3])
        r = [cols[:, :, :, i : i + 2 * th : 2] for i in range(4)]  # tile rows 0..3
        v = SCRATCH.take((4, 4, c, n, th, tw), dt)
        np.subtract(r[0], r[2], out=v[0])
        np.add(r[1], r[2], out=v[1])
        np.subtract(r[2], r[1], out=v[2])
        np.subtract(r[1], r[3], out=v[3])
        SCRATCH.give(planes, cols)
        return v
