"""An EP's ``Capability`` as node indices, checked: what it claims must be nodes of the graph, each at most once.

``claimed`` nodes listed twice are taken once (the first contract allowed it); a node in two groups, twice in
one group, or in a group and in ``claimed`` is EPFail naming the EP, as is a node not in the graph: the
partitioner cannot tell which partition the EP meant it for.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING

from epctx.errors import EPFail

if TYPE_CHECKING:
    import onnx_ir as ir

    from epctx.ep._compiling import Capability
    from epctx.model.view import NodeView

__all__ = ["Claims", "checked_claims"]


@dataclasses.dataclass(frozen=True, slots=True)
class Claims:
    """``groups``: the EP's groups, in its order (an empty one left out); ``flat``: its ``claimed`` nodes."""

    groups: tuple[tuple[int, ...], ...]
    flat: tuple[int, ...]


def _describe(node: ir.Node) -> str:
    return f"node {node.name!r} ({node.domain + '::' if node.domain else ''}{node.op_type})"


def checked_claims(ep_name: str, capability: Capability, index: Mapping[NodeView, int]) -> Claims:
    """The indices (in ``index``) of what ``capability`` claims; EPFail for a node claimed twice or not there."""
    where: dict[int, str] = {}  # node index -> where it was claimed, for the error

    def at(node: ir.Node, place: str) -> int:
        i = index.get(node)
        if i is None:
            raise EPFail(
                f"{ep_name}.get_capability claims {_describe(node)} in {place}, which is not a node of the graph "
                "it was given"
            )
        first = where.get(i)
        if first is not None and not first == place == "claimed":
            raise EPFail(
                f"{ep_name}.get_capability claims {_describe(node)} twice: in {first} and in {place} (a node "
                "belongs to one partition)"
            )
        where[i] = place
        return i

    if not capability.groups:  # the common case, on every node of the graph for the CPU EP: no bookkeeping
        found = dict.fromkeys(map(index.get, capability.claimed))
        if None in found:
            at(next(n for n in capability.claimed if index.get(n) is None), "claimed")  # raises
        return Claims((), tuple(i for i in found if i is not None))
    groups = []
    for k, group in enumerate(capability.groups):
        place = f"group {k}"
        indices = tuple(at(node, place) for node in group)
        if indices:
            groups.append(indices)
    flat = tuple(dict.fromkeys(at(node, "claimed") for node in capability.claimed))
    return Claims(tuple(groups), flat)
