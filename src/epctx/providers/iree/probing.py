"""Which candidate nodes IREE takes, asked of IREE itself within a time budget (``capability_budget_s``):

0. a model with a dynamic size (not only a batch) and convolutions whose spatial sizes are dynamic is not
   compiled at all (``capability.losing_conv``: IREE's code for them lost to the CPU EP on every such corpus model,
   after 15-45 s of compiles; ``EPCTX_IREE_DYNAMIC_CONVS=1`` compiles it anyway): every candidate is declined,
   naming the convolution that forces it and the ``--dim`` sizes that would let IREE compile it static;
1. the candidates are compiled whole with the EP's flags: usually the one compile of the model (its one group,
   and the compile is reused);
2. when that fails before code generation and the flags convert convolutions to channels-last, the whole set is
   compiled again in ONNX's layout (IREE's conversion fails on convolutions with dynamic sizes), with IREE's data
   tiling of convolutions unless ``fast_codegen=0`` (``options.CONV_DATA_TILING``): the model stays whole;
3. when it still fails and IREE's message names nodes (``blame``: the operations its diagnostics quote), those
   are declined with IREE's message and the others compiled at once (PP-OCRv4 det, dynamic sizes: its Conv and
   ConvTranspose that IREE's code generation fails on; the other 490 nodes compile);
4. else the set is bisected with cheap probes (``--compile-to=flow``: import, legalisation and dispatch
   formation, where IREE rejects ops, without code generation), in parallel, down to single nodes; not when the
   failures are in code generation, which the probes pass;
5. the claim is split into cycle-free groups (``fused_groups``: other EPs' nodes, those ahead of IREE included,
   and the nodes IREE declines lie between them; the partitions of EPs ahead count as one unit each) and each
   group is compiled fully; a group that fails (code generation fails where the flow probes passed) is halved
   in graph order and its halves compiled fully, largest pieces first, in parallel, down to single nodes: a
   failure in one region declines that region only. Halves of a cycle-free group in a topological order are
   cycle-free, and so are they with the other groups. The groups returned are those whose full compile passed
   (``Capability.groups``): the partitioner makes each one partition, so what passes capability is what the
   framework asks IREE to compile.

The budget: the first compile runs whatever it costs (it is the model's compile when it passes); no step starts
after it that is expected to end past the budget (``Search.affords``: the slowest seconds per node seen so far,
the probe records' included), and the nodes not decided then are declined, saying so, with a warning naming the
provider option and the ``--dim`` sizes. What each compile showed is kept (``probe_cache``: failures and probe
outcomes, by the content of the node set, the flags, IREE's and epctx's versions, in the user's cache): a later
check of the same model reads it instead of compiling, so each session goes on where the last one stopped, and
once a search ends every later one reaches the same verdict with no compile but the final ones. No node set is
compiled twice with the same flags in one check, failures included (``Search.compile``). Three boundaries IREE
cannot take: a value with a type but no shape (IREE would read it as a scalar), a Reshape's shape operand
(IREE mishandles -1 and 0 in a shape known only at run: RESOURCE_EXHAUSTED at run, or a wrong result) and a
Pow's exponent (IREE's power with an exponent unknown at compile is NaN for a negative base). A
partition with one fails, with that reason, without a compile (``capability.unfit_boundary``; the worker refuses
one too), and groups are halved where no such value crosses (``capability.halves``). Once the first compile failed on a
model with dynamic dimensions, the search leaves out the Reshapes to a shape computed at run
(``capability.runtime_shape``: IREE gets them wrong in pieces). When the model has dynamic dimensions and nodes
are declined, each reason and the log name the ``--dim`` sizes to state for IREE to try the model whole."""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping, Sequence

import onnx_ir as ir

from epctx.ep import CompileGuard, Partition, fused_groups
from epctx.providers.iree.blame import is_codegen_failure, named_nodes
from epctx.providers.iree.capability import (
    DYNAMIC_CONVS_ENV,
    channels_last_pool,
    dims_hint,
    halves,
    has_dynamic_dims,
    input_text,
    losing_conv,
    runtime_shape,
    short_error,
    sizes_dynamic,
)
from epctx.providers.iree.compile import CompileResult
from epctx.providers.iree.options import CONV_DATA_TILING, CONV_TILING_FALLBACK, with_flags
from epctx.providers.iree.probe_cache import PROBE_FLAG, RECORDED, compiler_version
from epctx.providers.iree.search import Group, Search

__all__ = ["PROBE_FLAG", "Probes", "Verdict", "check_nodes"]

logger = logging.getLogger("epctx")


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
    memory_mib: int = 0,
) -> Verdict:
    """The nodes of ``nodes`` (graph order) IREE takes, and why it declines the others (see the module).
    ``partitions``: those the EPs ahead formed (``CapabilityContext.assigned_partitions``)."""
    search = Search(ep_name, graph, opsets, guard, budget_s, partitions, memory_mib=memory_mib)
    probes = Probes({}, tuple(flags))
    verdict = Verdict([], {}, probes)
    whole = _without_losing(search, list(nodes), verdict.declined)
    if not whole:
        _log_declines(search, verdict)
        return verdict
    first = fused_groups(graph, whole, partitions)  # one, unless other EPs' nodes lie between the candidates
    _announce(search, whole, first)
    failed = _first_compile(search, verdict, first, flags, layout_flag)
    if failed:
        rest = _drop_runtime_shapes(graph, [n for group in failed for n in group], verdict.declined)
        codegen = all(is_codegen_failure(search.seen[(frozenset(g), probes.flags)][1].error) for g in failed
                      if (frozenset(g), probes.flags) in search.seen)  # fmt: skip
        if len(first) == 1 and rest and not codegen:
            # where IREE rejects ops: cheap probes (which pass what fails in code generation), then full compiles
            rest = [n for group in _bisect(search, rest, probes.flags, verdict.declined) for n in group]
        failed = fused_groups(graph, rest, partitions) if rest else []
    verdict.groups = _merge_neighbours(search, verdict, _verify(search, verdict, failed))
    _compile_recorded(search, verdict)
    verdict.claimed = [n for group in verdict.groups for n in group]
    order = {node: i for i, node in enumerate(graph)}
    verdict.claimed.sort(key=order.__getitem__)
    logger.info("%s capability: %d node(s) claimed in %d group(s), %d declined, in %.1f s (%d compile(s) run, %d "
                "outcome(s) from the probe records)", ep_name, len(verdict.claimed), len(verdict.groups),
                len(verdict.declined), search.spent, search.fresh, search.cache.hits)  # fmt: skip
    if search.ran_out:
        _warn_budget(search, verdict)
    _log_declines(search, verdict)
    return verdict


def _announce(search: Search, nodes: Group, groups: list[Group]) -> None:
    """What the check is about to do, before its first compile (seconds to a minute on a loaded machine): the
    progress line ``epctx compile`` shows, with the ``--dim`` sizes that would make the code faster where the
    model's dimensions are dynamic."""
    hint = dims_hint(search.graph, "for faster code") if has_dynamic_dims(search.graph) else ""
    logger.info(
        "%s: compiling the model's %d node(s) IREE may take%s with IREE, to see what it takes (that compile is "
        "reused as the session's)%s", search.ep_name, len(nodes),
        f", in {len(groups)} group(s) between other EPs' nodes," if len(groups) > 1 else " whole",
        f"; its dimensions are dynamic: {hint}" if hint else "",
    )  # fmt: skip


def _log_declines(search: Search, verdict: Verdict) -> None:
    """The warning of a check that declines nodes (with the ``--dim`` sizes to state, added to each reason), or
    of one that claims size-sensitive ops with dynamic dims."""
    ep_name, graph = search.ep_name, search.graph
    if verdict.declined:
        hint = dims_hint(graph, "for IREE to try the model whole with static shapes")
        logger.warning("%s declines %d node(s) of this model. %s", ep_name, len(verdict.declined), hint)
        if hint:
            for node, why in verdict.declined.items():
                verdict.declined[node] = f"{why}. {hint}"
    elif any(n.op_type in _SIZE_SENSITIVE for n in verdict.claimed) and has_dynamic_dims(graph):
        logger.warning(
            "%s compiles this model with dynamic dimensions: IREE's code for its convolutions / matrix products is "
            "much slower without the sizes (magika's shipped model, dynamic batch: 201 ms a run; batch stated: "
            "7.7 ms). %s", ep_name, dims_hint(graph, "for faster code"),
        )  # fmt: skip


def _without_losing(search: Search, nodes: Group, declined: dict[ir.Node, str]) -> Group:
    """``nodes``, or none when some are convolutions IREE's code is known to lose on (``capability.losing_conv``:
    dynamic spatial sizes; unless ``EPCTX_IREE_DYNAMIC_CONVS=1``): those declined with that reason, and the others
    with one naming the first of them, nothing compiled. Not the others alone: what lies between such
    convolutions (PP-OCRv4 det's and cls's squeeze-excitation 1x1 convolutions and glue, rec's attention) would
    be 6-10 pieces between CPU convolutions, costing more at their boundaries than they save; the model is left
    whole to the next EP. What it spares: PP-OCRv4 det / rec and nudenet as shipped, 15-37 s of compiles (one
    thread, loaded 2-core machine) whose code the measured rule handed back whole, or that failed."""
    if not sizes_dynamic(search.graph) or os.environ.get(DYNAMIC_CONVS_ENV, "") == "1":
        return nodes
    losing = {node: why for node in nodes if (why := losing_conv(node)) is not None}
    if not losing:
        return nodes
    first = next(iter(losing))
    forced = (
        f"not compiled: this model's convolutions have dynamic spatial sizes ({first.name!r} first, its input "
        f"{input_text(first)}), where IREE's code is slower than the CPU EP's; the model is left whole to the next "
        "EP rather than split around them"
    )
    declined.update({node: losing.get(node, forced) for node in nodes})
    logger.warning(
        "%s does not compile this model: %d of its convolutions have dynamic spatial sizes (%r first, its input "
        "%s), where IREE's code is slower than the CPU EP's (the measured rule handed such models back after "
        "15-45 s of compiles); %s=1 compiles them anyway.",
        search.ep_name, len(losing), first.name, input_text(first), DYNAMIC_CONVS_ENV,
    )  # fmt: skip
    return []


def _warn_budget(search: Search, verdict: Verdict) -> None:
    undecided = sum(why == search.budget_reason() for why in verdict.declined.values())
    hint = dims_hint(search.graph, "for IREE to try the model whole")
    why = (
        f"its next step, expected to take {search.refused_s:.0f} s more at the rate of its compiles so far, would "
        "have ended past it"
        if search.refused_s
        else "a compile still running then was stopped"
    )
    logger.warning(
        "%s: its capability budget of %g s ran out after %.1f s (%s) with %d node(s) undecided: they run on the "
        "next EP. What IREE's compiles showed is kept (%s): the next session of this model goes on from there. "
        "To decide them now, raise the provider option capability_budget_s%s",
        search.ep_name, search.budget_s, search.spent, why, undecided, search.cache.records.folder,
        f", or state the sizes: {hint}" if hint else ".",
    )  # fmt: skip


# Ops whose IREE code is much faster with the sizes known (data tiling, microkernels, im2col need static shapes).
_SIZE_SENSITIVE = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm", "ConvInteger", "MatMulInteger"})


def _first_compile(
    search: Search, verdict: Verdict, groups: list[Group], flags: Sequence[str], layout_flag: str | None
) -> list[Group]:
    """Compile the candidates' groups (usually one: the model whole), whatever the budget; when some fail with
    channels-last before code generation, again in ONNX's layout; a group that still fails with a message naming
    nodes (``blame``) is compiled without them (both budget allowing). Those that pass are the verdict's groups;
    returns those that fail."""
    probes = verdict.probes
    results = _layout_compile(search, groups, flags, layout_flag)
    failed = [k for k, (_, r) in enumerate(results) if not r.ok and not is_codegen_failure(r.error)]
    # ONNX's layout, with IREE's convolution data tiling unless fast_codegen=0 (options.CONV_DATA_TILING): 3.5x
    # faster than without
    tiling = CONV_DATA_TILING if CONV_TILING_FALLBACK in flags else ()
    plain = tuple(with_flags([f for f in flags if f != layout_flag], tiling))
    if failed and layout_flag in flags and search.affords([groups[k] for k in failed], plain):
        again = search.compile([groups[k] for k in failed], plain)
        if any(r.ok for _, r in again):
            logger.info(
                "%s: channels-last convolutions fail with this model's dynamic dimensions (%s); compiled in "
                "ONNX's layout%s", search.ep_name, short_error(results[failed[0]][1]),
                ", with IREE's data tiling of convolutions" if tiling else "",
            )  # fmt: skip
            probes.flags = plain
        elif has_dynamic_dims(search.graph):  # search in ONNX's layout: channels-last fails on dynamic convs
            probes.flags = tuple(
                f for f in flags if f != layout_flag
            )  # without the data tiling that failed too
        for k, retried in zip(failed, again):
            results[k] = retried if retried[1].ok or probes.flags == plain else results[k]
    groups, results = _without_named(search, verdict.declined, groups, results, probes.flags)
    for group, (part, result) in zip(groups, results):
        if result.ok:
            _keep_code(probes, group, part, result)
            verdict.groups.append(group)
    return [g for g, (_, r) in zip(groups, results) if not r.ok]


Compiled = tuple[Partition, CompileResult]


# The IREE compilers whose channels-last conversion fails on a dynamic MaxPool (measured: iree-base-compiler 3.13.0)
def _pool_fails(version: str) -> bool:
    return version.startswith("3.13.")


def _layout_compile(
    search: Search, groups: list[Group], flags: Sequence[str], layout_flag: str | None
) -> list[Compiled]:
    """``groups`` compiled with ``flags``, but not a group that IREE's channels-last conversion is known to fail
    on when the flags ask for it (``capability.channels_last_pool``, the model's dimensions dynamic): that
    failure stands for its compile, and the group goes on to ONNX's layout (ResNet-18 as shipped: two failed
    compiles, 3.4 s of 16.4, spared)."""
    if layout_flag not in flags or not has_dynamic_dims(search.graph) or not _pool_fails(compiler_version()):
        return search.compile(groups, flags)
    known = [next(filter(None, map(channels_last_pool, g)), None) for g in groups]
    done = iter(search.compile([g for g, why in zip(groups, known) if why is None], flags))
    return [
        next(done) if why is None else search.known_failure(g, flags, "channels-last", why)
        for g, why in zip(groups, known)
    ]


def _compile_recorded(search: Search, verdict: Verdict) -> None:
    """The code of the verdict's groups whose passed compiles came from the probe records (one that fails now is
    left to the compile stage, which fails with IREE's message)."""
    todo = [g for g in verdict.groups if frozenset(g) not in verdict.probes.compiled]
    if not todo:
        return
    logger.info("%s capability: the probe records say %d group(s) compile (%s node(s)): compiling their code",
                search.ep_name, len(todo), "/".join(str(len(g)) for g in todo))  # fmt: skip
    for group, part, result in search.compile_code(todo):
        if result.ok:
            verdict.probes.compiled[frozenset(group)] = (part, result)


def _keep_code(probes: Probes, group: Group, part: Partition, result: CompileResult) -> None:
    """A passed compile's code for the EP's compile stage to reuse; one read from the probe records has none
    (``_compile_recorded`` compiles it once the search is done)."""
    if result.stage != RECORDED:
        probes.compiled[frozenset(group)] = (part, result)


def _without_named(
    search: Search, declined: dict[ir.Node, str], groups: list[Group], results: list[Compiled],
    flags: Sequence[str],
) -> tuple[list[Group], list[Compiled]]:  # fmt: skip
    """Each failed group whose message names some of its nodes (``blame.named_nodes``) replaced by the groups of
    its other nodes, compiled (the named nodes declined with IREE's message), again while messages name nodes
    and the budget allows; the groups and their results."""
    done: list[tuple[Group, Compiled]] = []
    pending = list(zip(groups, results))
    while pending:
        retry: list[Group] = []
        for group, (part, result) in pending:
            named = [] if result.ok else named_nodes(result.error, group)
            left = set(named)
            rest = (
                fused_groups(search.graph, [n for n in group if n not in left], search.partitions)
                if named
                else []
            )
            if not named or not search.affords(rest, flags):
                done.append((group, (part, result)))
                continue
            declined.update(dict.fromkeys(named, f"{short_error(result)} (IREE's message names this node)"))
            retry += rest
            logger.info("%s capability: IREE's message names %d node(s) (%s); compiling the other %d without them, "
                        "%.1f of %g s spent", search.ep_name, len(named), ", ".join(sorted({n.op_type for n in named})),
                        len(group) - len(named), search.spent, search.budget_s)  # fmt: skip
        pending = list(zip(retry, search.compile(retry, flags))) if retry else []
    return [g for g, _ in done], [r for _, r in done]


def _drop_runtime_shapes(graph: ir.Graph, nodes: Group, declined: dict[ir.Node, str]) -> Group:
    """``nodes`` without the Reshapes IREE would get wrong in pieces of a model with dynamic dims (declined)."""
    if not has_dynamic_dims(graph):
        return nodes
    unsafe = {node: why for node in nodes if (why := runtime_shape(node)) is not None}
    declined.update(unsafe)
    return [node for node in nodes if node not in unsafe]


def _bisect(search: Search, whole: Group, flags: Sequence[str], declined: dict[ir.Node, str]) -> list[Group]:
    """Halve the failing groups (``capability.halves``) with cheap probes down to single nodes; the groups that pass, in
    order."""
    probe_flags = [*flags, PROBE_FLAG]
    known = search.seen.get((frozenset(whole), tuple(flags)))
    pending = halves(whole) if known is not None else [whole]  # a set not compiled yet is probed first
    if (
        not pending and known is not None
    ):  # one node, or no cut IREE can take: the set's failure is its reason
        declined.update(dict.fromkeys(whole, short_error(known[1])))
    passed: list[Group] = []
    level = 1
    while pending:
        if not search.affords(pending, probe_flags):
            for group in pending:
                declined.update(dict.fromkeys(group, search.budget_reason()))
            break
        logger.info("%s capability: bisection level %d, %d group(s), %.1f of %g s spent", search.ep_name, level,
                    len(pending), search.spent, search.budget_s)  # fmt: skip
        following: list[Group] = []
        for group, (_, result) in zip(pending, search.compile(pending, probe_flags)):
            if result.ok:
                passed.append(group)
            elif cut := halves(group):
                following += cut
            else:
                declined.update(dict.fromkeys(group, short_error(result)))
        pending = following
        level += 1
    order = {node: i for i, node in enumerate(whole)}
    return sorted(passed, key=lambda g: order[g[0]])


def _verify(search: Search, verdict: Verdict, pending: list[Group]) -> list[Group]:
    """Compile each of ``pending`` fully; one that fails is halved (graph order) and its halves compiled, largest
    first, in parallel, down to single nodes, while the budget lasts. The verdict's groups with those that
    passed, in graph order."""
    order = {node: i for i, node in enumerate(search.graph)}
    pending = [sorted(g, key=order.__getitem__) for g in pending]
    kept = verdict.groups
    width = max(1, os.cpu_count() or 1)  # one batch: as many compiles as run at once
    while pending:
        pending.sort(key=len, reverse=True)
        batch, pending = pending[:width], pending[width:]
        if not search.affords(batch, verdict.probes.flags):
            for group in [*batch, *pending]:
                verdict.declined.update(dict.fromkeys(group, search.budget_reason()))
            break
        logger.info("%s capability: full compiles of %d group(s) of %s node(s), %d more pending, %.1f of %g s "
                    "spent", search.ep_name, len(batch), "/".join(str(len(g)) for g in batch), len(pending),
                    search.spent, search.budget_s)  # fmt: skip
        for group, (part, result) in zip(batch, search.compile(batch, verdict.probes.flags)):
            if result.ok:
                _keep_code(verdict.probes, group, part, result)
                kept.append(group)
            elif cut := halves(group):
                pending += cut
            else:
                verdict.declined.update(dict.fromkeys(group, short_error(result)))
    return sorted(kept, key=lambda g: order[g[0]])


def _merge_neighbours(search: Search, verdict: Verdict, groups: list[Group]) -> list[Group]:
    """``groups`` (each compiled and passed), with the pieces that one partition could hold together (the
    cycle-free groups of their nodes, ``fused_groups``) compiled as one, one compile each, budget allowing:
    halving leaves neighbouring pieces apart that IREE takes together (nudenet's pieces around the nodes it
    declines). A merge that passes replaces its pieces; one that fails leaves them as they are."""
    if len(groups) < 2:
        return groups
    piece = {node: k for k, group in enumerate(groups) for node in group}
    merged = [
        m for m in fused_groups(search.graph, list(piece), search.partitions)
        if len({piece[n] for n in m}) > 1 and sum(len(groups[k]) for k in {piece[n] for n in m}) == len(m)
    ]  # fmt: skip
    if not merged or not search.affords(merged, verdict.probes.flags):
        return groups
    logger.info("%s capability: %d set(s) of neighbouring pieces compiled as one (%s node(s)), %.1f of %g s spent",
                search.ep_name, len(merged), "/".join(str(len(m)) for m in merged), search.spent,
                search.budget_s)  # fmt: skip
    gone: set[int] = set()
    kept: list[Group] = []
    for group, (part, result) in zip(merged, search.compile(merged, verdict.probes.flags)):
        if result.ok:
            _keep_code(verdict.probes, group, part, result)
            gone |= {piece[n] for n in group}
            kept.append(group)
    order = {node: i for i, node in enumerate(search.graph)}
    kept += [g for k, g in enumerate(groups) if k not in gone]
    return sorted(kept, key=lambda g: order[g[0]])
