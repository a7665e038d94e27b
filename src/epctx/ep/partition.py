"""Partition: the unit a compiling EP compiles (its own module, so the contract and the stage values both
name it without importing each other)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import onnx_ir as ir

__all__ = ["Partition"]


@dataclasses.dataclass(frozen=True, slots=True)
class Partition:
    """A set of nodes of one graph that one EP runs as a unit (a fused node, once compiled)."""

    name: str
    ep_name: str
    nodes: tuple[ir.Node, ...]  # topological order
    inputs: tuple[ir.Value, ...]  # graph-level values read from outside (graph inputs or other partitions)
    outputs: tuple[ir.Value, ...]  # values read outside the partition or graph outputs
    initializers: tuple[ir.Value, ...]  # constant inputs of the nodes
    opset_imports: Mapping[str, int]
