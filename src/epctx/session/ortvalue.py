"""OrtValue: onnxruntime's tensor handle, over a numpy array in host memory (epctx keeps every value there).

``ortvalue_from_numpy`` shares the array's memory as onnxruntime does on the CPU (no copy for a C-contiguous
array), and ``numpy()`` returns that same memory."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

import numpy as np

from epctx import errors
from epctx.errors import InvalidArgument
from epctx.model.dtypes import onnx_elem_type
from epctx.session.node_arg import tensor_type_string

__all__ = ["OrtValue", "array_from_pointer", "check_cpu", "owned_array", "owned_arrays"]


def check_cpu(device_type: str, device_id: int, what: str) -> None:
    """epctx's values live in host memory: 'cpu' only (an EP copies to its device itself)."""
    if str(device_type).lower() != "cpu":
        raise errors.NotImplemented(
            f"{what}: device_type {device_type!r} is not supported; epctx keeps inputs and outputs in host "
            "memory ('cpu') and each EP moves them to its device"
        )
    if device_id != 0:
        raise InvalidArgument(f"{what}: device_id must be 0 for 'cpu', got {device_id!r}")


def owned_array(value: Any) -> Any:
    """A result the caller may own: views (of inputs, weights or cached constants) and read-only arrays are
    copied, fresh arrays are handed over as they are."""
    if isinstance(value, np.ndarray):
        return value if value.base is None and value.flags.writeable else value.copy()
    if value is None or isinstance(value, list):
        return value
    return np.asarray(value)


def owned_arrays(values: Sequence[Any]) -> list[Any]:
    """``[owned_array(v) for v in values]``, the test for a fresh array inlined (run()'s hot path: a session's
    results are fresh arrays in the common case)."""
    ndarray = np.ndarray
    return [
        v if type(v) is ndarray and v.base is None and v.flags.writeable else owned_array(v) for v in values
    ]


def array_from_pointer(ptr: int, element_type: Any, shape: Sequence[int], what: str) -> np.ndarray:
    """The host memory at ``ptr`` as an array of ``shape`` / ``element_type`` (no copy)."""
    if not isinstance(ptr, int) or ptr <= 0:
        raise InvalidArgument(f"{what}: buffer_ptr must be a memory address (an int > 0), got {ptr!r}")
    dtype = np.dtype(element_type)
    dims = tuple(int(d) for d in shape)
    if any(d < 0 for d in dims):
        raise InvalidArgument(f"{what}: shape must have sizes >= 0, got {list(dims)}")
    nbytes = int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
    buffer = (ctypes.c_byte * nbytes).from_address(ptr)
    return np.frombuffer(buffer, dtype=dtype).reshape(dims)


class OrtValue:
    """A tensor in host memory; mirrors ``onnxruntime.OrtValue`` for tensors."""

    __slots__ = ("_array",)

    def __init__(self, array: np.ndarray) -> None:
        if not isinstance(array, np.ndarray):
            raise InvalidArgument(f"OrtValue holds a numpy array, got {type(array).__name__}")
        self._array = array

    @staticmethod
    def ortvalue_from_numpy(numpy_obj: Any, device_type: str = "cpu", device_id: int = 0) -> OrtValue:
        check_cpu(device_type, device_id, "OrtValue.ortvalue_from_numpy")
        if not isinstance(numpy_obj, np.ndarray):
            raise InvalidArgument(
                f"OrtValue.ortvalue_from_numpy takes a numpy array, got {type(numpy_obj).__name__}"
            )
        return OrtValue(np.ascontiguousarray(numpy_obj))

    @staticmethod
    def ortvalue_from_shape_and_type(
        shape: Sequence[int], element_type: Any, device_type: str = "cpu", device_id: int = 0
    ) -> OrtValue:
        check_cpu(device_type, device_id, "OrtValue.ortvalue_from_shape_and_type")
        try:
            dtype = np.dtype(element_type)
        except TypeError as exc:
            raise InvalidArgument(f"OrtValue: element_type {element_type!r} is not a numpy type") from exc
        dims = [int(d) for d in shape]
        if any(d < 0 for d in dims):
            raise InvalidArgument(f"OrtValue: shape must have sizes >= 0, got {dims}")
        return OrtValue(np.empty(dims, dtype=dtype))

    def numpy(self) -> np.ndarray:
        """The tensor as a numpy array (the same memory)."""
        return self._array

    def shape(self) -> list[int]:
        return list(self._array.shape)

    def data_type(self) -> str:
        """onnxruntime's spelling: ``tensor(float)``."""
        return tensor_type_string(_onnx_type(self._array.dtype))

    def element_type(self) -> int:
        """The ONNX element type (``onnx.TensorProto`` enum value)."""
        return int(_onnx_type(self._array.dtype))

    def device_name(self) -> str:
        return "cpu"

    def data_ptr(self) -> int:
        return int(self._array.ctypes.data)

    def tensor_size_in_bytes(self) -> int:
        return int(self._array.nbytes)

    def has_value(self) -> bool:
        return True

    def is_tensor(self) -> bool:
        return True

    def is_sparse_tensor(self) -> bool:
        return False

    def is_tensor_sequence(self) -> bool:
        return False

    def update_inplace(self, np_arr: np.ndarray) -> None:
        """Copy ``np_arr`` into this value's memory (same shape and dtype)."""
        source = np.asarray(np_arr)
        if source.shape != self._array.shape or source.dtype != self._array.dtype:
            raise InvalidArgument(
                f"OrtValue.update_inplace: the array must have shape {list(self._array.shape)} and dtype "
                f"{self._array.dtype}, got {list(source.shape)} {source.dtype}"
            )
        np.copyto(self._array, source)

    def __repr__(self) -> str:
        return f"OrtValue({self.data_type()}, shape={self.shape()}, device='cpu')"


def _onnx_type(dtype: np.dtype[Any]) -> int:
    elem_type = onnx_elem_type(dtype)
    if not elem_type:
        raise InvalidArgument(f"OrtValue: numpy dtype {dtype} has no ONNX element type")
    return elem_type
