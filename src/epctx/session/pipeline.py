"""The session-creation pipeline shared by InferenceSession and ModelCompiler:
load -> route EPContext nodes -> partition -> compile (or load contexts)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from epctx import options as opt
from epctx.ep.compiling import CapabilityContext, CompileGuard
from epctx.ep.context_io import BinaryLayout
from epctx.ep.contract import CompiledPartition, ExecutionProvider
from epctx.epcontext.load import ContextLoader
from epctx.model import LoadedModel, load_model
from epctx.partition import CompiledModel, GraphPartitioner, Unit
from epctx.providers.registry import create_provider
from epctx.session.builder import CompileSetup, StepBuilder
from epctx.session.overrides import apply_dimension_overrides, apply_initializers

__all__ = ["Pipeline"]


@dataclasses.dataclass
class Pipeline:
    """A model split among EPs. ``compile()`` fills ``compiled`` (new) and ``from_context`` (loaded)."""

    loaded: LoadedModel
    providers: list[ExecutionProvider]
    config: Mapping[str, str]
    units: list[Unit]
    builder: StepBuilder
    loader: ContextLoader
    compiled: dict[int, CompiledPartition] = dataclasses.field(default_factory=dict)
    from_context: dict[int, CompiledPartition] = dataclasses.field(default_factory=dict)
    # node name -> {EP name: why that EP declined it} (the node runs on a later EP)
    declined: dict[str, dict[str, str]] = dataclasses.field(default_factory=dict)
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
        data: bytes | None = None,
        optimization_level: int | None = None,
    ) -> Pipeline:
        """``optimization_level``: instead of ``options.graph_optimization_level`` (ModelCompiler's own; the
        caller's options are never changed)."""
        config = options.config
        level = options.graph_optimization_level if optimization_level is None else optimization_level
        loaded = load_model(
            source,
            data=data,
            external_data_folder=config.get(opt.EXTERNAL_INITIALIZERS_FOLDER),
            infer_types=any(ep.compiles for ep in providers),
        )
        graph = loaded.model.graph
        opsets = dict(loaded.model.opset_imports)
        apply_dimension_overrides(graph, *options.free_dimension_overrides)
        apply_initializers(graph, options.initializers)
        if level >= opt.GraphOptimizationLevel.ORT_ENABLE_BASIC:
            from epctx.optimize import fold_conv_batchnorm

            fold_conv_batchnorm(graph)
        loader = ContextLoader(model_path=loaded.path, config=config, metadata=loaded.model.metadata_props)
        routed = loader.route(graph, providers)
        partitioner = GraphPartitioner(
            providers, cpu_fallback=not opt.config_flag(config, opt.DISABLE_CPU_EP_FALLBACK)
        )
        # The guard of every compile of this session, capability probes included (given to EPs as a value).
        guard = CompileGuard.current(disable_model_compile=opt.config_flag(config, opt.DISABLE_MODEL_COMPILE))
        units = partitioner.partition(graph, opsets, preassigned=routed, ctx=CapabilityContext(guard))
        fold = level != opt.GraphOptimizationLevel.ORT_DISABLE_ALL
        kernel_ep = next((ep for ep in providers if not ep.compiles), None) or create_provider(
            "CPUExecutionProvider"
        )
        pipeline = cls(loaded, providers, config, units, StepBuilder(opsets, kernel_ep, fold), loader)
        pipeline.declined = {node.name or "": dict(reasons) for node, reasons in partitioner.declined.items()}
        pipeline.guard, pipeline.artefacts = guard, partitioner.artefacts
        pending = pipeline.to_compile
        if pending and opt.config_flag(config, opt.DISABLE_MODEL_COMPILE):  # before any context is loaded
            guard.check(", ".join(sorted({u.ep.name for u in pending})), len(pending))
        return pipeline

    @property
    def to_compile(self) -> list[Unit]:
        return [u for u in self.units if u.partition is not None and not u.from_context]

    def compile(self, target: Callable[[ExecutionProvider], BinaryLayout | None] | None = None) -> None:
        """Load the contexts and compile the partitions (``target``: EP -> the sharing group's binary the
        partitions will be saved into, when generating into one). The capability artefacts go with it."""
        setup = CompileSetup(self.guard, self.artefacts, target)
        self.artefacts = {}
        self.compiled, self.from_context = self.builder.compile_units(self.units, self.loader, setup)

    def result(self) -> CompiledModel:
        """What generation needs of this pipeline, as an immutable value."""
        return CompiledModel(
            self.loaded.model, self.loaded.path, tuple(self.units), dict(self.compiled), dict(self.config)
        )


def resolve_providers(
    providers: Sequence[str | tuple[str, Mapping[str, Any]]] | None,
    provider_options: Sequence[Mapping[str, Any]] | None,
    options: opt.SessionOptions | Mapping[str, str] | None,
    *,
    source: str | os.PathLike[str] | bytes | None = None,
) -> list[ExecutionProvider]:
    """Providers in precedence order, the CPU EP last unless CPU fallback is disabled: the one provider
    normaliser (``epctx.providers.selection``), shared with ModelCompiler and the command line."""
    from epctx.providers.selection import resolve_providers as resolve

    return resolve(providers, provider_options, options, source=source)
