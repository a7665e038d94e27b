"""Tensor values as kernels see them."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["to_numpy"]


def to_numpy(tensor: Any) -> np.ndarray:
    """An onnx-ir tensor as numpy. String tensors become object arrays of ``str`` (onnx-ir gives bytes),
    the same type a caller feeds and onnxruntime returns."""
    array = np.asarray(tensor.numpy())
    if array.dtype.kind == "S" or (array.dtype == object and array.size and isinstance(array.flat[0], bytes)):
        return np.array(
            [v.decode("utf-8") if isinstance(v, bytes) else v for v in array.flat], dtype=object
        ).reshape(array.shape)
    return array
