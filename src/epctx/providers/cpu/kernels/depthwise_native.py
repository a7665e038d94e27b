"""Depthwise convolutions channels-last in C (``csrc/depthwise.c``, loaded by ``native.py``): 2-D, float32, one
output channel per group, any padding, strides and dilations.

The C loop reads the input where it lies when it is channels-last memory (a value handed over by the conv
before it, ``layout.py``), else from one transposed copy; taps in the padding are skipped, so there is no padded
buffer to fill. It computes four output columns at a time, 16 channels each, in vector registers, the bias
their start. Against the numpy form's einsum over a padded window view (``depthwise.py``), one thread, input
channels-last, measured here: 16 channels at 112x112, 3x3: 324 -> 81 us; 32 at 112x112, stride 2: 437 -> 51;
72 at 56x56: 381 -> 97; 240 at 14x14, 5x5: 163 -> 38. A conv's rows are shared by ``csrc/pool.c``'s workers
(ctypes releases the GIL for the call), whose threads spin between convs: at two threads 16 at 112x112 101 ->
60 us, 128 at 28x28 56 -> 40, 576 at 7x7, 5x5 64 -> 43. Other dtypes run the numpy form.
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Callable

import numpy as np

from epctx.providers.cpu import blas_serial as blas
from epctx.providers.cpu import fusion
from epctx.providers.cpu.kernels.depthwise import DepthwiseChannelsLast, copy_in_tiles
from epctx.providers.cpu.kernels.windows import SCRATCH, Geometry
from epctx.providers.cpu.native import DEPTHWISE, Activation, DwGeometry, Native, aligned

__all__ = ["DepthwiseNative", "native_fits"]

# A conv of at least this many multiply-adds shares its output rows (of all images) with csrc/pool.c's workers,
# in _BLOCKS blocks a thread.
_SHARED_MACS = 1 << 19
_BLOCKS = 4


def native_fits(x_shape: tuple[int, ...], w_shape: tuple[int, ...], geo: Geometry) -> bool:
    """2-D, one output channel per group (C in, C out)."""
    return len(geo.out) == 2 and w_shape[0] == x_shape[1] and w_shape[1] == 1


class DepthwiseNative:
    """A depthwise conv run by the native kernel: ``route`` (the conv's call, ``conv_direct.route_for``), ``run``
    and ``run_channels_last`` as ``DepthwiseChannelsLast``'s (which runs inputs other than float32)."""

    __slots__ = ("_fallback", "geo", "geometry", "native", "shares", "w_shape", "x_shape")

    def __init__(
        self, x_shape: tuple[int, ...], w_shape: tuple[int, ...], geo: Geometry, native: Native
    ) -> None:
        self.x_shape, self.w_shape, self.geo, self.native = x_shape, w_shape, geo, native
        (_, c, h, w), (kh, kw) = x_shape, geo.kernel
        self.geometry = DwGeometry(
            h, w, c, w * c, c, geo.out[1], kh, kw, *geo.strides, *geo.dilations, *geo.pad_begin
        )
        self.shares = x_shape[0] * math.prod(geo.out) * c * kh * kw >= _SHARED_MACS
        self._fallback: DepthwiseChannelsLast | None = None

    def route(
        self,
        prep: dict[str, np.ndarray],
        bias: np.ndarray | None,
        activation: fusion.Activation | None,
        handing: bool,
    ) -> Callable[[np.ndarray], tuple[np.ndarray]]:
        """The conv's call with its ``bias`` ((C, 1) or None) and ``activation`` applied in C (numpy applies one
        the kernel has no form of): its result channels-last as an NCHW view when ``handing`` it over
        (``layout.py``), else copied to NCHW."""
        add = None if bias is None else aligned(bias.reshape(-1))
        form, after = fusion.native_split(activation)
        fused = None if form is None else activation
        geometry = self.geometry
        if form is not None:
            geometry = DwGeometry.from_buffer_copy(geometry)
            geometry.act = Activation(*form)
        # the C loop's addresses, taken once (None: numpy's form); the closure keeps what they point to alive
        args, kept = self._args(prep, add, geometry), (geometry, add)

        def route(x: np.ndarray) -> tuple[np.ndarray]:
            if args is None or x.dtype != np.float32:
                y = self._numpy(x, prep, add, fused)
            else:
                y = self._native(x, args, kept)
            if after is not None:
                after(y)
            if handing:
                return (y.transpose(0, 3, 1, 2),)
            out = np.empty((y.shape[0], y.shape[3], y.shape[1], y.shape[2]), dtype=y.dtype)
            copy_in_tiles(out.transpose(0, 2, 3, 1), y)
            return (out,)

        return route

    def run(self, x: np.ndarray, prep: dict[str, np.ndarray]) -> np.ndarray:
        """The conv alone, its result NCHW (``_ConvPlan.run``)."""
        (y,) = self.route(prep, None, None, False)(x)
        return y

    def run_channels_last(self, x: np.ndarray, prep: dict[str, np.ndarray]) -> np.ndarray:
        """The conv alone, its result a contiguous (N, H, W, C) array."""
        args = self._args(prep, None, self.geometry)
        if args is None or x.dtype != np.float32:
            return self._numpy(x, prep, None, None)
        return self._native(x, args, self.geometry)

    def _args(
        self, prep: dict[str, np.ndarray], bias: np.ndarray | None, geometry: DwGeometry
    ) -> tuple[int, int, int | None] | None:
        """The C loop's geometry, filter ((KH, KW, C, 1)) and bias addresses; None where the filter or the bias
        is not float32 (numpy's form then). The caller keeps the three alive."""
        wl = prep["wl"]
        if wl.dtype != np.float32 or (bias is not None and bias.dtype != np.float32):
            return None
        filter_ = prep.get("wl_aligned")
        if filter_ is None:
            filter_ = prep["wl_aligned"] = aligned(wl)  # kept in ``prep``
        return ctypes.addressof(geometry), filter_.ctypes.data, None if bias is None else bias.ctypes.data

    def _numpy(
        self,
        x: np.ndarray,
        prep: dict[str, np.ndarray],
        bias: np.ndarray | None,
        activation: fusion.Activation | None,
    ) -> np.ndarray:
        """Numpy's form (``DepthwiseChannelsLast``), then ``bias`` and ``activation``: dtypes other than float32."""
        y = self.fallback().run_channels_last(x, prep)
        if bias is not None:
            y += bias
        if activation is not None:
            activation(y)
        return y

    def _native(self, x: np.ndarray, args: tuple[int, int, int | None], kept: object) -> np.ndarray:
        """The C loop's result (N, H, W, C), contiguous, its bias and activation those of ``args``; ``kept`` holds
        the geometry (and bias) ``args`` points to, alive through the call."""
        nhwc = x.transpose(0, 2, 3, 1)
        copied = None
        if not nhwc.flags.c_contiguous:  # NCHW memory: one transposed copy
            copied = SCRATCH.take(nhwc.shape, x.dtype)
            np.copyto(copied, nhwc)
            nhwc = copied
        n, (h, w), c = x.shape[0], self.geo.out, x.shape[1]
        y = np.empty((n, h, w, c), dtype=np.float32)
        threads = blas.serial().threads() if self.shares else 1
        xs = [nhwc.ctypes.data + i * nhwc.strides[0] for i in range(n)]
        ys = [y.ctypes.data + i * y.strides[0] for i in range(n)]
        self.native.rows(DEPTHWISE, xs, ys, h, args, threads, _BLOCKS * threads)
        del kept  # only its lifetime mattered
        if copied is not None:
            SCRATCH.give(copied)
        return y

    def fallback(self) -> DepthwiseChannelsLast:
        if self._fallback is None:
            self._fallback = DepthwiseChannelsLast(self.x_shape, self.w_shape, self.geo)
        return self._fallback
