"""Dense 2-D convolutions in C (``csrc/conv.c``, loaded by ``native.py``), float32, one group, where that beats
im2col and BLAS: a network's stem (3 channels, 3x3), few input values per output, or few output channels.

im2col builds C * KH * KW rows of columns and hands BLAS a GEMM of that inner dimension (27 for a stem), which it
runs far from its peak, after a copy of every window; the C loop reads the input where it lies (NCHW or
channels-last memory, any strides), skips the taps in the padding, and keeps 4 pixels x 32 output channels (8 x
16 for up to 16) in vector registers over every tap and input channel, the bias their start and the activation
applied before the store. The result channels-last when it is handed over (``layout.py``), else NCHW. Rows of a
large conv are shared by ``csrc/pool.c``'s workers (ctypes releases the GIL for the call).
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Callable

import numpy as np

from epctx.providers.cpu import blas_serial as blas
from epctx.providers.cpu import fusion
from epctx.providers.cpu.kernels.windows import Geometry
from epctx.providers.cpu.native import CONV, Activation, ConvGeometry, Native

__all__ = ["DirectConv", "direct_fits"]

# The convs the direct loop beats im2col and BLAS (or the flat GEMM) on: at most this many input values per output
# (C * KH * KW), or at most this many output channels. Two threads, median, measured here (direct / before): a
# stem 3 -> 16, 3x3, stride 2 at 224x224: 107 / 423 us; 16 -> 32 stride 2 at 160x160: 298 / 1201; 16 -> 16 at
# 80x80: 349 / 482; 32 -> 64 stride 2 at 80x80: 403 / 669; 64 -> 64 at 40x40: 734 / 823; 128 -> 64 at 20x20:
# 477 / 512; but 64 -> 128 stride 2 at 40x40: 527 / 505, 128 -> 256 at 20x20: 1424 / 1238 (BLAS's GEMM wins as M
# grows). One thread, the direct loop won on each of these but the last two (stem 194 / 417, 64 -> 64 922 / 1335).
_MAX_DEPTH = 160
_MAX_OUTPUTS = 64
# 1x1 convs: BLAS's GEMM wins from 128 input channels on (direct / before, two threads, NCHW input: 16 -> 32 at
# 112x112: 146 / 269 us; 64 -> 128 at 28x28: 83 / 131; 96 -> 576 at 7x7: 59 / 58; 128 -> 128 at 28x28: 188 /
# 185; 512 -> 512 at 7x7: 356 / 204), and on tiny ones (squeeze-excitation's 1x1 maps: 6-8 / 3 us, the lean GEMM).
_MAX_POINTWISE = 96
_MIN_POINTWISE_MACS = 1 << 16
# Output channels a pass of the C loop over more than 16 (two vectors): the packed filter's rows are a multiple.
_TILE = 32
# A conv of at least this many multiply-adds shares its output rows with csrc/pool.c's workers, in _BLOCKS blocks
# a thread.
_SHARED_MACS = 1 << 19
_BLOCKS = 4


def direct_fits(x_shape: tuple[int, ...], w_shape: tuple[int, ...], geo: Geometry, group: int) -> bool:
    """A 2-D dense conv of one group that the C loop beats im2col and BLAS (or the flat GEMM) on: at most
    ``_MAX_DEPTH`` input values per output or at most ``_MAX_OUTPUTS`` output channels; a 1x1 conv at most
    ``_MAX_POINTWISE`` input channels and ``_MIN_POINTWISE_MACS`` multiply-adds."""
    if len(geo.out) != 2 or group != 1:
        return False
    depth = w_shape[1] * math.prod(geo.kernel)
    if math.prod(geo.kernel) == 1:
        macs = x_shape[0] * w_shape[0] * depth * math.prod(geo.out)
        return depth <= _MAX_POINTWISE and macs >= _MIN_POINTWISE_MACS
    return depth <= _MAX_DEPTH or w_shape[0] <= _MAX_OUTPUTS


class DirectConv:
    """A dense conv run by the native direct loop; ``route`` is the conv's call (``conv_direct.route_for``)."""

    __slots__ = ("geo", "native", "out_shape", "shares", "w_shape", "x_shape")

    def __init__(
        self, x_shape: tuple[int, ...], w_shape: tuple[int, ...], geo: Geometry, native: Native
    ) -> None:
        self.x_shape, self.w_shape, self.geo, self.native = x_shape, w_shape, geo, native
        self.out_shape = (x_shape[0], w_shape[0], *geo.out)
        macs = math.prod(self.out_shape) * math.prod(w_shape[1:])
        self.shares = macs >= _SHARED_MACS

    def geometry(
        self, x: np.ndarray, nhwc: bool, form: fusion.NativeForm | None
    ) -> tuple[ConvGeometry, np.ndarray]:
        """The C loop's geometry for an input laid out as ``x`` (one image's strides) and a result in NCHW or
        channels-last, with the input offsets of the filter's rows it points to (keep both)."""
        (_, c, h, w), m, geo = self.x_shape, self.w_shape[0], self.geo
        x_ch, x_row, x_col = (s // x.itemsize for s in x.strides[1:])
        kh, kw = geo.kernel
        p, q, k = np.meshgrid(np.arange(kh), np.arange(kw), np.arange(c), indexing="ij")
        offsets = (
            (p * geo.dilations[0] * x_row + q * geo.dilations[1] * x_col + k * x_ch).astype(np.intp).ravel()
        )
        act = Activation(*form) if form is not None else Activation(0, 0.0, 0.0, 0.0)
        kernel = (*geo.kernel, *geo.strides, *geo.dilations, *geo.pad_begin)
        pad = _row_length(m)
        geometry = ConvGeometry(c, h, w, x_ch, x_row, x_col, m, pad, *geo.out, *kernel, int(nhwc), act)
        geometry.offsets = offsets.ctypes.data
        return geometry, offsets

    def route(
        self,
        prep: dict[str, np.ndarray],
        bias: np.ndarray | None,
        activation: fusion.Activation | None,
        handing: bool,
        fallback: Callable[[np.ndarray], tuple[np.ndarray]],
    ) -> Callable[[np.ndarray], tuple[np.ndarray]]:
        """The conv's call with its ``bias`` ((M, 1) or None) and ``activation`` (in C where it has a native
        form, else after), its result channels-last as an NCHW view when ``handing`` it over; an input other
        than float32 goes to ``fallback``."""
        packed, m = _packed(prep, self.w_shape), self.w_shape[0]
        padded = None
        if bias is not None:
            padded = np.zeros(packed.shape[-1], dtype=np.float32)
            padded[:m] = bias.reshape(-1)
        form, after = fusion.native_split(activation)
        n, (oh, ow) = self.x_shape[0], self.geo.out
        shape = (n, oh, ow, m) if handing else self.out_shape
        # input strides -> (geometry, its offsets: kept alive, the C loop's geometry, filter and bias addresses)
        layouts: dict[tuple[int, ...], tuple[ConvGeometry, np.ndarray, tuple[int, int, int | None]]] = {}
        weights = (packed.ctypes.data, None if padded is None else padded.ctypes.data)
        kept = (packed, padded)  # what ``weights`` points to, alive as long as this call

        def route(x: np.ndarray) -> tuple[np.ndarray]:
            if x.dtype != np.float32:
                return fallback(x)
            found = layouts.get(x.strides)
            if found is None:
                geometry, offsets = self.geometry(x, handing, form)
                found = layouts[x.strides] = (geometry, offsets, (ctypes.addressof(geometry), *weights))
            y = np.empty(shape, dtype=np.float32)
            self._compute(x, found[2], y, kept)
            if after is not None:
                after(y)
            return (y.transpose(0, 3, 1, 2) if handing else y,)

        return route

    def _compute(self, x: np.ndarray, args: tuple[int, int, int | None], y: np.ndarray, kept: object) -> None:
        """The C loop over every row of ``x``'s images into ``y``; ``args`` its geometry, filter and bias
        addresses, ``kept`` the filter and bias they point to (alive through the call)."""
        threads = blas.serial().threads() if self.shares else 1
        xs = [x.ctypes.data + i * x.strides[0] for i in range(x.shape[0])]
        ys = [y.ctypes.data + i * y.strides[0] for i in range(y.shape[0])]
        self.native.rows(CONV, xs, ys, self.geo.out[0], args, threads, _BLOCKS * threads)
        del kept  # only its lifetime mattered


def _row_length(m: int) -> int:
    """The packed filter's row length for M output channels: one vector (16) up to 16, else a multiple of two."""
    return 16 if m <= 16 else -(-m // _TILE) * _TILE


def _packed(prep: dict[str, np.ndarray], w_shape: tuple[int, ...]) -> np.ndarray:
    """The filter as (KH, KW, C, ``_row_length(M)``), zeros past M, float32; kept in ``prep``."""
    packed = prep.get("w_direct")
    if packed is None:
        m = w_shape[0]
        w = prep["w2"].reshape(w_shape).transpose(2, 3, 1, 0)
        packed = np.zeros((*w.shape[:3], _row_length(m)), dtype=np.float32)
        packed[..., :m] = w
        prep["w_direct"] = packed
    return packed
