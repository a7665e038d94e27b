"""Placement you can see: for every node, the EP that runs it and why each EP ahead of it declined it.

Built once per session from the partition stage's result (its units, and the reasons EPs gave in
``Capability.declined`` as ``GraphPartitioner.declined`` records them); read by
``InferenceSession.get_node_placement``, ``epctx compile``'s summary, the profile's ``node_placement`` event and
``epctx inspect --placement``'s picture.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import onnx_ir as ir

if TYPE_CHECKING:
    from epctx.partition.partitioner import Unit

__all__ = [
    "BODY_NOT_OFFERED",
    "NO_REASON",
    "BodyPartitioning",
    "NodePlacement",
    "node_placement",
    "placement_summary",
]

# What an EP ahead in the list is said to have done when it gave no reason for not taking a node.
NO_REASON = "not claimed by its get_capability (no reason given)"
# Why a node inside a control-flow body run by a kernel EP was not offered to the EPs ahead.
BODY_NOT_OFFERED = (
    "inside a control-flow body, which is offered to the EPs only with session.partition_control_flow_bodies=1 "
    "(never in a context model)"
)
_QUOTED = re.compile(r" '[^']*'")  # a node / value / operation name quoted in a reason


@dataclasses.dataclass(frozen=True, slots=True)
class NodePlacement:
    """Where one node of the main graph runs (``provider``; ``partition``: the fused partition of a compiling
    EP that holds it, or the EPContext node it was loaded as; None for a node a kernel EP runs alone), and for
    each EP ahead of ``provider`` in the session's list, why it did not take the node (``declined``)."""

    index: int  # position of the node in its graph
    name: str
    op_type: str
    domain: str
    provider: str
    partition: str | None
    declined: tuple[tuple[str, str], ...] = ()
    # "" for the main graph; for a node inside a control-flow body, the body's path from the main graph:
    # "<node>/<attribute>" per level (e.g. "If_0/then_branch/decoder_If/else_branch").
    graph: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "graph": self.graph,
            "index": self.index,
            "name": self.name,
            "op_type": self.op_type,
            "domain": self.domain,
            "provider": self.provider,
            "partition": self.partition,
            "declined": dict(self.declined),
        }


# A body the session partitioned among its EPs: its units and the reasons EPs gave (the partitioner's).
BodyPartitioning = tuple[Sequence["Unit"], Mapping[ir.Node, Sequence[tuple[str, str]]]]


def node_placement(
    graph: ir.Graph,
    units: Sequence[Unit],
    declined: Mapping[ir.Node, Sequence[tuple[str, str]]],
    providers: Sequence[str],
    *,
    bodies: Mapping[ir.Graph, BodyPartitioning] | None = None,
    kernel_ep: str = "",
    path: str = "",
) -> list[NodePlacement]:
    """The placement of every node of ``graph`` in graph order, each followed by the nodes of its control-flow
    bodies. ``declined``: the partitioner's reasons (node -> [(EP name, why)]); ``providers``: the session's EP
    names in precedence order; ``bodies``: the bodies the session partitioned (others run where their
    control-flow node runs: inside its partition, or on ``kernel_ep`` node by node)."""
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
        placed = NodePlacement(
            index=index,
            name=node.name or "",
            op_type=node.op_type,
            domain=node.domain or "",
            provider=provider,
            partition=partition,
            declined=tuple((ep, reasons.get(ep, NO_REASON)) for ep in ahead),
            graph=path,
        )
        result.append(placed)
        result.extend(_body_placement(node, placed, providers, bodies or {}, kernel_ep))
    return result


def _body_placement(
    node: ir.Node,
    parent: NodePlacement,
    providers: Sequence[str],
    bodies: Mapping[ir.Graph, BodyPartitioning],
    kernel_ep: str,
) -> list[NodePlacement]:
    result: list[NodePlacement] = []
    for attr in node.attributes.values():
        if not isinstance(attr, ir.Attr) or attr.type not in (
            ir.AttributeType.GRAPH,
            ir.AttributeType.GRAPHS,
        ):
            continue
        many = attr.type == ir.AttributeType.GRAPHS
        for k, body in enumerate(attr.value if many else [attr.value]):
            path = f"{parent.graph}/" if parent.graph else ""
            path += f"{node.name or node.op_type}/{attr.name}" + (f"[{k}]" if many else "")
            if body in bodies:
                units, declined = bodies[body]
                result += node_placement(
                    body, units, declined, providers, bodies=bodies, kernel_ep=kernel_ep, path=path
                )
            else:
                result += _inherited(body, parent, providers, bodies, kernel_ep, path)
    return result


def _inherited(
    body: ir.Graph,
    parent: NodePlacement,
    providers: Sequence[str],
    bodies: Mapping[ir.Graph, BodyPartitioning],
    kernel_ep: str,
    path: str,
) -> list[NodePlacement]:
    """A body nobody partitioned: inside its control-flow node's partition, or on the kernel EP node by node."""
    inside = parent.partition is not None
    ahead = providers[: providers.index(kernel_ep)] if kernel_ep in providers else providers
    result: list[NodePlacement] = []
    for index, node in enumerate(body):
        placed = NodePlacement(
            index=index,
            name=node.name or "",
            op_type=node.op_type,
            domain=node.domain or "",
            provider=parent.provider if inside else kernel_ep,
            partition=parent.partition,
            declined=() if inside else tuple((ep, BODY_NOT_OFFERED) for ep in ahead),
            graph=path,
        )
        result.append(placed)
        result.extend(_body_placement(node, placed, providers, bodies, kernel_ep))
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
