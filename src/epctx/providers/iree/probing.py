"""Which candidate nodes IREE takes, asked of IREE itself within a time budget (``capability_budget_s``):

1. the candidates are compiled whole with the EP's flags: usually the one compile of the model (its one group,
   and the compile is reused);
2. when that fails and the flags convert convolutions to channels-last, the whole set is compiled again in ONNX's
   layout (IREE's conversion fails on convolutions with dynamic sizes): the model stays whole, and the log says
   which ``--dim`` would give channels-last back;
3. else the set is bisected with cheap probes (``--compile-to=flow``: import, legalisation and dispatch
   formation, where IREE rejects ops, without code generation), in parallel, down to single nodes;
4. the claim is split into cycle-free groups (``fused_groups``: other EPs' nodes, those ahead of IREE included,
   and the nodes IREE declines lie between them; the partitions of EPs ahead count as one unit each) and each
   group is compiled fully; a group that fails (code generation fails where the flow probes passed) is halved
   in graph order and its halves compiled fully, largest pieces first, in parallel, down to single nodes: a
   failure in one region declines that region only. Halves of a cycle-free group in a topological order are
   cycle-free, and so are they with the other groups. The groups returned are those whose full compile passed
   (``Capability.groups``): the partitioner makes each one partition, so what passes capability is what the
   framework asks IREE to compile.

No search step starts once the budget is spent (the nodes not decided then are declined, saying so). No node set
is compiled twice with the same flags in one check, failures included (``_Search.compile``); across sessions
results are cached per process by content (``compile``). Two boundaries IREE cannot take: a value with a type
but no shape (IREE would read it as a scalar) and a Reshape's shape operand (IREE mishandles -1 and 0 in a shape
known only at run: RESOURCE_EXHAUSTED at run, or a wrong result). A partition with one fails, with that reason,
without a compile (``capability.unfit_boundary``; the worker refuses one too), and groups are halved where no
such value crosses (``_halves``). Once the first compile failed on a model with dynamic dimensions, the search
leaves out the Reshapes to a shape computed at run (``capability.runtime_shape``: IREE gets them wrong in pieces).
When the model has dynamic dimensions and nodes are declined, each reason and the log name the ``--dim`` sizes to
state for IREE to try the model whole."""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Mapping, Sequence

import onnx_ir as ir

from epctx.ep import CompileGuard, Partition, fused_groups, make_partition
from epctx.providers.iree.capability import is_unfit_boundary, runtime_shape, short_error, unfit_boundary
from epctx.providers.iree.compile import CompileResult, compile_partitions
from epctx.providers.iree.options import CONV_DATA_TILING, CONV_TILING_FALLBACK, with_flags

__all__ = ["Probes", "Verdict", "check_nodes"]

logger = logging.getLogger("epctx")

PROBE_FLAG = "--compile-to=flow"

Group = list[ir.Node]
_Key = tuple[frozenset[ir.Node], tuple[str, ...]]


@dataclasses.dataclass
class Probes:
    """The capability's artefacts: full compiles by node set (partition checked, result), and the flags that the
    EP's compile uses for this graph (without channels-last when the check had to drop it)."""

    compiled: dict[frozenset[ir.Node], tuple[Partition, CompileResult]]
    flags: tuple[str, ...]


@dataclasses.dataclass
class Verdict:
    """``claimed``: the nodes IREE takes, in graph order; ``groups``: the same nodes as the partitions checked
    (each compiled, in ``probes.compiled``); ``declined``: the others, with IREE's reasons."""

    claimed: list[ir.Node]
    declined: dict[ir.Node, str]
    probes: Probes
    groups: list[Group] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class _Search:
    ep_name: str
    graph: ir.Graph
    opsets: Mapping[str, int]
    guard: CompileGuard
    budget_s: float
    partitions: Sequence[Sequence[ir.Node]] = ()  # of the EPs ahead: one unit each when grouping
    started: float = dataclasses.field(default_factory=time.perf_counter)
    count: int = 0
    seen: dict[_Key, tuple[Partition, CompileResult]] = dataclasses.field(default_factory=dict)

    @property
    def spent(self) -> float:
        return time.perf_counter() - self.started

    def over(self) -> bool:
        return self.spent > self.budget_s

    def compile(self, groups: Sequence[Group], flags: Sequence[str]) -> list[tuple[Partition, CompileResult]]:
        """Each group compiled with ``flags``, in parallel: a node set compiled before in this check (passed or
        failed) is not compiled again, and one whose boundary IREE would misread fails without a compile."""
        fresh: dict[_Key, Partition] = {}
        for group in groups:
            key = (frozenset(group), tuple(flags))
            if key in self.seen or key in fresh:
                continue
            part = make_partition(f"{self.ep_name}_check{self.count}", self.ep_name, self.graph, group,
                                  self.opsets)  # fmt: skip
            self.count += 1
            why = unfit_boundary(part)
            if why is None:
                fresh[key] = part
            else:
                self.seen[key] = (part, CompileResult(False, stage="import", error=why))
        results = compile_partitions(list(fresh.values()), flags, self.guard, ep_name=self.ep_name,
                                     what="capability check")  # fmt: skip
        self.seen.update(zip(fresh, zip(fresh.values(), results)))
        return [self.seen[(frozenset(group), tuple(flags))] for group in groups]

    def budget_reason(self) -> str:
        return (
            f"not checked: IREE's capability budget of {self.budget_s:g} s was spent (provider option "
            "capability_budget_s)"
        )


def check_nodes(
    ep_name: str,
    graph: ir.Graph,
    opsets: Mapping[str, int],
    nodes: Sequence[ir.Node],
    flags: Sequence[str],
    guard: CompileGuard,
    *,
    layout_flag: str | None = None,
    budget_s: float = 30.0,
    partitions: Sequence[Sequence[ir.Node]] = (),
) -> Verdict:
    """The nodes of ``nodes`` (graph order) IREE takes, and why it declines the others (see the module).
    ``partitions``: those the EPs ahead formed (``CapabilityContext.assigned_partitions``)."""
    search = _Search(ep_name, graph, opsets, guard, budget_s, partitions)
    probes = Probes({}, tuple(flags))
    verdict = Verdict([], {}, probes)
    if not nodes:
        return verdict
    whole = list(nodes)
    first = fused_groups(graph, whole, partitions)  # one, unless other EPs' nodes lie between the candidates
    failed = _first_compile(search, verdict, first, flags, layout_flag)
    if failed:
        rest = _drop_runtime_shapes(graph, [n for group in failed for n in group], verdict.declined)
        if (
            len(first) == 1 and rest
        ):  # where IREE rejects ops: cheap probes, then full compiles of what passed
            rest = [n for group in _bisect(search, rest, probes.flags, verdict.declined) for n in group]
        failed = fused_groups(graph, rest, partitions) if rest else []
    verdict.groups = _verify(search, verdict, failed)
    verdict.claimed = [n for group in verdict.groups for n in group]
    order = {node: i for i, node in enumerate(graph)}
    verdict.claimed.sort(key=order.__getitem__)
    logger.info("%s capability: %d node(s) claimed in %d group(s), %d declined, in %.1f s", ep_name,
                len(verdict.claimed), len(verdict.groups), len(verdict.declined), search.spent)  # fmt: skip
    if verdict.declined:
        hint = _dims_hint(graph, "for IREE to try the model whole with static shapes")
        logger.warning("%s declines %d node(s) of this model. %s", ep_name, len(verdict.declined), hint)
        if hint:
            for node, why in verdict.declined.items():
                verdict.declined[node] = f"{why}. {hint}"
    elif any(n.op_type in _SIZE_SENSITIVE for n in verdict.claimed) and _has_dynamic_dims(graph):
        logger.warning(
            "%s compiles this model with dynamic dimensions: IREE's code for its convolutions / matrix products is "
            "much slower without the sizes (magika's shipped model, dynamic batch: 201 ms a run; batch stated: "
            "7.7 ms). %s", ep_name, _dims_hint(graph, "for faster code"),
        )  # fmt: skip
    return verdict


# Ops whose IREE code is much faster with the sizes known (data tiling, microkernels, im2col need static shapes).
_SIZE_SENSITIVE = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm", "ConvInteger", "MatMulInteger"})


def _first_compile(
    search: _Search, verdict: Verdict, groups: list[Group], flags: Sequence[str], layout_flag: str | None
) -> list[Group]:
    """Compile the candidates' groups (usually one: the model whole), whatever the budget; when some fail with
    channels-last, again in ONNX's layout. Those that pass are the verdict's groups; returns those that fail."""
    probes = verdict.probes
    results = search.compile(groups, flags)
    failed = [k for k, (_, r) in enumerate(results) if not r.ok]
    if failed and layout_flag in flags:
        # ONNX's layout, with IREE's convolution data tiling unless fast_codegen=0 (options.CONV_DATA_TILING):
        # 3.5x faster than without
        tiling = CONV_DATA_TILING if CONV_TILING_FALLBACK in flags else ()
        plain = tuple(with_flags([f for f in flags if f != layout_flag], tiling))
        again = search.compile([groups[k] for k in failed], plain)
        if any(r.ok for _, r in again):
            logger.info(
                "%s: channels-last convolutions fail with this model's dynamic dimensions (%s); compiled in "
                "ONNX's layout%s", search.ep_name, short_error(results[failed[0]][1]),
                ", with IREE's data tiling of convolutions" if tiling else "",
            )  # fmt: skip
            probes.flags = plain
        elif _has_dynamic_dims(search.graph):  # search in ONNX's layout: channels-last fails on dynamic convs
            probes.flags = tuple(
                f for f in flags if f != layout_flag
            )  # without the data tiling that failed too
        for k, retried in zip(failed, again):
            results[k] = retried if retried[1].ok else results[k]
    for group, (part, result) in zip(groups, results):
        if result.ok:
            probes.compiled[frozenset(group)] = (part, result)
            verdict.groups.append(group)
    return [g for g, (_, r) in zip(groups, results) if not r.ok]


def _drop_runtime_shapes(graph: ir.Graph, nodes: Group, declined: dict[ir.Node, str]) -> Group:
    """``nodes`` without the Reshapes IREE would get wrong in pieces of a model with dynamic dims (declined)."""
    if not _has_dynamic_dims(graph):
        return nodes
    unsafe = {node: why for node in nodes if (why := runtime_shape(node)) is not None}
    declined.update(unsafe)
    return [node for node in nodes if node not in unsafe]


def _has_dynamic_dims(graph: ir.Graph) -> bool:
    from epctx.providers.iree.capability import dynamic_dims

    return bool(dynamic_dims(graph))


def _dims_hint(graph: ir.Graph, why: str) -> str:
    """Which ``--dim`` would state the graph inputs' dynamic sizes, each with a size to start from: 1 for an
    input's first axis (a batch, as a session runs it most often), else a size the model's metadata gives for
    that name (``metadata_props``), else none: the size the model is fed, said so."""
    found: dict[str, str] = {}
    for value in graph.inputs:
        if value.const_value is not None or value.shape is None:
            continue
        for axis, dim in enumerate(value.shape):
            if isinstance(dim, int):
                continue
            key = dim.value if dim.value else f"{value.name}:{axis}"
            if key not in found:
                found[key] = _suggested_size(graph, key, axis)
    if not found:
        return ""
    dims = " ".join(f"--dim {k}={size}" for k, size in found.items())
    legend = []
    if any(size == "1" for size in found.values()):
        legend.append("1 for a first axis: a batch of one, or the batch the model runs")
    if any(size == "N" for size in found.values()):
        legend.append("N: no size known here, the one the model is fed")
    return (
        f"State the sizes {why}: epctx compile {dims} ({'; '.join(legend) or 'from the model'}) "
        "(SessionOptions.add_free_dimension_override_by_name)."
    )


def _suggested_size(graph: ir.Graph, key: str, axis: int) -> str:
    """A size for dimension ``key``: the graph's metadata's (``metadata_props[key]``, a positive integer), 1 for
    a first axis, else ``N`` (unknown)."""
    text = str(dict(getattr(graph, "metadata_props", None) or {}).get(key, ""))
    if text.isdigit() and int(text) > 0:
        return text
    return "1" if axis == 0 else "N"


def _bisect(search: _Search, whole: Group, flags: Sequence[str], declined: dict[ir.Node, str]) -> list[Group]:
    """Halve the failing groups (``_halves``) with cheap probes down to single nodes; the groups that pass, in
    order."""
    probe_flags = [*flags, PROBE_FLAG]
    known = search.seen.get((frozenset(whole), tuple(flags)))
    pending = _halves(whole) if known is not None else [whole]  # a set not compiled yet is probed first
    if (
        not pending and known is not None
    ):  # one node, or no cut IREE can take: the set's failure is its reason
        declined.update(dict.fromkeys(whole, short_error(known[1])))
    passed: list[Group] = []
    level = 1
    while pending:
        if search.over():
            for group in pending:
                declined.update(dict.fromkeys(group, search.budget_reason()))
            break
        logger.info("%s capability: bisection level %d, %d group(s), %.1f of %g s spent", search.ep_name, level,
                    len(pending), search.spent, search.budget_s)  # fmt: skip
        following: list[Group] = []
        for group, (_, result) in zip(pending, search.compile(pending, probe_flags)):
            if result.ok:
                passed.append(group)
            elif halves := _halves(group):
                following += halves
            else:
                declined.update(dict.fromkeys(group, short_error(result)))
        pending = following
        level += 1
    order = {node: i for i, node in enumerate(whole)}
    return sorted(passed, key=lambda g: order[g[0]])


def _verify(search: _Search, verdict: Verdict, pending: list[Group]) -> list[Group]:
    """Compile each of ``pending`` fully; one that fails is halved (graph order) and its halves compiled, largest
    first, in parallel, down to single nodes, while the budget lasts. The verdict's groups with those that
    passed, in graph order."""
    order = {node: i for i, node in enumerate(search.graph)}
    pending = [sorted(g, key=order.__getitem__) for g in pending]
    kept = verdict.groups
    width = max(1, os.cpu_count() or 1)  # one batch: as many compiles as run at once
    while pending:
        if search.over():
            for group in pending:
                verdict.declined.update(dict.fromkeys(group, search.budget_reason()))
            break
        pending.sort(key=len, reverse=True)
        batch, pending = pending[:width], pending[width:]
        logger.info("%s capability: full compiles of %d group(s) of %s node(s), %d more pending, %.1f of %g s "
                    "spent", search.ep_name, len(batch), "/".join(str(len(g)) for g in batch), len(pending),
                    search.spent, search.budget_s)  # fmt: skip
        for group, (part, result) in zip(batch, search.compile(batch, verdict.probes.flags)):
            if result.ok:
                verdict.probes.compiled[frozenset(group)] = (part, result)
                kept.append(group)
            elif halves := _halves(group):
                pending += halves
            else:
                verdict.declined.update(dict.fromkeys(group, short_error(result)))
    return sorted(kept, key=lambda g: order[g[0]])


def _halves(group: Group) -> list[Group]:
    """``group`` (graph order) cut in two at the index nearest its middle where no value crosses the cut that
    IREE cannot take at a boundary (``is_unfit_boundary``); none for one node or no such cut."""
    index = {node: k for k, node in enumerate(group)}
    blocked = [0] * (len(group) + 1)  # cut k (group[:k] | group[k:]) is blocked where the running sum is > 0
    for k, node in enumerate(group):
        for value in filter(None, node.inputs):
            producer = value.producer()
            if producer in index and index[producer] < k and is_unfit_boundary(value, node):
                blocked[index[producer] + 1] += 1
                blocked[k + 1] -= 1
    free, running = [], 0
    for k in range(1, len(group)):
        running += blocked[k]
        if running == 0:
            free.append(k)
    if not free:
        return []
    cut = min(free, key=lambda k: abs(2 * k - len(group)))
    return [group[:cut], group[cut:]]
