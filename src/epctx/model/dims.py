"""Free dimension overrides on a parsed model, before type inference: the sizes a user states reach every
intermediate value ONNX shape inference types, so a compiling EP sees static shapes, not only at the inputs.

The keys are those of ``SessionOptions.add_free_dimension_override_by_name`` (a symbolic dimension's name, as
onnxruntime) plus epctx's ``INPUT:AXIS`` for any dynamic input dimension (needed where it has no name, ``-1`` or
empty, or a name shared by unrelated dimensions, as Paddle's ``?``), and those of
``add_free_dimension_override_by_denotation``. A dimension fixed in the model is never changed here (the session
reports a conflicting override)."""

from __future__ import annotations

from collections.abc import Mapping

import onnx

__all__ = ["axis_key", "override_proto_dims"]


def axis_key(input_name: str, axis: int) -> str:
    """The override key of an unnamed dynamic dimension: ``INPUT:AXIS``."""
    return f"{input_name}:{axis}"


def override_proto_dims(
    graph: onnx.GraphProto, by_name: Mapping[str, int], by_denotation: Mapping[str, int]
) -> bool:
    """Set the overridden dynamic dimensions of ``graph``'s inputs (and the same names at its outputs); whether
    any changed."""
    if not by_name and not by_denotation:
        return False
    changed = False
    inputs = {v.name for v in graph.input}
    for value in (*graph.input, *graph.output):
        if not value.type.HasField("tensor_type") or not value.type.tensor_type.HasField("shape"):
            continue
        for axis, dim in enumerate(value.type.tensor_type.shape.dim):
            if dim.HasField("dim_value") and dim.dim_value >= 0:
                continue
            size = by_name.get(dim.dim_param) if dim.dim_param else None
            if size is None and value.name in inputs:
                size = by_denotation.get(dim.denotation) if dim.denotation else None
                if size is None:  # INPUT:AXIS names any dynamic input dimension (Paddle names them all "?")
                    size = by_name.get(axis_key(value.name, axis))
            if size is not None:
                dim.dim_value = size  # clears dim_param (a oneof)
                changed = True
    return changed
