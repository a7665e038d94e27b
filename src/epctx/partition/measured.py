"""The measured rule (session config ``epctx.partition.measured_rule=1``): adding an EP never makes a model
slower. The cost rule (``cost``) judges a partition by its shape before anything is compiled; this one judges
it by its speed after: each partition a compiling EP compiled is run beside the kernel EP (the CPU EP, which
runs what no EP takes) on the same nodes, with synthetic inputs of the partition's stated shapes, and a
partition slower than the kernel EP by more than ``MARGIN`` is handed back: its nodes are declined by its EP
with the reason ``measured: <EP> x ms vs <kernel EP> y ms`` (``get_node_placement``, the fallback reasons) and
the graph is partitioned again without them.

A partition with an input whose shape is not stated (a dynamic dimension) is not measured (its EP keeps it),
nor one that either side fails to run on synthetic inputs (a shape tensor among its inputs, say). Timing is the
median of a few alternating runs after a warm-up, within a budget per partition (``BUDGET_S``).

A context model generated after a hand-back records it (metadata ``REFUSALS_KEY``: ``refusal_record``); a session
over it reads the record back (``recorded_refusals``) and refuses those nodes to those EPs again, with or without
the rule: nothing is compiled or measured again on a warm load.

Off by default (``epctx.partition.measured_rule``): the verdict is a timing on synthetic inputs, and the record
keeps whichever verdict the compiling run got. Measured here (IREE + CPU EP, stated shapes, load 2.4-3.7 on 2
cores): MiniLM 1x128 was handed back in 6 of 7 runs (IREE 54-84 ms vs CPU EP 41-65 ms on synthetic inputs),
while on its real feed IREE runs it in 27 ms against the CPU EP's 34-35 ms (0.77-0.80x): handed back, it ran in
45 ms, 1.65x slower than with IREE kept; magika was kept in both runs while its steady IREE / CPU EP ratio was
1.43 in one, 0.91 in the other (bench_iree_flags --cpu, variants default,measured).

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

__all__ = [
    "BUDGET_S",
    "FROM_CONTEXT",
    "MARGIN",
    "REFUSALS_KEY",
    "Measurement",
    "hand_back",
    "measure",
    "recorded_refusals",
    "refusal_record",
    "synthetic_inputs",
]

logger = logging.getLogger("epctx")

MARGIN = 1.1  # handed back when slower than the kernel EP by more than 10 %
BUDGET_S = 2.0  # timing per partition, both sides together (after one warm-up run each)
_RUNS = 10  # alternating runs per side at most

# Context model metadata: the hand-backs of the session that generated it, JSON {EP name: {node name: reason}};
# a session over that context refuses those nodes to those EPs again (neither compiled nor measured again).
REFUSALS_KEY = "epctx.measured_refusals"
FROM_CONTEXT = "from the context model: "  # the reason shown for a refusal read from the record

Run = Callable[..., Sequence[Any]]


@dataclasses.dataclass(frozen=True, slots=True)
class Measurement:
    ep: str
    ms: float  # median run of the EP's compiled partition
    fallback: str
    fallback_ms: float  # median run of the same nodes on the kernel EP
    runs: int

    @property
    def slower(self) -> bool:
        return self.ms > self.fallback_ms * MARGIN

    def reason(self) -> str:
        return (
            f"measured: {self.ep} {self.ms:.3g} ms vs {self.fallback} {self.fallback_ms:.3g} ms on this "
            f"partition (median of {self.runs} runs each, synthetic inputs of its stated shapes; handed back when "
            f"slower by more than {MARGIN:g}x)"
        )


def synthetic_inputs(partition: Partition, seed: int = 0) -> list[np.ndarray] | None:
    """One array per partition input, of its stated shape and type (floats in [0, 1), integers 0, booleans
    False); None when an input's shape or type is not fully known."""
    rng = np.random.default_rng(seed)
    arrays = []
    for value in partition.inputs:
        shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
        if shape is None or dtype is None or not all(isinstance(d, int) for d in shape):
            return None
        try:
            np_type = np.dtype(dtype.numpy())
        except (TypeError, ValueError, AttributeError):
            return None
        dims = tuple(int(d) for d in shape)
        if np_type.kind == "f":
            arrays.append(rng.random(dims).astype(np_type))
        elif np_type.kind in "iub":
            arrays.append(np.zeros(dims, np_type))
        else:
            return None
    return arrays


def measure(
    ep: str, compiled: Run, fallback: str, fallback_run: Run, inputs: Sequence[np.ndarray]
) -> Measurement | None:
    """Both sides timed on ``inputs`` (one warm-up each, then alternating runs within ``BUDGET_S``, at least 3,
    at most ``_RUNS``): the median of each, what a user sees more than a best run (on a busy machine IREE's best
    runs stay fast while its median grows with its task workers' wake-ups: MiniLM's best run was near
    onnxruntime's, its median 2.4x the CPU EP's). None when either fails to run them."""
    sides = (compiled, fallback_run)
    try:
        for run in sides:
            run(*inputs)
    except Exception as exc:  # any failure on made-up inputs: not measurable, the EP keeps the partition
        logger.info(
            "measured rule: %s's partition not measured, a side fails on synthetic inputs: %s", ep, exc
        )
        return None
    times: tuple[list[float], list[float]] = ([], [])
    deadline = time.perf_counter() + BUDGET_S
    while len(times[0]) < _RUNS and (len(times[0]) < 3 or time.perf_counter() < deadline):
        for k, run in enumerate(sides):
            start = time.perf_counter()
            run(*inputs)
            times[k].append(time.perf_counter() - start)
    ours, theirs = (statistics.median(t) * 1e3 for t in times)
    return Measurement(ep, ours, fallback, theirs, len(times[0]))


def hand_back(
    units: Sequence[Any],
    compiled: Mapping[int, CompiledPartition],
    fallback: str,
    fallback_runner: Callable[[Partition], Run],
) -> dict[ir.Node, tuple[str, str]]:
    """The nodes of the compiled partitions (``units[k]``, ``compiled[k]``) slower than the kernel EP named
    ``fallback`` (``fallback_runner(partition)`` runs the same nodes there): node -> (EP name, reason)."""
    refused: dict[ir.Node, tuple[str, str]] = {}
    for k, run in compiled.items():
        unit = units[k]
        partition = unit.partition
        inputs = synthetic_inputs(partition) if partition is not None else None
        if partition is None or inputs is None:
            continue
        found = measure(unit.ep.name, run, fallback, fallback_runner(partition), inputs)
        if found is None:
            continue
        logger.info(
            "measured rule: %s partition %r (%d nodes) %.3g ms, %s %.3g ms: %s",
            unit.ep.name, partition.name, len(partition.nodes), found.ms, fallback, found.fallback_ms,
            "handed back" if found.slower else "kept",
        )  # fmt: skip
        if found.slower:
            why = found.reason()
            refused.update((node, (unit.ep.name, why)) for node in ir_nodes(partition.nodes))
    return refused


def refusal_record(refused: Mapping[ir.Node, tuple[str, str]]) -> str | None:
    """The metadata value (``REFUSALS_KEY``) recording ``refused`` (node -> (EP name, reason)) in a context
    model, by node name; None when nothing was handed back. A node without a name cannot be found again: not
    recorded (the EP would claim it again on a warm load)."""
    record: dict[str, dict[str, str]] = {}
    for node, (ep, why) in refused.items():
        if node.name:
            record.setdefault(ep, {})[node.name] = why.removeprefix(FROM_CONTEXT)
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
