"""The partitioner's grouping lives in ``epctx.ep.grouping`` (EPs ask it which partitions their claim forms)."""

from epctx.ep.grouping import group_units

__all__ = ["group_units"]
