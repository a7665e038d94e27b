"""CPU kernels: MaxPool (with Indices), AveragePool, LpPool and the Global* pools.

A pool is a loop over the kernel offsets (9 for a 3x3 window) of one vectorized max / add over the whole
(N, C, *out) block; window geometry, pads, element counts and index offsets are computed once per input
shape and cached.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from epctx.ep import Kernel
from epctx.providers.cpu import blas_serial as blas
from epctx.providers.cpu.kernels.pool_max import UnpaddedMax
from epctx.providers.cpu.kernels.windows import (
    Geometry,
    ints,
    pad_input,
    release_padded,
    spatial_geometry,
    window_slices,
)
from epctx.providers.cpu.registry import NodeInfo, kernel

__all__: list[str] = []

_ALL = slice(None)


def _pool_geometry(info: NodeInfo, in_sp: tuple[int, ...]) -> Geometry:
    n = len(in_sp)
    kshape = info.get("kernel_shape")
    if not kshape:
        raise _missing(info, "kernel_shape")
    auto_pad = info.get("auto_pad", "NOTSET") or "NOTSET"
    pads = info.get("pads")
    return spatial_geometry(
        in_sp,
        [int(k) for k in kshape],
        ints(info.get("strides"), n, 1),
        ints(info.get("dilations"), n, 1),
        list(pads) if pads else None,
        auto_pad,
        ceil_mode=bool(info.get("ceil_mode", 0)),
        node=info.name,
    )


def _missing(info: NodeInfo, attr: str) -> Exception:
    from epctx.errors import InvalidGraph

    return InvalidGraph(f"{info.op_type} node {info.name!r}: required attribute {attr!r} is missing")


def _lowest(dtype: np.dtype[Any]) -> Any:
    if dtype.kind == "f":
        return -np.inf
    return np.iinfo(dtype).min


class _PoolPlan:
    __slots__ = ("counts", "geo", "index_offsets", "slices")

    def __init__(self, geo: Geometry) -> None:
        self.geo = geo
        self.slices = [src for _offs, src in window_slices(geo)]
        self.counts = np.ones(geo.out)
        self.index_offsets: list[np.ndarray] = []

    def reduce_max(self, xp: np.ndarray) -> np.ndarray:
        """The window max one axis at a time (max is separable, NaN spreading the same way): K1 + K2 - 2 maxima
        instead of K1 * K2 - 1, the last axis over the flattened rows (long runs, the columns past each row's
        windows cropped once). YOLOv8's SPPF pools, 5x5 stride 1 on (1, 128, 10, 10): 180-200 -> ~40 us."""
        geo, a = self.geo, xp
        last = len(geo.out) - 1
        rows = geo.strides[last] == 1 and geo.kernel[last] > 1 and geo.out[last] > 0 and a.size > 0
        if rows and a.flags.c_contiguous:
            a = _max_along_rows(a, geo.kernel[last], geo.dilations[last], geo.out[last])
        else:
            a = _max_along(
                a, 2 + last, geo.kernel[last], geo.dilations[last], geo.strides[last], geo.out[last]
            )
        for i in range(last):
            a = _max_along(a, 2 + i, geo.kernel[i], geo.dilations[i], geo.strides[i], geo.out[i])
        return a

    def reduce_sum(self, xp: np.ndarray) -> np.ndarray:
        slices = self.slices
        y = np.array(xp[slices[0]], copy=True)
        for src in slices[1:]:
            y += xp[src]
        return y


def _max_along(a: np.ndarray, axis: int, k: int, d: int, s: int, o: int) -> np.ndarray:
    """max over windows of ``k`` values (dilation ``d``, stride ``s``, ``o`` windows) along ``axis``: a new array."""
    index: list[Any] = [_ALL] * a.ndim

    def part(t: int) -> np.ndarray:
        index[axis] = slice(t * d, t * d + s * (o - 1) + 1, s)
        return a[tuple(index)]

    if k == 1:
        return np.array(part(0), copy=True)
    y = np.maximum(part(0), part(1))
    for t in range(2, k):
        np.maximum(y, part(t), out=y)
    return y


def _max_along_rows(a: np.ndarray, k: int, d: int, o: int) -> np.ndarray:
    """max over windows of ``k`` values (dilation ``d``, stride 1) along the last axis of the contiguous ``a``,
    on the flattened rows: each maximum one long run; the windows of the first ``o`` columns of a row stay in
    that row, the values past them (windows running into the next row, or not computed at the end) are cropped
    by the final copy."""
    flat = a.reshape(-1)
    length = flat.size - (k - 1) * d
    y = np.empty_like(flat)
    head = y[:length]
    np.maximum(flat[:length], flat[d : d + length], out=head)
    for t in range(2, k):
        np.maximum(head, flat[t * d : t * d + length], out=head)
    return np.ascontiguousarray(y.reshape(a.shape)[..., :o])


def _plan_cache(info: NodeInfo, extra: Any = None) -> Any:
    cache: dict[tuple[int, ...], _PoolPlan] = {}

    def get(shape: tuple[int, ...]) -> _PoolPlan:
        plan = cache.get(shape)
        if plan is None:
            plan = cache[shape] = _PoolPlan(_pool_geometry(info, shape[2:]))
            if extra is not None:
                extra(plan, shape)
        return plan

    return get


# --------------------------------------------------------------------------------------------------------
# MaxPool


@kernel("MaxPool", since=1)
def _max_pool(info: NodeInfo) -> Kernel:
    with_indices = info.has_output(1)
    column_major = int(info.get("storage_order", 0)) == 1
    plans = _plan_cache(info, _index_offsets(column_major) if with_indices else None)
    unpadded: dict[tuple[int, ...], UnpaddedMax | None] = {}  # per input shape (pool_max.py)

    def run(x: np.ndarray) -> tuple[np.ndarray, ...]:
        plan = plans(x.shape)
        if not with_indices:
            if x.shape not in unpadded:
                pays = UnpaddedMax.pays(plan.geo, x.shape)
                unpadded[x.shape] = UnpaddedMax(plan.geo, x.shape[2:]) if pays else None
            fast = unpadded[x.shape]
            if fast is not None:
                return (fast(x),)
        xp = pad_input(x, plan.geo, _lowest(x.dtype))
        result = (plan.reduce_max(xp),) if not with_indices else _max_with_indices(plan, xp, x.shape)
        release_padded(x, xp)
        return result

    return run


def _index_offsets(column_major: bool) -> Any:
    def extra(plan: _PoolPlan, shape: tuple[int, ...]) -> None:
        geo = plan.geo
        in_sp = shape[2:]
        nd = len(in_sp)
        # Flat-index weight of each spatial axis within one (n, c) image.
        if column_major:
            weights = [math.prod(in_sp[:i]) for i in range(nd)]
        else:
            weights = [math.prod(in_sp[i + 1 :]) for i in range(nd)]
        grids = np.meshgrid(*(np.arange(o, dtype=np.int64) for o in geo.out), indexing="ij")
        offsets = []
        for offs, _src in window_slices(geo):
            flat = np.zeros(geo.out, dtype=np.int64)
            for i in range(nd):
                coord = grids[i] * geo.strides[i] + offs[i] * geo.dilations[i] - geo.pad_begin[i]
                flat += coord * weights[i]
            offsets.append(flat)
        plan.index_offsets = offsets

    return extra


def _max_with_indices(
    plan: _PoolPlan, xp: np.ndarray, shape: tuple[int, ...]
) -> tuple[np.ndarray, np.ndarray]:
    slices = plan.slices
    offsets = plan.index_offsets
    y = np.array(xp[slices[0]], copy=True)
    idx = np.empty(y.shape, dtype=np.int64)
    idx[...] = offsets[0]
    mask = np.empty(y.shape, dtype=bool)
    for k in range(1, len(slices)):
        patch = xp[slices[k]]
        np.greater(patch, y, out=mask)
        np.copyto(y, patch, where=mask)
        np.copyto(idx, offsets[k], where=mask)
    n, c = shape[0], shape[1]
    image = math.prod(shape[2:])
    idx += (np.arange(n * c, dtype=np.int64) * image).reshape((n, c) + (1,) * (len(shape) - 2))
    return y, idx


# --------------------------------------------------------------------------------------------------------
# AveragePool, LpPool


def _counts(include_pad: bool) -> Any:
    def extra(plan: _PoolPlan, shape: tuple[int, ...]) -> None:
        geo = plan.geo
        in_sp = shape[2:]
        mask = np.zeros((1, 1) + geo.padded, dtype=np.float64)
        if include_pad:
            region = tuple(slice(0, b + s + e) for b, s, e in zip(geo.pad_begin, in_sp, geo.pad_end))
        else:
            region = tuple(slice(b, b + s) for b, s in zip(geo.pad_begin, in_sp))
        mask[(0, 0) + region] = 1.0
        plan.counts = plan.reduce_sum(mask)

    return extra


@kernel("AveragePool", since=1)
def _average_pool(info: NodeInfo) -> Kernel:
    include_pad = int(info.get("count_include_pad", 0)) == 1
    plans = _plan_cache(info, _counts(include_pad))
    recips: dict[tuple[tuple[int, ...], Any], np.ndarray] = {}

    def run(x: np.ndarray) -> tuple[np.ndarray]:
        plan = plans(x.shape)
        key = (x.shape, x.dtype)
        recip = recips.get(key)
        if recip is None:
            recip = recips[key] = (1.0 / plan.counts).astype(x.dtype)
        xp = pad_input(x, plan.geo)
        y = plan.reduce_sum(xp)
        release_padded(x, xp)
        y *= recip
        return (y,)

    return run


@kernel("LpPool", since=1)
def _lp_pool(info: NodeInfo) -> Kernel:
    p = float(info.get("p", 2))
    plans = _plan_cache(info)

    def run(x: np.ndarray) -> tuple[np.ndarray]:
        plan = plans(x.shape)
        powered = _abs_pow(x, p)
        xp = pad_input(powered, plan.geo)
        y = plan.reduce_sum(xp)
        release_padded(powered, xp)
        return (_root(y, p),)

    return run


def _abs_pow(x: np.ndarray, p: float) -> np.ndarray:
    if p == 2.0:
        return x * x
    if p == 1.0:
        return np.abs(x)
    return np.power(np.abs(x), x.dtype.type(p))


def _root(y: np.ndarray, p: float) -> np.ndarray:
    if p == 2.0:
        return np.sqrt(y, out=y)
    if p == 1.0:
        return y
    return np.power(y, y.dtype.type(1.0 / p), out=y)


# --------------------------------------------------------------------------------------------------------
# Global pools


def _spatial_axes(x: np.ndarray) -> tuple[int, ...]:
    if x.ndim < 3:
        from epctx.errors import InvalidArgument

        raise InvalidArgument(f"global pooling needs an input of rank >= 3 (N, C, ...), got shape {x.shape}")
    return tuple(range(2, x.ndim))


@kernel("GlobalAveragePool", since=1)
def _global_average_pool(info: NodeInfo) -> Kernel:
    # (shape, strides, dtype) -> how to take the input (``_GemvPool``), or None: numpy's mean
    found: dict[tuple[Any, ...], _GemvPool | None] = {}
    gate = blas.serial()

    def run(x: np.ndarray) -> tuple[np.ndarray]:
        key = (x.shape, x.strides, x.dtype)
        how = found.get(key)
        if how is None:
            if key in found:
                return (x.mean(axis=_spatial_axes(x), keepdims=True),)
            how = found[key] = _GemvPool.of(x, gate)
            if how is None:
                return (x.mean(axis=_spatial_axes(x), keepdims=True),)
        return (how.pool(x),)

    return run


# Above this many values a gemv could wake OpenBLAS's other threads: it runs on one (blas_serial).
_GEMV_SERIAL = 1 << 18


class _GemvPool:
    """A global average pool as one BLAS gemv, laid out once per input shape, strides and dtype: (N * C, H * W)
    rows times a vector of 1 / (H * W), 4-5x numpy's mean on the small maps of squeeze-excitation blocks (200 x
    2 x 96: 10.9 -> 2.4 us), no less accurate; channels-last memory (a depthwise conv's hand-off, layout.py):
    the vector times each (H * W, C) matrix. Float32 and float64 inputs of rank >= 3 with values, contiguous or
    channels-last."""

    __slots__ = ("gate", "last", "out_shape", "rows", "v")

    def __init__(self, x: np.ndarray, last: tuple[int, ...] | None, gate: Any) -> None:
        n, c, size = x.shape[0], x.shape[1], math.prod(x.shape[2:])
        self.v = np.full(size, 1.0 / size, dtype=x.dtype)
        self.last = last  # the axes that make x's memory (N, *spatial, C), or None: x is contiguous
        self.rows = (n * c, size) if last is None else (n, size, c)
        self.out_shape = (n, c) + (1,) * (x.ndim - 2)
        self.gate = gate if x.size >= _GEMV_SERIAL else None

    @classmethod
    def of(cls, x: np.ndarray, gate: Any) -> _GemvPool | None:
        if x.ndim < 3 or x.dtype not in (np.float32, np.float64) or not x.size:
            return None
        if x.flags.c_contiguous:
            return cls(x, None, gate)
        last = (0, *range(2, x.ndim), 1)
        return cls(x, last, gate) if x.transpose(last).flags.c_contiguous else None

    def pool(self, x: np.ndarray) -> np.ndarray:
        if self.last is None:
            rows = x.reshape(self.rows)
            y = rows @ self.v if self.gate is None else self.gate(np.matmul, rows, self.v)
        else:
            rows = x.transpose(self.last).reshape(self.rows)
            y = self.v @ rows if self.gate is None else self.gate(np.matmul, self.v, rows)
        return y.reshape(self.out_shape)


@kernel("GlobalMaxPool", since=1)
def _global_max_pool(info: NodeInfo) -> Kernel:
    def run(x: np.ndarray) -> tuple[np.ndarray]:
        return (x.max(axis=_spatial_axes(x), keepdims=True),)

    return run


@kernel("GlobalLpPool", since=2)
def _global_lp_pool(info: NodeInfo) -> Kernel:
    p = float(info.get("p", 2))

    def run(x: np.ndarray) -> tuple[np.ndarray]:
        y = _abs_pow(x, p).sum(axis=_spatial_axes(x), keepdims=True)
        return (_root(y, p),)

    return run
