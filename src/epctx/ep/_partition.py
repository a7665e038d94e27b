"""Partition: the unit a compiling EP compiles (its own module, so the contract and the stage values both
name it without importing each other)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, cast

from epctx.errors import InvalidGraph

if TYPE_CHECKING:
    import onnx_ir as ir

    from epctx.model.view import NodeView, ValueView

__all__ = ["Partition", "ir_nodes", "ir_values"]


@dataclasses.dataclass(frozen=True, slots=True)
class Partition:
    """A set of nodes of one graph that one EP runs as a unit (a fused node, once compiled)."""

    name: str
    ep_name: str
    nodes: tuple[NodeView, ...]  # topological order
    inputs: tuple[ValueView, ...]  # graph-level values read from outside (graph inputs or other partitions)
    outputs: tuple[ValueView, ...]  # values read outside the partition or graph outputs
    initializers: tuple[ValueView, ...]  # constant inputs of the nodes
    opset_imports: Mapping[str, int]


def ir_nodes(nodes: Sequence[NodeView]) -> tuple[ir.Node, ...]:
    """``nodes`` as onnx-ir's nodes, for code that needs more than the view (serialising, lowering): the
    nodes of a partition an EP compiles always are (compiling happens on the full load path only); a lean
    reader's node here is an InvalidGraph naming it."""
    import onnx_ir as ir

    for node in nodes:
        if not isinstance(node, ir.Node):
            raise InvalidGraph(
                f"node {node.name!r} is not an onnx-ir node (a context model's: nothing to compile)"
            )
    return cast("tuple[ir.Node, ...]", tuple(nodes))


def ir_values(values: Sequence[ValueView]) -> tuple[ir.Value, ...]:
    """``values`` as onnx-ir's values (see :func:`ir_nodes`)."""
    import onnx_ir as ir

    for value in values:
        if not isinstance(value, ir.Value):
            raise InvalidGraph(f"value {value.name!r} is not an onnx-ir value (a context model's)")
    return cast("tuple[ir.Value, ...]", tuple(values))
