"""Dense 2-D convolutions in C (``csrc/conv.c``, loaded by ``native.py``), float32, one group, where that beats
im2col and BLAS: a network's stem (3 channels, 3x3) and its convs of up to 128 input channels (3x3) or 384 (1x1).

im2col builds C * KH * KW rows of columns and hands BLAS a GEMM of that inner dimension (27 for a stem), which it
runs far from its peak, after a copy of every window; the C loop reads the input where it lies (NCHW or
channels-last memory, any strides), skips the taps in the padding, and keeps 12 or 8 pixels x 32 output channels
(4 x 32 where the CPU has 16 vector registers; 8 x 16 for up to 16) in vector registers over every tap and input
channel, the bias their start and the activation applied before the store; the filter packed once, 64-byte
aligned. The result channels-last when it is handed over (``layout.py``), else NCHW. Rows of a
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
from epctx.providers.cpu.native import CONV, Activation, ConvGeometry, Native, aligned

__all__ = ["DirectConv", "direct_fits"]

# The convs the direct loop beats im2col and BLAS (or the flat GEMM) on: at most this many input values per output
# (C * KH * KW), or at most _MAX_OUTPUTS output channels and _MAX_NARROW_DEPTH values. Measured here (stop 31, the
# filter 64-byte aligned, 8- and 12-pixel tiles; direct / before, us, fastest of 150 session runs, two threads and
# one): 64 -> 128 3x3 at 40x40 915 / 1119, 1735 / 2071; 128 -> 128 at 10x10 118 / 294, 186 / 298; at 28x28 899 /
# 1230, 1670 / 1439 (one thread BLAS wins by 16 %; kept for the default two); 128 -> 256 stride 2 at 20x20 277 / 400,
# 489 / 569; 64 -> 128 stride 2 at 56x56 551 / 821, 819 / 974; but 256 -> 256 at 14x14 1382 / 1038, 2872 / 1674,
# and 512 -> 512 at 7x7 4849 / 1313 (a pixel at a border, computed alone, reads the whole filter; past this depth
# the filter's slice no longer sits in L2 for the tiles).
_MAX_DEPTH = 1152
_MAX_OUTPUTS = 64
_MAX_NARROW_DEPTH = 2304
# 1x1 convs (two threads, one; direct / before): 192 -> 64 at 40x40 177 / 307, 335 / 426; 384 -> 128 at 20x20 164 /
# 256, 263 / 325; 256 -> 128 at 20x20 120 / 175, 177 / 205; 384 -> 256 at 10x10 116 / 134, 175 / 156 (one thread
# BLAS by 12 %); but 512 -> 512 at 7x7 211 / 204, 339 / 242; and BLAS on tiny ones (squeeze-excitation's 1x1 maps:
# 6-8 / 3 us, the lean GEMM).
_MAX_POINTWISE = 384
_MIN_POINTWISE_MACS = 1 << 16
# Output channels a pass of the C loop over more than 16 (two vectors): the packed filter's rows are a multiple.
_TILE = 32
# A conv of at least this many multiply-adds shares its output rows with csrc/pool.c's workers, in _BLOCKS blocks
# a thread.
_SHARED_MACS = 1 << 19
_BLOCKS = 4


def direct_fits(x_shape: tuple[int, ...], w_shape: tuple[int, ...], geo: Geometry, group: int) -> bool:
    """A 2-D dense conv of one group that the C loop beats im2col and BLAS (or the flat GEMM) on: at most
    ``_MAX_DEPTH`` input values per output, or ``_MAX_NARROW_DEPTH`` with at most ``_MAX_OUTPUTS`` output
    channels; a 1x1 conv at most ``_MAX_POINTWISE`` input channels and ``_MIN_POINTWISE_MACS`` multiply-adds."""
    if len(geo.out) != 2 or group != 1:
        return False
    depth = w_shape[1] * math.prod(geo.kernel)
    if math.prod(geo.kernel) == 1:
        macs = x_shape[0] * w_shape[0] * depth * math.prod(geo.out)
        return depth <= _MAX_POINTWISE and macs >= _MIN_POINTWISE_MACS
    return depth <= _MAX_DEPTH or (w_shape[0] <= _MAX_OUTPUTS and depth <= _MAX_NARROW_DEPTH)


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
            padded = aligned(padded)
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
        packed = prep["w_direct"] = aligned(packed)
    return packed
