"""CPU kernels: Cast and CastLike (numbers, bool, strings as onnxruntime converts them), and the dtype tables
other kernels use."""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np

from epctx.ep import Kernel
from epctx.providers.cpu.fallback import reference_kernel
from epctx.providers.cpu.registry import NodeInfo, kernel

__all__ = ["NATIVE_DTYPES", "convert_dtype", "onnx_to_numpy_dtype"]


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
