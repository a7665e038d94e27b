"""CPU kernels: BatchNormalization, LayerNormalization, InstanceNormalization, GroupNormalization,
LpNormalization.

BatchNormalization in inference mode is one fused multiply-add with ``scale / sqrt(var + eps)`` and
``B - mean * scale / sqrt(var + eps)`` precomputed when the parameters are constants (whatever the opset
and whether or not a ``momentum`` attribute is present); training mode follows onnxruntime's outputs.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from epctx.ep import Kernel
from epctx.errors import InvalidArgument
from epctx.providers.cpu.fallback import reference_kernel
from epctx.providers.cpu.registry import NodeInfo, kernel

__all__: list[str] = []


def _compute_dtype(dtype: np.dtype[Any]) -> type[np.floating[Any]]:
    """float64 stays float64; every narrower float is computed in float32."""
    return np.float64 if dtype == np.float64 else np.float32


# --------------------------------------------------------------------------------------------------------
# BatchNormalization


def _param_shape(p: np.ndarray, ndim: int) -> tuple[int, ...]:
    # (C,) -> (C, 1, ..., 1); the (C, D1, ...) parameters of spatial=0 broadcast as they are.
    if p.ndim == 1:
        return (p.shape[0],) + (1,) * max(ndim - 2, 0)
    return p.shape


def _bn_affine(
    scale: np.ndarray, bias: np.ndarray, mean: np.ndarray, var: np.ndarray, eps: float
) -> tuple[np.ndarray, np.ndarray]:
    a = scale.astype(np.float64) / np.sqrt(var.astype(np.float64) + eps)
    b = bias.astype(np.float64) - mean.astype(np.float64) * a
    return a, b


@kernel("BatchNormalization", since=1)
def _batch_norm(info: NodeInfo) -> Kernel:
    eps = float(info.get("epsilon", 1e-5))
    momentum = float(info.get("momentum", 0.9))
    if info.opset >= 14:
        training = int(info.get("training_mode", 0)) == 1
    else:
        training = any(info.has_output(i) for i in range(1, info.num_outputs))
    if training:
        if info.opset < 6:
            return reference_kernel(info)
        return _batch_norm_training(info, eps, momentum)

    sc, bi, mu, va = (info.const_input(i) for i in range(1, 5))
    prepared: dict[tuple[int, Any], tuple[np.ndarray, np.ndarray]] = {}
    affine = None
    if sc is not None and bi is not None and mu is not None and va is not None:
        affine = _bn_affine(sc, bi, mu, va, eps)

    def run(
        x: np.ndarray, scale: np.ndarray, bias: np.ndarray, mean: np.ndarray, var: np.ndarray
    ) -> tuple[np.ndarray]:
        key = (x.ndim, x.dtype)
        ab = prepared.get(key) if affine is not None else None
        if ab is None:
            a64, b64 = affine if affine is not None else _bn_affine(scale, bias, mean, var, eps)
            shape = _param_shape(a64, x.ndim)
            ab = (a64.astype(x.dtype).reshape(shape), b64.astype(x.dtype).reshape(shape))
            if affine is not None:
                prepared[key] = ab
        y = np.multiply(x, ab[0])
        y += ab[1]
        return (y,)

    return run


def _batch_norm_training(info: NodeInfo, eps: float, momentum: float) -> Kernel:
    # onnxruntime's training outputs: batch statistics normalize Y; running stats are blended with
    # ``momentum``; the opset < 14 saved_var output is the inverse standard deviation.
    n_out = info.num_outputs
    legacy = info.opset < 14

    def run(
        x: np.ndarray, scale: np.ndarray, bias: np.ndarray, mean: np.ndarray, var: np.ndarray
    ) -> list[np.ndarray]:
        ct = _compute_dtype(x.dtype)
        axes = (0,) + tuple(range(2, x.ndim))
        xf = x.astype(ct, copy=False)
        bmean = xf.mean(axis=axes)
        bvar = xf.var(axis=axes)
        shape = _param_shape(bmean, x.ndim)
        inv = 1.0 / np.sqrt(bvar + ct(eps))
        a = scale.astype(ct) * inv
        y = (xf - bmean.reshape(shape)) * a.reshape(shape) + bias.astype(ct).reshape(shape)
        run_mean = (mean.astype(ct) * ct(momentum) + bmean * ct(1.0 - momentum)).astype(mean.dtype)
        run_var = (var.astype(ct) * ct(momentum) + bvar * ct(1.0 - momentum)).astype(var.dtype)
        outs = [y.astype(x.dtype, copy=False), run_mean, run_var]
        if legacy:
            outs += [bmean.astype(mean.dtype), inv.astype(var.dtype)]
        return outs[:n_out]

    return run


# --------------------------------------------------------------------------------------------------------
# LayerNormalization


@kernel("LayerNormalization", since=17)
def _layer_norm(info: NodeInfo) -> Kernel:
    if int(info.get("stash_type", 1)) != 1:
        return reference_kernel(info)
    axis_attr = int(info.get("axis", -1))
    eps = float(info.get("epsilon", 1e-5))
    want_stats = info.has_output(1) or info.has_output(2)

    def run(x: np.ndarray, scale: np.ndarray, bias: np.ndarray | None = None) -> tuple[np.ndarray, ...]:
        axis = axis_attr + x.ndim if axis_attr < 0 else axis_attr
        if not 0 <= axis < x.ndim:
            raise InvalidArgument(
                f"LayerNormalization node {info.name!r}: axis {axis_attr} out of range for rank {x.ndim}"
            )
        ct = _compute_dtype(x.dtype)
        xf = x.astype(ct, copy=False)
        outer = x.shape[:axis]
        x2 = xf.reshape(math.prod(outer), math.prod(x.shape[axis:]))  # no -1: 0-size batches
        mean = x2.mean(axis=1, keepdims=True)
        d = x2 - mean
        var = np.einsum("ij,ij->i", d, d).reshape(-1, 1) / ct(d.shape[1])
        inv = 1.0 / np.sqrt(var + ct(eps))
        d *= inv
        y = d.reshape(x.shape)
        y *= scale
        if bias is not None:
            y += bias
        y = y.astype(x.dtype, copy=False)
        if not want_stats:
            return (y,)
        stat_shape = outer + (1,) * (x.ndim - axis)
        return (y, mean.astype(np.float32).reshape(stat_shape), inv.astype(np.float32).reshape(stat_shape))

    return run


# --------------------------------------------------------------------------------------------------------
# InstanceNormalization, GroupNormalization


def _normalize_rows(x3: np.ndarray, eps: float) -> np.ndarray:
    """(A, B, L) -> each (a, b) row standardized over L (a new array)."""
    mean = x3.mean(axis=2, keepdims=True)
    d = x3 - mean
    var = np.einsum("abl,abl->ab", d, d)[..., None] / x3.dtype.type(x3.shape[2])
    d *= 1.0 / np.sqrt(var + x3.dtype.type(eps))
    return d


@kernel("InstanceNormalization", since=1)
def _instance_norm(info: NodeInfo) -> Kernel:
    eps = float(info.get("epsilon", 1e-5))

    def run(x: np.ndarray, scale: np.ndarray, bias: np.ndarray) -> tuple[np.ndarray]:
        ct = _compute_dtype(x.dtype)
        n, c = x.shape[0], x.shape[1]
        y = _normalize_rows(x.astype(ct, copy=False).reshape(n, c, math.prod(x.shape[2:])), eps)
        y *= scale.astype(ct).reshape(c, 1)
        y += bias.astype(ct).reshape(c, 1)
        return (y.reshape(x.shape).astype(x.dtype, copy=False),)

    return run


def _group_norm_factory(per_channel: bool) -> Any:
    def factory(info: NodeInfo) -> Kernel:
        if int(info.get("stash_type", 1)) != 1:
            return reference_kernel(info)
        eps = float(info.get("epsilon", 1e-5))
        groups = int(info.get("num_groups", 0))
        if groups <= 0:
            raise InvalidArgument(f"GroupNormalization node {info.name!r}: num_groups must be positive")

        def run(x: np.ndarray, scale: np.ndarray, bias: np.ndarray) -> tuple[np.ndarray]:
            ct = _compute_dtype(x.dtype)
            n, c = x.shape[0], x.shape[1]
            if c % groups:
                raise InvalidArgument(
                    f"GroupNormalization node {info.name!r}: {c} channels not divisible by {groups} groups"
                )
            spatial = math.prod(x.shape[2:])
            y = _normalize_rows(x.astype(ct, copy=False).reshape(n, groups, (c // groups) * spatial), eps)
            y = y.reshape(n, c, spatial)
            if per_channel:
                s, b = scale.astype(ct).reshape(c, 1), bias.astype(ct).reshape(c, 1)
            else:
                s = np.repeat(scale.astype(ct), c // groups).reshape(c, 1)
                b = np.repeat(bias.astype(ct), c // groups).reshape(c, 1)
            y *= s
            y += b
            return (y.reshape(x.shape).astype(x.dtype, copy=False),)

        return run

    return factory


kernel("GroupNormalization", since=18)(_group_norm_factory(per_channel=False))
kernel("GroupNormalization", since=21)(_group_norm_factory(per_channel=True))


# --------------------------------------------------------------------------------------------------------
# LpNormalization


@kernel("LpNormalization", since=1)
def _lp_norm(info: NodeInfo) -> Kernel:
    axis = int(info.get("axis", -1))
    p = int(info.get("p", 2))
    if p not in (1, 2):
        raise InvalidArgument(f"LpNormalization node {info.name!r}: p must be 1 or 2, got {p}")

    def run(x: np.ndarray) -> tuple[np.ndarray]:
        if p == 2:
            norm = np.sqrt(np.sum(x * x, axis=axis, keepdims=True))
        else:
            norm = np.sum(np.abs(x), axis=axis, keepdims=True)
        safe = np.where(norm == 0, x.dtype.type(1), norm)
        y = x / safe
        return (y,)

    return run
