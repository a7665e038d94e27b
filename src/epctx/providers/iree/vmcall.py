"""A compiled IREE function called with numpy arrays straight on IREE's VM: the per-call path of
:class:`~epctx.providers.iree.runtime.Runner` (issue 21: on a tiny model the cost of a call is the Python
around it, not the kernels).

``iree.runtime.FunctionInvoker`` did this in Python per call: an ``InvokeContext`` and an ``Invocation``, its
``ArgumentPacker``, a ``DeviceArray`` per result whose ``to_host`` asks the buffer's memory type and usage and
maps the element type to a dtype again (0.5 us), then our own mapping of it (measured on the corpus' LLM decode,
6 inputs and 5 outputs, one thread: 34 us for the invoker's call, 57 us with the results made numpy arrays, of
which 21.5 us are IREE's ``invoke`` itself; 34.5 us on this path). Here, per call:

- each argument is copied into a buffer view by the device's allocator (``allocate_buffer_copy``: one C call,
  0.5 us for a small array; what the invoker's packer does too), its element type read from a table filled
  once per dtype. Not imported over the caller's memory (``import_host_allocation``): IREE hands an argument's
  buffer back as a result when the function returns it (an input passed through, a reshape of one), which
  would then alias the caller's array, and mapping such a result fails in IREE's bindings (``std::bad_cast``);
- the argument and result lists are made per call (0.2 us each): a ``VmVariantList`` has no way to be cleared
  for reuse from Python, and a kept result list would hold the last call's results alive;
- each result is handed to numpy through DLPack (``HalDevice.create_dlpack_capsule``, ``np.from_dlpack``:
  0.5 us, where mapping it cost 1.4 us with its shape and dtype read). The capsule retains the result's IREE
  buffer and the array owns the capsule, so the array keeps IREE's memory alive, whatever its size, with no
  copy: the rule a mapped result had to be given by hand (MiniLM with its pooling on the CPU EP after an IREE
  partition returned sentence embeddings 0.17-0.28 off, different at each run, while arrays came from
  ``DeviceArray.to_host()`` alone). numpy makes such an array read-only (IREE's capsule is DLPack's legacy
  kind): a session's outputs are copied for the caller as any read-only result is (``owned_array``), and the
  EPs that read a value take read-only arrays already (weights mapped from files are read-only too). An
  element type that numpy cannot take through DLPack (bool before numpy 1.25) is read through a mapping from
  then on: a small result (<= 16 KiB) copied (0.3 us), a larger one held by its array with its mapping and
  buffer view (2 us).

Only ``invoke`` holds the lock: an IREE context is not reentrant, IREE's allocator and buffer views are
thread-safe, and each call's lists are its own.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from epctx.errors import EPFail
from epctx.providers.iree.runtime_import import iree_runtime

__all__ = ["VmCall"]

logger = logging.getLogger("epctx")

_DL_CPU = 1  # DLPack's kDLCPU: the local devices' buffers are host memory
_COPIED_BYTES = 16384  # mapped results up to this size are copied: cheaper than a holder
# element types this numpy does not take through DLPack (bool before numpy 1.25): mapped instead
_UNEXPORTED: set[int] = set()
_ELEMENT_TYPES: dict[np.dtype[Any], Any] = {}  # numpy dtype -> IREE HalElementType, filled on first use
_DTYPES: dict[int, np.dtype[Any]] = {}  # IREE HAL element type -> numpy dtype, filled on first use


class VmCall:
    """``function`` of the VM ``context`` on ``device``, called with numpy arrays (one per argument), returning
    one numpy array per result; thread-safe. IREE's failures are EPFail naming ``where``, with IREE's
    message."""

    __slots__ = (
        "_allocator",
        "_context",
        "_device",
        "_export",
        "_function",
        "_list",
        "_lock",
        "_usage",
        "_view",
        "where",
    )

    def __init__(self, context: Any, device: Any, function: Any, where: str) -> None:
        rt = iree_runtime()
        self._context = context
        self._device = device
        self._allocator = device.allocator
        self._function = function
        self._list = rt.VmVariantList
        self._view = rt.HalBufferView
        self._export = device.create_dlpack_capsule
        # what FunctionInvoker's packer asks for an argument it copies
        self._usage = (int(rt.MemoryType.DEVICE_LOCAL), int(rt.BufferUsage.DEFAULT))
        self._lock = threading.Lock()
        self.where = where

    def __call__(self, arrays: Sequence[Any]) -> list[np.ndarray]:
        args = self._arguments(arrays)
        results = self._list(4)  # grows as IREE pushes the results
        with self._lock:
            try:
                self._context.invoke(self._function, args, results)
            except (RuntimeError, ValueError, TypeError) as exc:
                raise EPFail(f"{self.where}: IREE failed to run it: {exc}") from exc
        return [self._result(results, i) for i in range(len(results))]

    def _arguments(self, arrays: Sequence[Any]) -> Any:
        args = self._list(len(arrays))
        memory, usage = self._usage
        copy, device = self._allocator.allocate_buffer_copy, self._device
        for value in arrays:
            # np.asarray(order="C"), not np.ascontiguousarray: that one makes a rank-0 value of shape (1,)
            array = np.asarray(value, order="C")
            element_type = _ELEMENT_TYPES.get(array.dtype)
            if element_type is None:
                element_type = _element_type(array.dtype, self.where)
            try:
                args.push_ref(copy(memory, usage, device, array, element_type))
            except (RuntimeError, ValueError, TypeError) as exc:
                raise EPFail(f"{self.where}: IREE failed to run it: {exc}") from exc
        return args

    def _result(self, results: Any, index: int) -> np.ndarray:
        try:
            view = results.get_as_object(index, self._view)
        except (RuntimeError, ValueError, TypeError) as exc:
            raise EPFail(
                f"{self.where}: IREE returned {results.get_variant(index)!r} as result {index}, not a tensor"
            ) from exc
        element_type = view.element_type
        if element_type not in _UNEXPORTED:
            try:  # the array owns the capsule, which retains IREE's buffer
                return np.from_dlpack(_Exported(self._export(view, _DL_CPU, 0)))
            except (BufferError, RuntimeError, TypeError, ValueError) as exc:
                _UNEXPORTED.add(element_type)  # this numpy cannot import it: mapped from now on
                logger.debug(
                    "%s: IREE result of element type %#x mapped, not exported: %s",
                    self.where,
                    element_type,
                    exc,
                )
        return self._mapped(view, element_type, index)

    def _mapped(self, view: Any, element_type: int, index: int) -> np.ndarray:
        """A result read through a mapping of its buffer: copied when small, else held by its array with its
        mapping and buffer view."""
        dtype = _DTYPES.get(element_type)
        if dtype is None:
            dtype = _dtype(element_type, self.where)
        try:
            mapping = view.map()
        except RuntimeError as exc:
            raise EPFail(f"{self.where}: IREE's result {index} cannot be read on the host: {exc}") from exc
        mapped = mapping.asarray(view.shape, dtype)
        if mapped.nbytes <= _COPIED_BYTES:
            return mapped.copy()  # type: ignore[no-any-return]
        return np.asarray(_Holder(mapped, (view, mapping)))


class _Exported:
    """A DLPack capsule of a result, as ``np.from_dlpack`` takes it (IREE's capsule is the legacy, unversioned
    kind: numpy makes the array read-only)."""

    __slots__ = ("_capsule",)

    def __init__(self, capsule: Any) -> None:
        self._capsule = capsule

    def __dlpack__(self, *, stream: Any = None, **kwargs: Any) -> Any:
        return self._capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return (_DL_CPU, 0)


class _Holder:
    """The numpy array interface of a result mapped to the host, holding what keeps its memory: an array made
    from it keeps them alive (``np.asarray(holder).base is holder``). ``keep`` is released in reverse order,
    the mapping before the buffer view it maps."""

    __slots__ = ("__array_interface__", "__weakref__", "_keep")

    def __init__(self, mapped: np.ndarray, keep: tuple[Any, ...]) -> None:
        self.__array_interface__ = mapped.__array_interface__
        self._keep = (*keep, mapped)


def _element_type(dtype: np.dtype[Any], where: str) -> Any:
    rt = iree_runtime()
    found = rt.array_interop.map_dtype_to_element_type(dtype)
    if found is None:
        raise EPFail(f"{where}: IREE failed to run it: IREE has no element type for {dtype} arrays")
    _ELEMENT_TYPES[dtype] = found
    return found


def _dtype(element_type: int, where: str) -> np.dtype[Any]:
    rt = iree_runtime()
    try:
        dtype = np.dtype(rt.HalElementType.map_to_dtype(element_type))
    except (RuntimeError, ValueError, TypeError) as exc:
        raise EPFail(f"{where}: IREE returned a result of element type {element_type:#x}: {exc}") from exc
    _DTYPES[element_type] = dtype
    return dtype
