"""Which nodes the example EP claims: float32 ops of its table whose attributes and inputs it can lower."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import onnx_ir as ir

from epctx.providers.example.ops import SUPPORTED_OPS

__all__ = ["supported_nodes"]


def supported_nodes(
    graph: ir.Graph, opset_imports: Mapping[str, int], ops: frozenset[str]
) -> Sequence[ir.Node]:
    claimed: list[ir.Node] = []
    floats: set[ir.Value] = set()  # outputs of claimed nodes: float32 whatever their declared type
    for node in graph:
        if _supports(node, opset_imports, floats, ops):
            claimed.append(node)
            floats.update(node.outputs)
    return claimed


def _supports(
    node: ir.Node, opset_imports: Mapping[str, int], floats: set[ir.Value], ops: frozenset[str]
) -> bool:
    if node.domain not in ("", "ai.onnx") or node.op_type not in ops:
        return False
    since, low, high = SUPPORTED_OPS[node.op_type]
    if _opset(node, opset_imports) < since or len(node.outputs) != 1:
        return False
    given = list(node.inputs)
    while given and given[-1] is None:  # trailing omitted optional inputs
        given.pop()
    inputs = [v for v in given if v is not None]
    if len(inputs) != len(given) or not low <= len(inputs) <= high:
        return False
    if any(isinstance(a, ir.Attr) and a.type in _GRAPH_ATTRS for a in node.attributes.values()):
        return False
    if node.op_type == "Reshape":
        shape = inputs.pop()
        if shape.const_value is None or shape.is_graph_input():
            return False  # the shape must be known at compile time
        if shape.const_value.dtype != ir.DataType.INT64:
            return False
    # Every op here outputs the type of its float inputs: an undeclared output type is float32.
    return all(_is_float32(v, floats) for v in inputs) and all(
        v.type is None or _is_float32(v, floats) for v in node.outputs
    )


_GRAPH_ATTRS = (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)


def _opset(node: ir.Node, opset_imports: Mapping[str, int]) -> int:
    if node.version is not None:
        return node.version
    return opset_imports.get(node.domain, opset_imports.get("", 1) if node.domain == "ai.onnx" else 1)


def _is_float32(value: ir.Value, floats: set[ir.Value]) -> bool:
    if value.type is not None:
        return isinstance(value.type, ir.TensorType) and value.type.dtype == ir.DataType.FLOAT
    if value.const_value is not None:
        return value.const_value.dtype == ir.DataType.FLOAT
    return value in floats
