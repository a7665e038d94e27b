"""CPU kernels: MatMul, Gemm, Einsum, and the softmax family (Softmax, LogSoftmax, Hardmax)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from epctx.ep import Kernel, settle_backends
from epctx.providers.cpu import blas_serial, parallel
from epctx.providers.cpu.kernels.cast import NATIVE_DTYPES
from epctx.providers.cpu.kernels.elementwise import widened
from epctx.providers.cpu.registry import NodeInfo, kernel

__all__: list[str] = []


def _product(a: Any, b: Any) -> Any:
    """``np.matmul(a, b)`` sized to its work, as the conv kernels do: under ``blas_serial.SERIAL_MACS``
    multiply-adds on one BLAS thread; a large product with a 2-D right side in column blocks shared with helper
    threads (``parallel``); anything else as numpy does it."""
    if a.ndim == 0 or b.ndim < 2 or a.dtype != b.dtype or a.dtype.kind != "f" or a.dtype.itemsize < 4:
        return np.matmul(a, b)
    n = b.shape[-1]
    if a.size * n < blas_serial.SERIAL_MACS:
        if blas_serial.single_threaded(a, n):
            return np.matmul(a, b)
        return blas_serial.serial()(np.matmul, a, b)
    if b.ndim == 2 and a.ndim >= 2 and (a.ndim == 2 or a.flags.c_contiguous):
        out = np.empty((*a.shape[:-1], n), dtype=a.dtype)
        parallel.matmul_columns(a.reshape(-1, a.shape[-1]), b, out.reshape(-1, n))
        return out
    return np.matmul(a, b)


@kernel("MatMul", since=1)
def _matmul(info: NodeInfo) -> Kernel:
    settle_backends()  # a set lookup: multi-threaded BLAS must not meet a backend's import-time fork
    weight = info.const_input(1)
    # A constant float weight (a projection): left sides of fewer values than this run on one BLAS thread by
    # themselves (blas_serial.single_threaded) and go straight to numpy (an LLM decode step's 19 MatMuls).
    small = blas_serial.single_threaded_rows(weight) if weight is not None else 0

    def run(a: Any, b: Any) -> tuple[Any]:
        if a.size < small and a.dtype == b.dtype:
            return (np.matmul(a, b),)
        y = _product(a, b)
        return (y,) if y.dtype == a.dtype else (y.astype(a.dtype),)  # bfloat16 comes back as float32

    return run


@kernel("Gemm", since=6)
def _gemm(info: NodeInfo) -> Kernel:
    # Opset 6 had a ``broadcast`` attribute; numpy broadcasting of C covers both of its settings.
    settle_backends()
    trans_a = bool(info.get("transA", 0))
    trans_b = bool(info.get("transB", 0))
    alpha = float(info.get("alpha", 1.0))
    beta = float(info.get("beta", 1.0))
    b_const = info.const_input(1)
    if b_const is not None and trans_b:
        b_const = np.ascontiguousarray(b_const.T)
        trans_b = False
    use_c = info.has_input(2) and beta != 0.0
    c_const = info.const_input(2) if use_c else None
    if c_const is not None and beta != 1.0:
        c_const = np.asarray(c_const * beta).astype(c_const.dtype)
        beta = 1.0

    # (product shape, C shape) -> whether C adds into the product in place (np.broadcast_shapes is 1.3 us)
    in_place: dict[tuple[tuple[int, ...], tuple[int, ...]], bool] = {}

    def run(a: Any, b: Any, c: Any = None) -> tuple[Any]:
        if trans_a:
            a = a.T
        if b_const is not None:
            b = b_const
        elif trans_b:
            b = b.T
        y = _product(a, b)
        if alpha != 1.0:
            np.multiply(y, alpha, out=y, casting="unsafe")
        if use_c:
            if c_const is not None:
                c = c_const
            elif beta != 1.0:
                c = c * beta
            key = (y.shape, np.shape(c))
            fits = in_place.get(key)
            if fits is None:
                fits = y.shape == np.broadcast_shapes(*key)
                if len(in_place) < 64:
                    in_place[key] = fits
            if fits:
                np.add(y, c, out=y, casting="unsafe")
            else:  # C may broadcast A*B up (e.g. a 1x1 product with a bigger C)
                y = (y + c).astype(y.dtype, copy=False)
        return (y,) if y.dtype == a.dtype else (y.astype(a.dtype),)

    return run


@kernel("Einsum", since=12)
def _einsum(info: NodeInfo) -> Kernel:
    equation = str(info.get("equation", "")).replace(" ", "")
    paths: dict[tuple[tuple[int, ...], ...], Any] = {}

    def run(*xs: Any) -> tuple[Any]:
        key = tuple(x.shape for x in xs)
        path = paths.get(key)
        if path is None:
            path = paths[key] = np.einsum_path(equation, *xs, optimize="greedy")[0]
        dtype = xs[0].dtype
        if dtype not in NATIVE_DTYPES:  # bfloat16: numpy's einsum has no loop for it
            xs = tuple(x.astype(np.float32) for x in xs)
            return (np.asarray(np.einsum(equation, *xs, optimize=path)).astype(dtype),)
        return (np.asarray(np.einsum(equation, *xs, optimize=path)),)

    return run


# ---------------------------------------------------------------------------------- softmax family
# The ufuncs' reduce methods themselves: np.max / np.sum wrap them in Python (PP-OCR cls's final Softmax of
# 2 values: 21 us against onnxruntime's 4, measured here). The shift is fmax's (NaN-ignoring) maximum, 1.5x
# maximum's along a short last axis (attention scores, 4 x 16 rows of 16: 6.9 -> 4.0 us): a row holding a NaN
# comes out all NaN either way (x - max is NaN there, and so is the row's sum).
def _softmax(x: np.ndarray, axis: int) -> np.ndarray:
    e = x - np.fmax.reduce(x, axis=axis, keepdims=True)
    np.exp(e, out=e)
    e /= np.add.reduce(e, axis=axis, keepdims=True)
    return e


def _log_softmax(x: np.ndarray, axis: int) -> np.ndarray:
    shifted = x - np.maximum.reduce(x, axis=axis, keepdims=True)
    shifted -= np.log(np.add.reduce(np.exp(shifted), axis=axis, keepdims=True))
    return shifted


def _hardmax(x: np.ndarray, axis: int) -> np.ndarray:
    idx = np.expand_dims(np.argmax(x, axis=axis), axis)
    out = np.zeros_like(x)
    np.put_along_axis(out, idx, 1, axis=axis)
    return out


_SOFTMAX: dict[str, Callable[[np.ndarray, int], np.ndarray]] = {
    "Softmax": widened(_softmax),
    "LogSoftmax": widened(_log_softmax),
    "Hardmax": _hardmax,
}


@kernel("Softmax", "LogSoftmax", "Hardmax", since=1)
def _softmax_2d(info: NodeInfo) -> Kernel:
    """Opsets 1-12: the input is coerced to 2-D at ``axis`` and normalized along the second dimension."""
    fn = _SOFTMAX[info.op_type]
    axis = int(info.get("axis", 1))

    def run(x: Any) -> tuple[Any]:
        shape = x.shape
        ax = axis + len(shape) if axis < 0 else axis
        if ax == len(shape) - 1:
            return (fn(x, -1),)
        outer = int(np.prod(shape[:ax], dtype=np.int64))
        inner = int(np.prod(shape[ax:], dtype=np.int64))
        return (fn(x.reshape(outer, inner), 1).reshape(shape),)

    return run


@kernel("Softmax", "LogSoftmax", "Hardmax", since=13)
def _softmax_axis(info: NodeInfo) -> Kernel:
    fn = _SOFTMAX[info.op_type]
    axis = int(info.get("axis", -1))

    def run(x: Any) -> tuple[Any]:
        return (fn(x, axis),)

    return run
