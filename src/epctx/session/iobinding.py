"""SessionIOBinding: inputs and outputs bound ahead of ``run_with_iobinding`` (mirrors onnxruntime's).

Inputs are bound by reference (no copy). An output bound to memory (``bind_output`` with a ``buffer_ptr``, or
``bind_ortvalue_output``) is written there in place when the result has its shape and type; an output bound
by name only receives the result array itself (no copy unless it is a view of something the session owns)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from epctx.errors import InvalidArgument
from epctx.session.ortvalue import OrtValue, array_from_pointer, check_cpu, owned_array

__all__ = ["SessionIOBinding"]


class SessionIOBinding:
    """Made by ``session.io_binding()`` (or ``IOBinding(session)``, as onnxruntime allows)."""

    def __init__(self, session: Any) -> None:
        inputs = [*session.get_inputs(), *session.get_overridable_initializers()]
        self._input_names = frozenset(i.name for i in inputs)
        self._output_names = [o.name for o in session.get_outputs()]
        self._inputs: dict[str, Any] = {}
        self._outputs: dict[str, OrtValue | None] = {}  # None: allocated by the run
        self._from_pointer: set[str] = set()  # outputs bound to raw memory: never re-allocated
        self._results: list[OrtValue] = []

    # -- inputs --------------------------------------------------------------------------------------------
    def _input(self, name: str, value: Any) -> None:
        if name not in self._input_names:
            raise InvalidArgument(
                f"bind input: the model has no input {name!r}; its inputs are {sorted(self._input_names)}"
            )
        self._inputs[name] = value

    def bind_cpu_input(self, name: str, arr_on_cpu: Any) -> None:
        self._input(name, arr_on_cpu)

    def bind_input(
        self,
        name: str,
        device_type: str,
        device_id: int,
        element_type: Any,
        shape: Sequence[int],
        buffer_ptr: int,
    ) -> None:
        check_cpu(device_type, device_id, f"bind_input({name!r})")
        self._input(name, array_from_pointer(buffer_ptr, element_type, shape, f"bind_input({name!r})"))

    def bind_ortvalue_input(self, name: str, ortvalue: OrtValue) -> None:
        if not isinstance(ortvalue, OrtValue):
            raise InvalidArgument(
                f"bind_ortvalue_input({name!r}) takes an OrtValue, got {type(ortvalue).__name__}"
            )
        self._input(name, ortvalue.numpy())

    # -- outputs -------------------------------------------------------------------------------------------
    def _output(self, name: str, value: OrtValue | None) -> None:
        if name not in self._output_names:
            raise InvalidArgument(
                f"bind output: the model has no output {name!r}; its outputs are {self._output_names}"
            )
        self._outputs[name] = value
        self._from_pointer.discard(name)

    def bind_output(
        self,
        name: str,
        device_type: str = "cpu",
        device_id: int = 0,
        element_type: Any = None,
        shape: Sequence[int] | None = None,
        buffer_ptr: int | None = None,
    ) -> None:
        check_cpu(device_type, device_id, f"bind_output({name!r})")
        if buffer_ptr is None:
            self._output(name, None)
            return
        if element_type is None or shape is None:
            raise InvalidArgument(f"bind_output({name!r}): a buffer_ptr needs its element_type and shape")
        what = f"bind_output({name!r})"
        self._output(name, OrtValue(array_from_pointer(buffer_ptr, element_type, shape, what)))
        self._from_pointer.add(name)

    def bind_ortvalue_output(self, name: str, ortvalue: OrtValue) -> None:
        if not isinstance(ortvalue, OrtValue):
            raise InvalidArgument(
                f"bind_ortvalue_output({name!r}) takes an OrtValue, got {type(ortvalue).__name__}"
            )
        self._output(name, ortvalue)

    def clear_binding_inputs(self) -> None:
        self._inputs.clear()

    def clear_binding_outputs(self) -> None:
        self._outputs.clear()
        self._from_pointer.clear()
        self._results = []

    def synchronize_inputs(self) -> None:
        """Host memory: nothing to wait for."""

    def synchronize_outputs(self) -> None:
        """Host memory: nothing to wait for."""

    # -- running -------------------------------------------------------------------------------------------
    def run(self, execute: Callable[[dict[str, Any]], list[Any]]) -> None:
        """``execute(feed)`` returns every model output in order; bound outputs are kept."""
        if not self._outputs:
            raise InvalidArgument(
                "run_with_iobinding: no output is bound (bind_output / bind_ortvalue_output)"
            )
        results = execute(dict(self._inputs))
        by_name = dict(zip(self._output_names, results))
        kept = []
        for name, bound in self._outputs.items():
            kept.append(self._store(name, bound, by_name[name]))
        self._results = kept

    def _store(self, name: str, bound: OrtValue | None, result: Any) -> OrtValue:
        if bound is None:
            return OrtValue(owned_array(result))
        target = bound.numpy()
        result = np.asarray(result)
        if target.shape == result.shape and target.dtype == result.dtype:
            np.copyto(target, result)  # in place: the caller's memory
            return bound
        if name in self._from_pointer:
            raise InvalidArgument(
                f"output {name!r} is bound to memory of shape {list(target.shape)} {target.dtype}, but the run "
                f"produced {list(result.shape)} {result.dtype}; bind a buffer of that shape, or bind by name"
            )
        bound._array = owned_array(result)  # an OrtValue of another shape: it now holds the result
        return bound

    def get_outputs(self) -> list[OrtValue]:
        return list(self._results)

    def get_outputs_as_ortvaluevector(self) -> list[OrtValue]:
        return list(self._results)

    def copy_outputs_to_cpu(self) -> list[np.ndarray]:
        return [v.numpy().copy() for v in self._results]
