"""What SessionOptions change in the graph at session creation: free dimension overrides (by name or by
denotation) on the graph inputs, and initializers given with ``add_initializer``."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx_ir as ir

from epctx.errors import InvalidArgument
from epctx.model.dims import axis_key

__all__ = ["apply_dimension_overrides", "apply_initializers"]

logger = logging.getLogger("epctx")


def apply_dimension_overrides(
    graph: ir.Graph, by_name: Mapping[str, int], by_denotation: Mapping[str, int]
) -> None:
    """Replace the symbolic dimensions of the graph inputs named in ``by_name`` / denoted in ``by_denotation``;
    a graph output's dimension of an overridden name gets the same size (one name, one size in ONNX)."""
    if not by_name and not by_denotation:
        return
    for value in (*graph.inputs, *graph.outputs):
        shape = value.shape
        if shape is None:
            continue
        dims: list[Any] = list(shape)
        for i, dim in enumerate(shape):
            size = by_denotation.get(shape.get_denotation(i) or "") if value in graph.inputs else None
            if not isinstance(dim, int) and dim.value is not None and dim.value in by_name:
                size = by_name[dim.value]
            elif size is None and not isinstance(dim, int) and value in graph.inputs:
                size = by_name.get(axis_key(value.name or "", i))  # epctx's INPUT:AXIS, an unnamed dimension
            if size is None:
                continue
            if isinstance(dim, int) and dim >= 0 and dim != size:
                raise InvalidArgument(
                    f"free dimension override: input {value.name!r} dimension {i} is fixed at {dim}, the override "
                    f"asks for {size}"
                )
            dims[i] = size
        if dims != list(shape):
            denotations = [shape.get_denotation(i) for i in range(len(dims))]
            value.shape = ir.Shape(dims, denotations=denotations)


def apply_initializers(graph: ir.Graph, initializers: Mapping[str, Any]) -> None:
    """Put the values of ``add_initializer`` in place of the model's initializers of the same names."""
    for name, value in initializers.items():
        array = np.asarray(value.numpy() if callable(getattr(value, "numpy", None)) else value)
        target = graph.initializers.get(name)
        if target is None:
            # onnxruntime ignores such a name silently; epctx says so.
            logger.warning("add_initializer(%r): the model has no initializer of that name; ignored", name)
            continue
        old = target.const_value
        if old is not None and old.dtype != ir.DataType.from_numpy(array.dtype):
            raise InvalidArgument(
                f"add_initializer({name!r}): the model's initializer is {old.dtype.name}, the value given is "
                f"numpy {array.dtype}"
            )
        target.const_value = ir.Tensor(array, name=name)
        target.shape = ir.Shape(array.shape)
