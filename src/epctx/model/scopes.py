"""Scope analysis: which outer values a control-flow node's subgraphs read."""

from __future__ import annotations

import onnx_ir as ir

__all__ = ["node_subgraphs", "outer_scope_values"]


def node_subgraphs(node: ir.Node) -> list[ir.Graph]:
    graphs: list[ir.Graph] = []
    for attr in node.attributes.values():
        if not isinstance(attr, ir.Attr):
            continue
        if attr.type == ir.AttributeType.GRAPH:
            graphs.append(attr.value)
        elif attr.type == ir.AttributeType.GRAPHS:
            graphs.extend(attr.value)
    return graphs


def outer_scope_values(node: ir.Node) -> tuple[ir.Value, ...]:
    """Values defined outside ``node``'s subgraphs that they read, in first-use order (deterministic)."""
    found: dict[ir.Value, None] = {}
    for graph in node_subgraphs(node):
        _collect(graph, set(), found)
    return tuple(found)


def _collect(graph: ir.Graph, enclosing_defined: set[ir.Value], found: dict[ir.Value, None]) -> None:
    defined = set(enclosing_defined)
    defined.update(graph.inputs)
    defined.update(graph.initializers.values())
    for node in graph:
        for value in node.inputs:
            if value is not None and value not in defined and value.graph is not graph:
                found.setdefault(value, None)
        for sub in node_subgraphs(node):
            inner: dict[ir.Value, None] = {}
            _collect(sub, set(), inner)
            for value in inner:
                if value not in defined and value.graph is not graph:
                    found.setdefault(value, None)
        defined.update(node.outputs)
    for value in graph.outputs:
        if value not in defined and value.graph is not graph:
            found.setdefault(value, None)
