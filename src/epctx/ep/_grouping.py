"""Cycle-free grouping of one EP's nodes on a DAG of units.

``group_units`` takes a DAG (successor lists over unit ids, in a topological-friendly numbering) and the
set of units an EP owns, and returns groups of owned units such that contracting every group to one node
leaves the DAG acyclic. It is a Kahn traversal that grows one open group at a time: a ready owned unit
joins the open group; a ready foreign unit is processed only while it does not depend on the open group;
when only tainted foreign units are ready, the open group is closed. So no path leaves a group and comes
back into it, and groups are as large as the traversal allows.

``fused_groups`` is the same grouping on a graph's nodes: the partitions the partitioner forms from an EP's
flat claim when no EP before it claimed any. An EP that returns its own ``Capability.groups`` forms cycle-free
groups with it (the nodes it leaves out, those EPs ahead of it took included, lie between the groups).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import onnx_ir as ir

__all__ = ["fused_groups", "group_units"]


def fused_groups(graph: ir.Graph, claimed: Sequence[ir.Node]) -> list[list[ir.Node]]:
    """The cycle-free groups (each in graph order) of the ``claimed`` nodes of ``graph``: the partitions the
    partitioner makes of them as a flat claim."""
    from epctx.model.scopes import outer_scope_values

    nodes = list(graph)
    index = {node: i for i, node in enumerate(nodes)}
    succ: list[set[int]] = [set() for _ in nodes]
    for j, node in enumerate(nodes):
        for value in (*node.inputs, *outer_scope_values(node)):
            producer = value.producer() if value is not None else None
            i = index.get(producer) if producer is not None else None
            if i is not None and i != j:
                succ[i].add(j)
    owned = {index[n] for n in claimed if n in index}
    return [[nodes[i] for i in sorted(g)] for g in group_units([sorted(s) for s in succ], owned)]


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
