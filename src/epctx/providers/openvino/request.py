"""One calling thread's OpenVINO infer request and the memory bound to it, at the least cost per call.

Measured with openvino 2026.4, one thread, on one-op models of each size (what a whole call costs against a
bare openvino loop: ``benchmarks/bench_openvino_call.py``): a new ``ov.Tensor`` over an array plus
``set_input_tensor`` costs ~2.4 µs whatever the size, while copying a small array into memory the request
already reads costs ~0.1 µs (16 KiB: 0.2 µs, 256 KiB: 4.8 µs).
So an input up to :data:`COPY_LIMIT` bytes is copied into a buffer this state owns and bound once (again only
when its shape or dtype changes: a dynamic dimension); a larger one is shared with OpenVINO (no copy).

Outputs come back from OpenVINO's synchronous ``infer`` as fresh arrays that it copies in C++ (owned by the
caller: the next infer cannot overwrite them), in the compiled model's output order; reading each output
tensor back from Python and copying it costs ~1.1 µs more per output. Giving each call fresh output tensors
(``set_output_tensor``) pays off only from ~256 KiB per output (1 MiB: 85 against 150 µs), and only for static
shapes, so it is not done. ``start_async`` + ``wait`` was slower in wall time on small models (8.8 µs against
4.5 µs for a one-op model): the run moves to OpenVINO's own thread and back (and leaves the calling thread's
CPU clock, which would flatter it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["COPY_LIMIT", "RequestState"]

COPY_LIMIT = 64 * 1024  # bytes: inputs up to this size are copied into the request's own buffer


def _infer_function(request: Any) -> Any:
    """``infer(request)`` -> the outputs as a dict of fresh arrays, ports as keys, in port order.

    The pybind ``InferRequest.infer`` underneath ``openvino.InferRequest`` (the public wrapper adds an input
    dispatcher and an ``OVDict`` around the same call: ~1.5 µs); the wrapper where that base is missing."""
    try:
        from openvino._pyopenvino import InferRequest as base
    except ImportError:  # pragma: no cover - a future openvino without the private module
        return lambda r: r.infer().to_dict()
    if not isinstance(request, base):  # pragma: no cover - likewise
        return lambda r: r.infer().to_dict()
    base_infer = base.infer
    return lambda r: base_infer(r, {}, False, True)  # no inputs given here, outputs copied, strings decoded


class RequestState:
    """A thread's infer request, the input buffers it reads, and how to read its outputs."""

    __slots__ = ("buffers", "infer", "ordered", "ports", "request", "shared")

    def __init__(self, request: Any, num_inputs: int, output_ports: Sequence[Any]) -> None:
        self.request = request
        self.buffers: list[np.ndarray | None] = [None] * num_inputs  # per input port: our bound buffer
        self.shared: list[Any] = [None] * num_inputs  # per input port: the caller's array bound (kept alive)
        self.ports = tuple(output_ports)
        self.ordered: bool | None = None  # the result dict's values are in port order (checked once)
        self.infer = _infer_function(request)

    def bind(self, port: int, array: Any) -> None:
        """A new binding for input ``port`` (the first call, a new shape or dtype, or a large array); the
        caller copies an array of the bound buffer's shape and dtype into ``buffers[port]`` instead."""
        import openvino as ov

        array = np.asarray(array)
        small = array.nbytes <= COPY_LIMIT
        # small: a C-ordered, writable copy of our own (keeps the rank: a scalar stays 0-d); large: the array
        held: Any = np.array(array, order="C") if small else array
        try:
            tensor = ov.Tensor(held, shared_memory=True)
        except (ValueError, RuntimeError, TypeError):  # read-only, non-contiguous, or a type OpenVINO copies
            tensor, held, small = ov.Tensor(np.array(array, order="C")), None, False
        self.request.set_input_tensor(port, tensor)
        self.buffers[port] = held if small else None
        # OpenVINO's tensor does not keep a shared array alive: we do, until this port is bound again
        self.shared[port] = None if small else held

    def run(self) -> list[np.ndarray]:
        """Infer; each output as a fresh array, in the compiled model's output order."""
        result = self.infer(self.request)
        if self.ordered:
            return list(result.values())
        if self.ordered is None:
            keys = list(result)
            self.ordered = len(keys) == len(self.ports) and all(k == p for k, p in zip(keys, self.ports))
            if self.ordered:
                return list(result.values())
        return [result[p] for p in self.ports]
