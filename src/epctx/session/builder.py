"""Turns partitioned units into plan steps: compiled partitions, per-node kernels, control-flow bodies."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import onnx_ir as ir

from epctx.ep.contract import CompiledPartition, ExecutionProvider, NodeContext, opset_of
from epctx.epcontext.load import ContextLoader
from epctx.errors import Fail, InvalidGraph
from epctx.model.scopes import node_subgraphs, outer_scope_values
from epctx.partition import Unit
from epctx.partition.placement import BodyPartitioning
from epctx.session.compile_guard import NO_COMPILE_ENV, check_compile_allowed, no_compile
from epctx.session.plan import _NOT_FOLDABLE, ExecutionPlan, PlanStep, build_plan

__all__ = ["NO_COMPILE_ENV", "StepBuilder", "no_compile"]  # the guard's names, kept for callers

logger = logging.getLogger("epctx")


def _one(ep: ExecutionProvider, results: Sequence[CompiledPartition]) -> Sequence[CompiledPartition]:
    if len(results) != 1:
        raise Fail(f"{ep.name}.compile returned {len(results)} results for 1 partition")
    return results


class StepBuilder:
    """Builds steps for one session. ``kernel_ep`` runs the nodes of control-flow bodies."""

    def __init__(self, opset_imports: Mapping[str, int], kernel_ep: ExecutionProvider, fold: bool) -> None:
        self.opset_imports = dict(opset_imports)
        self.kernel_ep = kernel_ep
        self.fold = fold
        # Wraps each partition's compile / context load: phase(kind, name, EP name) -> context (profiles).
        self.phase: Callable[[str, str, str], contextlib.AbstractContextManager[Any]] = _no_phase
        # The EPs control-flow bodies (If / Loop / Scan) are partitioned among, as the main graph is; empty (the
        # default, and always for a context model, whose bodies were not compiled): body nodes run on
        # ``kernel_ep``. Set with session.partition_control_flow_bodies=1.
        self.body_providers: Sequence[ExecutionProvider] = ()
        # The bodies partitioned so far: graph -> (units as run, the EPs' reasons), for the placement.
        self.bodies: dict[ir.Graph, BodyPartitioning] = {}

    def compile_units(
        self, units: Sequence[Unit], loader: ContextLoader | None
    ) -> tuple[dict[int, CompiledPartition], dict[int, CompiledPartition]]:
        """Compile (per EP, all its partitions in one call) or load every fused unit.
        Returns (compiled now, loaded from context), each by unit index."""
        compiled: dict[int, CompiledPartition] = {}
        loaded: dict[int, CompiledPartition] = {}
        by_ep: dict[int, list[int]] = {}
        for k, unit in enumerate(units):
            if unit.partition is None:
                continue
            if unit.from_context:
                if loader is None:
                    raise InvalidGraph(f"EPContext node {unit.nodes[0].name!r} has no context loader")
                with self.phase("context_load", unit.nodes[0].name or unit.partition.name, unit.ep.name):
                    loaded[k] = loader.load(unit.ep, unit.nodes[0], unit.partition)
            else:
                by_ep.setdefault(id(unit.ep), []).append(k)
        total = sum(len(ks) for ks in by_ep.values())
        done = 0
        for ks in by_ep.values():
            ep = units[ks[0]].ep
            check_compile_allowed(ep, len(ks))
            # One partition per call, so long compiles report progress partition by partition.
            for k in ks:
                part = units[k].partition
                assert part is not None
                started = time.perf_counter()
                with self.phase("compile", part.name, ep.name):
                    (result,) = _one(ep, ep.compile([part]))
                compiled[k] = result
                done += 1
                logger.info(
                    "compiled partition %d/%d %s (%d nodes) on %s in %.2f s",
                    done, total, part.name, len(part.nodes), ep.name, time.perf_counter() - started,
                )  # fmt: skip
        if loader is not None:
            loader.finish()
        return compiled, loaded

    def steps_for_units(
        self, units: Sequence[Unit], fused: Mapping[int, CompiledPartition]
    ) -> list[PlanStep]:
        """One step per unit; ``fused`` holds the compiled partition of every fused unit."""
        steps = []
        for k, unit in enumerate(units):
            if unit.partition is not None:
                p = unit.partition
                steps.append(PlanStep(fused[k], p.inputs, p.outputs, label=p.name))
            else:
                steps.append(self.node_step(unit.ep, unit.nodes[0]))
        return steps

    def node_step(self, ep: ExecutionProvider, node: ir.Node) -> PlanStep:
        outer = outer_scope_values(node)
        ctx = NodeContext(
            node=node,
            opset=opset_of(node, self.opset_imports),
            outer_values=outer,
            build_subgraph=self.build_subgraph,
        )
        fn = ep.create_kernel(ctx)
        foldable = not outer and not node_subgraphs(node) and node.op_type not in _NOT_FOLDABLE
        return PlanStep(
            fn, (*node.inputs, *outer), tuple(node.outputs), foldable=foldable, label=node.name or ""
        )

    def build_subgraph(self, graph: ir.Graph, outer: tuple[ir.Value, ...]) -> _SubgraphRunner:
        """A body's plan. With ``body_providers`` holding a compiling EP, the body is partitioned like the main
        graph: the EP compiles what it takes (e.g. OpenVINO the convolutions inside silero-vad's If branches,
        whose nested Ifs its frontend cannot translate as a whole), the kernel EP runs the rest."""
        if any(ep.compiles for ep in self.body_providers):
            steps = self._partitioned_steps(graph)
        else:
            steps = [self.node_step(self.kernel_ep, node) for node in graph]
        plan = build_plan((*graph.inputs, *outer), graph.outputs, steps, fold_constants=self.fold)
        return _SubgraphRunner(plan, len(graph.inputs))

    def _partitioned_steps(self, graph: ir.Graph) -> list[PlanStep]:
        from epctx.partition import GraphPartitioner, Unit

        partitioner = GraphPartitioner(self.body_providers, cpu_fallback=True)
        units = partitioner.partition(graph, self.opset_imports)
        declined = {node: list(reasons) for node, reasons in partitioner.declined.items()}
        steps: list[PlanStep] = []
        ran: list[Unit] = []
        for unit in units:
            part = unit.partition
            if part is not None and not _worth_compiling(part.nodes):
                why = (
                    f"cost rule: a body partition of {len(part.nodes)} node(s) with no convolution, matmul or "
                    "recurrent op runs on the kernel EP (a call into a compiled partition costs more)"
                )
                for node in part.nodes:
                    declined.setdefault(node, []).append((unit.ep.name, why))
                    ran.append(Unit(self.kernel_ep, (node,)))
                    steps.append(self.node_step(self.kernel_ep, node))
                continue
            ran.append(unit)
            if part is None:
                steps.append(self.node_step(unit.ep, unit.nodes[0]))
                continue
            check_compile_allowed(unit.ep, 1)
            started = time.perf_counter()
            with self.phase("compile", part.name, unit.ep.name):
                (compiled,) = _one(unit.ep, unit.ep.compile([part]))
            logger.info(
                "compiled body partition %s (%d nodes) of graph %r on %s in %.2f s",
                part.name, len(part.nodes), graph.name, unit.ep.name, time.perf_counter() - started,
            )  # fmt: skip
            steps.append(PlanStep(compiled, part.inputs, part.outputs, label=part.name))
        self.bodies[graph] = (ran, declined)
        return steps


# A body partition is compiled when it holds one of these or at least _MIN_BODY_NODES nodes: a call into a
# compiled partition costs tens of microseconds, more than the kernel EP spends on a Squeeze or a Gather (the
# one- and two-node branches exporters emit for "squeeze if the dim is 1").
_HEAVY_OPS = frozenset(
    {"Conv", "ConvTranspose", "MatMul", "Gemm", "LSTM", "GRU", "RNN", "Einsum", "Attention"}
)
_MIN_BODY_NODES = 16


def _worth_compiling(nodes: Sequence[ir.Node]) -> bool:
    return len(nodes) >= _MIN_BODY_NODES or any(n.op_type in _HEAVY_OPS for n in nodes)


def _no_phase(kind: str, name: str, ep: str) -> contextlib.AbstractContextManager[Any]:
    return contextlib.nullcontext()


class _SubgraphRunner:
    __slots__ = ("num_inputs", "plan")

    def __init__(self, plan: ExecutionPlan, num_inputs: int) -> None:
        self.plan = plan
        self.num_inputs = num_inputs

    def __call__(self, inputs: Sequence[Any], outer: Sequence[Any]) -> list[Any]:
        return self.plan.run((*inputs, *outer))
