"""Turns partitioned units into plan steps: compiled partitions, per-node kernels, control-flow bodies."""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import onnx_ir as ir

from epctx.ep._calls import compile_partitions
from epctx.ep._compiling import CapabilityContext, CompileContext, CompileGuard
from epctx.ep._context_io import BinaryLayout
from epctx.ep._contract import CompiledPartition, ExecutionProvider, NodeContext, Partition, opset_of
from epctx.ep._partition import ir_nodes
from epctx.epcontext.load import ContextLoader
from epctx.errors import EPFail, InvalidGraph
from epctx.model.scopes import node_subgraphs, outer_scope_values
from epctx.model.tensors import to_numpy
from epctx.partition import Unit
from epctx.partition.placement import BodyPartitioning
from epctx.session.compile_guard import NO_COMPILE_ENV, no_compile
from epctx.session.plan import _NOT_FOLDABLE, ExecutionPlan, PlanStep, build_plan
from epctx.session.profiling import Phase, no_phase

# NO_COMPILE_ENV, no_compile: the guard's names, kept for callers
__all__ = ["NO_COMPILE_ENV", "CompileSetup", "PartitionsFailed", "StepBuilder", "no_compile"]

logger = logging.getLogger("epctx")


@dataclasses.dataclass(frozen=True, slots=True)
class CompileSetup:
    """What a session's compile stage is given: the guard, each EP's capability artefacts (by ``id(ep)``), and
    where the partitions will be saved (EP -> the sharing group's binary; None: not into a sharing group)."""

    guard: CompileGuard = dataclasses.field(default_factory=CompileGuard)
    artefacts: Mapping[int, object] = dataclasses.field(default_factory=dict)
    target: Callable[[ExecutionProvider], BinaryLayout | None] | None = None


class StepBuilder:
    """Builds steps for one session. ``kernel_ep`` runs the nodes of control-flow bodies."""

    def __init__(
        self,
        opset_imports: Mapping[str, int],
        kernel_ep: ExecutionProvider,
        fold: bool,
        *,
        guard: CompileGuard | None = None,
        body_providers: Sequence[ExecutionProvider] = (),
        phase: Phase = no_phase,
        ended: Callable[[str, str, str, float], None] | None = None,
    ) -> None:
        self.opset_imports = dict(opset_imports)
        self.kernel_ep = kernel_ep
        self.fold = fold
        # Wraps each partition's context load: phase(kind, name, EP name) -> context (profiles).
        self.phase: Phase = phase
        # Called as each partition's compile ends: (kind, name, EP name, seconds since its EP's compile began).
        self.ended: Callable[[str, str, str, float], None] = ended or _no_end
        # The EPs control-flow bodies (If / Loop / Scan) are partitioned among, as the main graph is; empty (the
        # default, and always for a context model, whose bodies were not compiled): body nodes run on
        # ``kernel_ep``. Set with session.partition_control_flow_bodies=1.
        self.body_providers: Sequence[ExecutionProvider] = body_providers
        # The bodies partitioned so far: graph -> (units as run, the EPs' reasons), for the placement.
        self.bodies: dict[ir.Graph, BodyPartitioning] = {}
        # The session's compile guard, for the bodies' capability probes and compiles.
        self.guard = guard or CompileGuard()

    def compile_units(
        self, units: Sequence[Unit], loader: ContextLoader | None, compiling: CompileSetup | None = None
    ) -> tuple[CompiledPartition | None, ...]:
        """Load every fused unit of an EPContext node, then compile the others: per EP, all its partitions in
        one call, through the single compile point (the guard first). Returns, per unit, its compiled partition
        (loaded from its context or compiled now; None for a kernel EP's node)."""
        found: list[CompiledPartition | None] = [None] * len(units)
        by_ep: dict[int, list[int]] = {}
        for k, unit in enumerate(units):
            if unit.partition is None:
                continue
            if unit.from_context:
                if loader is None:
                    raise InvalidGraph(f"EPContext node {unit.nodes[0].name!r} has no context loader")
                with self.phase("context_load", unit.nodes[0].name or unit.partition.name, unit.ep.name):
                    found[k] = loader.load(unit.ep, unit.nodes[0], unit.partition)
            else:
                by_ep.setdefault(id(unit.ep), []).append(k)
        setup = compiling or CompileSetup()
        total = sum(len(ks) for ks in by_ep.values())
        done = [0]
        failed: dict[int, str] = {}
        for ks in by_ep.values():
            ep = units[ks[0]].ep
            parts = [part for k in ks if (part := units[k].partition) is not None]
            ctx = self._context(ep, setup, total, done)
            for k, result in zip(ks, _compiled_or_failed(ep, parts, ctx), strict=True):
                if isinstance(result, str):
                    failed[k] = result
                else:
                    found[k] = result
        if loader is not None:
            loader.finish()
        if failed:
            raise PartitionsFailed(failed, units)
        return tuple(found)

    def _context(
        self, ep: ExecutionProvider, setup: CompileSetup, total: int, done: list[int]
    ) -> CompileContext:
        started = time.perf_counter()

        def progress(part: Partition) -> None:  # called once per partition, under compile_partitions' lock
            done[0] += 1
            seconds = time.perf_counter() - started
            self.ended("compile", part.name, ep.name, seconds)
            logger.info(
                "compiled partition %d/%d %s (%d nodes) on %s, %.2f s into its EP's compile",
                done[0], total, part.name, len(part.nodes), ep.name, seconds,
            )  # fmt: skip

        target = setup.target
        return CompileContext(
            guard=setup.guard,
            artefacts=setup.artefacts.get(id(ep)),
            progress=progress,
            target=_no_target if target is None else functools.partial(target, ep),
        )

    def steps_for_units(
        self, units: Sequence[Unit], fused: Sequence[CompiledPartition | None]
    ) -> list[PlanStep]:
        """One step per unit; ``fused``, per unit, the compiled partition of every fused unit (``compile_units``)."""
        steps = []
        for unit, compiled in zip(units, fused, strict=True):
            if unit.partition is not None:
                p = unit.partition
                if compiled is None:
                    raise InvalidGraph(
                        f"partition {p.name!r} of {unit.ep.name} was neither compiled nor loaded"
                    )
                steps.append(PlanStep(compiled, p.inputs, p.outputs, label=p.name))
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
        # An outer value that is a constant (an initializer of an enclosing graph that cannot be fed, or a
        # Constant node's output there) is one in the body's plan, not an input taken at each call: the body's
        # steps over constants fold once (silero-vad's nested LSTM branches sliced and concatenated the weights
        # of their enclosing branch's Constant nodes at every chunk).
        constants = {value: array for value in outer if (array := _outer_constant(value)) is not None}
        fed = tuple(k for k, value in enumerate(outer) if value not in constants)
        plan = build_plan(
            (*graph.inputs, *(outer[k] for k in fed)),
            graph.outputs,
            steps,
            fold_constants=self.fold,
            constants=constants,
        )
        return _SubgraphRunner(plan, len(graph.inputs), None if len(fed) == len(outer) else fed)

    def _partitioned_steps(self, graph: ir.Graph) -> list[PlanStep]:
        """The body partitioned among ``body_providers`` (capability asked with the session's guard), partitions
        too small to pay for a call left to the kernel EP, the rest compiled per EP through the single compile
        point, as the main graph's."""
        from epctx.partition import GraphPartitioner

        partitioner = GraphPartitioner(self.body_providers, cpu_fallback=True)
        units = partitioner.partition(graph, self.opset_imports, ctx=CapabilityContext(self.guard))
        declined = {node: list(reasons) for node, reasons in partitioner.declined.items()}
        ran: list[Unit] = []
        for unit in units:
            part = unit.partition
            if part is None or _worth_compiling(ir_nodes(part.nodes)):
                ran.append(unit)
                continue
            why = (
                f"cost rule: a body partition of {len(part.nodes)} node(s) with no convolution, matmul or "
                "recurrent op runs on the kernel EP (a call into a compiled partition costs more)"
            )
            for node in ir_nodes(part.nodes):
                declined.setdefault(node, []).append((unit.ep.name, why))
                ran.append(Unit(self.kernel_ep, (node,)))
        compiled = self.compile_units(ran, None, CompileSetup(self.guard, partitioner.artefacts))
        self.bodies[graph] = (ran, declined)
        return self.steps_for_units(ran, compiled)


class PartitionsFailed(EPFail):
    """Partitions their EP failed to compile (``compile_units``): unit index -> the EP's message. Uncaught it is
    the EP's failure; a session partitions the graph again without them (``Pipeline.compile``)."""

    def __init__(self, failed: Mapping[int, str], units: Sequence[Unit]) -> None:
        first = next(iter(failed.values()))
        super().__init__(first if len(failed) == 1 else f"{first} (and {len(failed) - 1} more partition(s))")
        self.failed = dict(failed)
        self.units = tuple(units)


def _compiled_or_failed(
    ep: ExecutionProvider, parts: Sequence[Partition], ctx: CompileContext
) -> list[CompiledPartition | str]:
    """``ep``'s compiled partitions, all in one call; when that call fails (``EPFail``), each partition compiled
    on its own, a failing one given as its message."""
    try:
        return list(compile_partitions(ep, parts, ctx))
    except EPFail as exc:
        if len(parts) == 1:
            return [_message(exc)]
    found: list[CompiledPartition | str] = []
    for part in parts:
        try:
            found += compile_partitions(ep, [part], ctx)
        except EPFail as exc:
            found.append(_message(exc))
    return found


def _message(exc: EPFail) -> str:
    """The failure's words, without its status code."""
    return str(exc.args[0]) if exc.args else str(exc)


# A body partition is compiled when it holds one of these or at least _MIN_BODY_NODES nodes: a call into a
# compiled partition costs tens of microseconds, more than the kernel EP spends on a Squeeze or a Gather (the
# one- and two-node branches exporters emit for "squeeze if the dim is 1").
_HEAVY_OPS = frozenset(
    {"Conv", "ConvTranspose", "MatMul", "Gemm", "LSTM", "GRU", "RNN", "Einsum", "Attention"}
)
_MIN_BODY_NODES = 16


def _worth_compiling(nodes: Sequence[ir.Node]) -> bool:
    return len(nodes) >= _MIN_BODY_NODES or any(n.op_type in _HEAVY_OPS for n in nodes)


def _no_end(kind: str, name: str, ep: str, seconds: float) -> None:
    return None


def _no_target() -> BinaryLayout | None:
    return None


def _outer_constant(value: ir.Value) -> Any:
    """The array of an outer value a body may read as a constant: an initializer that is not a graph input of
    its graph (a fed initializer is not constant, as in onnxruntime) or a Constant node's output; else None."""
    if value.is_graph_input():
        return None
    tensor = ir.convenience.get_const_tensor(value)
    return None if tensor is None else to_numpy(tensor)


class _SubgraphRunner:
    """A body's plan called with its inputs and the outer values its node reads; ``fed``: the indices of the
    outer values the plan takes as inputs (None: all; the others are constants in the plan)."""

    __slots__ = ("fed", "num_inputs", "plan")

    def __init__(self, plan: ExecutionPlan, num_inputs: int, fed: tuple[int, ...] | None = None) -> None:
        self.plan = plan
        self.num_inputs = num_inputs
        self.fed = fed

    def __call__(self, inputs: Sequence[Any], outer: Sequence[Any]) -> list[Any]:
        if self.fed is None:
            return self.plan.run((*inputs, *outer))
        return self.plan.run((*inputs, *(outer[k] for k in self.fed)))
