"""What the ONNX-level rewrites of the compile worker share (``space_to_depth``, ``nhwc_pools``, ``upsample``; with
``onnx`` only): the shapes shape inference gives the values, and the loop that replaces matching nodes in place."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["PARAMETER_MIN_ELEMENTS", "Replacement", "rewrite_nodes", "value_shapes", "value_types"]

# Initializers of at least this many elements become IREE parameters (the worker's import), which the EP serves from
# the model's own initializers; smaller ones (shapes, axes, scalars) stay in the code, where the compiler folds them
PARAMETER_MIN_ELEMENTS = 100

# A node's replacement: the nodes that stand for it, in order, and the initializers they read
Replacement = tuple[Sequence[Any], Sequence[Any]]


def value_shapes(model: Any) -> dict[str, list[int | None]]:
    """The shapes ONNX's shape inference gives the inputs and values of ``model`` (None: a dimension unknown)."""
    return value_types(model)[0]


def value_types(model: Any) -> tuple[dict[str, list[int | None]], dict[str, int]]:
    """The shapes (as ``value_shapes``) and element types (``onnx.TensorProto`` codes) ONNX's shape inference gives
    the inputs and values of ``model``."""
    import onnx

    inferred = onnx.shape_inference.infer_shapes(model)
    shapes: dict[str, list[int | None]] = {}
    types: dict[str, int] = {}
    for value in [*inferred.graph.input, *inferred.graph.value_info]:
        tensor = value.type.tensor_type
        if tensor.HasField("shape"):
            shapes[value.name] = [d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim]
        if tensor.elem_type:
            types[value.name] = tensor.elem_type
    return shapes, types


def rewrite_nodes(model: Any, replace: Callable[[int, Any], Replacement | None]) -> int:
    """Each node of ``model``'s graph (an onnx ModelProto) for which ``replace(k, node)`` (``k``: its index, for
    unique names) gives a replacement is replaced by its nodes, in place, and their initializers added; the
    others kept in order. Returns how many were replaced."""
    graph = model.graph
    rewritten: list[Any] = []
    count = 0
    for k, node in enumerate(graph.node):
        found = replace(k, node)
        if found is None:
            rewritten.append(node)
            continue
        nodes, initializers = found
        graph.initializer.extend(initializers)
        rewritten += nodes
        count += 1
    if count:
        del graph.node[:]
        graph.node.extend(rewritten)
    return count
