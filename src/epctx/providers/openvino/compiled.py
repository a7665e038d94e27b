"""A compiled OpenVINO model as the framework calls it: numpy arrays in, numpy arrays out.

Everything is decided once: the order of the compiled model's inputs and outputs against the partition's
(matched by name), and one infer request per calling thread (OpenVINO's requests are not re-entrant). A call
wraps each input in an ``ov.Tensor`` that shares its memory (a copy only for arrays OpenVINO cannot share:
read-only or non-contiguous ones), runs the request synchronously and copies the outputs out of the
request's buffers, which the next call reuses.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from epctx.errors import InvalidGraph

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
        import openvino as ov

        self.compiled_model: Any = None
        self.input_names = tuple(input_names)
        self.output_names = tuple(output_names)
        self.where = where
        self._keep_alive = keep_alive  # memory OpenVINO may read: source weights, the imported blob
        self.source_file: Any = None  # EXTERNAL_ONLY: the source's data file the blob references (SourceFile)
        self._tensor = ov.Tensor
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
        self._local = threading.local()

    def _request(self) -> Any:
        request = self.compiled_model.create_infer_request()
        self._local.request = request
        return request

    def __call__(self, *inputs: np.ndarray) -> list[np.ndarray]:
        try:
            request = self._local.request
        except AttributeError:
            request = self._request()
        tensor = self._tensor
        for k, port in self._feeds:
            array = inputs[k]
            try:
                request.set_input_tensor(port, tensor(array, shared_memory=True))
            except (ValueError, RuntimeError, TypeError):  # read-only, non-contiguous or a scalar
                # a C-ordered copy that keeps the rank (np.ascontiguousarray makes a scalar shape (1,))
                request.set_input_tensor(port, tensor(np.array(array, order="C")))
        request.infer()
        return [request.get_output_tensor(i).data.copy() for i in self._outputs]
