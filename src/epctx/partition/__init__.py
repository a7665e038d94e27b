"""The GraphPartitioner: assigns every node to one EP and groups compiling EPs' nodes into partitions."""

from epctx.partition.partitioner import GraphPartitioner, Unit

__all__ = ["GraphPartitioner", "Unit"]
