"""CPU kernels: elementwise math, activations, broadcasting binary ops, comparisons, Where, Clip, Identity.

Each family is registered from a table by one small factory; the returned ``run`` closures do no attribute
parsing and (at most) one dtype check on the hot path. Cast is in ``cast.py``, erf in ``erf.py``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from epctx.ep import Kernel
from epctx.providers.cpu.fusion import clip_ufunc
from epctx.providers.cpu.kernels.erf import erf
from epctx.providers.cpu.registry import NodeInfo, kernel

__all__ = ["DIRECT_DTYPES", "relu", "widened"]

Fn = Callable[..., Any]


# ------------------------------------------------------------------------------------------- unary
def _sigmoid(x: np.ndarray) -> np.ndarray:
    # exp(-x) overflows to inf for very negative x, which gives the right limit 0. The plan runs (and folds)
    # every kernel under np.errstate(all="ignore"), so no errstate here: its context cost 1.3 us a call, more
    # than the arithmetic on silero-vad's 128 gates.
    e = np.negative(x)  # one temporary, updated in place
    np.exp(e, out=e)
    e += 1
    return np.reciprocal(e, out=e)


_CLIP = clip_ufunc  # numpy's clip ufunc itself (fusion.clip_ufunc)


# (lower, upper) bounds of relu and _unit per floating dtype, made once: two numpy scalars made at each call cost
# 0.4 us, more than np.maximum on arrays of up to ~4,000 values (silero-vad's).
_RELU_BOUNDS: dict[np.dtype[Any], tuple[Any, Any]] = {}
_UNIT_BOUNDS: dict[np.dtype[Any], tuple[Any, Any]] = {}


def _bounds(dtype: np.dtype[Any], lo: float, hi: float) -> tuple[Any, Any]:
    kind = dtype.type
    return kind(lo), kind(hi)


def relu(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """max(x, 0); for floating x numpy's clip ufunc with bounds (0, inf): NaN kept, -inf to 0, and -0.0 kept
    as onnxruntime keeps it (np.maximum gave +0.0), at 39 against np.maximum's 68 us on 401,408 float32
    values, 6.4 against 11.4 on 65,536 (one thread, measured here: maximum against a scalar runs a slower
    loop than clip's)."""
    bounds = _RELU_BOUNDS.get(x.dtype)
    if bounds is None:
        if x.dtype.kind != "f":
            return np.maximum(x, 0, out=out)
        bounds = _RELU_BOUNDS[x.dtype] = _bounds(x.dtype, 0.0, np.inf)
    found: np.ndarray = _CLIP(x, bounds[0], bounds[1], out=out)
    return found


def _softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(x, 0)


def _mish(x: np.ndarray) -> np.ndarray:
    return x * np.tanh(np.logaddexp(x, 0))


# op -> (since, function of one array)
_UNARY: dict[str, tuple[int, Fn]] = {
    "Abs": (1, np.abs),
    "Neg": (1, np.negative),
    "Exp": (1, np.exp),
    "Log": (1, np.log),
    "Sqrt": (1, np.sqrt),
    "Reciprocal": (1, np.reciprocal),
    "Floor": (1, np.floor),
    "Ceil": (1, np.ceil),
    "Round": (11, np.round),
    "Sign": (9, np.sign),
    "Sin": (7, np.sin),
    "Cos": (7, np.cos),
    "Tan": (7, np.tan),
    "Asin": (7, np.arcsin),
    "Acos": (7, np.arccos),
    "Atan": (7, np.arctan),
    "Sinh": (9, np.sinh),
    "Cosh": (9, np.cosh),
    "Asinh": (9, np.arcsinh),
    "Acosh": (9, np.arccosh),
    "Atanh": (9, np.arctanh),
    "Tanh": (1, np.tanh),
    "Erf": (9, erf),
    "Relu": (1, relu),
    "Sigmoid": (1, _sigmoid),
    "Softplus": (1, _softplus),
    "Softsign": (1, lambda x: x / (1 + np.abs(x))),
    "Mish": (18, _mish),
    "IsNaN": (9, np.isnan),
    "Not": (1, np.logical_not),
    "BitwiseNot": (18, np.invert),
}


# Dtypes numpy computes at full precision. The others (float16, bfloat16, float8) are computed in float32
# and rounded once at the end, as onnxruntime does, instead of after every step of a composite function.
DIRECT_DTYPES = frozenset(
    np.dtype(t)
    for t in (np.float32, np.float64, np.bool_, np.int8, np.int16, np.int32, np.int64)
    + (np.uint8, np.uint16, np.uint32, np.uint64)
)
# Unary ops whose result is bool whatever the input.
_TESTS = frozenset({"IsNaN", "IsInf", "Not"})


def widened(fn: Fn) -> Fn:
    """``fn`` of one array, computed in float32 for the dtypes outside DIRECT_DTYPES."""

    def call(x: Any, *args: Any) -> Any:
        dtype = x.dtype
        if dtype in DIRECT_DTYPES:
            return fn(x, *args)
        return fn(x.astype(np.float32), *args).astype(dtype)

    return call


def _unary_factory(fn: Fn) -> Callable[[NodeInfo], Kernel]:
    def factory(info: NodeInfo) -> Kernel:
        if info.op_type in _TESTS:
            return lambda x: (fn(x),)

        def run(x: Any) -> tuple[Any]:
            if x.dtype in DIRECT_DTYPES:
                return (fn(x),)
            return (fn(x.astype(np.float32)).astype(x.dtype),)

        return run

    return factory


for _op, (_since, _fn) in _UNARY.items():
    kernel(_op, since=_since)(_unary_factory(_fn))


# Activations with attributes: op -> (since, builder(info) -> function of one array). Piecewise functions
# are written with maximum/minimum rather than np.where, which is ~10x slower on unpredictable masks.
def _leaky_relu(info: NodeInfo) -> Fn:
    alpha = float(info.get("alpha", 0.01))
    if alpha <= 1.0:  # x*alpha lies below x for x >= 0 and above it for x < 0
        return lambda x: np.maximum(x, x * alpha)
    return lambda x: np.minimum(x, x * alpha)


def _elu(info: NodeInfo) -> Fn:
    alpha = float(info.get("alpha", 1.0))
    return lambda x: np.maximum(x, 0) + np.expm1(np.minimum(x, 0)) * alpha


def _selu(info: NodeInfo) -> Fn:
    alpha = float(info.get("alpha", 1.67326319217681884765625))
    gamma = float(info.get("gamma", 1.05070102214813232421875))
    return lambda x: np.maximum(x, 0) * gamma + np.expm1(np.minimum(x, 0)) * (alpha * gamma)


def _celu(info: NodeInfo) -> Fn:
    alpha = float(info.get("alpha", 1.0))
    return lambda x: np.maximum(x, 0) + np.expm1(np.minimum(x, 0) / alpha) * alpha


def _unit(t: np.ndarray) -> np.ndarray:
    """``t`` clipped to [0, 1] in place, NaN kept: one pass of the clip ufunc where maximum then minimum made
    two, each slower against a scalar (``relu``)."""
    bounds = _UNIT_BOUNDS.get(t.dtype)
    if bounds is None:
        if t.dtype.kind != "f":
            np.maximum(t, 0, out=t)
            return np.minimum(t, 1, out=t)
        bounds = _UNIT_BOUNDS[t.dtype] = _bounds(t.dtype, 0.0, 1.0)
    found: np.ndarray = _CLIP(t, bounds[0], bounds[1], out=t)
    return found


def _hard_sigmoid(info: NodeInfo) -> Fn:
    alpha = float(info.get("alpha", 0.2))
    beta = float(info.get("beta", 0.5))

    def hard_sigmoid(x: np.ndarray) -> np.ndarray:
        t = x * alpha  # one temporary, updated in place
        t += beta
        return _unit(t)

    return hard_sigmoid


def _hard_swish_of(x: np.ndarray) -> np.ndarray:
    t = x * (1.0 / 6.0)  # one temporary, updated in place
    t += 0.5
    _unit(t)
    t *= x
    return t


def _hard_swish(info: NodeInfo) -> Fn:
    return _hard_swish_of


def _thresholded_relu(info: NodeInfo) -> Fn:
    alpha = float(info.get("alpha", 1.0))
    return lambda x: np.where(x > alpha, x, 0).astype(x.dtype, copy=False)


def _shrink(info: NodeInfo) -> Fn:
    lambd = float(info.get("lambd", 0.5))
    bias = float(info.get("bias", 0.0))

    def fn(x: np.ndarray) -> np.ndarray:
        out = np.where(x < -lambd, x + bias, np.where(x > lambd, x - bias, 0))
        return out.astype(x.dtype, copy=False)

    return fn


def _gelu(info: NodeInfo) -> Fn:
    if info.get("approximate", "none") == "tanh":
        k = math.sqrt(2.0 / math.pi)
        return lambda x: x * 0.5 * (1 + np.tanh((x + x * x * x * 0.044715) * k))
    inv_sqrt2 = 1.0 / math.sqrt(2.0)
    return lambda x: x * 0.5 * (1 + erf(x * inv_sqrt2))


def _is_inf(info: NodeInfo) -> Fn:
    neg = bool(info.get("detect_negative", 1))
    pos = bool(info.get("detect_positive", 1))
    if neg and pos:
        return np.isinf
    if pos:
        return np.isposinf
    if neg:
        return np.isneginf
    return lambda x: np.zeros(np.shape(x), dtype=bool)


def _bit_shift(info: NodeInfo) -> Fn:
    return np.left_shift if info.get("direction") == "LEFT" else np.right_shift


_ACTIVATIONS: dict[str, tuple[int, Callable[[NodeInfo], Fn]]] = {
    "LeakyRelu": (1, _leaky_relu),
    "Elu": (1, _elu),
    "Selu": (1, _selu),
    "Celu": (12, _celu),
    "HardSigmoid": (1, _hard_sigmoid),
    "HardSwish": (14, _hard_swish),
    "ThresholdedRelu": (10, _thresholded_relu),
    "Shrink": (9, _shrink),
    "Gelu": (20, _gelu),
    "IsInf": (10, _is_inf),
}


def _activation_factory(build: Callable[[NodeInfo], Fn]) -> Callable[[NodeInfo], Kernel]:
    def factory(info: NodeInfo) -> Kernel:
        return _unary_factory(build(info))(info)

    return factory


for _op, (_since, _build) in _ACTIVATIONS.items():
    kernel(_op, since=_since)(_activation_factory(_build))


# ------------------------------------------------------------------------------------------ binary
def _div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    kind = a.dtype.kind
    if kind == "i":  # C semantics: truncate toward zero
        q = np.floor_divide(a, b)
        q += ((a % b) != 0) & ((a < 0) != (b < 0))
        return q
    if kind == "u":
        return np.floor_divide(a, b)
    return np.divide(a, b)


def _pow(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    # The result keeps the base's dtype.
    if a.dtype.kind == "f":
        return np.power(a, b if b.dtype == a.dtype else b.astype(a.dtype))
    if a.dtype == b.dtype and (b.dtype.kind == "u" or not (b < 0).any()):
        return np.power(a, b)
    return np.power(a.astype(np.float64), b).astype(a.dtype)


def _prelu(x: np.ndarray, slope: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0) + np.minimum(x, 0) * slope


# op -> (since, function of two arrays); opset < 7 used the legacy ``broadcast``/``axis`` attributes.
_BINARY: dict[str, tuple[int, Fn]] = {
    "Add": (7, np.add),
    "Sub": (7, np.subtract),
    "Mul": (7, np.multiply),
    "Div": (7, _div),
    "And": (7, np.logical_and),
    "Or": (7, np.logical_or),
    "Xor": (7, np.logical_xor),
    "Equal": (7, np.equal),
    "Less": (7, np.less),
    "Greater": (7, np.greater),
    "LessOrEqual": (12, np.less_equal),
    "GreaterOrEqual": (12, np.greater_equal),
    "BitwiseAnd": (18, np.bitwise_and),
    "BitwiseOr": (18, np.bitwise_or),
    "BitwiseXor": (18, np.bitwise_xor),
}


def _binary_factory(fn: Fn) -> Callable[[NodeInfo], Kernel]:
    def factory(info: NodeInfo) -> Kernel:
        def run(a: Any, b: Any) -> tuple[Any]:
            return (fn(a, b),)

        return run

    return factory


for _op, (_since, _fn) in _BINARY.items():
    kernel(_op, since=_since)(_binary_factory(_fn))


def _pow_const(exponent: float) -> Fn | None:
    """Exact shortcuts for common scalar exponents (LayerNorm / RMSNorm decompositions)."""
    if exponent == 1.0:
        return lambda a: a
    if exponent == 2.0:
        return lambda a: a * a
    if exponent == 3.0:
        return lambda a: a * a * a
    return None


@kernel("Pow", since=7)
def _pow_kernel(info: NodeInfo) -> Kernel:
    e = info.const_input(1)
    fast = (
        _pow_const(float(e.reshape(-1)[0]))
        if e is not None and e.size == 1 and e.dtype.kind in "fiu"
        else None
    )
    if fast is None:
        if e is not None and e.size == 1 and e.dtype.kind == "f" and float(e.reshape(-1)[0]) == 0.5:

            def run_sqrt(a: Any, b: Any) -> tuple[Any]:
                if a.dtype.kind == "f" and a.ndim >= b.ndim:
                    return (np.sqrt(a),)
                return (_pow(a, b),)

            return run_sqrt
        return lambda a, b: (_pow(a, b),)
    shortcut = fast

    def run(a: Any, b: Any) -> tuple[Any]:
        if a.ndim >= b.ndim:
            return (shortcut(a),)
        return (_pow(a, b),)

    return run


@kernel("PRelu", since=7)
def _prelu_kernel(info: NodeInfo) -> Kernel:
    slope = info.const_input(1)
    if slope is not None and slope.size and slope.dtype.kind == "f" and slope.min() >= 0 and slope.max() <= 1:
        return lambda x, s: (np.maximum(x, x * slope),)
    return lambda x, s: (_prelu(x, s),)


@kernel("Mod", since=10)
def _mod(info: NodeInfo) -> Kernel:
    fn = np.fmod if info.get("fmod", 0) else np.mod

    def run(a: Any, b: Any) -> tuple[Any]:
        return (fn(a, b),)

    return run


@kernel("BitShift", since=11)
def _bitshift(info: NodeInfo) -> Kernel:
    fn = _bit_shift(info)

    def run(a: Any, b: Any) -> tuple[Any]:
        return (fn(a, b),)

    return run


def _variadic_factory(fn: Fn, mean: bool = False) -> Callable[[NodeInfo], Kernel]:
    def factory(info: NodeInfo) -> Kernel:
        n = info.num_inputs
        if n == 1 and not mean:
            return lambda x: (x,)
        if n == 2:
            if mean:
                return lambda a, b: (fn(a, b) / 2,)
            return lambda a, b: (fn(a, b),)

        def run(*xs: Any) -> tuple[Any]:
            r = xs[0]
            for x in xs[1:n]:
                r = fn(r, x)
            return (r / n,) if mean else (r,)

        return run

    return factory


# Opset 6 required equal shapes (numpy broadcasting is a superset); opset 1 had consumed_inputs.
kernel("Max", since=6)(_variadic_factory(np.maximum))
kernel("Min", since=6)(_variadic_factory(np.minimum))
kernel("Sum", since=6)(_variadic_factory(np.add))
kernel("Mean", since=6)(_variadic_factory(np.add, mean=True))


@kernel("Where", since=9)
def _where(info: NodeInfo) -> Kernel:
    def run(c: Any, x: Any, y: Any) -> tuple[Any]:
        return (np.where(c, x, y),)

    return run


@kernel("Clip", since=6)
def _clip_attrs(info: NodeInfo) -> Kernel:
    lo = info.get("min")
    hi = info.get("max")
    lo = None if lo is None else np.float32(lo)
    hi = None if hi is None else np.float32(hi)

    def run(x: Any) -> tuple[Any]:
        r = x
        if lo is not None:
            r = np.maximum(r, lo.astype(x.dtype))
        if hi is not None:
            r = np.minimum(r, hi.astype(x.dtype))
        return (r,)

    return run


@kernel("Clip", since=11)
def _clip(info: NodeInfo) -> Kernel:
    has_lo = info.has_input(1)
    has_hi = info.has_input(2)
    if has_lo and has_hi:

        def clip(x: Any, lo: Any, hi: Any) -> tuple[Any]:
            r = np.maximum(x, lo)
            return (np.minimum(r, hi, out=r) if isinstance(r, np.ndarray) else np.minimum(r, hi),)

        return clip
    if has_lo:
        return lambda x, lo, hi=None: (np.maximum(x, lo),)
    if has_hi:
        return lambda x, lo, hi: (np.minimum(x, hi),)
    return lambda x, lo=None, hi=None: (x,)


@kernel("Identity", since=1)
def _identity(info: NodeInfo) -> Kernel:
    def run(x: Any) -> tuple[Any]:
        return (x,)

    # the session's plan gives the output the input's slot and drops the step (session/plan.py)
    run.passes_input = _first  # type: ignore[attr-defined]
    return run


def _first() -> int:
    return 0
