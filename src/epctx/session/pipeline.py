"""The session-creation pipeline shared by InferenceSession and ModelCompiler:
load -> route EPContext nodes -> partition -> compile (or load contexts)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Any

from epctx import options as opt
from epctx.epcontext.load import ContextLoader
from epctx.errors import ModelRequiresCompilation
from epctx.model import LoadedModel, load_model
from epctx.partition import GraphPartitioner, Unit
from epctx.providers.base import CompiledPartition, ExecutionProvider
from epctx.providers.registry import create_provider
from epctx.session.builder import StepBuilder

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

    @classmethod
    def partition(
        cls,
        source: str | os.PathLike[str] | bytes,
        providers: list[ExecutionProvider],
        options: opt.SessionOptions,
    ) -> Pipeline:
        config = options.config
        loaded = load_model(
            source,
            external_data_folder=config.get(opt.EXTERNAL_INITIALIZERS_FOLDER),
            infer_types=any(ep.compiles for ep in providers),
        )
        graph = loaded.model.graph
        opsets = dict(loaded.model.opset_imports)
        if options.graph_optimization_level >= opt.GraphOptimizationLevel.ORT_ENABLE_BASIC:
            from epctx.optimize import fold_conv_batchnorm

            fold_conv_batchnorm(graph)
        loader = ContextLoader(model_path=loaded.path, config=config)
        routed = loader.route(graph, providers)
        units = GraphPartitioner(
            providers, cpu_fallback=not opt.config_flag(config, opt.DISABLE_CPU_EP_FALLBACK)
        ).partition(graph, opsets, preassigned=routed)
        fold = options.graph_optimization_level != opt.GraphOptimizationLevel.ORT_DISABLE_ALL
        kernel_ep = next((ep for ep in providers if not ep.compiles), None) or create_provider(
            "CPUExecutionProvider"
        )
        pipeline = cls(loaded, providers, config, units, StepBuilder(opsets, kernel_ep, fold), loader)
        pending = pipeline.to_compile
        if pending and opt.config_flag(config, opt.DISABLE_MODEL_COMPILE):
            names = ", ".join(sorted({u.ep.name for u in pending}))
            raise ModelRequiresCompilation(
                f"session.disable_model_compile=1 but {len(pending)} partition(s) would be compiled by "
                f"{names}; load a context model made for them instead"
            )
        return pipeline

    @property
    def to_compile(self) -> list[Unit]:
        return [u for u in self.units if u.partition is not None and not u.from_context]

    def compile(self) -> None:
        self.compiled, self.from_context = self.builder.compile_units(self.units, self.loader)


def resolve_providers(
    providers: Sequence[str | tuple[str, Mapping[str, Any]]] | None,
    provider_options: Sequence[Mapping[str, Any]] | None,
    config: Mapping[str, str],
) -> list[ExecutionProvider]:
    """Providers in precedence order; the CPU EP appended last unless CPU fallback is disabled."""
    from epctx.errors import InvalidArgument

    specs: list[tuple[str, Mapping[str, Any]]] = []
    for k, p in enumerate(providers or []):
        if isinstance(p, str):
            specs.append((p, {}))
        elif isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str) and isinstance(p[1], Mapping):
            specs.append((p[0], p[1]))
        else:
            raise InvalidArgument(f"providers[{k}] must be a name or a (name, options) tuple, got {p!r}")
    if provider_options is not None:
        if len(provider_options) != len(specs):
            raise InvalidArgument(
                f"provider_options has {len(provider_options)} entries for {len(specs)} providers"
            )
        specs = [(name, {**opts, **extra}) for (name, opts), extra in zip(specs, provider_options)]
    names = [n for n, _ in specs]
    if len(set(names)) != len(names):
        raise InvalidArgument(f"a provider is listed twice: {names}")
    eps = [create_provider(name, {k: str(v) for k, v in opts.items()}) for name, opts in specs]
    if "CPUExecutionProvider" not in names and not opt.config_flag(config, opt.DISABLE_CPU_EP_FALLBACK):
        eps.append(create_provider("CPUExecutionProvider"))
    return eps
