"""Which candidate nodes IREE takes, asked of IREE itself within a time budget (``capability_budget_s``):

1. the candidates are compiled whole with the EP's flags: usually the one compile of the model (its one group,
   and the compile is reused);
2. when that fails and the flags convert convolutions to channels-last, the whole set is compiled again in ONNX's
   layout (IREE's conversion fails on convolutions with dynamic sizes): the model stays whole, and the log says
   which ``--dim`` would give channels-last back;
3. else the set is bisected with cheap probes (``--compile-to=flow``: import, legalisation and dispatch
   formation, where IREE rejects ops, without code generation), in parallel, down to single nodes, until the
   budget is spent (nodes not decided then are declined, saying so);
4. the claim is split into cycle-free groups (``fused_groups``: other EPs' nodes, those ahead of IREE included,
   and the nodes IREE declines lie between them; the partitions of EPs ahead count as one unit each) and each
   group is compiled fully; one that fails is shrunk (its probed pieces added in graph order, a piece that
   breaks it declined) and the claim grouped again. The groups returned are those compiled
   (``Capability.groups``): the partitioner makes each one partition, so what passes capability is what the
   framework asks IREE to compile.

Every compile passes the session's guard; results are cached per process by content (``compile``)."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping, Sequence

import onnx_ir as ir

from epctx.ep import CompileGuard, Partition, fused_groups, make_partition
from epctx.providers.iree.capability import short_error
from epctx.providers.iree.compile import CompileResult, compile_partitions

__all__ = ["Probes", "Verdict", "check_nodes"]

logger = logging.getLogger("epctx")

PROBE_FLAG = "--compile-to=flow"
_ROUNDS = 4  # regroupings of the claim after a partition failed (each declines at least one group)

Group = list[ir.Node]


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

    @property
    def spent(self) -> float:
        return time.perf_counter() - self.started

    def over(self) -> bool:
        return self.spent > self.budget_s

    def compile(self, groups: Sequence[Group], flags: Sequence[str]) -> list[tuple[Partition, CompileResult]]:
        parts = []
        for group in groups:
            parts.append(make_partition(f"{self.ep_name}_check{self.count}", self.ep_name, self.graph, group,
                                        self.opsets))  # fmt: skip
            self.count += 1
        results = compile_partitions(parts, flags, self.guard, ep_name=self.ep_name, what="capability check")
        return list(zip(parts, results))

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
    ((part, result),) = search.compile([whole], flags)
    if not result.ok and layout_flag in flags:
        plain = tuple(f for f in flags if f != layout_flag)
        ((part2, result2),) = search.compile([whole], plain)
        if result2.ok:
            logger.warning(
                "%s: channels-last convolutions fail with this model's dynamic dimensions (%s); compiled in "
                "ONNX's layout (slower convolutions). %s",
                ep_name, short_error(result), _dims_hint(graph, "to compile them channels-last"),
            )  # fmt: skip
            probes.flags, part, result = plain, part2, result2
        elif _has_dynamic_dims(graph):  # probe in ONNX's layout: channels-last fails on dynamic convolutions
            probes.flags = plain
    if result.ok:  # the partitions the set forms (one, unless other EPs' nodes lie between its nodes)
        probes.compiled[frozenset(whole)] = (part, result)
        passed = [whole]
    else:
        passed = _bisect(search, whole, probes.flags, verdict.declined)
    verdict.claimed = [n for group in passed for n in group]
    verdict.groups = _check_partitions(search, verdict, passed)
    order = {node: i for i, node in enumerate(graph)}
    verdict.claimed.sort(key=order.__getitem__)
    logger.info("%s capability: %d node(s) claimed in %d group(s), %d declined, in %.1f s", ep_name,
                len(verdict.claimed), len(verdict.groups), len(verdict.declined), search.spent)  # fmt: skip
    if verdict.declined:
        logger.warning("%s declines %d node(s) of this model. %s", ep_name, len(verdict.declined),
                       _dims_hint(graph, "for IREE to try them with static shapes"))  # fmt: skip
    return verdict


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
    """Halve the failing groups with cheap probes down to single nodes; the groups that pass, in order."""
    probe_flags = [*flags, PROBE_FLAG]
    pending = [whole[: len(whole) // 2], whole[len(whole) // 2 :]] if len(whole) > 1 else []
    if len(whole) == 1:
        declined[whole[0]] = "IREE cannot compile it alone"
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
            elif len(group) == 1:
                declined[group[0]] = short_error(result)
            else:
                following += [group[: len(group) // 2], group[len(group) // 2 :]]
        pending = following
        level += 1
    order = {node: i for i, node in enumerate(whole)}
    return sorted(passed, key=lambda g: order[g[0]])


def _check_partitions(search: _Search, verdict: Verdict, passed: list[Group]) -> list[Group]:
    """The claim's cycle-free groups, each compiled; those IREE fails on are shrunk and the claim regrouped."""
    flags = verdict.probes.flags
    for _ in range(_ROUNDS):
        groups = fused_groups(search.graph, verdict.claimed, search.partitions)
        todo = [g for g in groups if frozenset(g) not in verdict.probes.compiled]
        if not todo:
            return groups
        failed = False
        for group, (part, result) in zip(todo, search.compile(todo, flags)):
            if result.ok:
                verdict.probes.compiled[frozenset(group)] = (part, result)
            else:
                failed = True
                _shrink(search, verdict, group, passed, result)
        if not failed:
            return groups
        gone = set(verdict.declined)
        verdict.claimed = [n for n in verdict.claimed if n not in gone]
    kept = []  # rounds spent: what is unchecked is declined
    for group in fused_groups(search.graph, verdict.claimed, search.partitions):
        if frozenset(group) in verdict.probes.compiled:
            kept.append(group)
        else:
            verdict.declined.update(dict.fromkeys(group, search.budget_reason()))
    gone = set(verdict.declined)
    verdict.claimed = [n for n in verdict.claimed if n not in gone]
    return kept


def _shrink(
    search: _Search, verdict: Verdict, group: Group, passed: list[Group], failure: CompileResult
) -> None:
    """Keep the probed pieces of ``group``, in graph order, that compile with the ones kept before them."""
    members = set(group)
    pieces = [p for p in passed if p[0] in members] or [group]
    why = f"{short_error(failure)} (its nodes pass alone, not in the partition they would form)"
    kept: Group = []
    for k, piece in enumerate(pieces):
        if k == 0 and len(pieces) > 1:
            kept = list(piece)
            continue
        if search.over() or len(pieces) == 1:
            verdict.declined.update(dict.fromkeys(piece, why if len(pieces) == 1 else search.budget_reason()))
            continue
        trial = [n for n in group if n in set(kept) | set(piece)]
        ((part, result),) = search.compile([trial], verdict.probes.flags)
        if result.ok:
            kept = trial
            verdict.probes.compiled[frozenset(trial)] = (part, result)
        else:
            verdict.declined.update(dict.fromkeys(piece, f"{short_error(result)} (its nodes pass alone, not "
                                                         "with the nodes before them)"))  # fmt: skip
