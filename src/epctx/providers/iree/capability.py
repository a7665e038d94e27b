"""Which nodes IREE runs, as IREE itself says: no hand-kept op list.

The candidates (standard-domain nodes whose values all have a known tensor type, no control flow, not
disabled) are compiled as one partition (import + ``iree-compile``, out of process). When that fails, the set
is split in halves, each compiled again, down to single nodes: the nodes whose own compile fails are declined
with IREE's message, the others claimed. With k failing nodes among n that is about k * log2(n) small
compiles, in parallel. The groups claimed apart are then compiled together (IREE may fail on a combination of
nodes it compiles apart), adding them in graph order and declining a group that breaks the compile. Every
successful compile is kept: the partition the framework then asks to compile is usually exactly the claimed
set, compiled once.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import onnx_ir as ir

from epctx.ep import CompileGuard, Partition, is_ep_context, make_partition, outer_scope_values
from epctx.providers.iree.compile import CompileResult, compile_partitions

__all__ = ["Verdict", "candidate_nodes", "check_nodes", "short_error"]

_DOMAINS = ("", "ai.onnx")
_GRAPH_ATTRS = (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)
_UNSUPPORTED_DTYPES = (ir.DataType.STRING, ir.DataType.UNDEFINED)
_ERROR_CHARS = 300


def _why_untyped(values: Sequence[ir.Value | None]) -> str | None:
    for v in values:
        if v is None:
            continue
        if v.const_value is not None:
            dtype = v.const_value.dtype
        elif isinstance(v.type, ir.TensorType):
            dtype = v.type.dtype
        else:
            return f"value {v.name!r} has no known tensor type"
        if dtype in _UNSUPPORTED_DTYPES:
            return f"value {v.name!r} is {dtype.name}, which IREE does not take"
    return None


def candidate_nodes(
    graph: ir.Graph, disabled_ops: frozenset[str]
) -> tuple[list[ir.Node], dict[ir.Node, str]]:
    """The nodes worth compiling, and why each other node is not one."""
    found: list[ir.Node] = []
    declined: dict[ir.Node, str] = {}
    for node in graph:
        if is_ep_context(node):
            continue
        if node.domain not in _DOMAINS:
            declined[node] = f"domain {node.domain!r} is not ONNX's: IREE imports standard ONNX ops only"
        elif node.op_type in disabled_ops:
            declined[node] = f"{node.op_type} is in the provider option disabled_ops"
        elif any(isinstance(a, ir.Attr) and a.type in _GRAPH_ATTRS for a in node.attributes.values()):
            declined[node] = "control flow (a subgraph attribute) is not offered to IREE"
        else:
            why = _why_untyped([*node.inputs, *node.outputs, *outer_scope_values(node)])
            if why is None:
                found.append(node)
            else:
                declined[node] = why
    return found, declined


def short_error(result: CompileResult) -> str:
    """IREE's message in one line: its first ``error:`` line (or the first line), shortened."""
    lines = [line.strip() for line in result.error.splitlines() if line.strip()]
    line = next(
        (x for x in lines if "error:" in x),
        next((x for x in lines if "error" in x.lower()), lines[0] if lines else "no message"),
    )
    line = re.sub(r"^\S*?(:\d+)+: ", "", line)  # drop the MLIR location prefix
    if len(line) > _ERROR_CHARS:
        line = line[:_ERROR_CHARS] + "..."
    return f"IREE {result.stage or 'compile'} failed: {line}"


class Verdict:
    """What ``check_nodes`` found: the claimed nodes, why the others were declined, and the compiles that
    succeeded (partition node set -> (partition, result)), which ``compile`` reuses (the capability's
    artefacts)."""

    def __init__(self) -> None:
        self.claimed: list[ir.Node] = []
        self.declined: dict[ir.Node, str] = {}
        self.compiled: dict[frozenset[ir.Node], tuple[Partition, CompileResult]] = {}


def check_nodes(
    ep_name: str,
    graph: ir.Graph,
    opset_imports: Mapping[str, int],
    nodes: Sequence[ir.Node],
    flags: Sequence[str],
    guard: CompileGuard,
) -> Verdict:
    """Compile ``nodes`` (graph order), bisecting on failure down to the nodes IREE cannot take; every compile
    passes ``guard`` first."""
    verdict = Verdict()
    pending: list[list[ir.Node]] = [list(nodes)] if nodes else []
    level = 0
    while pending:
        parts = [
            make_partition(f"{ep_name}_check{level}_{k}", ep_name, graph, group, opset_imports)
            for k, group in enumerate(pending)
        ]
        results = compile_partitions(parts, flags, guard, ep_name=ep_name, what="capability check")
        following: list[list[ir.Node]] = []
        for group, part, result in zip(pending, parts, results):
            if result.ok:
                verdict.compiled[frozenset(group)] = (part, result)
                verdict.claimed.extend(group)
            elif len(group) == 1:
                verdict.declined[group[0]] = short_error(result)
            else:
                half = len(group) // 2
                following += [group[:half], group[half:]]
        pending = following
        level += 1
    order = {node: i for i, node in enumerate(graph)}
    verdict.claimed.sort(key=order.__getitem__)
    if verdict.claimed and frozenset(verdict.claimed) not in verdict.compiled:
        _check_together(ep_name, graph, opset_imports, verdict, flags, guard, order)
    return verdict


def _check_together(
    ep_name: str,
    graph: ir.Graph,
    opset_imports: Mapping[str, int],
    verdict: Verdict,
    flags: Sequence[str],
    guard: CompileGuard,
    order: Mapping[ir.Node, int],
) -> None:
    """The groups claimed after a bisection compiled apart; the framework compiles them as one partition. Compile
    them together; when IREE fails on the combination (each part alone compiles), keep the groups, in graph
    order, that compile with the ones kept before them and decline the others with IREE's message."""
    union = make_partition(f"{ep_name}_together", ep_name, graph, verdict.claimed, opset_imports)
    (result,) = compile_partitions([union], flags, guard, ep_name=ep_name, what="capability check")
    if result.ok:  # the usual case: one more compile, reused when the partition is this set
        verdict.compiled[frozenset(verdict.claimed)] = (union, result)
        return
    groups = sorted(
        (sorted(group, key=order.__getitem__) for group in verdict.compiled),
        key=lambda g: order[g[0]],
    )
    kept = groups[0]
    for k, group in enumerate(groups[1:], start=1):
        trial = sorted([*kept, *group], key=order.__getitem__)
        part = make_partition(f"{ep_name}_together{k}", ep_name, graph, trial, opset_imports)
        (result,) = compile_partitions([part], flags, guard, ep_name=ep_name, what="capability check")
        if result.ok:
            verdict.compiled[frozenset(trial)] = (part, result)
            kept = trial
            continue
        why = f"{short_error(result)} (its nodes compile apart, not with the nodes before them)"
        for node in group:
            verdict.declined[node] = why
    verdict.claimed = kept
