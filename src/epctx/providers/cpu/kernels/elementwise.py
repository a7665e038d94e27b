"""CPU kernels: elementwise math, activations, broadcasting binary ops, comparisons, Where, Clip, Cast.

Each family is registered from a table by one small factory; the returned ``run`` closures do no attribute
parsing and (at most) one dtype check on the hot path.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

import numpy as np

from epctx.ep import Kernel
from epctx.providers.cpu.reference import reference_kernel
from epctx.providers.cpu.registry import NodeInfo, kernel

__all__ = ["DIRECT_DTYPES", "NATIVE_DTYPES", "convert_dtype", "erf", "onnx_to_numpy_dtype", "widened"]

Fn = Callable[..., Any]


# ----------------------------------------------------------------------------------------------- erf
# erf(x) ~= x * T_c(2 x^2 / limit^2 - 1) on |x| <= limit: Chebyshev coefficients c fitted by least squares
# (np.polynomial.chebyshev.chebfit at 4 * degree + 64 Chebyshev nodes), stored as constants so that importing
# the CPU EP does no BLAS work (issue 7); tests/cpu/test_erf_coefficients.py re-derives and compares them.
# float32 (and narrower): |x| <= 4 (erfc(4) ~ 1.5e-8), degree 16 converted to monomials in t, highest power
# first, for Horner (all below 0.4, so Horner in float32 is stable): ~3e-7 relative. float64: |x| <= 6
# (erfc(6) ~ 2e-17), Clenshaw of degree 44.
_ERF32_LIMIT = 4.0
_ERF32_DEGREE = 16
_ERF32_HORNER = (
    0.0005964250760405544,
    -0.0013728150919252446,
    0.0006166107064264988,
    -0.0010769420974992994,
    0.0055773636942869085,
    -0.010085906983711531,
    0.01390814620087608,
    -0.02166253225456539,
    0.033217001104644164,
    -0.0460143213657504,
    0.05985599357852605,
    -0.07468753070210446,
    0.09021204267260763,
    -0.10771336119337308,
    0.13167500145685612,
    -0.17657617187695768,
    0.35353099636156904,
)
_ERF32 = [np.float32(c) for c in _ERF32_HORNER]
_ERF64_LIMIT = 6.0
_ERF64_DEGREE = 44
_ERF64 = np.array(
    [
        0.3674498180429922,
        -0.3134656066710444,
        0.18068036754729247,
        -0.10948259780540122,
        0.06650028321506797,
        -0.03976284161522614,
        0.023194768790993376,
        -0.013132045071459814,
        0.007193664033012386,
        -0.003805440047020393,
        0.0019417349790359253,
        -0.0009550486382426148,
        0.0004526814560034558,
        -0.00020677121401630548,
        9.103378630425243e-05,
        -3.864376344861928e-05,
        1.5824027438643246e-05,
        -6.253838171503066e-06,
        2.386845548771821e-06,
        -8.802851958636263e-07,
        3.139269266644465e-07,
        -1.083256356826505e-07,
        3.6193117155297243e-08,
        -1.1716764393951545e-08,
        3.677641816651296e-09,
        -1.1199561404789588e-09,
        3.3112100764588646e-10,
        -9.510575671206154e-11,
        2.6553979750323718e-11,
        -7.211639076211984e-12,
        1.9060483321596087e-12,
        -4.908313028784601e-13,
        1.2286046831129028e-13,
        -3.030245618758494e-14,
        7.0806793555386514e-15,
        -1.7893989080730637e-15,
        2.261837448374384e-16,
        -7.510727185860072e-17,
        -1.455066551613924e-16,
        -4.0833855997992164e-17,
        -3.7555582930717765e-17,
        -5.4180861884634647e-17,
        -2.9656272769273847e-16,
        -4.496353541757644e-16,
        4.877967284107881e-16,
    ]
)


def erf(x: np.ndarray) -> np.ndarray:
    """The error function elementwise (numpy has none); keeps float16/float32/float64."""
    dtype = x.dtype
    if dtype == np.float64:
        xc = np.clip(x, -_ERF64_LIMIT, _ERF64_LIMIT)
        t = xc * xc * (2.0 / (_ERF64_LIMIT * _ERF64_LIMIT)) - 1.0
        return np.asarray(xc * np.polynomial.chebyshev.chebval(t, _ERF64))
    xc = np.clip(x.astype(np.float32, copy=False), np.float32(-_ERF32_LIMIT), np.float32(_ERF32_LIMIT))
    t = xc * xc
    t *= np.float32(2.0 / (_ERF32_LIMIT * _ERF32_LIMIT))
    t -= np.float32(1.0)
    r = np.full_like(t, _ERF32[0])
    for c in _ERF32[1:]:
        r *= t
        r += c
    r *= xc
    return r if dtype == np.float32 else r.astype(dtype)


# ------------------------------------------------------------------------------------------- unary
def _sigmoid(x: np.ndarray) -> np.ndarray:
    # exp(-x) overflows to inf for very negative x, which gives the right limit 0.
    with np.errstate(over="ignore"):
        e = np.exp(-x)
    return 1 / (1 + e)


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
    "Relu": (1, lambda x: np.maximum(x, 0)),
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


def _hard_sigmoid(info: NodeInfo) -> Fn:
    alpha = float(info.get("alpha", 0.2))
    beta = float(info.get("beta", 0.5))
    return lambda x: np.minimum(np.maximum(x * alpha + beta, 0), 1)


def _hard_swish(info: NodeInfo) -> Fn:
    return lambda x: x * np.minimum(np.maximum(x * (1.0 / 6.0) + 0.5, 0), 1)


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
        return lambda x, lo, hi: (np.minimum(np.maximum(x, lo), hi),)
    if has_lo:
        return lambda x, lo, hi=None: (np.maximum(x, lo),)
    if has_hi:
        return lambda x, lo, hi: (np.minimum(x, hi),)
    return lambda x, lo=None, hi=None: (x,)


@kernel("Identity", since=1)
def _identity(info: NodeInfo) -> Kernel:
    def run(x: Any) -> tuple[Any]:
        return (x,)

    return run


# -------------------------------------------------------------------------------------------- cast
_NP_OF_ONNX: dict[int, Any] = {
    1: np.dtype(np.float32),
    2: np.dtype(np.uint8),
    3: np.dtype(np.int8),
    4: np.dtype(np.uint16),
    5: np.dtype(np.int16),
    6: np.dtype(np.int32),
    7: np.dtype(np.int64),
    8: np.dtype(object),
    9: np.dtype(np.bool_),
    10: np.dtype(np.float16),
    11: np.dtype(np.float64),
    12: np.dtype(np.uint32),
    13: np.dtype(np.uint64),
}


NATIVE_DTYPES = frozenset(_NP_OF_ONNX.values())


def onnx_to_numpy_dtype(elem_type: int) -> np.dtype[Any] | None:
    """The numpy dtype of an ONNX element type this module converts natively (None for the others)."""
    return _NP_OF_ONNX.get(elem_type)


def _float_str(v: float) -> str:
    if v != v:
        return "NaN"
    if v in (math.inf, -math.inf):
        return "INF" if v > 0 else "-INF"
    return f"{v:.8g}"


def _to_strings(x: np.ndarray) -> np.ndarray:
    flat = np.asarray(x).ravel()
    kind = flat.dtype.kind
    if kind in "OSU":
        items = [s.decode() if isinstance(s, bytes) else str(s) for s in flat.tolist()]
    elif kind == "f":
        items = [_float_str(v) for v in flat.tolist()]
    elif kind == "b":
        items = ["1" if v else "0" for v in flat.tolist()]
    else:
        items = [str(v) for v in flat.tolist()]
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out.reshape(np.shape(x))


_NUMBER_PREFIX = re.compile(r"\s*[-+]?(?:inf(?:inity)?|nan|(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)", re.I)


def _parse_float(s: Any) -> float:
    if isinstance(s, bytes):
        s = s.decode()
    try:
        return float(s)
    except ValueError:
        m = _NUMBER_PREFIX.match(s)
        if m is None:
            raise
        return float(m.group(0))


def _parse_int(s: Any) -> int:
    if isinstance(s, bytes):
        s = s.decode()
    try:
        return int(s)
    except ValueError:
        return int(_parse_float(s))


def _from_strings(x: np.ndarray, dtype: np.dtype[Any]) -> np.ndarray:
    flat = np.asarray(x).ravel().tolist()
    if dtype.kind in "iu":
        return np.array([_parse_int(s) for s in flat], dtype=dtype).reshape(np.shape(x))
    if dtype.kind == "b":
        return np.array([_parse_float(s) != 0 for s in flat], dtype=dtype).reshape(np.shape(x))
    return np.array([_parse_float(s) for s in flat], dtype=np.float64).astype(dtype).reshape(np.shape(x))


def convert_dtype(x: Any, dtype: np.dtype[Any]) -> Any:
    """``x`` as ``dtype`` with ONNX Cast semantics for the plain numeric, bool and string types."""
    if x.dtype == dtype:
        return x
    if dtype.kind == "O":
        return _to_strings(x)
    if x.dtype.kind in "OSU":
        return _from_strings(x, dtype)
    return x.astype(dtype)


@kernel("Cast", since=6)
def _cast(info: NodeInfo) -> Kernel:
    dtype = _NP_OF_ONNX.get(int(info.get("to", 0)))
    if dtype is None:  # bfloat16, float8 (saturate), 4-bit types: the reference implements them
        return reference_kernel(info)
    if dtype.kind == "O":
        return lambda x: (_to_strings(x),)

    def run(x: Any) -> tuple[Any]:
        if x.dtype.kind in "OSU":
            return (_from_strings(x, dtype),)
        return (x.astype(dtype, copy=False),)

    return run


@kernel("CastLike", since=15)
def _cast_like(info: NodeInfo) -> Kernel:
    fallback: list[Kernel] = []

    def run(x: Any, like: Any) -> Any:
        dtype = like.dtype
        if dtype not in NATIVE_DTYPES:
            # bfloat16, float8, int4 (ml_dtypes): their rounding and saturation rules are in the reference
            if not fallback:
                fallback.append(reference_kernel(info))
            return fallback[0](x, like)
        return (convert_dtype(x, dtype),)

    return run
