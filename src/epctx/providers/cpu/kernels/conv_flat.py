"""Dense stride-1 2-D convs with M <= C computed without an im2col copy, on the padded input flattened per
channel. (Depthwise convs ran so too until the column blocks of ``depthwise.py``, faster on every shape
measured: 40 channels at 33x32, 5x5: 639 -> 180 us; 64 at 56x56, 3x3: 639 -> 597 us.)"""

from __future__ import annotations

import math

import numpy as np

from epctx.providers.cpu import blas_serial as blas
from epctx.providers.cpu import parallel
from epctx.providers.cpu.cblas import Gemm, gemm_for
from epctx.providers.cpu.kernels.windows import SCRATCH, Geometry

__all__ = ["FlatGemm", "FlatLayout", "flat_gemm_fits"]


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
    runs (added up: M values per output pixel and offset) costs less than copying the im2col matrix (C). Not
    on maps so narrow that the extra columns of each output row (``(KW - 1) * dilation``, computed and
    cropped) are over a quarter of the row: ResNet-18's 512 -> 512 3x3 convs at 7x7 (9 columns computed per 7)
    2.80-2.90 ms flat, 2.18-2.22 with the im2col copy; 256 -> 256 at 7x7 755-893 us against 638-676; 64 -> 64
    5x5 at 14x14 (18 per 14) 501-595 against 445-449; at 8x8 3x3 (10 per 8) and wider, flat is as fast or
    faster (32 -> 32 at 40x40: 430 against 542; one thread, load 2.2-2.6, measured here)."""
    if group != 1 or len(geo.out) != 2 or geo.strides != (1, 1) or math.prod(geo.kernel) == 1:
        return False
    extra = (geo.kernel[1] - 1) * geo.dilations[1]
    return w_shape[0] <= x_shape[1] and 4 * extra <= geo.out[1]


class FlatGemm:
    """A dense stride-1 2-D conv without an im2col copy: for each kernel offset k, ``W_k (M, C)`` times the
    shifted runs ``(C, oh * Wp)`` of the flattened padded input (a strided operand BLAS reads in place), summed.
    Measured on PP-OCRv4 det's 96 -> 24 channel 3x3 conv at 80x80, one thread: 9.9 ms with the im2col copy.
    BLAS runs on one thread (the serial gate). The products are summed by the GEMM itself where numpy's OpenBLAS is
    found (``cblas``: no temporary, no add pass per offset; 64 -> 64 at 56x56 2.48 -> 1.88 ms), else added by
    numpy. A ``shared`` conv with ``cblas`` is one block of rows or columns per runner (``parallel``), each block
    all nine GEMMs of its part: 64 -> 64 at 56x56, two threads, 1594 -> 958 us. (Blocks of numpy calls, two a kernel
    offset taking the GIL back from the other thread, took twice as long as one thread: the YOLO of the corpus at
    two threads 33.9 ms shared, 23.8 at one thread; those stay on one.)"""

    __slots__ = ("layout", "shared")

    def __init__(self, geo: Geometry, shared: bool = False) -> None:
        self.layout = FlatLayout(geo)
        self.shared = shared  # large enough to share with helper threads (``parallel.SHARE_MACS``)

    def run(self, x: np.ndarray, wk: np.ndarray) -> np.ndarray:
        layout = self.layout
        n, m, length = x.shape[0], wk.shape[1], layout.length
        buf = layout.padded(x)
        dt = np.result_type(x.dtype, wk.dtype)
        y = np.empty((n, m, length), dtype=dt)
        plain = buf.dtype == wk.dtype == dt and buf.flags.c_contiguous and wk.flags.c_contiguous
        gemm = gemm_for(dt) if plain else None
        if gemm is not None and self.shared:
            self._summed(gemm, buf, wk, y)  # gated per block (parallel.split_ranges)
        elif gemm is not None:
            blas.serial()(self._summed, gemm, buf, wk, y)
        else:
            blas.serial()(self._added, buf, wk, y)
        SCRATCH.give(buf)
        return layout.crop(y)

    def _summed(self, gemm: Gemm, buf: np.ndarray, wk: np.ndarray, y: np.ndarray) -> None:
        """Each kernel offset's product added to ``y`` by the GEMM itself (``cblas``: beta 1 after the first):
        ``buf`` (N, C, size), ``wk`` (K, M, C) and ``y`` (N, M, length), all C-contiguous, of one dtype, alive
        for the calls (the addresses are theirs). A large conv in one block of rows or columns per runner
        (``parallel.split_product``: each block all the offsets' GEMMs, which release the GIL)."""
        n, c, size = buf.shape
        m, length = y.shape[1], y.shape[2]
        item = buf.itemsize
        weights, step, shifts = wk.ctypes.data, wk.strides[0], self.layout.shifts

        def offsets(rows: int, cols: int, w0: int, x0: int, y0: int) -> None:
            for k, shift in enumerate(shifts):
                beta = 0.0 if k == 0 else 1.0
                gemm(rows, cols, c, w0 + k * step, c, x0 + shift * item, size, beta, y0, length)

        for i in range(n):
            xb, yb = buf.ctypes.data + i * buf.strides[0], y.ctypes.data + i * y.strides[0]

            def rows(lo: int, hi: int, xb: int = xb, yb: int = yb) -> None:
                offsets(hi - lo, length, weights + lo * c * item, xb, yb + lo * length * item)

            def cols(lo: int, hi: int, xb: int = xb, yb: int = yb) -> None:
                offsets(m, hi - lo, weights, xb + lo * item, yb + lo * item)

            if self.shared:
                parallel.split_product(m, length, rows, cols)
            else:
                cols(0, length)

    def _added(self, buf: np.ndarray, wk: np.ndarray, y: np.ndarray) -> None:
        """numpy's form (no cblas GEMM, or mixed dtypes): each product into a temporary, added to ``y``."""
        length = y.shape[2]
        tmp = SCRATCH.take(y.shape[1:], y.dtype)
        for xi, yi in zip(buf, y):
            for k, shift in enumerate(self.layout.shifts):
                src = xi[:, shift : shift + length]
                if k == 0:
                    np.matmul(wk[0], src, out=yi)
                else:
                    np.matmul(wk[k], src, out=tmp)
                    yi += tmp
        SCRATCH.give(tmp)
