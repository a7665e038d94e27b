"""The session-creation pipeline shared by InferenceSession and ModelCompiler:
load -> route EPContext nodes -> partition -> compile (or load contexts)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from epctx import options as opt
from epctx.ep._compiling import CapabilityContext, CompileGuard
from epctx.ep._context_io import BinaryLayout
from epctx.ep._contract import CompiledPartition, ExecutionProvider
from epctx.epcontext.load import ContextLoader
from epctx.errors import InvalidArgument
from epctx.model import LoadedModel, load_model
from epctx.partition import CompiledModel, GraphPartitioner, Unit
from epctx.partition.placement import NodePlacement, node_placement
from epctx.providers.registry import create_provider
from epctx.session.builder import CompileSetup, StepBuilder
from epctx.session.overrides import apply_dimension_overrides, apply_initializers

if TYPE_CHECKING:
    import onnx_ir as ir

__all__ = ["Pipeline"]


@dataclasses.dataclass
class Pipeline:
    """A model split among EPs. ``compile()`` fills ``compiled`` (new) and ``from_context`` (loaded)."""

    loaded: LoadedModel
    providers: list[ExecutionProvider]
    config: opt.SessionConfig
    units: list[Unit]
    builder: StepBuilder
    loader: ContextLoader
    compiled: dict[int, CompiledPartition] = dataclasses.field(default_factory=dict)
    from_context: dict[int, CompiledPartition] = dataclasses.field(default_factory=dict)
    # node name -> {EP name: why that EP declined it} (the node runs on a later EP)
    declined: dict[str, dict[str, str]] = dataclasses.field(default_factory=dict)
    # the same by node (names may repeat or be empty): node -> [(EP name, why)]
    declined_by_node: dict[ir.Node, list[tuple[str, str]]] = dataclasses.field(default_factory=dict)
    guard: CompileGuard = dataclasses.field(default_factory=CompileGuard)
    # id(EP) -> its Capability.artefacts, handed to its compile (then dropped: they may hold compiled code)
    artefacts: dict[int, object] = dataclasses.field(default_factory=dict)

    @classmethod
    def partition(
        cls,
        source: str | os.PathLike[str] | bytes,
        providers: list[ExecutionProvider],
        options: opt.SessionOptions,
        *,
        config: opt.SessionConfig | None = None,
        data: bytes | None = None,
        optimization_level: int | None = None,
    ) -> Pipeline:
        """``config``: ``options``' config, parsed once by the caller (None: parsed here).
        ``optimization_level``: instead of ``options.graph_optimization_level`` (ModelCompiler's own; the
        caller's options are never changed)."""
        config = opt.SessionConfig.of(options) if config is None else config
        level = options.graph_optimization_level if optimization_level is None else optimization_level
        loaded = _load(source, options, config, level, data, compiles=any(ep.compiles for ep in providers))
        graph = loaded.model.graph
        opsets = dict(loaded.model.opset_imports)
        loader = ContextLoader(
            model_path=loaded.path,
            config=config,
            metadata=loaded.model.metadata_props,
            read_func=options.ep_context_data_read_func,
        )
        routed = loader.route(graph, providers)
        partitioner = GraphPartitioner(
            providers,
            cpu_fallback=not config.disable_cpu_ep_fallback,
            cost_rule=config.partition_cost_rule,
        )
        # The guard of every compile of this session, capability probes included (given to EPs as a value).
        guard = CompileGuard.current(disable_model_compile=config.disable_model_compile)
        reuse = _reuse(config, providers)
        if (
            reuse
        ):  # a refit compiles nothing: the EPs that refit hand their context's code to the compile point
            guard = CompileGuard()
        units = partitioner.partition(
            graph, opsets, preassigned=routed, ctx=CapabilityContext(guard, reuse=reuse)
        )
        # Control-flow bodies are offered to the EPs too; never in a context model (its bodies were not
        # compiled when it was made, and loading one never compiles), where compiling is disabled, nor in a
        # refit (it compiles nothing).
        bodies = config.partition_control_flow_bodies and not (
            routed or config.disable_model_compile or reuse
        )
        builder = _step_builder(opsets, providers, level, guard, bodies=bool(bodies))
        pipeline = cls(loaded, providers, config, units, builder, loader)
        pipeline.declined = {node.name or "": dict(reasons) for node, reasons in partitioner.declined.items()}
        pipeline.declined_by_node = partitioner.declined
        pipeline.guard, pipeline.artefacts = guard, partitioner.artefacts
        pending = pipeline.to_compile
        if pending and config.disable_model_compile:  # before any context is loaded
            guard.check(", ".join(sorted({u.ep.name for u in pending})), len(pending))
        return pipeline

    @property
    def to_compile(self) -> list[Unit]:
        return [u for u in self.units if u.partition is not None and not u.from_context]

    def placement(self) -> list[NodePlacement]:
        """Where each node runs (those of control-flow bodies after their node), and why the EPs ahead of its EP
        declined it. Bodies are partitioned when the plan is built: ask after ``StepBuilder.steps_for_units``."""
        names = [ep.name for ep in self.providers]
        graph, builder = self.loaded.model.graph, self.builder
        return node_placement(
            graph,
            self.units,
            self.declined_by_node,
            names,
            bodies=builder.bodies,
            kernel_ep=builder.kernel_ep.name,
        )

    def compile(self, target: Callable[[ExecutionProvider], BinaryLayout | None] | None = None) -> None:
        """Load the contexts and compile the partitions (``target``: EP -> the sharing group's binary the
        partitions will be saved into, when generating into one). The capability artefacts go with it."""
        setup = CompileSetup(self.guard, self.artefacts, target)
        self.artefacts = {}
        self.compiled, self.from_context = self.builder.compile_units(self.units, self.loader, setup)

    def result(self) -> CompiledModel:
        """What generation needs of this pipeline, as an immutable value."""
        return CompiledModel(
            self.loaded.model, self.loaded.path, tuple(self.units), dict(self.compiled), self.config
        )


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
    """The loading stage: the model loaded (types inferred when an EP compiles), its free dimensions and
    initializers overridden as ``options`` say, Conv+BatchNormalization folded from the basic level up."""
    loaded = load_model(
        source,
        data=data,
        external_data_folder=config.external_initializers_folder or None,
        infer_types=compiles,
        free_dims=options.free_dimension_overrides,  # before type inference: sizes reach every value
    )
    graph = loaded.model.graph
    apply_dimension_overrides(graph, *options.free_dimension_overrides)
    apply_initializers(graph, options.initializers)
    if level >= opt.GraphOptimizationLevel.ORT_ENABLE_BASIC:
        from epctx.optimize import fold_conv_batchnorm

        fold_conv_batchnorm(graph)
    return loaded


def _step_builder(
    opsets: dict[str, int],
    providers: list[ExecutionProvider],
    level: int,
    guard: CompileGuard,
    *,
    bodies: bool,
) -> StepBuilder:
    """The plan's step builder: kernels from the first EP that runs per node (else the CPU EP), constants
    folded unless optimizations are off, control-flow bodies offered to ``providers`` when ``bodies``."""
    fold = level != opt.GraphOptimizationLevel.ORT_DISABLE_ALL
    kernel_ep = next((ep for ep in providers if not ep.compiles), None) or create_provider(
        "CPUExecutionProvider"
    )
    builder = StepBuilder(opsets, kernel_ep, fold)
    builder.guard = guard
    if bodies:
        builder.body_providers = providers
    return builder
