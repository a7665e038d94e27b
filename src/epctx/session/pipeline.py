"""The session-creation pipeline shared by InferenceSession and ModelCompiler, one method per stage, each taking
the value the stage before returned and returning its own, frozen: ``load`` -> ``LoadedModel``, ``partition``
(EPContext nodes routed, the rest partitioned) -> ``Partitioning``, ``compile`` (new partitions compiled, contexts
loaded) -> ``CompiledUnits``, ``plan`` -> ``PreparedSession`` (what the lean path makes too)."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from epctx import options as opt
from epctx.ep._compiling import CapabilityContext, CompileGuard
from epctx.ep._context_io import BinaryLayout
from epctx.ep._contract import ExecutionProvider
from epctx.epcontext.load import ContextLoader
from epctx.errors import InvalidArgument
from epctx.model import LoadedModel, load_model
from epctx.partition import GraphPartitioner, Unit
from epctx.partition.placement import BodyPartitioning, NodePlacement, node_placement
from epctx.providers.registry import create_provider
from epctx.session.builder import CompileSetup, PartitionsFailed, StepBuilder
from epctx.session.overrides import apply_dimension_overrides, apply_initializers
from epctx.session.plan import build_plan
from epctx.session.prepared import PreparedSession, prepare
from epctx.session.profiling import Phase, no_phase
from epctx.session.stages import CompiledUnits, Partitioning, frozen_mapping

if TYPE_CHECKING:
    import onnx_ir as ir

    from epctx.session.measured_rule import CachedVerdicts

__all__ = ["Pipeline"]

Ended = Callable[[str, str, str, float], None]

_log = logging.getLogger("epctx")
_PASSES = (
    3  # partitionings after a hand-back, each refusing what a compiling EP newly claimed (the last: all)
)
_COMPILE_ROUNDS = (
    4  # partitionings after EPs failed to compile partitions, each refusing those partitions' nodes
)
_COMPILE_FAILED = "failed to compile its partition: "
_NOT_MEASURED = (
    "measured rule: {ep} claimed this node only after its slower partitions were handed back; a partition "
    "formed then would not be measured, so it is left to the next EP"
)


@dataclasses.dataclass(frozen=True, slots=True)
class Pipeline:
    """The stages of one session creation over ``providers`` (in precedence order) with ``options`` and their
    parsed ``config``. Holds no stage result: each stage method returns a frozen value the next one takes."""

    providers: tuple[ExecutionProvider, ...]
    options: opt.SessionOptions
    config: opt.SessionConfig
    level: int  # the graph optimization level
    kernel_ep: ExecutionProvider  # runs control-flow bodies' nodes: the first kernel EP, else the CPU EP
    phase: Phase = no_phase  # wraps each context load (profiles)
    ended: Ended | None = None  # called as each partition's compile ends (profiles)

    @classmethod
    def of(
        cls,
        providers: Sequence[ExecutionProvider],
        options: opt.SessionOptions,
        *,
        config: opt.SessionConfig | None = None,
        optimization_level: int | None = None,
        phase: Phase | None = None,
        ended: Ended | None = None,
    ) -> Pipeline:
        """``config``: ``options``' config, parsed once by the caller (None: parsed here).
        ``optimization_level``: instead of ``options.graph_optimization_level`` (ModelCompiler's own; the
        caller's options are never changed). ``phase`` / ``ended``: the profiler's hooks."""
        config = opt.SessionConfig.of(options) if config is None else config
        level = options.graph_optimization_level if optimization_level is None else optimization_level
        kernel_ep = next((ep for ep in providers if not ep.compiles), None) or create_provider(
            "CPUExecutionProvider"
        )
        return cls(tuple(providers), options, config, level, kernel_ep, phase or no_phase, ended)

    def load(self, source: str | os.PathLike[str] | bytes, data: bytes | None = None) -> LoadedModel:
        """Stage 1: the model loaded (types inferred when an EP compiles), its free dimensions and initializers
        overridden as the options say, Conv+BatchNormalization folded from the basic level up."""
        compiles = any(ep.compiles for ep in self.providers)
        return _load(source, self.options, self.config, self.level, data, compiles=compiles)

    def partition(self, loaded: LoadedModel) -> Partitioning:
        """Stages 2 and 3: EPContext nodes routed to the EPs that load them, the other nodes partitioned among
        the EPs (capability asked under the session's compile guard). A session that must not compile and
        has partitions to compile is refused here, before any context is loaded."""
        config, providers = self.config, list(self.providers)
        model = loaded.model
        loader = ContextLoader(
            model_path=loaded.path,
            config=config,
            metadata=model.metadata_props,
            read_func=self.options.ep_context_data_read_func,
        )
        routed = loader.route(model.graph, providers)
        refused = _recorded_refusals(model)
        # the measured rule's verdicts of an earlier session (``epctx.partition.verdicts``): not measured again
        cached = None if routed else self._cached_verdicts(loaded)
        if cached is not None and cached.found is not None:
            refused = {**cached.found.refusals(model.graph), **refused}
        partitioner = GraphPartitioner(
            providers,
            cpu_fallback=not config.disable_cpu_ep_fallback,
            cost_rule=config.partition_cost_rule,
            refused=refused,
        )
        # The guard of every compile of this session, capability probes included (given to EPs as a value);
        # a refit compiles nothing: the EPs that refit hand their context's code to the compile point.
        reuse = _reuse(config, providers)
        guard = (
            CompileGuard()
            if reuse
            else CompileGuard.current(disable_model_compile=config.disable_model_compile)
        )
        ctx = CapabilityContext(guard, reuse=reuse)
        units = partitioner.partition(model.graph, dict(model.opset_imports), preassigned=routed, ctx=ctx)
        # Control-flow bodies are offered to the EPs too; never in a context model (its bodies were not
        # compiled when it was made, and loading one never compiles), where compiling is disabled, nor in a
        # refit (it compiles nothing).
        bodies = config.partition_control_flow_bodies and not (
            routed or config.disable_model_compile or reuse
        )
        partitioning = Partitioning(
            loaded=loaded,
            units=tuple(units),
            routed=frozen_mapping(routed),
            declined=frozen_mapping({node: tuple(why) for node, why in partitioner.declined.items()}),
            artefacts=frozen_mapping(partitioner.artefacts),
            guard=guard,
            bodies=bool(bodies),
            loader=loader,
            refused=frozen_mapping(refused),
            compiling=frozenset(ep.name for ep in providers if ep.compiles),
        )
        pending = partitioning.to_compile
        if pending and config.disable_model_compile:  # before any context is loaded
            guard.check(", ".join(sorted({u.ep.name for u in pending})), len(pending))
        return partitioning

    def compile(
        self,
        partitioning: Partitioning,
        target: Callable[[ExecutionProvider], BinaryLayout | None] | None = None,
        failed_rounds: int = 0,
    ) -> CompiledUnits:
        """Stage 4: the contexts loaded and the partitions compiled (``target``: EP -> the sharing group's
        binary the partitions will be saved into, when generating into one), each EP's capability artefacts
        handed to its compile. The value returned holds the partitioning without those artefacts."""
        setup = CompileSetup(partitioning.guard, partitioning.artefacts, target)
        try:
            found = self._builder(partitioning).compile_units(partitioning.units, partitioning.loader, setup)
        except PartitionsFailed as failure:
            if failed_rounds >= _COMPILE_ROUNDS:
                raise
            return self.compile(self._without_failed(partitioning, failure), target, failed_rounds + 1)
        compiled = CompiledUnits(partitioning.without_artefacts(), found)
        again = (
            self._hand_back(compiled)
            if self.config.partition_measured_rule and not partitioning.routed
            else None
        )
        if again is not None:  # once: the partitions kept were measured, the nodes handed back are refused
            rest = self.config.replace({opt.PARTITION_MEASURED_RULE: "0"})
            return dataclasses.replace(self, config=rest).compile(again, target)
        return compiled

    def _without_failed(self, partitioning: Partitioning, failure: PartitionsFailed) -> Partitioning:
        """The graph partitioned again with the nodes of each partition its EP failed to compile refused to that
        EP, in its words (OpenVINO's query claims what its CPU plugin then fails to compile: onnx-asr's NeMo front
        ends, "Check '!shape.rank().is_dynamic()' failed"); warned. Each round refuses at least one partition's
        nodes; past ``_COMPILE_ROUNDS`` rounds the failure is raised."""
        refused = dict(partitioning.refused)
        for k, message in failure.failed.items():
            unit = failure.units[k]
            name = unit.partition.name if unit.partition is not None else "?"
            _log.warning("%s failed to compile its partition %r (%d node(s)); they go to the next EP: %s",
                         unit.ep.name, name, len(unit.nodes), message)  # fmt: skip
            why = f"{_COMPILE_FAILED}{message.splitlines()[0][:400]}"
            refused.update({node: (unit.ep.name, why) for node in unit.nodes})
        return self._partition_within(partitioning, refused, set(partitioning.loaded.model.graph))

    def _hand_back(self, compiled: CompiledUnits) -> Partitioning | None:
        """The measured rule (``epctx.partition.measured``): the graph partitioned again without the compiled
        partitions slower than the kernel EP on the same nodes; None when every one is kept."""
        from epctx.partition.measured import hand_back
        from epctx.partition.verdicts import node_positions
        from epctx.session.measured_rule import kernel_runner

        partitioning, kernel, units = compiled.partitioning, self.kernel_ep, compiled.partitioning.units
        runs = {k: c for k, c in compiled.compiled.items() if units[k].ep is not kernel}
        if kernel not in self.providers or not runs:
            return None
        cached = self._cached_verdicts(partitioning.loaded, warn=False)  # warned at partitioning
        known = cached.found if cached is not None else None  # partitions kept before: not measured again
        where = node_positions(partitioning.loaded.model.graph) if known is not None else {}
        fresh = {
            k: c
            for k, c in runs.items()
            if known is None or not known.was_kept(units[k].ep.name, units[k].nodes, where)
        }
        found = {}
        if fresh:
            with contextlib.ExitStack() as stack:  # timed as a run is: each EP's run scope (BLAS threads...)
                for ep in self.providers:
                    scope = ep.run_scope()
                    if scope is not None:
                        stack.enter_context(scope)
                found = hand_back(units, fresh, kernel.name, kernel_runner(self._builder(partitioning)))
        held = {node for k in runs for node in units[k].nodes}
        refused = {**partitioning.refused, **found}  # with those a context model recorded, if any
        again = self._partition_within(partitioning, refused, held) if found else None
        if cached is not None and fresh:  # what this session learned, for the next
            final = again or partitioning
            kept = [(u.ep.name, u.nodes) for u in final.units if u.ep is not kernel]
            cached.put(partitioning.loaded.model.graph, final.refused, kept)
        return again

    def _cached_verdicts(self, loaded: LoadedModel, *, warn: bool = True) -> CachedVerdicts | None:
        """The measured rule's verdicts kept for this session (``epctx.partition.verdicts``); None when the rule
        is off, the cache is off (``EPCTX_MEASURED_CACHE=0``) or no EP compiles."""
        if not self.config.partition_measured_rule:
            return None
        from epctx.session.measured_rule import cached_verdicts

        return cached_verdicts(
            loaded.model, self.providers, self.kernel_ep, self.options, self.level, warn=warn
        )

    def _partition_within(
        self, partitioning: Partitioning, refused: dict[Any, tuple[str, str]], held: set[Any]
    ) -> Partitioning:
        """The graph partitioned again with ``refused`` refused, and no compiling EP given a node outside
        ``held`` (the nodes of the partitions measured): an EP whose capability depends on what it is offered
        (IREE's) may claim other nodes once some are refused, and a partition formed then is not measured
        (nudenet on IREE: its DFL head handed back, IREE then took the box decode, then the backbone, 6.8x the
        CPU EP). Those nodes are refused to it too, a few passes at most (each asks the EPs' capability). The
        nodes outside ``held`` that a compiling EP declined when the measured partitions were formed are refused
        to it from the start, in its own words: asked again, it would check them again for nothing (IREE's
        capability compiles: silero-vad's folded graph on IREE, 26 s more after its 30 s budget was spent); the
        partitioning returned does not count them among its refusals (what the measured cache and a context
        model keep): the next session offers them again (IREE's search goes on from its probe records)."""
        model, config = partitioning.loaded.model, self.config
        carried = _declined_outside(partitioning, held)
        refused = {**carried, **refused}
        fresh: dict[Any, tuple[str, str]] = {}
        for attempt in range(_PASSES):
            # the last pass: every node outside ``held`` refused to the EPs still claiming new ones
            if attempt == _PASSES - 1:
                refused = _refuse_all_but(model.graph, held, refused, {why[0] for why in fresh.values()})
            partitioner = GraphPartitioner(list(self.providers), cpu_fallback=not config.disable_cpu_ep_fallback,
                                           cost_rule=config.partition_cost_rule, refused=refused)  # fmt: skip
            units = partitioner.partition(
                model.graph, dict(model.opset_imports), ctx=CapabilityContext(partitioning.guard)
            )
            fresh = {
                node: (unit.ep.name, _NOT_MEASURED.format(ep=unit.ep.name))
                for unit in units
                if unit.ep is not self.kernel_ep
                for node in unit.nodes
                if node not in held
            }
            if not fresh:
                break
            refused = {**refused, **fresh}
        else:
            _log.warning("measured rule: an EP still claims nodes it did not hold when measured (refused to it "
                         "elsewhere); its partitions of them run unmeasured")  # fmt: skip
        declined = {node: tuple(why) for node, why in partitioner.declined.items()}
        refused = {node: why for node, why in refused.items() if carried.get(node) != why}
        return dataclasses.replace(partitioning, units=tuple(units), declined=frozen_mapping(declined),
                                   artefacts=frozen_mapping(partitioner.artefacts),
                                   refused=frozen_mapping(refused))  # fmt: skip

    def plan(self, compiled: CompiledUnits) -> PreparedSession:
        """The last stage: one plan step per unit (control-flow bodies partitioned as their steps are built),
        the plan laid out, and the prepared session InferenceSession adopts."""
        partitioning = compiled.partitioning
        units, loaded = partitioning.units, partitioning.loaded
        builder = self._builder(partitioning)
        steps = [
            dataclasses.replace(step, provider=unit.ep.name, op_type=_op_type(unit))
            for step, unit in zip(builder.steps_for_units(units, compiled.partitions), units, strict=True)
        ]
        placement = self.placement(
            partitioning, builder.bodies
        )  # after the steps: bodies partitioned by then
        graph = loaded.model.graph
        plan = build_plan(list(graph.inputs), list(graph.outputs), steps, fold_constants=builder.fold)
        return prepare(
            loaded.model,
            plan,
            [(unit.ep.name, [node.name or "" for node in unit.nodes]) for unit in units],
            declined=partitioning.declined_reasons(),
            placement=placement,
            loaded=loaded,
        )

    def placement(
        self, partitioning: Partitioning, bodies: Mapping[Any, BodyPartitioning] | None = None
    ) -> list[NodePlacement]:
        """Where each node runs (those of control-flow bodies after their node, given the ``bodies`` the plan
        stage partitioned), and why the EPs ahead of its EP declined it."""
        return node_placement(
            partitioning.loaded.model.graph,
            partitioning.units,
            partitioning.declined,
            [ep.name for ep in self.providers],
            bodies=bodies or {},
            kernel_ep=self.kernel_ep.name,
        )

    def _builder(self, partitioning: Partitioning) -> StepBuilder:
        """A step builder for this partitioning: constants folded unless optimizations are off, control-flow
        bodies offered to the EPs when the partitioning says so, the session's guard and profiler hooks."""
        return StepBuilder(
            partitioning.loaded.model.opset_imports,
            self.kernel_ep,
            self.level != opt.GraphOptimizationLevel.ORT_DISABLE_ALL,
            guard=partitioning.guard,
            body_providers=self.providers if partitioning.bodies else (),
            phase=self.phase,
            ended=self.ended,
        )


def _declined_outside(partitioning: Partitioning, held: set[Any]) -> dict[Any, tuple[str, str]]:
    """The nodes outside ``held`` that a compiling EP declined in ``partitioning``: each refused to the first
    such EP, with its reason (so the placement still shows that EP's own words)."""
    found = {}
    for node, reasons in partitioning.declined.items():
        if node not in held:
            why = next(((ep, text) for ep, text in reasons if ep in partitioning.compiling), None)
            if why is not None:
                found[node] = why
    return found


def _refuse_all_but(
    graph: Any, held: set[Any], refused: dict[Any, tuple[str, str]], eps: set[str]
) -> dict[Any, tuple[str, str]]:
    """``refused`` with every node of ``graph`` outside ``held`` (and not refused already) refused to the first
    of ``eps`` (one refusal per node: with one compiling EP, the usual case, that EP)."""
    if not eps:
        return refused
    ep = sorted(eps)[0]
    why = _NOT_MEASURED.format(ep=ep)
    return {**{node: (ep, why) for node in graph if node not in held and node not in refused}, **refused}


def resolve_providers(
    providers: Sequence[str | tuple[str, Mapping[str, Any]]] | None,
    provider_options: Sequence[Mapping[str, Any]] | None,
    options: opt.SessionOptions | Mapping[str, str] | None,
    *,
    source: str | os.PathLike[str] | bytes | None = None,
    config: opt.SessionConfig | None = None,
) -> list[ExecutionProvider]:
    """Providers in precedence order, the CPU EP last unless CPU fallback is disabled: the one provider
    normaliser (``epctx.providers.selection``), shared with ModelCompiler and the command line."""
    from epctx.providers.selection import resolve_providers as resolve

    return resolve(providers, provider_options, options, source=source, config=config)


def _reuse(config: opt.SessionConfig, providers: Sequence[ExecutionProvider]) -> dict[str, Any]:
    """Refit (``epctx.refit_context``): that context's graphs by EP; every compiling EP of the session must
    have some, so that no partition is compiled."""
    if not config.refit_context:
        return {}
    from epctx.epcontext.reuse import reusable_graphs

    rest = config.replace({opt.REFIT_CONTEXT: None})
    reuse = reusable_graphs(config.refit_context, providers, rest)
    idle = [ep.name for ep in providers if ep.compiles and ep.name not in reuse]
    if idle:
        raise InvalidArgument(
            f"{opt.REFIT_CONTEXT}: {', '.join(idle)} would compile, and the context has no code of theirs to "
            "reuse: list only the EPs of the context"
        )
    return reuse


def _load(
    source: str | os.PathLike[str] | bytes,
    options: opt.SessionOptions,
    config: opt.SessionConfig,
    level: int,
    data: bytes | None,
    *,
    compiles: bool,
) -> LoadedModel:
    """The loading stage: the model loaded (types inferred when an EP compiles), its input shapes stated as
    ``config`` says, its free dimensions and initializers overridden as ``options`` say, Conv + BatchNormalization / Mul / Add folded from the basic level up."""
    loaded = load_model(
        source,
        data=data,
        external_data_folder=config.external_initializers_folder or None,
        infer_types=compiles,
        free_dims=options.free_dimension_overrides,  # before type inference: sizes reach every value
        input_shapes=config.input_shapes,  # whole shapes (epctx.input_shapes), anonymous dimensions too
        input_values=config.input_values,  # scalar values (epctx.input_values), the control flow they decide
    )
    graph = loaded.model.graph
    apply_dimension_overrides(graph, *options.free_dimension_overrides)
    apply_initializers(graph, options.initializers)
    if level >= opt.GraphOptimizationLevel.ORT_ENABLE_BASIC:
        from epctx.optimize import fold_conv_affine

        fold_conv_affine(graph)
    return loaded


def _recorded_refusals(model: ir.Model) -> dict[ir.Node, tuple[str, str]]:
    """The measured rule's hand-backs a context model records (``epctx.measured_refusals``): node -> (EP name,
    reason), refused to that EP again so that it neither compiles nor measures them; {} without a record."""
    from epctx.partition.measured import REFUSALS_KEY, recorded_refusals

    return recorded_refusals(model.graph, model.metadata_props.get(REFUSALS_KEY))


def _op_type(unit: Unit) -> str:
    """For profiles: the node's op type, "EPContext", or the compiled partition's name."""
    if unit.partition is None:
        return str(unit.nodes[0].op_type)
    return "EPContext" if unit.from_context else str(unit.partition.name)
