"""ONNX element types (TensorProto.DataType numbers) and numpy dtypes, both ways, without onnx or onnx-ir."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["numpy_dtype", "onnx_elem_type"]

_NUMPY = {
    1: np.float32,
    2: np.uint8,
    3: np.int8,
    4: np.uint16,
    5: np.int16,
    6: np.int32,
    7: np.int64,
    8: np.object_,  # strings, as onnxruntime takes and returns them
    9: np.bool_,
    10: np.float16,
    11: np.float64,
    12: np.uint32,
    13: np.uint64,
    14: np.complex64,
    15: np.complex128,
}
_BFLOAT16 = 16


def numpy_dtype(elem_type: int) -> np.dtype[Any] | None:
    """The numpy dtype of an ONNX element type; None for one numpy cannot hold."""
    if elem_type == _BFLOAT16:
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    found = _NUMPY.get(elem_type)
    return np.dtype(found) if found is not None else None


def onnx_elem_type(dtype: np.dtype[Any]) -> int:
    """The ONNX element type of a numpy dtype (strings included); 0 when there is none."""
    if dtype.kind in "USO":
        return 8
    for elem_type, candidate in _NUMPY.items():
        if dtype == candidate:
            return elem_type
    return _BFLOAT16 if dtype.name == "bfloat16" else 0
