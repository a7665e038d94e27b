"""GraphPartitioner: EPs asked in precedence order, first come first served (as onnxruntime does)."""

from __future__ import annotations

import dataclasses
import hashlib
import heapq
import logging
from collections import Counter
from collections.abc import Mapping, Sequence

import onnx_ir as ir

from epctx.ep._calls import ask_capability
from epctx.ep._compiling import Capability, CapabilityContext
from epctx.ep._contract import ExecutionProvider, Partition, make_partition
from epctx.errors import InvalidGraph, NotImplemented
from epctx.model.view import NodeView
from epctx.partition.claims import checked_claims
from epctx.partition.cost import cost_rule_reason
from epctx.partition.grouping import group_nodes, node_successors

__all__ = ["GraphPartitioner", "Unit"]

logger = logging.getLogger("epctx")


@dataclasses.dataclass(frozen=True, slots=True)
class Unit:
    """One step of the partitioned graph: a fused partition of a compiling EP, or one node of a kernel EP."""

    ep: ExecutionProvider
    nodes: tuple[ir.Node, ...]
    partition: Partition | None = None  # set for compiling EPs
    from_context: bool = False  # an EPContext node: loaded from its binary, never compiled


@dataclasses.dataclass(slots=True)
class _State:
    """The graph being partitioned: its nodes, their data edges, and who runs them so far."""

    nodes: list[ir.Node]
    index: dict[NodeView, int]
    node_succ: list[set[int]]
    owner: list[ExecutionProvider | None]
    # unit_of[i]: the unit node i belongs to; units start as single nodes and merge as EPs fuse.
    unit_of: list[int]
    fused: dict[int, tuple[ExecutionProvider, list[int]]]  # unit head -> (compiling EP, its nodes)

    @classmethod
    def of(cls, graph: ir.Graph) -> _State:
        nodes = list(graph)
        index: dict[NodeView, int] = {node: i for i, node in enumerate(nodes)}
        n = len(nodes)
        return cls(nodes, index, node_successors(nodes, index), [None] * n, list(range(n)), {})

    def context(self, ctx: CapabilityContext, hidden: frozenset[ir.Node] = frozenset()) -> CapabilityContext:
        """``ctx`` for the next EP: the nodes taken so far (with ``hidden``: those refused to it, shown as taken
        so that it neither claims nor probes them), and the partitions of several nodes formed so far."""
        taken = frozenset(n for n, o in zip(self.nodes, self.owner) if o is not None) | hidden
        parts = tuple(tuple(self.nodes[i] for i in m) for _, m in self.fused.values() if len(m) > 1)
        return dataclasses.replace(ctx, assigned=taken, assigned_partitions=parts)


class GraphPartitioner:
    def __init__(
        self,
        providers: Sequence[ExecutionProvider],
        *,
        cpu_fallback: bool,
        cost_rule: bool = True,
        refused: Mapping[ir.Node, tuple[str, str]] | None = None,
    ) -> None:
        self.providers = list(providers)
        self.cpu_fallback = cpu_fallback
        # A compiling EP's small partitions with no heavy op go to the next EP (``cost``); a later EP must be
        # there to take them: when none does, the graph is partitioned again without the rule.
        self.cost_rule = cost_rule
        # After partition(): node -> [(EP name, why it declined the node)] for nodes that EPs declined with a
        # reason (``Capability.declined``) before another EP took them (or none did).
        self.declined: dict[ir.Node, list[tuple[str, str]]] = {}
        # After partition(): id(EP) -> the ``Capability.artefacts`` it returned (for its compile), when not None.
        self.artefacts: dict[int, object] = {}
        # node -> (EP name, why): nodes that EP claims and may not have (the measured rule's hand-backs)
        self.refused = dict(refused or {})

    def partition(
        self,
        graph: ir.Graph,
        opset_imports: Mapping[str, int],
        *,
        preassigned: Mapping[NodeView, ExecutionProvider] | None = None,
        ctx: CapabilityContext | None = None,
    ) -> list[Unit]:
        """Assign every node of ``graph``; return the units in a valid execution order.
        ``preassigned`` nodes (EPContext nodes routed by their source) are units of their own, not asked about;
        ``ctx`` is given to each EP's ``get_capability`` (the session's compile guard), with the nodes the EPs
        ahead of it took (``CapabilityContext.assigned``)."""
        ctx = ctx or CapabilityContext()
        st = _State.of(graph)
        for node, ep in (preassigned or {}).items():
            i = st.index[node]
            st.owner[i] = ep
            st.fused[i] = (ep, [i])
        loaded = set(st.fused)
        for ep in self.providers:
            if all(o is not None for o in st.owner):
                break  # every node has its EP: later ones are not asked (the CPU EP's kernels stay unimported)
            hidden = self._hide_refused(ep, st) if self.refused else frozenset()
            if hidden and all(o is not None or n in hidden for n, o in zip(st.nodes, st.owner)):
                continue  # every node left is refused to it: not asked (no capability probe)
            self._take(ep, ask_capability(ep, graph, opset_imports, st.context(ctx, hidden)), st)
        missing = [st.nodes[i] for i, ep in enumerate(st.owner) if ep is None]
        if missing and self.cost_rule and any(_by_cost_rule(self.declined.get(n, ())) for n in missing):
            logger.info(
                "no EP after the one the cost rule refused takes its nodes: partitioning without the rule"
            )
            self.cost_rule, self.declined, self.artefacts = False, {}, {}
            return self.partition(graph, opset_imports, preassigned=preassigned, ctx=ctx)
        if missing:
            raise self._unassigned_error(missing, opset_imports)
        for node, reasons in self.declined.items():
            logger.info(
                "node %r (%s) runs on %s: %s", node.name, node.op_type, st.owner[st.index[node]].name,  # type: ignore[union-attr]
                "; ".join(f"{ep} declined it: {why}" for ep, why in reasons),
            )  # fmt: skip
        return self._ordered_units(graph, st, loaded, opset_imports, _graph_key(st.nodes))

    def _hide_refused(self, ep: ExecutionProvider, st: _State) -> frozenset[ir.Node]:
        """The nodes no EP took yet that are refused to ``ep`` (the measured rule's hand-backs, or a context
        model's record of them), their reason recorded: ``ep`` is shown them as taken."""
        hidden = []
        for node, (name, why) in self.refused.items():
            i = st.index.get(node)
            if name == ep.name and i is not None and st.owner[i] is None:
                hidden.append(node)
                self.declined.setdefault(node, []).append((name, why))
        return frozenset(hidden)

    def _refused(self, ep: ExecutionProvider, st: _State, claimed: Sequence[int]) -> set[int]:
        """The claimed nodes refused to ``ep``, for an EP that claims nodes shown to it as taken (their reason
        was recorded when they were hidden from it)."""
        return {
            i for i in claimed if self.refused.get(st.nodes[i], ("",))[0] == ep.name and st.owner[i] is None
        }

    def _take(self, ep: ExecutionProvider, capability: Capability, st: _State) -> None:
        """Give ``ep`` the nodes it claims that no EP ahead of it took; a compiling EP's become partitions."""
        if capability.artefacts is not None:
            self.artefacts[id(ep)] = capability.artefacts
        claims = checked_claims(ep.name, capability, st.index)
        refused = self._refused(ep, st, [*claims.flat, *(i for group in claims.groups for i in group)])
        free_groups = [
            [i for i in group if st.owner[i] is None and i not in refused] for group in claims.groups
        ]
        flat = [i for i in claims.flat if st.owner[i] is None and i not in refused]
        for i in (*flat, *(i for group in free_groups for i in group)):
            st.owner[i] = ep
        for node, why in capability.declined.items():
            at = st.index.get(node)
            if at is not None and st.owner[at] is None:
                self.declined.setdefault(node, []).append((ep.name, why))
        if not ep.compiles:
            return
        for k, (group, free) in enumerate(zip(claims.groups, free_groups)):
            if len(free) < len(group):
                logger.info("%s: %d of the %d node(s) of its group %d run on EPs ahead of it", ep.name,
                            len(group) - len(free), len(group), k)  # fmt: skip
            if free:
                self._fuse(ep, free, st, f"group {k} of {len(group)} node(s)")
        if flat:
            self._fuse(ep, flat, st)

    def _fuse(self, ep: ExecutionProvider, mine: list[int], st: _State, group: str | None = None) -> None:
        """Group a compiling EP's new nodes into partitions; those the cost rule refuses are left unowned.
        ``group``: ``mine`` is (what is left of) one of the EP's groups, split only where it must be."""
        parts = group_nodes(st.node_succ, st.unit_of, set(mine))
        if group is not None and len(parts) > 1:
            logger.info(
                "%s: %s split into %d cycle-free partitions (a path leaves it and comes back into it)",
                ep.name, group, len(parts),
            )  # fmt: skip
        for members in parts:
            refused = self._cost_reason(ep, [st.nodes[i] for i in members], len(st.nodes))
            if refused is not None:
                for i in members:
                    st.owner[i] = None
                    self.declined.setdefault(st.nodes[i], []).append((ep.name, refused))
                continue
            head = members[0]
            for i in members:
                st.unit_of[i] = head
            st.fused[head] = (ep, members)

    def _cost_reason(self, ep: ExecutionProvider, members: list[ir.Node], graph_size: int) -> str | None:
        if not self.cost_rule or ep is self.providers[-1]:
            return None
        why = cost_rule_reason(members, graph_size, ep.min_partition_nodes)
        if why is not None:
            logger.info("%s: %d node(s) left to the next EP (%s)", ep.name, len(members), why)
        return why

    def _unassigned_error(self, missing: list[ir.Node], opset_imports: Mapping[str, int]) -> Exception:
        from epctx.ep._contract import opset_of

        def why(node: ir.Node) -> str:
            reasons = self.declined.get(node)
            return "" if not reasons else ": " + "; ".join(f"{ep}: {text}" for ep, text in reasons)

        ops = ", ".join(
            f"{n.op_type} (domain {n.domain or 'ai.onnx'!r}, opset {opset_of(n, opset_imports)}, node {n.name!r})"
            f"{why(n)}"
            for n in missing[:20]
        )
        more = f" and {len(missing) - 20} more" if len(missing) > 20 else ""
        names = ", ".join(ep.name for ep in self.providers)
        if self.cpu_fallback:
            return NotImplemented(f"no execution provider ({names}) implements: {ops}{more}")
        return InvalidGraph(
            "session.disable_cpu_ep_fallback=1 and these nodes are not supported by the requested "
            f"execution providers ({names}): {ops}{more}"
        )

    @staticmethod
    def _ordered_units(
        graph: ir.Graph, st: _State, loaded: set[int], opset_imports: Mapping[str, int], key: str
    ) -> list[Unit]:
        nodes, unit_of, fused = st.nodes, st.unit_of, st.fused
        heads = sorted(set(unit_of))
        succ: dict[int, set[int]] = {h: set() for h in heads}
        indeg: Counter[int] = Counter()
        for i, targets in enumerate(st.node_succ):
            for j in targets:
                a, b = unit_of[i], unit_of[j]
                if a != b and b not in succ[a]:
                    succ[a].add(b)
                    indeg[b] += 1
        ready = [h for h in heads if indeg[h] == 0]
        heapq.heapify(ready)
        units: list[Unit] = []
        counts: Counter[str] = Counter()
        while ready:
            h = heapq.heappop(ready)
            if h in loaded:
                ep, _ = fused[h]
                part = make_partition(nodes[h].name or "", ep.name, graph, [nodes[h]], opset_imports)
                units.append(Unit(ep, (nodes[h],), part, from_context=True))
            elif h in fused:
                ep, members = fused[h]
                name = f"{ep.name}_{key}_{counts[ep.name]}"
                counts[ep.name] += 1
                part = make_partition(name, ep.name, graph, [nodes[i] for i in members], opset_imports)
                units.append(Unit(ep, tuple(nodes[i] for i in members), part))
            else:
                kernel_ep = st.owner[h]
                if kernel_ep is None:  # every node was checked to have an owner before ordering
                    raise InvalidGraph(f"node {nodes[h].name!r} has no execution provider (internal error)")
                units.append(Unit(kernel_ep, (nodes[h],)))
            for s in sorted(succ[h]):
                indeg[s] -= 1
                if indeg[s] == 0:
                    heapq.heappush(ready, s)
        if len(units) != len(heads):
            raise InvalidGraph("partitioning produced a cycle between fused partitions (internal error)")
        return units


def _by_cost_rule(reasons: Sequence[tuple[str, str]]) -> bool:
    return any(why.startswith("cost rule:") for _, why in reasons)


# Attributes that distinguish otherwise equal nodes in partition names (tensors and graphs are left out:
# hashing them would cost as much as the weights).
_KEYED_ATTRIBUTES = frozenset(
    {
        ir.AttributeType.INT,
        ir.AttributeType.INTS,
        ir.AttributeType.FLOAT,
        ir.AttributeType.FLOATS,
        ir.AttributeType.STRING,
        ir.AttributeType.STRINGS,
    }
)


def _graph_key(nodes: list[ir.Node]) -> str:
    """A short digest of the graph's structure: partition names derive from it, not from a counter."""
    h = hashlib.sha256()
    for node in nodes:
        h.update(f"{node.domain}:{node.op_type}:{node.name}|".encode())
        for name, attr in sorted(node.attributes.items()):
            if isinstance(attr, ir.Attr) and attr.type in _KEYED_ATTRIBUTES:
                value = attr.value
                if isinstance(value, (bytes, str)) and len(value) > 256:
                    # Large payloads (an embedded EP context) are named by size, not hashed byte by byte.
                    value = f"<{len(value)} bytes>"
                h.update(f"{name}={value!r}|".encode())
        h.update(",".join(v.name or "" if v is not None else "" for v in node.inputs).encode())
        h.update(b">")
        h.update(",".join(v.name or "" for v in node.outputs).encode())
        h.update(b";")
    return h.hexdigest()[:12]
