"""CPU kernels: Resize (opset 10-19) and Upsample (opset 7, 9), separable and vectorized.

Each resized axis becomes either an index map (nearest) or a small set of taps (indices + weights per
output position: linear, cubic, antialiased filters); the output is one gather (nearest) or one weighted
gather per axis. Coordinates follow onnxruntime's float32 arithmetic so nearest-pixel choices match it.
Plans are cached per (input shape, scales, sizes, roi).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from epctx.ep import Kernel
from epctx.errors import InvalidArgument
from epctx.providers.cpu.fallback import reference_kernel
from epctx.providers.cpu.registry import NodeInfo, kernel

__all__: list[str] = []

_F = np.float32
_COORD_MODES = {
    "half_pixel",
    "half_pixel_symmetric",
    "pytorch_half_pixel",
    "align_corners",
    "asymmetric",
    "tf_half_pixel_for_nn",
    "tf_crop_and_resize",
}
_NEAREST_MODES = {"round_prefer_floor", "round_prefer_ceil", "floor", "ceil", "simple"}


class _Options:
    __slots__ = (
        "antialias",
        "axes",
        "coord",
        "cubic_a",
        "exclude_outside",
        "extrapolation",
        "keep_aspect",
        "mode",
        "name",
        "nearest",
    )

    def __init__(self, info: NodeInfo, *, legacy: bool) -> None:
        self.name = info.name
        self.mode = str(info.get("mode", "nearest"))
        if legacy:  # Upsample and Resize-10: asymmetric coordinates, floor/ceil ("simple") nearest pixel
            self.coord = "asymmetric"
            self.nearest = "simple"
        else:
            self.coord = str(info.get("coordinate_transformation_mode", "half_pixel"))
            self.nearest = str(info.get("nearest_mode", "round_prefer_floor"))
        self.cubic_a = float(info.get("cubic_coeff_a", -0.75))
        self.exclude_outside = bool(info.get("exclude_outside", 0))
        self.extrapolation = float(info.get("extrapolation_value", 0.0))
        self.antialias = bool(info.get("antialias", 0)) and self.mode != "nearest"
        axes = info.get("axes")
        self.axes = None if axes is None else [int(a) for a in axes]
        self.keep_aspect = str(info.get("keep_aspect_ratio_policy", "stretch"))

    def supported(self) -> bool:
        return (
            self.mode in ("nearest", "linear", "cubic")
            and self.coord in _COORD_MODES
            and self.nearest in _NEAREST_MODES
            and self.keep_aspect in ("stretch", "not_larger", "not_smaller")
        )


# --------------------------------------------------------------------------------------------------------
# Factories


@kernel("Resize", since=10)
def _resize(info: NodeInfo) -> Kernel:
    legacy = info.opset < 11
    opts = _Options(info, legacy=legacy)
    if not opts.supported():
        return reference_kernel(info)
    plans = _PlanCache(opts)
    if legacy:

        def run10(x: np.ndarray, scales: np.ndarray) -> tuple[np.ndarray]:
            return (plans.get(x.shape, scales, None, None).apply(x),)

        return run10

    def run(
        x: np.ndarray,
        roi: np.ndarray | None = None,
        scales: np.ndarray | None = None,
        sizes: np.ndarray | None = None,
    ) -> tuple[np.ndarray]:
        return (plans.get(x.shape, scales, sizes, roi).apply(x),)

    return run


@kernel("Upsample", since=7)
def _upsample(info: NodeInfo) -> Kernel:
    opts = _Options(info, legacy=True)
    if not opts.supported():
        return reference_kernel(info)
    plans = _PlanCache(opts)
    if info.opset < 9:
        attr_scales = np.asarray(info.get("scales", []), dtype=np.float32)

        def run7(x: np.ndarray) -> tuple[np.ndarray]:
            return (plans.get(x.shape, attr_scales, None, None).apply(x),)

        return run7

    def run9(x: np.ndarray, scales: np.ndarray) -> tuple[np.ndarray]:
        return (plans.get(x.shape, scales, None, None).apply(x),)

    return run9


# --------------------------------------------------------------------------------------------------------
# Plans


class _PlanCache:
    def __init__(self, opts: _Options) -> None:
        self.opts = opts
        self.cache: dict[tuple[Any, ...], _Plan] = {}

    def get(
        self,
        shape: tuple[int, ...],
        scales: np.ndarray | None,
        sizes: np.ndarray | None,
        roi: np.ndarray | None,
    ) -> _Plan:
        key = (shape, _key(scales), _key(sizes), _key(roi))
        plan = self.cache.get(key)
        if plan is None:
            if len(self.cache) > 64:
                self.cache.clear()
            plan = self.cache[key] = _Plan(self.opts, shape, scales, sizes, roi)
        return plan


def _key(a: np.ndarray | None) -> Any:
    if a is None or a.size == 0:
        return None
    return (a.dtype.str, a.tobytes())


class _Axis:
    """One resized axis: output positions read ``idx`` (out,) or ``idx`` (out, taps) with ``weights``."""

    __slots__ = ("axis", "idx", "outside", "weights")

    def __init__(self, axis: int, idx: np.ndarray, weights: np.ndarray, outside: np.ndarray | None) -> None:
        self.axis = axis
        self.idx = idx
        self.weights = weights
        self.outside = outside if outside is not None and outside.any() else None


class _Plan:
    def __init__(
        self,
        opts: _Options,
        shape: tuple[int, ...],
        scales: np.ndarray | None,
        sizes: np.ndarray | None,
        roi: np.ndarray | None,
    ) -> None:
        self.opts = opts
        rank = len(shape)
        out, scale = _output_size(opts, shape, scales, sizes)
        self.out_shape = tuple(out)
        self.identity = self.out_shape == tuple(shape)
        roi_full = _full_roi(opts, rank, roi)
        self.axes: list[_Axis] = []
        if self.identity:
            return
        for a in range(rank):
            if opts.antialias:
                if out[a] == shape[a]:
                    continue
            elif scale[a] == _F(1.0):
                continue
            self.axes.append(_axis_plan(opts, a, shape[a], out[a], scale[a], roi_full[a], roi_full[a + rank]))
        # Shrinking axes first keeps the intermediate small.
        if opts.antialias:
            # onnxruntime filters the innermost axis first (matters for integer rounding)
            self.axes.sort(key=lambda ax: -ax.axis)
        else:
            self.axes.sort(key=lambda ax: self.out_shape[ax.axis] / max(shape[ax.axis], 1))
        self.nearest = opts.mode == "nearest"

    def apply(self, x: np.ndarray) -> np.ndarray:
        if self.identity:
            return x.copy()
        if any(d == 0 for d in self.out_shape):
            return np.empty(self.out_shape, dtype=x.dtype)
        if self.nearest:
            y = _gather(x, self.axes)
        else:
            y = _interpolate(x, self.axes, round_ints=self.opts.antialias)
        self._extrapolate(y)
        return y

    def _extrapolate(self, y: np.ndarray) -> None:
        for ax in self.axes:
            if ax.outside is not None:
                index: list[Any] = [slice(None)] * y.ndim
                index[ax.axis] = ax.outside
                y[tuple(index)] = self.opts.extrapolation


def _output_size(
    opts: _Options, shape: tuple[int, ...], scales: np.ndarray | None, sizes: np.ndarray | None
) -> tuple[list[int], list[Any]]:
    rank = len(shape)
    axes = list(range(rank)) if opts.axes is None else [a + rank if a < 0 else a for a in opts.axes]
    if any(not 0 <= a < rank for a in axes):
        raise InvalidArgument(f"Resize node {opts.name!r}: axes {opts.axes} out of range for rank {rank}")
    out = list(shape)
    scale = [_F(1.0)] * rank
    if sizes is not None and sizes.size > 0:
        vals = [int(v) for v in sizes.reshape(-1)]
        if len(vals) != len(axes):
            raise InvalidArgument(f"Resize node {opts.name!r}: {len(vals)} sizes for {len(axes)} axes")
        for a, v in zip(axes, vals):
            out[a] = v
            scale[a] = _F(v) / _F(shape[a]) if shape[a] else _F(1.0)
        if opts.keep_aspect != "stretch":
            picked = [scale[a] for a in axes]
            s = min(picked) if opts.keep_aspect == "not_larger" else max(picked)
            for a in axes:
                scale[a] = s
                out[a] = math.floor(float(_F(s) * _F(shape[a])) + 0.5)
        return out, scale
    if scales is None or scales.size == 0:
        raise InvalidArgument(f"Resize node {opts.name!r}: one of scales and sizes must be given")
    vals_f = [_F(v) for v in scales.reshape(-1)]
    if len(vals_f) != len(axes):
        raise InvalidArgument(f"Resize node {opts.name!r}: {len(vals_f)} scales for {len(axes)} axes")
    for a, v in zip(axes, vals_f):
        if not v > 0:
            raise InvalidArgument(f"Resize node {opts.name!r}: scales must be positive, got {float(v)}")
        scale[a] = v
        out[a] = int(v * _F(shape[a]))
    return out, scale


def _full_roi(opts: _Options, rank: int, roi: np.ndarray | None) -> list[float]:
    full = [0.0] * rank + [1.0] * rank
    if roi is None or roi.size == 0 or opts.coord != "tf_crop_and_resize":
        return full
    vals = [float(v) for v in roi.reshape(-1)]
    axes = list(range(rank)) if opts.axes is None else [a + rank if a < 0 else a for a in opts.axes]
    if len(vals) != 2 * len(axes):
        raise InvalidArgument(f"Resize node {opts.name!r}: roi has {len(vals)} values for {len(axes)} axes")
    for i, a in enumerate(axes):
        full[a] = vals[i]
        full[a + rank] = vals[i + len(axes)]
    return full


# --------------------------------------------------------------------------------------------------------
# Coordinates and taps


def _original(opts: _Options, n_in: int, n_out: int, scale: Any, r0: float, r1: float) -> np.ndarray:
    """Source coordinate of every output position, in onnxruntime's float32 arithmetic."""
    x = np.arange(n_out, dtype=_F)
    s = _F(scale)
    half = _F(0.5)
    mode = opts.coord
    if mode == "half_pixel":
        return (x + half) / s - half
    if mode == "asymmetric":
        return x / s
    if mode == "pytorch_half_pixel":
        return (x + half) / s - half if n_out > 1 else np.zeros(n_out, dtype=_F)
    if mode == "tf_half_pixel_for_nn":
        return (x + half) / s
    if mode == "align_corners":
        if n_out == 1:
            return np.zeros(1, dtype=_F)
        return x * _F(n_in - 1) / _F(n_out - 1)
    if mode == "half_pixel_symmetric":
        adjustment = _F(n_out) / (s * _F(n_in))
        offset = _F(n_in) / _F(2) * (_F(1) - adjustment)
        # onnxruntime evaluates this sum in double precision
        return (np.float64(offset) + (x.astype(np.float64) + 0.5) / np.float64(s) - 0.5).astype(_F)
    # tf_crop_and_resize
    f0, f1 = _F(r0), _F(r1)
    if n_out > 1:
        return f0 * _F(n_in - 1) + (x * (f1 - f0) * _F(n_in - 1)) / _F(n_out - 1)
    return np.full(n_out, 0.5 * (r0 + r1) * (n_in - 1), dtype=_F)


def _outside(opts: _Options, coord: np.ndarray, n_in: int) -> np.ndarray | None:
    if opts.coord != "tf_crop_and_resize":
        return None
    return (coord < 0) | (coord > _F(n_in - 1))


def _nearest_index(mode: str, x: np.ndarray, down: bool) -> np.ndarray:
    fl = np.floor(x)
    if mode in ("round_prefer_floor", "round_prefer_ceil"):
        # onnxruntime treats coordinates within 1e-6 of a half-way point as half-way.
        half = np.abs(x - (fl + _F(0.5))) < _F(1e-6)
        r = np.where(half, fl if mode == "round_prefer_floor" else fl + 1, np.rint(x))
    elif mode == "floor":
        r = fl
    elif mode == "ceil":
        r = np.ceil(x)
    else:  # simple
        r = np.ceil(x) if down else np.trunc(x)
    return r.astype(np.int64)


def _axis_plan(opts: _Options, axis: int, n_in: int, n_out: int, scale: Any, r0: float, r1: float) -> _Axis:
    if opts.antialias:
        return _antialias_axis(opts, axis, n_in, n_out, scale, r0, r1)
    coord = _original(opts, n_in, n_out, scale, r0, r1)
    outside = _outside(opts, coord, n_in)
    if opts.mode == "nearest":
        idx = np.clip(_nearest_index(opts.nearest, coord, bool(scale < 1)), 0, n_in - 1)
        return _Axis(axis, idx.astype(np.intp), np.ones(0, dtype=_F), outside)
    if opts.mode == "linear":
        c = np.clip(coord, _F(0), _F(n_in - 1))
        i1 = np.minimum(c.astype(np.int64), n_in - 1)
        i2 = np.minimum(i1 + 1, n_in - 1)
        d1 = np.abs(c - i1.astype(_F))
        d2 = np.abs(c - i2.astype(_F))
        same = i1 == i2
        d1[same] = 0.5
        d2[same] = 0.5
        return _Axis(axis, np.stack([i1, i2], 1).astype(np.intp), np.stack([d2, d1], 1), outside)
    return _cubic_axis(opts, axis, n_in, coord, outside)


def _cubic_axis(opts: _Options, axis: int, n_in: int, coord: np.ndarray, outside: np.ndarray | None) -> _Axis:
    a = _F(opts.cubic_a)
    base = np.floor(coord)
    s = np.abs(coord - base)
    one, two = _F(1), _F(2)
    c0 = ((a * (s + one) - _F(5) * a) * (s + one) + _F(8) * a) * (s + one) - _F(4) * a
    c1 = ((a + two) * s - (a + _F(3))) * s * s + one
    c2 = ((a + two) * (one - s) - (a + _F(3))) * (one - s) * (one - s) + one
    c3 = ((a * (two - s) - _F(5) * a) * (two - s) + _F(8) * a) * (two - s) - _F(4) * a
    w = np.stack([c0, c1, c2, c3], 1)
    taps = base.astype(np.int64)[:, None] + np.arange(-1, 3)[None, :]
    if opts.exclude_outside:
        w = np.where((taps < 0) | (taps >= n_in), _F(0), w)
        w = w / w.sum(axis=1, keepdims=True)
    return _Axis(axis, np.clip(taps, 0, n_in - 1).astype(np.intp), w.astype(_F), outside)


def _linear_filter(x: np.ndarray, a: Any) -> np.ndarray:
    x = np.abs(x)
    return np.where(x < 1, _F(1) - x, _F(0)).astype(_F)


def _cubic_filter(x: np.ndarray, a: Any) -> np.ndarray:
    x = np.abs(x)
    inner = ((a + _F(2)) * x - (a + _F(3))) * x * x + _F(1)
    outer = (((x - _F(5)) * x + _F(8)) * x - _F(4)) * a
    return np.where(x < 1, inner, np.where(x < 2, outer, _F(0))).astype(_F)


def _antialias_axis(
    opts: _Options, axis: int, n_in: int, n_out: int, rscale: Any, r0: float, r1: float
) -> _Axis:
    # Pillow-style filter: widened by 1/scale when shrinking, normalized per output position.
    filt: Callable[[np.ndarray, Any], np.ndarray]
    filt, support_size = (_linear_filter, 2.0) if opts.mode == "linear" else (_cubic_filter, 4.0)
    scale = _F(1) / _F(rscale)
    support = _F(support_size * 0.5) * scale if scale >= 1 else _F(support_size * 0.5)
    inv_scale = _F(1) / scale if scale >= 1 else _F(1)
    if scale == _F(1):
        coord = np.arange(n_out, dtype=_F)
    else:
        coord = _original(opts, n_in, n_out, rscale, r0, r1)
    center = coord + _F(0.5)
    outside = _outside(opts, coord, n_in)
    xmin = np.floor(center - support + _F(0.5)).astype(np.int64)
    xmax = np.floor(center + support + _F(0.5)).astype(np.int64)
    if opts.exclude_outside:
        xmin = np.maximum(xmin, 0)
        xmax = np.minimum(xmax, n_in)
    width = int(max(int((xmax - xmin).max()), 1))
    taps = xmin[:, None] + np.arange(width)[None, :]
    valid = taps < xmax[:, None]
    w = filt((taps.astype(_F) - center[:, None] + _F(0.5)) * inv_scale, _F(opts.cubic_a))
    w = np.where(valid, w, _F(0)).astype(_F)
    # Sequential float32 sums in onnxruntime's order (integer outputs round these weights to fixed point).
    total = np.zeros(n_out, dtype=_F)
    for t in range(width):
        total += w[:, t]
    if not opts.exclude_outside:
        _fold_edges(w, taps, n_in)
    w *= np.where(total == 0, _F(1), _F(1) / total)[:, None]
    return _Axis(axis, np.clip(taps, 0, n_in - 1).astype(np.intp), w, outside)


def _fold_edges(w: np.ndarray, taps: np.ndarray, n_in: int) -> None:
    """Move the weights of taps left of 0 / right of ``n_in - 1`` onto the edge taps, in place."""
    width = taps.shape[1]
    first = taps[:, 0]
    rows = np.arange(taps.shape[0])
    lo_col = np.clip(-first, 0, width - 1)  # column of tap 0 in rows that start left of the input
    hi_col = np.clip(n_in - 1 - first, 0, width - 1)  # column of tap n_in - 1
    lo_acc = w[rows, lo_col].copy()
    hi_acc = w[rows, hi_col].copy()
    for t in range(width):
        lo_acc += np.where(taps[:, t] < 0, w[:, t], _F(0))
        hi_acc += np.where(taps[:, t] > n_in - 1, w[:, t], _F(0))
    outside = (taps < 0) | (taps > n_in - 1)
    w[outside] = 0
    has_lo = first < 0
    has_hi = (taps > n_in - 1).any(axis=1)
    w[rows[has_lo], lo_col[has_lo]] = lo_acc[has_lo]
    w[rows[has_hi], hi_col[has_hi]] = hi_acc[has_hi]


# --------------------------------------------------------------------------------------------------------
# Application


def _gather(x: np.ndarray, axes: list[_Axis]) -> np.ndarray:
    if not axes:
        return x.copy()
    first = min(ax.axis for ax in axes)
    last = max(ax.axis for ax in axes)
    by_axis = {ax.axis: ax.idx for ax in axes}
    span = [by_axis.get(a, np.arange(x.shape[a], dtype=np.intp)) for a in range(first, last + 1)]
    index: tuple[Any, ...] = (slice(None),) * first + np.ix_(*span)
    return x[index]


def _compute_dtype(dtype: np.dtype[Any]) -> Any:
    return np.float64 if dtype == np.float64 else np.float32


def _interpolate(x: np.ndarray, axes: list[_Axis], *, round_ints: bool) -> np.ndarray:
    if round_ints and x.dtype.kind in "iu":
        return _interpolate_int_antialias(x, axes)
    ct = _compute_dtype(x.dtype)
    y = x.astype(ct, copy=False)
    for ax in axes:
        y = _taps(y, ax, ax.weights.astype(ct, copy=False))
    if y.dtype == x.dtype:
        return y
    if x.dtype.kind in "iu":
        # onnxruntime truncates interpolated integers
        info = np.iinfo(x.dtype)
        return np.clip(np.trunc(y), info.min, info.max).astype(x.dtype)
    return y.astype(x.dtype)


def _taps(y: np.ndarray, ax: _Axis, weights: np.ndarray) -> np.ndarray:
    """Weighted gather along ``ax.axis``: sum over taps t of weights[:, t] * y[..., idx[:, t], ...]."""
    bshape = (1,) * ax.axis + (weights.shape[0],) + (1,) * (y.ndim - ax.axis - 1)
    acc = np.take(y, ax.idx[:, 0], axis=ax.axis)
    acc *= weights[:, 0].reshape(bshape)
    for t in range(1, ax.idx.shape[1]):
        g = np.take(y, ax.idx[:, t], axis=ax.axis)
        g *= weights[:, t].reshape(bshape)
        acc += g
    return acc


def _interpolate_int_antialias(x: np.ndarray, axes: list[_Axis]) -> np.ndarray:
    # onnxruntime's integer antialias path rounds after every axis: 8-bit types use 22-bit fixed-point
    # weights, round half up and clip to [0, 255]; int32 accumulates in float32 and rounds half away.
    y = x
    for ax in axes:
        if x.dtype.itemsize == 1:
            scaled = ax.weights.astype(np.float64) * (1 << 22)
            w = (np.sign(scaled) * np.floor(np.abs(scaled) + 0.5)).astype(np.int64)  # half away from zero
            acc = _taps(y.astype(np.int64), ax, w) + (1 << 21)
            y = np.clip(acc >> 22, 0, 255).astype(np.uint8).view(np.uint8).astype(x.dtype, casting="unsafe")
        else:
            acc = _taps(y.astype(np.float32), ax, ax.weights)
            y = (np.sign(acc) * np.floor(np.abs(acc) + _F(0.5))).astype(x.dtype)
    return y
