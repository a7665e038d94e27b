"""The measured rule (session config ``epctx.partition.measured_rule``, on by default): adding an EP never makes a
model slower. The cost rule (``cost``) judges a partition by its shape before anything is compiled; this one
judges it by its speed after: each partition a compiling EP compiled is run beside the kernel EP (the CPU EP,
which runs what no EP takes) on the same nodes, with synthetic inputs (``epctx.partition.synthetic``: dynamic
dimensions get a documented size, 1 for a batch, 128 and 32 for the others, and when neither runs further
sizes in turn (48, 64, ...) until one does, unless the user stated them with free-dimension overrides; masks
are ones), and a partition slower than the kernel EP by more than ``MARGIN`` in its best
run, and in its median run or in the CPU time the process spent per run (or by more than ``STRONG_MARGIN`` in
both of those, an EP whose usual run is far from its best), is handed back: its nodes are declined by its EP with the reason ``measured: <EP> x ms
vs <kernel EP> y ms ...`` (``get_node_placement``, the fallback reasons), which names the sizes measured, and
the graph is partitioned again without them. A partition measured at two sizes (a dynamic dimension that is
not a batch) is handed back only when it is slower at both.

Under load: a busy core inflates whichever side it preempts, the median of a few runs moves with it while the
best run and the CPU time the process spent barely do (the CPU time counts every thread of the process: an EP
running on several threads spends more of it than its wall time, which only makes a hand-back less likely);
requiring the best run and one of the other two to say "slower" keeps a decision from flipping with the
machine's load when the two sides are clearly apart (seen: mobilenetv3 on IREE at load 6, the CPU EP's median
15.6 vs 14.4 ms, best 12.4 vs 6.21 ms, kept by medians and best runs alone; then, though, the CPU EP's side ran
outside the session's run scopes, on two BLAS threads, which the rule no longer does), and when only one says
slower (the evidence is ambiguous) the EP keeps the partition, and the log says so. The partitions are timed
inside every EP's ``run_scope`` (the CPU EP's BLAS threads per ``intra_op_num_threads``), as a run is. Timing is a warm-up run of each side, then alternating runs, at least
``_MIN_RUNS``, within ``BUDGET_S`` per partition, stopping early once every run of one side beats every run of
the other (what the rule adds to a session's creation: the CPU EP's plan
for the partition, the warm-ups and about ``BUDGET_S`` at most per partition, and a second compile of what the
EP keeps when something is handed back; the corpus benchmark ``benchmarks/bench_never_slower.py`` reports it).

A partition that either side fails to run on the synthetic inputs at every size tried (a shape tensor among its
inputs, say) is not measured: its EP keeps it.

A context model generated after a hand-back records it (metadata ``REFUSALS_KEY``: ``refusal_record``); a session
over it reads the record back (``recorded_refusals``) and refuses those nodes to those EPs again, with or without
the rule: nothing is compiled or measured again on a warm load. A session from the .onnx reads the verdicts of
an earlier process from the user's cache instead (``epctx.partition.verdicts``, reason prefixed ``FROM_CACHE``;
``EPCTX_MEASURED_CACHE=0`` turns it off): the nodes handed back are refused before partitioning, a partition kept
is compiled and not measured again.

Nothing here knows an EP: the session gives the compiled partitions and a way to run the same nodes on its
kernel EP."""

from __future__ import annotations

import dataclasses
import json
import logging
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx_ir as ir

from epctx.ep._contract import CompiledPartition, Partition
from epctx.ep._partition import ir_nodes
from epctx.partition.synthetic import describe_sizes, further_choices, size_choices, synthetic_inputs

__all__ = [
    "BUDGET_S",
    "FROM_CACHE",
    "FROM_CONTEXT",
    "MARGIN",
    "STRONG_MARGIN",
    "REFUSALS_KEY",
    "Measurement",
    "hand_back",
    "measure",
    "recorded_refusals",
    "refusal_record",
    "synthetic_inputs",
]

logger = logging.getLogger("epctx")

MARGIN = 1.1  # handed back when slower than the kernel EP by more than 10 % (median and best run both)
# ... or by more than this in the median and in the CPU time both, whatever the best run says: an EP whose usual run
# is far slower than its best. Seen: IREE's task workers at two threads on ddddocr's CNN (83 nodes), median 7.91 ms
# best 3.49 ms CPU time 14.5 ms against the CPU EP's 3.66 / 3.48 / 3.94: kept on its best run, the model then ran
# 19.5 ms against 16.6 on the CPU EP alone. The load cannot make this verdict either: it does not raise the CPU time
# a side spends. Only where that CPU time measures the EP's work (``Measurement._computes``).
STRONG_MARGIN = 1.5
BUDGET_S = 1.0  # timing per partition, both sides together (after one warm-up run each)
_MIN_RUNS = 3  # alternating runs per side at least, even past the budget
_RUNS = 10  # alternating runs per side at most

# Context model metadata: the hand-backs of the session that generated it, JSON {EP name: {node name: reason}};
# a session over that context refuses those nodes to those EPs again (neither compiled nor measured again).
REFUSALS_KEY = "epctx.measured_refusals"
FROM_CONTEXT = "from the context model: "  # the reason shown for a refusal read from the record
FROM_CACHE = "from the measured cache: "  # ... read from the user's cache of verdicts (``verdicts``)

Run = Callable[..., Sequence[Any]]


@dataclasses.dataclass(frozen=True, slots=True)
class Measurement:
    ep: str
    ms: float  # median run of the EP's compiled partition
    fallback: str
    fallback_ms: float  # median run of the same nodes on the kernel EP
    runs: int
    best_ms: float = 0.0  # best run of each side (0: not known, the median stands for it)
    fallback_best_ms: float = 0.0
    sizes: str = "static shapes"  # the sizes given to dynamic dimensions (``describe_sizes``)
    cpu_ms: float = 0.0  # median CPU time of the process per run of each side (0: not known)
    fallback_cpu_ms: float = 0.0

    @property
    def slower(self) -> bool:
        """Slower by more than ``MARGIN`` in the best run, and in the median or in the CPU time; or by more than
        ``STRONG_MARGIN`` in the median and the CPU time both: verdicts the load cannot make (a busy core inflates
        the median of the side it preempts, not its best run nor the CPU time it spent)."""
        strongly = (
            self.ms > self.fallback_ms * STRONG_MARGIN and self._cpu_beyond(STRONG_MARGIN) and self._computes
        )
        return strongly or (self._best_slower and (self._median_slower or self._cpu_slower))

    @property
    def ambiguous(self) -> bool:
        """Kept, though one of the three says slower: the EP keeps the partition, the log says so."""
        return not self.slower and (self._best_slower or self._median_slower or self._cpu_slower)

    @property
    def _median_slower(self) -> bool:
        return self.ms > self.fallback_ms * MARGIN

    @property
    def _best_slower(self) -> bool:
        return (self.best_ms or self.ms) > (self.fallback_best_ms or self.fallback_ms) * MARGIN

    @property
    def _cpu_slower(self) -> bool:
        return self._cpu_beyond(MARGIN)

    @property
    def _computes(self) -> bool:
        """The EP's side spent at least half its best run's time on this process's CPU: its CPU time measures its
        work (not so for a side that waits: on a device, or held up by a sleep or a lock)."""
        return self.cpu_ms >= 0.5 * (self.best_ms or self.ms)

    def _cpu_beyond(self, margin: float) -> bool:
        return bool(self.cpu_ms and self.fallback_cpu_ms) and self.cpu_ms > self.fallback_cpu_ms * margin

    def verdict(self) -> str:
        if self.slower:
            return "handed back"
        return (
            "kept (ambiguous: the best run, the median and the CPU time disagree)"
            if self.ambiguous
            else "kept"
        )

    def reason(self) -> str:
        return (
            f"measured: {self.ep} {self.ms:.3g} ms vs {self.fallback} {self.fallback_ms:.3g} ms on this "
            f"partition (median of {self.runs} runs each, best {self.best_ms or self.ms:.3g} vs "
            f"{self.fallback_best_ms or self.fallback_ms:.3g} ms, CPU time {self.cpu_ms:.3g} vs "
            f"{self.fallback_cpu_ms:.3g} ms; synthetic inputs, {self.sizes}; handed back when slower by more than "
            f"{MARGIN:g}x in the best run and in the median or the CPU time, or by more than {STRONG_MARGIN:g}x in "
            f"the median and the CPU time){self._sizes_hint()}"
        )

    def _sizes_hint(self) -> str:
        """Where dynamic dimensions were sized here: how to state the sizes that run (measured at those)."""
        if self.sizes == "static shapes":
            return ""
        return (
            "; to measure and compile at the sizes that run, state them: --dim NAME=N (free dimension "
            "overrides), or --shape INPUT[d0,...] (epctx.input_shapes) for anonymous dimensions"
        )


def _timed(sides: Sequence[Run], inputs: Sequence[np.ndarray]) -> tuple[list[float], ...]:
    """Seconds per run of each side, wall then the process's CPU time: one warm-up each, then alternating runs,
    at least ``_MIN_RUNS``, then until ``BUDGET_S`` or ``_RUNS``."""
    for run in sides:
        run(*inputs)
    times: tuple[list[float], ...] = ([], [], [], [])
    deadline = time.perf_counter() + BUDGET_S
    while len(times[0]) < _RUNS and (len(times[0]) < _MIN_RUNS or time.perf_counter() < deadline):
        for k, run in enumerate(sides):
            start, start_cpu = time.perf_counter(), time.process_time()
            run(*inputs)
            times[k].append(time.perf_counter() - start)
            times[k + 2].append(time.process_time() - start_cpu)
        if len(times[0]) >= _MIN_RUNS and _apart(times[0], times[1]):
            break
    return times


def _apart(ours: Sequence[float], theirs: Sequence[float]) -> bool:
    """Every run of one side beats every run of the other (by ``MARGIN`` where the EP is the slower): more runs
    would not change the verdict, the rest of the budget is not spent."""
    return max(ours) < min(theirs) or min(ours) > max(theirs) * MARGIN


def measure(
    ep: str,
    compiled: Run,
    fallback: str,
    fallback_run: Run,
    inputs: Sequence[np.ndarray],
    sizes: str = "static shapes",
) -> Measurement | None:
    """Both sides timed on ``inputs`` (``_timed``): the median of each, what a user sees, and the best run of
    each, which a busy machine moves least (on a loaded core IREE's median grows with its task workers'
    wake-ups while its best run stays). None when either side fails to run them."""
    try:
        ours, theirs, ours_cpu, theirs_cpu = _timed((compiled, fallback_run), inputs)
    except Exception as exc:  # any failure on made-up inputs: not measurable, the EP keeps the partition
        logger.info(
            "measured rule: %s's partition not measured at %s, a side fails on synthetic inputs: %s",
            ep,
            sizes,
            exc,
        )
        return None
    ms, fallback_ms, cpu_ms, fallback_cpu_ms = (
        statistics.median(t) * 1e3 for t in (ours, theirs, ours_cpu, theirs_cpu)
    )
    best = (min(ours) * 1e3, min(theirs) * 1e3)
    return Measurement(ep, ms, fallback, fallback_ms, len(ours), *best, sizes, cpu_ms, fallback_cpu_ms)


def _measure_unit(
    unit: Any, run: Run, fallback: str, fallback_runner: Callable[[Partition], Run]
) -> list[Measurement]:
    """The partition measured at each of its ``size_choices``, the next size only while it is slower (a size
    where a side fails to run is left out: ppocr_cls's MaxPool refuses a 32-pixel image): [] when it is not
    measured at any."""
    partition = unit.partition
    choices = size_choices(partition.inputs) if partition is not None else None
    if partition is None or choices is None:
        logger.info("measured rule: %s's partition not measured: an input's shape is unknown", unit.ep.name)
        return []
    if synthetic_inputs(partition.inputs, choices[0]) is None:
        logger.info(
            "measured rule: %s's partition not measured: an input's type is not a number", unit.ep.name
        )
        return []
    found: list[Measurement] = []
    try:
        kernel_run = fallback_runner(partition)
    except NotImplementedError as exc:  # the kernel EP lacks a node's kernel (OpenVINO's DynamicQuantizeLSTM)
        logger.info(
            "measured rule: %s's partition not measured: %s cannot run it (%s)", unit.ep.name, fallback, exc
        )
        return []
    for sizes in choices:
        one = _measure_at(unit, run, fallback, kernel_run, sizes)
        if one is not None:
            found.append(one)
        if one is not None and not one.slower:  # kept at one size: kept (the next size cannot change that)
            break
    return found or _measure_further(unit, run, fallback, kernel_run, choices)


def _measure_at(
    unit: Any, run: Run, fallback: str, kernel_run: Run, sizes: Mapping[str, int]
) -> Measurement | None:
    """The partition measured with its dynamic dimensions at ``sizes`` (logged); None when a side fails there."""
    partition = unit.partition
    inputs = synthetic_inputs(partition.inputs, sizes)
    one = (
        None
        if inputs is None
        else measure(unit.ep.name, run, fallback, kernel_run, inputs, describe_sizes(sizes))
    )
    if one is not None:
        logger.info(
            "measured rule: %s partition %r (%d nodes, %s) median %.3g ms best %.3g ms cpu %.3g ms, %s "
            "median %.3g ms best %.3g ms cpu %.3g ms: %s",
            unit.ep.name, partition.name, len(partition.nodes), one.sizes, one.ms, one.best_ms, one.cpu_ms,
            fallback, one.fallback_ms, one.fallback_best_ms, one.fallback_cpu_ms, one.verdict(),
        )  # fmt: skip
    return one


def _measure_further(
    unit: Any, run: Run, fallback: str, kernel_run: Run, tried: Sequence[Mapping[str, int]]
) -> list[Measurement]:
    """When no size of ``tried`` runs on both sides: the sizes of ``further_choices`` in turn, the first at
    which both sides run measured (``[that one]``); [] past the list, or once the failed tries have cost
    ``BUDGET_S`` (``epctx.partition.synthetic``)."""
    further = further_choices(unit.partition.inputs, tried)
    if not further:
        return []
    logger.info(
        "measured rule: %s's partition runs at none of the sizes chosen; trying further sizes: %s",
        unit.ep.name, "; ".join(describe_sizes(sizes) for sizes in further),
    )  # fmt: skip
    start = time.perf_counter()
    for count, sizes in enumerate(further, 1):
        one = _measure_at(unit, run, fallback, kernel_run, sizes)
        if one is not None:
            return [one]
        if time.perf_counter() - start > BUDGET_S and count < len(further):
            logger.info(
                "measured rule: %s's partition not measured: %d further size(s) failed in %.2f s, over the "
                "budget of %g s", unit.ep.name, count, time.perf_counter() - start, BUDGET_S,
            )  # fmt: skip
            return []
    logger.info(
        "measured rule: %s's partition not measured: it runs at none of the further sizes", unit.ep.name
    )
    return []


def hand_back(
    units: Sequence[Any],
    compiled: Mapping[int, CompiledPartition],
    fallback: str,
    fallback_runner: Callable[[Partition], Run],
) -> dict[ir.Node, tuple[str, str]]:
    """The nodes of the compiled partitions (``units[k]``, ``compiled[k]``) slower than the kernel EP named
    ``fallback`` (``fallback_runner(partition)`` runs the same nodes there): node -> (EP name, reason)."""
    refused: dict[ir.Node, tuple[str, str]] = {}
    start = time.perf_counter()
    for k, run in compiled.items():
        unit = units[k]
        found = _measure_unit(unit, run, fallback, fallback_runner)
        if found and all(one.slower for one in found):  # slower at every size measured
            why = "; and ".join(one.reason() for one in found)
            refused.update((node, (unit.ep.name, why)) for node in ir_nodes(unit.partition.nodes))
    logger.info(
        "measured rule: %d partition(s) measured in %.2f s, %d node(s) handed back",
        len(compiled), time.perf_counter() - start, len(refused),
    )  # fmt: skip
    return refused


def refusal_record(refused: Mapping[ir.Node, tuple[str, str]]) -> str | None:
    """The metadata value (``REFUSALS_KEY``) recording ``refused`` (node -> (EP name, reason)) in a context
    model, by node name; None when nothing was handed back. A node without a name cannot be found again: not
    recorded (the EP would claim it again on a warm load)."""
    record: dict[str, dict[str, str]] = {}
    for node, (ep, why) in refused.items():
        if node.name:
            record.setdefault(ep, {})[node.name] = why.removeprefix(FROM_CONTEXT).removeprefix(FROM_CACHE)
        else:
            logger.debug(
                "measured rule: a %s node without a name handed back by %s: not recorded", node.op_type, ep
            )
    return json.dumps(record, sort_keys=True, separators=(",", ":")) if record else None


def recorded_refusals(graph: ir.Graph, text: str | None) -> dict[ir.Node, tuple[str, str]]:
    """The refusals a context model records (``REFUSALS_KEY``'s value, or None): node of ``graph`` -> (EP name,
    the recorded reason prefixed with ``FROM_CONTEXT``). Nodes matched by name; a name not in the graph is
    ignored (debug log); a record that is not {EP: {node: reason}} JSON is ignored with a warning (the
    record only spares a compile: without it the EP is offered the nodes as if there were none)."""
    if not text:
        return {}
    try:
        record = json.loads(text)
        pairs = [
            (str(ep), str(name), str(why)) for ep, nodes in record.items() for name, why in nodes.items()
        ]
    except (ValueError, AttributeError, TypeError) as exc:
        logger.warning("%s: not a record of refusals, ignored: %s", REFUSALS_KEY, exc)
        return {}
    by_name = {node.name: node for node in graph if node.name}
    refused: dict[ir.Node, tuple[str, str]] = {}
    for ep, name, why in pairs:
        node = by_name.get(name)
        if node is None:
            logger.debug("%s: no node %r in the graph, its refusal to %s ignored", REFUSALS_KEY, name, ep)
        else:
            refused[node] = (ep, FROM_CONTEXT + why)
    return refused
