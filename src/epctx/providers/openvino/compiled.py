"""A compiled OpenVINO model as the framework calls it: numpy arrays in, numpy arrays out.

Everything is decided once: the order of the compiled model's inputs and outputs against the partition's
(matched by name), and one infer request per calling thread (OpenVINO's requests are not re-entrant), with
the memory bound to it (``request.py``). A call copies each small input into the buffer its request already
reads (a large one is shared, not copied), runs the request synchronously and hands over the fresh arrays
OpenVINO copies its outputs into: no result is overwritten by a later call.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from epctx.errors import InvalidGraph
from epctx.providers.openvino.request import RequestState

__all__ = ["CompiledOpenVINO"]


def _port_names(ports: Sequence[Any]) -> list[set[str]]:
    return [set(port.get_names()) for port in ports]


def _order(names: Sequence[str], ports: Sequence[Any], what: str, where: str) -> tuple[int, ...]:
    """Port index of each name; a name the compiled model lacks is InvalidGraph."""
    found = _port_names(ports)
    order = []
    for name in names:
        index = next((k for k, port in enumerate(found) if name in port), None)
        if index is None:
            known = sorted(n for port in found for n in port)
            raise InvalidGraph(f"{where}: the compiled model has no {what} {name!r} (it has {known})")
        order.append(index)
    return tuple(order)


class CompiledOpenVINO:
    """``fn(*inputs)`` -> one array per partition output. Holds what the context cache saves."""

    def __init__(
        self,
        compiled_model: Any,
        input_names: Sequence[str],
        output_names: Sequence[str],
        *,
        where: str,
        keep_alive: Any = None,
        weights: Any = None,
    ) -> None:
        self.compiled_model: Any = None
        self.input_names = tuple(input_names)
        self.output_names = tuple(output_names)
        self.where = where
        self._keep_alive = keep_alive  # memory OpenVINO may read: source weights, the imported blob
        self.source_file: Any = None  # EXTERNAL_ONLY: the source's data file the blob references (SourceFile)
        self.rebind(compiled_model, weights=weights)

    def release(self) -> None:
        """Drop the compiled model (and its requests); ``rebind`` must follow before the next call."""
        self.compiled_model = None
        self._local = threading.local()

    def rebind(self, compiled_model: Any, *, weights: Any = None) -> None:
        """Run ``compiled_model`` from now on (the same partition compiled again)."""
        where = self.where
        self.compiled_model = compiled_model
        self.weights = weights  # weightless mode: the weights layout the blob references (WeightsFile)
        inputs = compiled_model.inputs
        # A partition input the compiled model does not read (OpenVINO may drop unused ones) is not fed.
        names = _port_names(inputs)
        used = [(k, name) for k, name in enumerate(self.input_names) if any(name in p for p in names)]
        self._feeds = tuple(
            (k, port) for (k, _), port in zip(used, _order([n for _, n in used], inputs, "input", where))
        )
        if len(self._feeds) != len(inputs):
            raise InvalidGraph(
                f"{where}: the compiled model reads {sorted(n for p in names for n in p)}, "
                f"not only the partition's inputs {list(self.input_names)}"
            )
        self._outputs = _order(self.output_names, compiled_model.outputs, "output", where)
        ports = compiled_model.outputs
        # the same port for two partition outputs (OpenVINO merged them): each gets an array of its own
        self._aliased = len(set(self._outputs)) < len(self._outputs) or len(set(ports)) < len(ports)
        self._all_outputs = not self._aliased and self._outputs == tuple(range(len(ports)))
        self._local = threading.local()

    def _state(self) -> RequestState:
        compiled_model = self.compiled_model
        state = RequestState(
            compiled_model.create_infer_request(), len(compiled_model.inputs), compiled_model.outputs
        )
        self._local.state = state
        return state

    def __call__(self, *inputs: np.ndarray) -> list[np.ndarray]:
        try:
            state = self._local.state
        except AttributeError:
            state = self._state()
        buffers = state.buffers
        for k, port in self._feeds:
            array = inputs[k]
            buffer = buffers[port]
            if buffer is not None and array.shape == buffer.shape and array.dtype == buffer.dtype:
                buffer[...] = array  # small, and the shape the request already reads: a copy, no new binding
            else:
                state.bind(port, array)
        results = state.run()
        if self._all_outputs:
            return results
        picked = [results[i] for i in self._outputs]
        return _unaliased(picked) if self._aliased else picked


def _unaliased(arrays: list[np.ndarray]) -> list[np.ndarray]:
    """A copy of each array already in the list: two outputs never share memory, as in onnxruntime."""
    seen: set[int] = set()
    out = []
    for array in arrays:
        out.append(array.copy() if id(array) in seen else array)
        seen.add(id(array))
    return out
