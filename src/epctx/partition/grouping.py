"""The partitioner's grouping lives in ``epctx.ep._grouping`` (EPs form their groups with it too)."""

from epctx.ep._grouping import group_nodes, group_units, node_successors

__all__ = ["group_nodes", "group_units", "node_successors"]
