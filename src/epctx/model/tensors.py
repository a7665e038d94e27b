"""Tensor values as kernels see them."""

from __future__ import annotations

from typing import Any

import numpy as np

from epctx.errors import EPCtxError, InvalidGraph

__all__ = ["to_numpy"]


def to_numpy(tensor: Any) -> np.ndarray:
    """An onnx-ir tensor as numpy. String tensors become object arrays of ``str`` (onnx-ir gives bytes),
    the same type a caller feeds and onnxruntime returns. A tensor whose data does not fit its type and
    shape (a corrupt file), or whose strings are not UTF-8, is InvalidGraph naming it."""
    try:
        array = np.asarray(tensor.numpy())
        if array.dtype.kind == "S" or (
            array.dtype == object and array.size and isinstance(array.flat[0], bytes)
        ):
            return np.array(
                [v.decode("utf-8") if isinstance(v, bytes) else v for v in array.flat], dtype=object
            ).reshape(array.shape)
    except EPCtxError:
        raise
    except Exception as exc:
        name = getattr(tensor, "name", None)
        dtype, shape = getattr(tensor, "dtype", None), getattr(tensor, "shape", None)
        raise InvalidGraph(
            f"tensor {name!r} ({getattr(dtype, 'name', dtype)}, shape {shape}) cannot be read: its data does "
            f"not match its type and shape, or it is not UTF-8 text: {type(exc).__name__}: {exc}"
        ) from exc
    return array
