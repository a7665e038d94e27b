"""Cycle-free grouping of one EP's nodes on a DAG of units.

``group_units`` takes a DAG (successor lists over unit ids, in a topological-friendly numbering) and the
set of units an EP owns, and returns groups of owned units such that contracting every group to one node
leaves the DAG acyclic. It is a Kahn traversal that grows one open group at a time: a ready owned unit
joins the open group; a ready foreign unit is processed only while it does not depend on the open group;
when only tainted foreign units are ready, the open group is closed. So no path leaves a group and comes
back into it, and groups are as large as the traversal allows.

``group_nodes`` runs it on the DAG of units of a graph's nodes (contracted partitions are one unit each), as
the partitioner does for each EP's claim and group.

``fused_groups`` is the same grouping on a graph's nodes: the partitions the partitioner forms from an EP's
flat claim. An EP that returns its own ``Capability.groups`` forms cycle-free groups with it: the nodes it
leaves out, those EPs ahead of it took included, lie between the groups, and the partitions those EPs formed
(``CapabilityContext.assigned_partitions``) count as one unit each, as the partitioner sees them.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import onnx_ir as ir

    from epctx.model.view import NodeView

__all__ = ["fused_groups", "group_nodes", "group_units", "node_successors"]


def node_successors(nodes: Sequence[ir.Node], index: Mapping[NodeView, int]) -> list[set[int]]:
    """Data edges between ``nodes`` (by position), including reads of outer values from inside subgraphs."""
    from epctx.model.scopes import outer_scope_values

    succ: list[set[int]] = [set() for _ in nodes]
    for j, node in enumerate(nodes):
        for value in (*node.inputs, *outer_scope_values(node)):
            if value is None:
                continue
            producer = value.producer()
            i = index.get(producer) if producer is not None else None
            if i is not None and i != j:
                succ[i].add(j)
    return succ


def group_nodes(
    node_succ: Sequence[set[int]], unit_of: Sequence[int], owned_nodes: set[int]
) -> list[list[int]]:
    """``group_units`` on the DAG of units, ``unit_of[i]`` being the unit (its first node) of node ``i``: the
    cycle-free groups of ``owned_nodes`` (each a unit of its own), as sorted node indices."""
    heads = sorted(set(unit_of))
    uid = {h: k for k, h in enumerate(heads)}
    succ: list[set[int]] = [set() for _ in heads]
    for i, targets in enumerate(node_succ):
        for j in targets:
            a, b = uid[unit_of[i]], uid[unit_of[j]]
            if a != b:
                succ[a].add(b)
    owned = {uid[unit_of[i]] for i in owned_nodes}
    groups = group_units([sorted(s) for s in succ], owned)
    members_of: dict[int, list[int]] = {}
    for i, h in enumerate(unit_of):
        members_of.setdefault(uid[h], []).append(i)
    return [sorted(i for u in g for i in members_of[u]) for g in groups]


def fused_groups(
    graph: ir.Graph, claimed: Sequence[ir.Node], partitions: Sequence[Sequence[ir.Node]] = ()
) -> list[list[ir.Node]]:
    """The cycle-free groups (each in graph order) of the ``claimed`` nodes of ``graph``: the partitions the
    partitioner makes of them as a flat claim. ``partitions``: node sets that run as one unit each (the
    partitions of EPs ahead, ``CapabilityContext.assigned_partitions``); their nodes are not grouped."""
    nodes = list(graph)
    index: dict[NodeView, int] = {node: i for i, node in enumerate(nodes)}
    unit_of = list(range(len(nodes)))
    inside: set[int] = set()
    for part in partitions:
        members = sorted(index[n] for n in part if n in index)
        inside.update(members)
        for i in members:
            unit_of[i] = members[0]
    owned = {index[n] for n in claimed if n in index} - inside
    return [[nodes[i] for i in g] for g in group_nodes(node_successors(nodes, index), unit_of, owned)]


def group_units(succ: Sequence[Sequence[int]], owned: set[int]) -> list[list[int]]:
    n = len(succ)
    indeg = [0] * n
    preds: list[list[int]] = [[] for _ in range(n)]
    for u in range(n):
        for v in succ[u]:
            indeg[v] += 1
            preds[v].append(u)
    # dep[u]: the highest group id u (transitively) depends on through processed units; -1 for none.
    dep = [-1] * n
    group_id = 0
    groups: list[list[int]] = []
    current: list[int] = []
    ready_owned: list[int] = []
    ready_clean: list[int] = []  # foreign units not depending on the open group
    ready_tainted: list[int] = []  # foreign units depending on the open group

    def push_ready(u: int) -> None:
        if u in owned:
            heapq.heappush(ready_owned, u)
        elif max((dep[p] for p in preds[u]), default=-1) == group_id and current:
            heapq.heappush(ready_tainted, u)
        else:
            heapq.heappush(ready_clean, u)

    def finish(u: int, d: int) -> None:
        dep[u] = d
        for v in succ[u]:
            indeg[v] -= 1
            if indeg[v] == 0:
                push_ready(v)

    for u in range(n):
        if indeg[u] == 0:
            push_ready(u)
    while ready_owned or ready_clean or ready_tainted:
        if ready_clean:
            u = heapq.heappop(ready_clean)
            finish(u, max((dep[p] for p in preds[u]), default=-1))
        elif ready_owned:
            u = heapq.heappop(ready_owned)
            current.append(u)
            finish(u, group_id)
        else:
            # Only units that depend on the open group are ready: close it; they become clean.
            groups.append(current)
            current = []
            group_id += 1
            ready_clean.extend(ready_tainted)
            heapq.heapify(ready_clean)
            ready_tainted.clear()
    if current:
        groups.append(current)
    return groups
