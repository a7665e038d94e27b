"""The partitioner's grouping lives in ``epctx.ep._grouping`` (EPs ask it which partitions their claim forms)."""

from epctx.ep._grouping import group_units

__all__ = ["group_units"]
