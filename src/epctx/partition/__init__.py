"""The GraphPartitioner: assigns every node to one EP and groups compiling EPs' nodes into partitions."""

from epctx.partition.partitioner import GraphPartitioner, Unit
from epctx.partition.placement import NodePlacement
from epctx.partition.stages import CompiledModel

__all__ = ["CompiledModel", "GraphPartitioner", "NodePlacement", "Unit"]
