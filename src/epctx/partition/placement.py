"""Placement you can see: for every node, the EP that runs it and why each EP ahead of it declined it.

Built once per session from the partitioner's result (its units and the reasons EPs gave through
``ExecutionProvider.declined_nodes``); read by ``InferenceSession.get_node_placement``, ``epctx compile``'s
summary, the profile's ``node_placement`` event and ``epctx inspect --placement``'s picture.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import onnx_ir as ir

    from epctx.partition.partitioner import Unit

__all__ = ["NO_REASON", "NodePlacement", "node_placement", "placement_summary"]

# What an EP ahead in the list is said to have done when it gave no reason for not taking a node.
NO_REASON = "not claimed by its get_capability (no reason given)"
_QUOTED = re.compile(r" '[^']*'")  # a node / value / operation name quoted in a reason


@dataclasses.dataclass(frozen=True, slots=True)
class NodePlacement:
    """Where one node of the main graph runs (``provider``; ``partition``: the fused partition of a compiling
    EP that holds it, or the EPContext node it was loaded as; None for a node a kernel EP runs alone), and for
    each EP ahead of ``provider`` in the session's list, why it did not take the node (``declined``)."""

    index: int  # position of the node in the graph
    name: str
    op_type: str
    domain: str
    provider: str
    partition: str | None
    declined: tuple[tuple[str, str], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "name": self.name,
            "op_type": self.op_type,
            "domain": self.domain,
            "provider": self.provider,
            "partition": self.partition,
            "declined": dict(self.declined),
        }


def node_placement(
    graph: ir.Graph,
    units: Sequence[Unit],
    declined: Mapping[ir.Node, Sequence[tuple[str, str]]],
    providers: Sequence[str],
) -> list[NodePlacement]:
    """The placement of every node of ``graph``, in graph order. ``declined``: the partitioner's reasons
    (node -> [(EP name, why)]); ``providers``: the session's EP names in precedence order."""
    where: dict[ir.Node, tuple[str, str | None, bool]] = {}
    for unit in units:
        partition = unit.partition.name if unit.partition is not None else None
        for node in unit.nodes:
            where[node] = (unit.ep.name, partition, unit.from_context)
    rank = {name: i for i, name in enumerate(providers)}
    result = []
    for index, node in enumerate(graph):
        provider, partition, from_context = where.get(node, ("", None, False))
        reasons = dict(declined.get(node, ()))
        ahead = [] if from_context else providers[: rank.get(provider, len(providers))]
        result.append(
            NodePlacement(
                index=index,
                name=node.name or "",
                op_type=node.op_type,
                domain=node.domain or "",
                provider=provider,
                partition=partition,
                declined=tuple((ep, reasons.get(ep, NO_REASON)) for ep in ahead),
            )
        )
    return result


def placement_summary(placement: Sequence[NodePlacement], *, top: int = 5) -> dict[str, Any]:
    """Nodes and partitions per EP, and the ``top`` reasons that sent the most nodes further down the list
    (each with the EP that gave it, how many nodes it covers and one of them; names quoted in a reason are
    shown as '...', so one reason given for many nodes counts as one)."""
    nodes = Counter(p.provider for p in placement)
    partitions: dict[str, set[str]] = {}
    for p in placement:
        if p.partition is not None:
            partitions.setdefault(p.provider, set()).add(p.partition)
    reasons: Counter[tuple[str, str]] = Counter()
    example: dict[tuple[str, str], str] = {}
    for p in placement:
        for ep, why in p.declined:
            key = (ep, _QUOTED.sub(" '...'", why))  # the same reason for other nodes / values counts once
            reasons[key] += 1
            example.setdefault(key, p.name)
    return {
        "nodes_per_provider": dict(nodes.most_common()),
        "partitions_per_provider": {ep: len(names) for ep, names in partitions.items()},
        "top_reasons": [
            {"provider": ep, "reason": why, "nodes": count, "example": example[(ep, why)]}
            for (ep, why), count in reasons.most_common(top)
        ],
    }
