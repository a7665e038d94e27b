"""CPU kernels: Conv (ConvTranspose is in ``conv_transpose.py``).

A Conv runs in C where the native kernels are built (``native.py``): depthwise convs (``depthwise_native.py``)
and dense convs of few input values or output channels (``conv_native.py``); otherwise as im2col + one matmul
per group, or without the im2col copy where that costs less (``conv_flat.py``: dense stride-1 convs with M <= C),
depthwise convs channels-last (``depthwise.py``), or as Winograd F(2x2, 3x3) when BLAS is single-threaded.
Shape-dependent work (output size, pads, slicing plans) is computed once per input shape and cached; the
activation after a Conv may run inside it (``fusion.py``). The window geometry and scratch arrays shared with the
pooling kernels are in ``windows.py``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from epctx.ep import Kernel
from epctx.errors import InvalidArgument
from epctx.providers.cpu import blas_serial as blas
from epctx.providers.cpu import fusion, layout, native, parallel
from epctx.providers.cpu.kernels.channel_rows import PixelRows, channel_rows
from epctx.providers.cpu.kernels.conv_direct import Route, route_for
from epctx.providers.cpu.kernels.conv_flat import FlatGemm, flat_gemm_fits
from epctx.providers.cpu.kernels.conv_native import DirectConv, direct_fits
from epctx.providers.cpu.kernels.conv_pointwise import pointwise_last
from epctx.providers.cpu.kernels.conv_weights import Weights, prepare_weight
from epctx.providers.cpu.kernels.depthwise import DepthwiseChannelsLast, channels_last_fits
from epctx.providers.cpu.kernels.depthwise_native import DepthwiseNative, native_fits
from epctx.providers.cpu.kernels.im2col import banded_columns, biased_weights
from epctx.providers.cpu.kernels.windows import (
    SCRATCH,
    Geometry,
    ScratchPool,
    ints,
    pad_input,
    release_padded,
    spatial_geometry,
    window_slices,
    window_view,
)
from epctx.providers.cpu.kernels.winograd import Winograd, winograd_fits, winograd_weight
from epctx.providers.cpu.registry import NodeInfo, kernel

__all__ = [
    "SCRATCH",
    "Geometry",
    "ScratchPool",
    "pad_input",
    "release_padded",
    "spatial_geometry",
    "window_view",
]

_ALL = slice(None)
_OWN_SERIAL_MACS = 1 << 18  # OpenBLAS runs a GEMM of fewer multiply-adds on one thread (blas_serial.py)
_NHWC_MIN_PIXELS = 1 << 12  # a 1x1 or im2col conv hands over channels-last from maps of this many pixels
_NHWC_MAX_COLUMNS = 32  # ... an im2col conv when it has at most this many input values per output (C * K)


def _conv_attrs(info: NodeInfo, n: int) -> tuple[tuple[int, ...], tuple[int, ...], list[int] | None, str]:
    strides = ints(info.get("strides"), n, 1)
    dilations = ints(info.get("dilations"), n, 1)
    pads = info.get("pads")
    auto_pad = info.get("auto_pad", "NOTSET") or "NOTSET"
    if isinstance(auto_pad, bytes):
        auto_pad = auto_pad.decode()
    return strides, dilations, (list(pads) if pads else None), auto_pad


def _half_in_float32(run: Kernel) -> Kernel:
    """float16 convolutions accumulate in float32, as onnxruntime's do (float16 sums drift by whole ulps)."""

    def run_any(x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None) -> Sequence[np.ndarray]:
        if x.dtype != np.float16:
            return run(x, w, b)
        (y,) = run(x.astype(np.float32), w.astype(np.float32), None if b is None else b.astype(np.float32))
        return (y.astype(np.float16),)

    return run_any


def _route_dtype(info: NodeInfo, w: np.ndarray | None, b: np.ndarray | None) -> np.dtype[Any] | None:
    """The input dtype a Conv keeps its routes for (``conv_direct.py``): its weights' when they and its bias (if
    any) are float32 or float64 constants (``const_input``: no feed replaces them); None otherwise."""
    if w is None or w.dtype not in (np.float32, np.float64) or (info.has_input(2) and b is None):
        return None
    return w.dtype


@kernel("Conv", since=1)
def _conv(info: NodeInfo) -> Kernel:
    group = int(info.get("group", 1))
    w_const = info.const_input(1)
    b_const = info.const_input(2) if info.has_input(2) else None
    route_dtype = _route_dtype(info, w_const, b_const)
    # Constant float16 weights are prepared once in float32 (see _half_in_float32).
    if w_const is not None and w_const.dtype == np.float16:
        w_const = w_const.astype(np.float32)
    if b_const is not None and b_const.dtype == np.float16:
        b_const = b_const.astype(np.float32)
    node = info.name
    cache: dict[tuple[int, ...], _ConvPlan] = {}
    routes: dict[tuple[int, ...], Route] = {}  # input shape -> its direct route, for inputs of route_dtype
    epilogue = fusion.epilogue_for(info.node, w_const)
    weights = Weights(w_const, b_const, group, epilogue, bias_input=info.has_input(2))
    handoff = _handoff(info, w_const, group, epilogue)

    def plan_for(x: np.ndarray, w: np.ndarray) -> _ConvPlan:
        n = x.ndim - 2
        kshape = tuple(w.shape[2:])
        strides, dilations, pads, auto_pad = _conv_attrs(info, n)
        if x.shape[1] != w.shape[1] * group:
            raise InvalidArgument(
                f"Conv node {node!r}: input has {x.shape[1]} channels, weight expects {w.shape[1] * group}"
            )
        geo = spatial_geometry(x.shape[2:], kshape, strides, dilations, pads, auto_pad, node=node)
        return _ConvPlan(x.shape, w.shape, geo, group)

    def first(x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None) -> tuple[np.ndarray]:
        """The call's route made now (weights fed at run time: prepared for this call); kept for later calls of
        this shape when everything but the input is constant."""
        plan = cache.get(x.shape)
        if plan is None or plan.w_shape != w.shape:
            plan = cache[x.shape] = plan_for(x, w)
        prepared, bias, activation = weights.settled()
        if w_const is None:
            prepared = prepare_weight(w, group)
        if bias is None and b is not None:  # a bias fed at run time
            bias = b.reshape(-1, 1)
        handing = handoff is not None and handoff()
        route = route_for(plan, prepared, bias, activation, handing, constant_bias=b_const is not None)
        if route_dtype is not None and x.dtype == route_dtype:  # (a dtype equals None when it is float64)
            routes[x.shape] = route
        return route(x)

    half = _half_in_float32(first)

    def run(x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None) -> Sequence[np.ndarray]:
        route = routes.get(x.shape)
        if route is not None and x.dtype == route_dtype:
            return route(x)
        return half(x, w, b)

    return run


def _handoff(
    info: NodeInfo, w: np.ndarray | None, group: int, epilogue: fusion.Epilogue | None
) -> Callable[[], bool] | None:
    """For a float32 depthwise or dense conv whose readers take channels-last memory (``layout.py``): whether it
    hands its result over channels-last, asked at each call (decided at the first, once every kernel exists)."""
    if w is None or w.dtype != np.float32 or w.ndim != 4:
        return None
    if not (w.shape[1] == 1 and group > 1) and group != 1:
        return None
    found = layout.handoff_for(info.node.outputs[0] if epilogue is None else epilogue.result)
    if found is None:
        return None
    if epilogue is None:
        return found.active
    return lambda: epilogue.active() and found.active()


def _nhwc_form(plan: _ConvPlan, unit: bool) -> str:
    """How ``plan`` may hand its result over channels-last (layout.py), or "": a 2-D depthwise conv run
    channels-last; a 1x1 conv of one image on a large map (the x^T W^T GEMM is 2-7% slower than W x on maps of
    28x28 and up, 20% on 7x7; the depthwise conv after it gains 5-20% on maps of 56x56 and up); an im2col conv
    of one image with few input values per output (a network's first conv, 3 channels 3x3: its GEMM cols^T W^T
    113 against 129 us at 112x112 to 16 channels, and the depthwise conv after it 315 -> 277 us; measured here,
    one thread)."""
    if plan.empty or len(plan.geo.out) != 2:
        return ""
    if plan.channels_last is not None:
        return "depthwise"
    one = plan.x_shape[0] == 1 and plan.group == 1 and plan.l_out >= _NHWC_MIN_PIXELS
    if one and plan.pointwise and unit:
        return "pointwise"
    dense = not (plan.pointwise or plan.depthwise or plan.winograd or plan.flat_gemm)
    if one and dense and plan.w_shape[1] * math.prod(plan.geo.kernel) <= _NHWC_MAX_COLUMNS:
        return "im2col"
    return ""


def _depthwise_form(
    x_shape: tuple[int, ...], w_shape: tuple[int, ...], geo: Geometry
) -> DepthwiseNative | DepthwiseChannelsLast | None:
    """How a depthwise conv runs channels-last: in C where the native kernels are built (``native.py``) and it
    fits, else as numpy's einsum where that pays (``depthwise.py``); None: per kernel offset in NCHW."""
    found = native.kernels()
    if found is not None and native_fits(x_shape, w_shape, geo):
        return DepthwiseNative(x_shape, w_shape, geo, found)
    if channels_last_fits(x_shape, w_shape, geo):
        return DepthwiseChannelsLast(x_shape, w_shape, geo)
    return None


def _direct_form(
    x_shape: tuple[int, ...], w_shape: tuple[int, ...], geo: Geometry, group: int
) -> DirectConv | None:
    """A dense conv run directly in C (``conv_native.py``) where the native kernels are built and it fits."""
    found = native.kernels()
    if found is None or not direct_fits(x_shape, w_shape, geo, group):
        return None
    return DirectConv(x_shape, w_shape, geo, found)


class _ConvPlan:
    __slots__ = (
        "channels_last",
        "depthwise",
        "direct",
        "empty",
        "flat_gemm",
        "geo",
        "group",
        "im2col_one",
        "l_out",
        "lean",
        "nhwc",
        "out_shape",
        "pointwise",
        "pointwise_one",
        "serial",
        "shared",
        "slices",
        "tiny",
        "w_shape",
        "winograd",
        "x_shape",
    )

    def __init__(self, x_shape: tuple[int, ...], w_shape: tuple[int, ...], geo: Geometry, group: int) -> None:
        self.x_shape = x_shape
        self.w_shape = w_shape
        self.geo = geo
        self.group = group
        n, m = x_shape[0], w_shape[0]
        self.out_shape = (n, m) + geo.out
        self.l_out = math.prod(geo.out)
        # A 0-size input or output (an empty batch): the result is an empty array of the output's shape.
        self.empty = math.prod(self.out_shape) == 0 or math.prod(x_shape) == 0
        self.pointwise = all(k == 1 for k in geo.kernel) and not geo.needs_pad
        self.depthwise = w_shape[1] == 1 and group > 1 and not self.pointwise
        self.slices = window_slices(geo) if self.depthwise else []
        self.channels_last = _depthwise_form(x_shape, w_shape, geo) if self.depthwise else None
        # Small convolutions call BLAS on one thread (see blas.SERIAL_MACS).
        macs = n * m * w_shape[1] * math.prod(geo.kernel) * self.l_out
        # A large conv of one image shares its work with helper threads, in bands (parallel.SHARE_MACS).
        self.shared = macs >= parallel.SHARE_MACS
        self.direct = None if self.depthwise or self.empty else _direct_form(x_shape, w_shape, geo, group)
        fits = self.direct is None and flat_gemm_fits(x_shape, w_shape, geo, group)
        self.flat_gemm = FlatGemm(geo, self.shared) if fits else None
        fits = self.direct is None and winograd_fits(x_shape, w_shape, geo, group)
        self.winograd = Winograd(x_shape, w_shape, geo) if fits else None
        self.serial = blas.serial() if macs < blas.SERIAL_MACS else None
        # A small pointwise conv of one image is one GEMM called straight away (squeeze-excitation blocks:
        # 50 -> 200 channels at 1x1 was 10.6 us a call for a 1.5 us GEMM); OpenBLAS keeps one that small
        # (under 2^18 multiply-adds) on one thread by itself, so the one-thread gate is skipped too.
        unit = all(s == 1 for s in geo.strides)
        self.lean = (
            self.pointwise and unit and n == 1 and group == 1 and self.serial is not None and not self.empty
        )
        self.tiny = macs < _OWN_SERIAL_MACS
        self.nhwc = _nhwc_form(self, unit)
        self.pointwise_one = self.pointwise and unit and n == 1 and group == 1 and len(geo.out) == 2
        # a dense conv of one image that ``run`` computes as im2col and one GEMM (conv_direct adds a constant
        # bias in that GEMM)
        im2col = not (self.pointwise or self.depthwise or self.flat_gemm or self.winograd)
        self.im2col_one = im2col and n == 1 and group == 1 and not self.empty

    def run(self, x: np.ndarray, prep: dict[str, Any]) -> np.ndarray:
        geo = self.geo
        n, c = x.shape[0], x.shape[1]
        g = self.group
        if self.empty:
            w = prep["w2"] if "w2" in prep else prep["w3"]
            return np.zeros(self.out_shape, dtype=np.result_type(w.dtype, x.dtype))
        if self.depthwise:
            return self._depthwise(x, prep)
        if self.winograd is not None and x.dtype.kind == "f" and x.dtype.itemsize >= 4:
            u = prep.get("winograd")
            if u is None:
                u = prep["winograd"] = winograd_weight(prep["w2"].reshape(self.w_shape))
            return self.winograd.run(x, u)
        if self.flat_gemm is not None:
            wk = prep.get("wk")
            if wk is None:  # (K, M, C): the filter of each kernel offset
                w = prep["w2"].reshape(self.w_shape)
                wk = prep["wk"] = np.ascontiguousarray(w.reshape(*self.w_shape[:2], -1).transpose(2, 0, 1))
            return self.flat_gemm.run(x, wk)
        if self.pointwise:
            if any(s != 1 for s in geo.strides):
                x = x[
                    (_ALL, _ALL)
                    + tuple(slice(None, s * (o - 1) + 1, s) for s, o in zip(geo.strides, geo.out))
                ]
            cols: np.ndarray = (
                channel_rows(x, n, c, self.l_out) if g == 1 else x.reshape(n, g, c // g, self.l_out)
            )
            scratch = None
        else:
            xp = pad_input(x, geo)
            view = window_view(xp, geo)  # (N, C, *K, *out)
            scratch = SCRATCH.take(view.shape, view.dtype)
            np.copyto(scratch, view)
            release_padded(x, xp)
            cols = scratch.reshape((n, -1, self.l_out) if g == 1 else (n, g, -1, self.l_out))
        if g == 1:
            # 2-D matmuls: numpy's broadcasting matmul is slower than plain GEMM calls.
            w2 = prep["w2"]
            y = np.empty((n, w2.shape[0], self.l_out), dtype=np.result_type(w2.dtype, cols.dtype))
            for i in range(n):
                if self.serial is None:  # a large GEMM: blocks shared with helper threads
                    parallel.matmul_columns(w2, cols[i], y[i])
                else:
                    np.matmul(w2, cols[i], out=y[i])
        else:
            y = np.matmul(prep["w3"], cols)
        if scratch is not None:
            SCRATCH.give(scratch)
        return y.reshape(self.out_shape)

    def pointwise_channels_last(self, x: np.ndarray, prep: dict[str, Any]) -> np.ndarray:
        return self.pointwise_last(prep)(x)

    def pointwise_last(
        self,
        prep: dict[str, Any],
        bias: np.ndarray | None = None,
        activation: fusion.Activation | None = None,
    ) -> Callable[[np.ndarray], np.ndarray]:
        """A 1x1 conv of one image as (H * W, C) times W^T (C, M), the result (1, H, W, M) contiguous, with a
        constant ``bias`` (M,) and ``activation`` (``conv_pointwise``); W^T kept in ``prep``."""
        w2t = prep.get("w2t")
        if w2t is None:
            w2t = prep["w2t"] = np.ascontiguousarray(prep["w2"].T)
        pixels = PixelRows(self.x_shape[1], self.l_out, len(self.geo.out))
        return pointwise_last(w2t, pixels, self.geo.out, bias, activation)

    def im2col_channels_last(
        self,
        x: np.ndarray,
        prep: dict[str, Any],
        bias: np.ndarray | None = None,
        activation: fusion.Activation | None = None,
    ) -> np.ndarray:
        """An im2col conv of one image as cols^T (H * W, C * K) times W^T: the result (1, H, W, M), contiguous.
        A constant ``bias`` (M,) is added in the GEMM: a row of ones under the columns, the bias a last column
        of the weights (kept in ``prep``, whose bias it is), saving a pass over the result (a network's first
        conv, 3 -> 16 channels at 112x112: the bias's pass over (12544, 16) took 57 us; the GEMM 108 us either
        way; measured here, one thread). A large conv in bands of output rows shared with helper threads, each
        band's ``activation`` applied while it is in cache."""
        w2 = prep["w2"] if bias is None else biased_weights(prep, bias)
        y = np.empty((1, *self.geo.out, w2.shape[0]), dtype=np.result_type(w2.dtype, x.dtype))
        flat, w2t = y.reshape(self.l_out, w2.shape[0]), w2.T

        def product(cols: np.ndarray, a: int, b: int) -> None:
            np.matmul(cols.T, w2t, out=flat[a:b])
            if activation is not None:  # after the bias: in the GEMM, or none
                activation(flat[a:b])

        banded_columns(x, self.geo, w2.shape[1], self.shared, product)
        return y

    def pointwise_gemm(self, x: np.ndarray, w2: np.ndarray) -> np.ndarray:
        return self.lean_gemm(w2)(x)

    def lean_gemm(self, w2: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
        """A ``lean`` conv: W (M, C) times x (C, H * W), the result owned (no view of another array); W and the
        shapes bound once, the GEMM called straight away when ``tiny``, else on one BLAS thread."""
        pixels = PixelRows(self.x_shape[1], self.l_out, len(self.geo.out))
        shape, flat = self.out_shape, (w2.shape[0], self.l_out)
        gate = None if self.tiny else self.serial

        def run(x: np.ndarray) -> np.ndarray:
            dtype = w2.dtype if x.dtype == w2.dtype else np.result_type(w2.dtype, x.dtype)
            y = np.empty(shape, dtype=dtype)
            if gate is None:
                np.matmul(w2, pixels(x).T, out=y.reshape(flat))
            else:
                gate(np.matmul, w2, pixels(x).T, out=y.reshape(flat))
            return y

        return run

    def _depthwise(self, x: np.ndarray, prep: dict[str, Any]) -> np.ndarray:
        if self.channels_last is not None:
            return self.channels_last.run(x, prep)
        # wd: (K, C, multiplier); out (N, C, multiplier, *out) accumulated offset by offset.
        wd = prep["wd"]
        geo = self.geo
        xp = pad_input(x, geo)
        n, c = x.shape[0], x.shape[1]
        mult = wd.shape[2]
        nd = len(geo.out)
        y = np.zeros((n, c, mult) + geo.out, dtype=np.result_type(x.dtype, wd.dtype))
        tmp = np.empty_like(y)
        wshape = (c, mult) + (1,) * nd
        for k, (_offs, src) in enumerate(self.slices):
            patch = xp[src][:, :, None]
            np.multiply(patch, wd[k].reshape(wshape), out=tmp)
            y += tmp
        release_padded(x, xp)
        return y.reshape(self.out_shape)
