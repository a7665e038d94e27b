"""Free dimension overrides on a parsed model, before type inference: the sizes a user states reach every
intermediate value ONNX shape inference types, so a compiling EP sees static shapes, not only at the inputs.

The keys are those of ``SessionOptions.add_free_dimension_override_by_name`` (a symbolic dimension's name, as
onnxruntime) plus epctx's ``INPUT:AXIS`` for any dynamic input dimension (needed where it has no name, ``-1`` or
empty, or a name shared by unrelated dimensions, as Paddle's ``?``), and those of
``add_free_dimension_override_by_denotation``. A dimension fixed in the model is never changed here (the session
reports a conflicting override).

``state_input_shapes`` sets whole input shapes (``epctx.input_shapes``, as onnxruntime's OpenVINO EP's
``reshape_input``): every dimension of an input, anonymous ones included, checked against the model."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import onnx

from epctx.config import INPUT_SHAPES
from epctx.errors import InvalidArgument

__all__ = ["axis_key", "override_proto_dims", "state_input_shapes"]


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


def state_input_shapes(
    graph: onnx.GraphProto,
    shapes: Sequence[tuple[str, tuple[int, ...]]],
    by_name: Mapping[str, int],
    by_denotation: Mapping[str, int],
    what: str = INPUT_SHAPES,
) -> bool:
    """Give each input named in ``shapes`` that shape (its dynamic dimensions set, an input of unknown rank
    given one); whether any changed. InvalidArgument, naming the input, for a name the graph's inputs lack, a
    rank other than the model's, a size other than a fixed dimension's or than a free dimension override of the
    same dimension (by its name, its ``INPUT:AXIS`` or its denotation); messages start with ``what``."""
    inputs = {value.name: value for value in graph.input}
    changed = False
    for name, sizes in shapes:
        value = inputs.get(name)
        if value is None or not value.type.HasField("tensor_type"):
            there = ", ".join(inputs) or "none"
            why = "is not a tensor input" if value is not None else "is not an input of the model"
            raise InvalidArgument(f"{what}: {name!r} {why} (its inputs: {there})")
        tensor = value.type.tensor_type
        if not tensor.HasField("shape"):
            tensor.shape.dim.extend(onnx.TensorShapeProto.Dimension(dim_value=size) for size in sizes)
            changed = True
            continue
        if len(tensor.shape.dim) != len(sizes):
            raise InvalidArgument(
                f"{what}: {name!r} has rank {len(tensor.shape.dim)} in the model, the shape stated "
                f"{list(sizes)} has rank {len(sizes)}"
            )
        for axis, (dim, size) in enumerate(zip(tensor.shape.dim, sizes, strict=True)):
            _check_stated(what, name, axis, dim, size, by_name, by_denotation)
            if not (dim.HasField("dim_value") and dim.dim_value == size):
                dim.dim_value = size  # clears dim_param (a oneof)
                changed = True
    return changed


def _check_stated(
    what: str,
    name: str,
    axis: int,
    dim: onnx.TensorShapeProto.Dimension,
    size: int,
    by_name: Mapping[str, int],
    by_denotation: Mapping[str, int],
) -> None:
    """InvalidArgument where ``size``, stated for ``name``'s dimension ``axis``, contradicts the model's fixed
    size or an override of that dimension."""
    if dim.HasField("dim_value") and dim.dim_value >= 0:
        if dim.dim_value != size:
            raise InvalidArgument(
                f"{what}: {name!r} dimension {axis} is fixed at {dim.dim_value} in the model, the shape "
                f"stated has {size}"
            )
        return
    overrides = [
        (f"{dim.dim_param!r}", by_name.get(dim.dim_param) if dim.dim_param else None),
        (f"{axis_key(name, axis)!r}", by_name.get(axis_key(name, axis))),
        (f"denotation {dim.denotation!r}", by_denotation.get(dim.denotation) if dim.denotation else None),
    ]
    for which, override in overrides:
        if override is not None and override != size:
            raise InvalidArgument(
                f"{what}: {name!r} dimension {axis} is stated {size}, a free dimension override of "
                f"{which} sets it to {override}"
            )
