"""CPU kernels: Conv (im2col + one matmul per group) and ConvTranspose (matmul + col2im scatter-add).

Shape-dependent work (output size, pads, slicing plans) is computed once per input shape and cached, so
the hot path is a padding copy, one strided gather, one BLAS call and a bias add.
"""

from __future__ import annotations

import functools
import itertools
import math
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import as_strided

from epctx.ep import Kernel
from epctx.errors import InvalidArgument
from epctx.providers.cpu import blas, fusion, parallel
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


class Geometry:
    """Where the windows of a conv/pool lie along the spatial axes of one input shape."""

    __slots__ = ("dilations", "kernel", "out", "pad_begin", "pad_end", "padded", "strides")

    def __init__(
        self,
        kernel: tuple[int, ...],
        strides: tuple[int, ...],
        dilations: tuple[int, ...],
        out: tuple[int, ...],
        pad_begin: tuple[int, ...],
        pad_end: tuple[int, ...],
        padded: tuple[int, ...],
    ) -> None:
        self.kernel = kernel
        self.strides = strides
        self.dilations = dilations
        self.out = out
        self.pad_begin = pad_begin
        self.pad_end = pad_end
        # Extent of the padded buffer the windows read: covers the input and every window.
        self.padded = padded

    @property
    def needs_pad(self) -> bool:
        return any(self.pad_begin) or any(self.pad_end)


def ints(value: Any, n: int, default: int) -> tuple[int, ...]:
    """An INTS attribute as a tuple of ``n`` ints (``default`` each when missing or empty)."""
    if value is None or len(value) == 0:
        return (default,) * n
    return tuple(int(v) for v in value)


def spatial_geometry(
    in_sp: Sequence[int],
    kernel: Sequence[int],
    strides: Sequence[int],
    dilations: Sequence[int],
    pads: Sequence[int] | None,
    auto_pad: str,
    *,
    ceil_mode: bool = False,
    node: str = "",
) -> Geometry:
    """Output size and pads per spatial axis, with onnxruntime's rules for auto_pad and ceil_mode."""
    n = len(in_sp)
    out: list[int] = []
    pb: list[int] = []
    pe: list[int] = []
    padded: list[int] = []
    for i in range(n):
        size, k, s, d = int(in_sp[i]), int(kernel[i]), int(strides[i]), int(dilations[i])
        dk = (k - 1) * d + 1
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            o = -(-size // s)
            total = max(0, (o - 1) * s + dk - size)
            head = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
            tail = total - head
        else:
            if auto_pad == "VALID" or not pads:
                head = tail = 0
            else:
                head, tail = int(pads[i]), int(pads[i + n])
            span = size + head + tail - dk
            if span < 0:
                raise InvalidArgument(
                    f"node {node!r}: kernel extent {dk} exceeds padded input size {size + head + tail} "
                    f"on spatial axis {i}"
                )
            if ceil_mode:
                o = -(-span // s) + 1
                if (o - 1) * s >= size + head:  # the last window must start inside the input or head pad
                    o -= 1
            else:
                o = span // s + 1
        out.append(o)
        pb.append(head)
        pe.append(tail)
        padded.append(max(head + size + tail, (o - 1) * s + dk))
    return Geometry(
        tuple(int(k) for k in kernel),
        tuple(int(s) for s in strides),
        tuple(int(d) for d in dilations),
        tuple(out),
        tuple(pb),
        tuple(pe),
        tuple(padded),
    )


class ScratchPool:
    """Scratch arrays reused from call to call, keyed by shape and dtype.

    Fresh multi-megabyte temporaries cost page faults on every call once the C heap has trimmed them
    (measured 2x on an isolated conv layer). Each caller takes its own array and gives it back when done,
    so concurrent runs never share one; at most ``limit`` bytes are kept.
    """

    __slots__ = ("_free", "kept", "limit")

    def __init__(self, limit: int) -> None:
        self._free: dict[tuple[tuple[int, ...], np.dtype[Any]], list[np.ndarray]] = {}
        self.kept = 0
        self.limit = limit

    def take(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        free = self._free.get((shape, np.dtype(dtype)))
        if free:
            try:
                arr = free.pop()
            except IndexError:  # another thread took the last one
                return np.empty(shape, dtype=dtype)
            self.kept -= arr.nbytes
            return arr
        return np.empty(shape, dtype=dtype)

    def give(self, *arrays: np.ndarray) -> None:
        for arr in arrays:
            if self.kept + arr.nbytes <= self.limit:
                self._free.setdefault((arr.shape, arr.dtype), []).append(arr)
                self.kept += arr.nbytes


SCRATCH = ScratchPool(128 << 20)


def pad_input(x: np.ndarray, geo: Geometry, fill: Any = 0) -> np.ndarray:
    """``x`` (N, C, *spatial) copied into a buffer of ``geo.padded`` spatial extent filled with ``fill``.

    The buffer comes from ``SCRATCH``: give it back with ``release_padded(x, buf)`` when done.
    """
    in_sp = x.shape[2:]
    if tuple(in_sp) == geo.padded:
        return x
    buf = SCRATCH.take(x.shape[:2] + geo.padded, x.dtype)
    buf.fill(fill)
    inner = (_ALL, _ALL) + tuple(slice(b, b + s) for b, s in zip(geo.pad_begin, in_sp))
    buf[inner] = x
    return buf


def release_padded(x: np.ndarray, xp: np.ndarray) -> None:
    if xp is not x:
        SCRATCH.give(xp)


def window_view(xp: np.ndarray, geo: Geometry) -> np.ndarray:
    """A read-only (N, C, *kernel, *out) view of the windows of the padded input ``xp``."""
    st = xp.strides
    sp_st = st[2:]
    shape = xp.shape[:2] + geo.kernel + geo.out
    strides = (
        st[:2]
        + tuple(s * d for s, d in zip(sp_st, geo.dilations))
        + tuple(s * t for s, t in zip(sp_st, geo.strides))
    )
    return as_strided(xp, shape=shape, strides=strides, writeable=False)


def window_slices(geo: Geometry) -> list[tuple[tuple[int, ...], tuple[slice, ...]]]:
    """For each kernel offset: the offset and the (N, C, *out) slice of the padded input it reads."""
    result = []
    for offs in itertools.product(*(range(k) for k in geo.kernel)):
        src = (_ALL, _ALL) + tuple(
            slice(o * d, o * d + s * (n - 1) + 1, s)
            for o, d, s, n in zip(offs, geo.dilations, geo.strides, geo.out)
        )
        result.append((offs, src))
    return result


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


@kernel("Conv", since=1)
def _conv(info: NodeInfo) -> Kernel:
    group = int(info.get("group", 1))
    w_const = info.const_input(1)
    b_const = info.const_input(2) if info.has_input(2) else None
    # Constant float16 weights are prepared once in float32 (see _half_in_float32).
    if w_const is not None and w_const.dtype == np.float16:
        w_const = w_const.astype(np.float32)
    if b_const is not None and b_const.dtype == np.float16:
        b_const = b_const.astype(np.float32)
    node = info.name
    cache: dict[tuple[int, ...], _ConvPlan] = {}
    prepared: dict[str, Any] = {}
    if w_const is not None:
        prepared = _prepare_weight(w_const, group)
    bias = None if b_const is None else b_const.reshape(-1, 1)
    epilogue = fusion.epilogue_for(info.node, w_const)

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

    def run(x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None) -> tuple[np.ndarray]:
        plan = cache.get(x.shape)
        if plan is None or plan.w_shape != w.shape:
            plan = cache[x.shape] = plan_for(x, w)
        prep = prepared if w_const is not None else _prepare_weight(w, group)
        y = plan.run(x, prep) if plan.serial is None else plan.serial(plan.run, x, prep)
        if b is not None:
            bb = bias if bias is not None else b.reshape(-1, 1)
            if y.size:  # an empty batch has no -1 to infer
                y3 = y.reshape(y.shape[0], y.shape[1], -1)
                y3 += bb
        if epilogue is not None and epilogue.active():
            epilogue.activation(y)
        return (y,)

    return _half_in_float32(run)


def _prepare_weight(w: np.ndarray, group: int) -> dict[str, Any]:
    m, cg = w.shape[0], w.shape[1]
    k = int(np.prod(w.shape[2:], dtype=np.int64))
    prep: dict[str, Any] = {}
    if group == 1:
        prep["w2"] = np.ascontiguousarray(w.reshape(m, cg * k))
    else:
        prep["w3"] = np.ascontiguousarray(w.reshape(group, m // group, cg * k))
    if cg == 1 and group > 1:
        # depthwise: (C, multiplier, K) per kernel offset
        prep["wd"] = np.ascontiguousarray(w.reshape(group, m // group, k).transpose(2, 0, 1))
        # channels-last: (*K, C, multiplier)
        nd = w.ndim - 2
        wl = w.reshape(group, m // group, *w.shape[2:]).transpose(*range(2, 2 + nd), 0, 1)
        prep["wl"] = np.ascontiguousarray(wl)
    return prep


class _ConvPlan:
    __slots__ = (
        "channels_last",
        "depthwise",
        "empty",
        "flat",
        "flat_gemm",
        "geo",
        "group",
        "l_out",
        "out_shape",
        "pointwise",
        "serial",
        "slices",
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
        self.flat = _DepthwiseFlat(geo) if self.depthwise and _flat_fits(x_shape, w_shape, geo) else None
        self.flat_gemm = _FlatGemm(geo) if _flat_gemm_fits(x_shape, w_shape, geo, group) else None
        self.channels_last = (
            _DepthwiseChannelsLast(x_shape, w_shape, geo)
            if self.depthwise and self.flat is None and x_shape[1] >= _CHANNELS_LAST_MIN
            else None
        )
        self.winograd = (
            _Winograd(x_shape, w_shape, geo) if _winograd_fits(x_shape, w_shape, geo, group) else None
        )
        # Small convolutions call BLAS on one thread (see blas.SERIAL_MACS).
        macs = n * m * w_shape[1] * math.prod(geo.kernel) * self.l_out
        self.serial = blas.serial() if macs < blas.SERIAL_MACS else None

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
                u = prep["winograd"] = _winograd_weight(prep["w2"].reshape(self.w_shape))
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
            cols: np.ndarray = x.reshape(n, c, self.l_out) if g == 1 else x.reshape(n, g, c // g, self.l_out)
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

    def _depthwise(self, x: np.ndarray, prep: dict[str, Any]) -> np.ndarray:
        if self.flat is not None:
            return self.flat.run(x, prep["wd"])
        if self.channels_last is not None:
            return self.channels_last.run(x, prep["wl"])
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


# Stride-1 2-D depthwise convs with at least this many output pixels (or few channels) run on flattened rows.
_FLAT_MIN_PIXELS = 1024


def _flat_fits(x_shape: tuple[int, ...], w_shape: tuple[int, ...], geo: Geometry) -> bool:
    if len(geo.out) != 2 or geo.strides != (1, 1) or w_shape[0] != x_shape[1]:
        return False
    return x_shape[1] < _CHANNELS_LAST_MIN or math.prod(geo.out) >= _FLAT_MIN_PIXELS


class _FlatLayout:
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


def _flat_gemm_fits(x_shape: tuple[int, ...], w_shape: tuple[int, ...], geo: Geometry, group: int) -> bool:
    """Dense stride-1 2-D convs with no more output than input channels: one GEMM per kernel offset on shifted
    runs (added up: M values per output pixel and offset) costs less than copying the im2col matrix (C)."""
    if group != 1 or len(geo.out) != 2 or geo.strides != (1, 1) or math.prod(geo.kernel) == 1:
        return False
    return w_shape[0] <= x_shape[1]


class _FlatGemm:
    """A dense stride-1 2-D conv without an im2col copy: for each kernel offset k, ``W_k (M, C)`` times the
    shifted runs ``(C, oh * Wp)`` of the flattened padded input (a strided operand BLAS reads in place), summed.
    Column blocks are shared with helper threads (``parallel.split_columns``). Measured on PP-OCRv4 det's
    96 -> 24 channel 3x3 conv at 80x80, one thread: 9.9 ms with the im2col copy."""

    __slots__ = ("layout",)

    def __init__(self, geo: Geometry) -> None:
        self.layout = _FlatLayout(geo)

    def run(self, x: np.ndarray, wk: np.ndarray) -> np.ndarray:
        layout = self.layout
        n, m, length = x.shape[0], wk.shape[1], layout.length
        buf = layout.padded(x)
        dt = np.result_type(x.dtype, wk.dtype)
        y = np.empty((n, m, length), dtype=dt)
        tmp = SCRATCH.take((m, length), dt)
        for i in range(n):
            xi, yi = buf[i], y[i]

            def block(lo: int, hi: int, xi: np.ndarray = xi, yi: np.ndarray = yi) -> None:
                for k, shift in enumerate(layout.shifts):
                    src = xi[:, shift + lo : shift + hi]
                    if k == 0:
                        np.matmul(wk[0], src, out=yi[:, lo:hi])
                    else:
                        part = tmp[:, lo:hi]
                        np.matmul(wk[k], src, out=part)
                        yi[:, lo:hi] += part

            parallel.split_columns(length, block)
        SCRATCH.give(buf, tmp)
        return layout.crop(y)


class _DepthwiseFlat:
    """A stride-1 2-D depthwise conv on the flattened padded input (``_FlatLayout``): one shifted
    multiply-add per kernel offset, with rows ``oh * Wp`` long. Measured here on 64 channels at 56x56, 3x3:
    560 us, against 910 for the channels-last einsum."""

    __slots__ = ("layout",)

    def __init__(self, geo: Geometry) -> None:
        self.layout = _FlatLayout(geo)

    def run(self, x: np.ndarray, wd: np.ndarray) -> np.ndarray:
        layout = self.layout
        n, c, length = x.shape[0], x.shape[1], layout.length
        buf = layout.padded(x)
        dt = np.result_type(x.dtype, wd.dtype)
        y = np.empty((n, c, length), dtype=dt)
        tmp = SCRATCH.take((n, c, length), dt)
        for k, shift in enumerate(layout.shifts):
            run = buf[:, :, shift : shift + length]
            if k == 0:
                np.multiply(run, wd[k], out=y)
            else:
                np.multiply(run, wd[k], out=tmp)
                y += tmp
        SCRATCH.give(buf, tmp)
        return layout.crop(y)


# Depthwise convolutions with at least this many channels run channels-last (one einsum over a strided window
# view, the channels innermost); with fewer, the windows' rows are too short for that to pay off.
_CHANNELS_LAST_MIN = 32


class _DepthwiseChannelsLast:
    """A depthwise conv as one einsum over an (N, *out, *K, C) window view of the input, padded channels-last:
    the inner loop runs over the channels (contiguous), with no per-offset temporaries. Measured here against
    the offset-by-offset form: 576 channels at 7x7, 5x5 kernel: 107 us vs 892 us."""

    __slots__ = ("eq", "geo", "out_nchw", "padded_shape", "view_shape")

    def __init__(self, x_shape: tuple[int, ...], w_shape: tuple[int, ...], geo: Geometry) -> None:
        nd = len(geo.out)
        self.geo = geo
        self.padded_shape = (x_shape[0], *geo.padded, x_shape[1])
        self.view_shape = (x_shape[0], *geo.out, *geo.kernel, x_shape[1])
        out, ker = "ijk"[:nd], "pqr"[:nd]
        self.eq = f"n{out}{ker}c,{ker}cm->n{out}cm"
        self.out_nchw = (0, nd + 1, *range(1, nd + 1))

    def run(self, x: np.ndarray, wl: np.ndarray) -> np.ndarray:
        geo = self.geo
        n, c = x.shape[0], x.shape[1]
        nd = len(geo.out)
        buf = SCRATCH.take(self.padded_shape, x.dtype)
        if geo.needs_pad or tuple(x.shape[2:]) != geo.padded:
            buf.fill(0)
        inner = (_ALL,) + tuple(slice(b, b + s) for b, s in zip(geo.pad_begin, x.shape[2:])) + (_ALL,)
        buf[inner] = np.moveaxis(x, 1, -1)
        st = buf.strides
        strides = (
            st[0],
            *(st[1 + i] * geo.strides[i] for i in range(nd)),
            *(st[1 + i] * geo.dilations[i] for i in range(nd)),
            st[-1],
        )
        view = as_strided(buf, shape=self.view_shape, strides=strides, writeable=False)
        y = np.einsum(self.eq, view, wl)  # (N, *out, C, multiplier)
        SCRATCH.give(buf)
        y = y.reshape((n, *geo.out, c * wl.shape[-1]))
        return np.ascontiguousarray(y.transpose(self.out_nchw))


# --------------------------------------------------------------------------------------------------------
# Winograd F(2x2, 3x3): 3x3 stride-1 convs as 16 GEMMs over 2x2 output tiles (2.25x fewer multiplies)

_WINO_G = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0.0, 0.0, 1.0]])
_WINO_MIN_TILES = 36  # below this many tiles per GEMM, im2col + one GEMM is faster
_WINO_MIN_CHANNELS = 16


@functools.cache
def _blas_single_threaded() -> bool:
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


def _winograd_fits(x_shape: tuple[int, ...], w_shape: tuple[int, ...], geo: Geometry, group: int) -> bool:
    if group != 1 or len(geo.kernel) != 2 or geo.kernel != (3, 3) or not _blas_single_threaded():
        return False
    if geo.strides != (1, 1) or geo.dilations != (1, 1):
        return False
    tiles = x_shape[0] * ((geo.out[0] + 1) // 2) * ((geo.out[1] + 1) // 2)
    return tiles >= _WINO_MIN_TILES and w_shape[0] >= _WINO_MIN_CHANNELS and w_shape[1] >= _WINO_MIN_CHANNELS


def _winograd_weight(w: np.ndarray) -> np.ndarray:
    """(M, C, 3, 3) -> U (16, M, C) = G g G^T per filter, computed in float64."""
    gw = np.tensordot(_WINO_G, w.astype(np.float64), axes=(1, 2))  # (a, M, C, j)
    u = np.tensordot(gw, _WINO_G, axes=(3, 1)).transpose(0, 3, 1, 2)  # (a, b, M, C)
    return np.ascontiguousarray(u.reshape((16,) + w.shape[:2]).astype(w.dtype))


class _Winograd:
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


# --------------------------------------------------------------------------------------------------------
# ConvTranspose


@kernel("ConvTranspose", since=1)
def _conv_transpose(info: NodeInfo) -> Kernel:
    group = int(info.get("group", 1))
    w_const = info.const_input(1)
    node = info.name
    cache: dict[tuple[int, ...], _ConvTransposePlan] = {}
    wt_const = None if w_const is None else _transpose_weight(w_const, group)

    def run(x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None) -> tuple[np.ndarray]:
        plan = cache.get(x.shape)
        if plan is None or plan.w_shape != w.shape:
            plan = cache[x.shape] = _ConvTransposePlan(info, x.shape, w.shape, group, node)
        wt = wt_const if wt_const is not None else _transpose_weight(w, group)
        y = plan.run(x, wt)
        if b is not None and y.size:
            y3 = y.reshape(y.shape[0], y.shape[1], -1)
            y3 += b.reshape(-1, 1)
        return (y,)

    return _half_in_float32(run)


def _transpose_weight(w: np.ndarray, group: int) -> np.ndarray:
    # W (C, M/group, *K) -> (group, M/group * K, C/group)
    c = w.shape[0]
    return np.ascontiguousarray(w.reshape(group, c // group, -1).transpose(0, 2, 1))


class _ConvTransposePlan:
    __slots__ = ("crop", "full", "group", "m", "slices", "w_shape", "x_shape")

    def __init__(
        self, info: NodeInfo, x_shape: tuple[int, ...], w_shape: tuple[int, ...], group: int, node: str
    ) -> None:
        nd = len(x_shape) - 2
        kshape = tuple(int(k) for k in w_shape[2:])
        strides, dilations, pads, auto_pad = _conv_attrs(info, nd)
        out_pad = ints(info.get("output_padding"), nd, 0)
        out_shape = info.get("output_shape")
        if x_shape[1] != w_shape[0]:
            raise InvalidArgument(
                f"ConvTranspose node {node!r}: input has {x_shape[1]} channels, weight expects {w_shape[0]}"
            )
        self.x_shape = x_shape
        self.w_shape = w_shape
        self.group = group
        self.m = w_shape[1] * group
        in_sp = x_shape[2:]
        full: list[int] = []
        crop: list[slice] = []
        self.slices: list[tuple[tuple[int, ...], tuple[slice, ...]]] = []
        for i in range(nd):
            size, k, s, d, op = in_sp[i], kshape[i], strides[i], dilations[i], out_pad[i]
            natural = s * (size - 1) + op + (k - 1) * d + 1
            if out_shape:
                o = int(list(out_shape)[-nd:][i])
                total = max(0, natural - o)
                head = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
            elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
                o = size * s
                total = max(0, natural - o)
                head = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
            else:
                head, tail = (0, 0) if auto_pad == "VALID" or not pads else (int(pads[i]), int(pads[i + nd]))
                o = natural - head - tail
            if o < 0:
                raise InvalidArgument(
                    f"ConvTranspose node {node!r}: negative output size on spatial axis {i}"
                )
            full.append(max(natural, head + o))
            crop.append(slice(head, head + o))
        self.full = tuple(full)
        self.crop = (_ALL, _ALL) + tuple(crop)
        for offs in itertools.product(*(range(k) for k in kshape)):
            dst = (_ALL, _ALL) + tuple(
                slice(o * d, o * d + s * (n - 1) + 1, s)
                for o, d, s, n in zip(offs, dilations, strides, in_sp)
            )
            self.slices.append((offs, dst))

    def run(self, x: np.ndarray, wt: np.ndarray) -> np.ndarray:
        n, c = x.shape[0], x.shape[1]
        g = self.group
        l_in = math.prod(x.shape[2:])
        cols = np.matmul(wt, x.reshape(n, g, c // g, l_in))  # (N, G, M/G * K, L)
        kshape = self.w_shape[2:]
        cols = cols.reshape((n, self.m) + tuple(kshape) + tuple(x.shape[2:]))
        buf = np.zeros((n, self.m) + self.full, dtype=cols.dtype)
        for offs, dst in self.slices:
            buf[dst] += cols[(_ALL, _ALL) + offs]
        return np.ascontiguousarray(buf[self.crop])
