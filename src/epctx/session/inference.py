"""InferenceSession, mirroring ``onnxruntime.InferenceSession``."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx_ir as ir

from epctx import options as opt
from epctx.epcontext.generate import build_context_model, save_context_model
from epctx.epcontext.load import ContextLoader
from epctx.epcontext.paths import context_model_path, model_name_for
from epctx.errors import Fail, InvalidArgument, ModelRequiresCompilation
from epctx.model import LoadedModel, load_model
from epctx.partition import GraphPartitioner
from epctx.providers.base import ExecutionProvider
from epctx.providers.registry import create_provider
from epctx.session.builder import StepBuilder
from epctx.session.feeds import FeedBinder
from epctx.session.node_arg import ModelMetadata, NodeArg, node_arg
from epctx.session.plan import build_plan

__all__ = ["InferenceSession", "ProviderSpec"]

logger = logging.getLogger("epctx")

ProviderSpec = str | tuple[str, Mapping[str, Any]]


class InferenceSession:
    """Load a model, split it among EPs, compile what compiles, and run it."""

    def __init__(
        self,
        path_or_bytes: str | os.PathLike[str] | bytes,
        sess_options: opt.SessionOptions | None = None,
        providers: Sequence[ProviderSpec] | None = None,
        provider_options: Sequence[Mapping[str, Any]] | None = None,
        **kwargs: Any,
    ) -> None:
        if kwargs:
            raise InvalidArgument(f"unexpected InferenceSession arguments: {', '.join(sorted(kwargs))}")
        self._options = sess_options if sess_options is not None else opt.SessionOptions()
        config = self._options.config
        self._model_path = None if isinstance(path_or_bytes, (bytes, bytearray)) else str(path_or_bytes)
        loaded = load_model(path_or_bytes, external_data_folder=config.get(opt.EXTERNAL_INITIALIZERS_FOLDER))
        self._loaded: LoadedModel = loaded
        self._providers = resolve_providers(providers, provider_options, config)
        graph = loaded.model.graph
        opsets = dict(loaded.model.opset_imports)
        context_loader = ContextLoader(model_path=loaded.path, config=config)
        routed = context_loader.route(graph, self._providers)
        units = GraphPartitioner(
            self._providers, cpu_fallback=not opt.config_flag(config, opt.DISABLE_CPU_EP_FALLBACK)
        ).partition(graph, opsets, preassigned=routed)
        to_compile = [u for u in units if u.partition is not None and not u.from_context]
        if to_compile and opt.config_flag(config, opt.DISABLE_MODEL_COMPILE):
            names = ", ".join(sorted({u.ep.name for u in to_compile}))
            raise ModelRequiresCompilation(
                f"session.disable_model_compile=1 but {len(to_compile)} partition(s) would be compiled by "
                f"{names}; load a context model made for them instead"
            )
        generate = opt.config_flag(config, opt.EP_CONTEXT_ENABLE)
        ctx_path = context_model_path(loaded.path, config) if generate and to_compile else None
        if ctx_path is not None and ctx_path.exists():
            raise Fail(
                f"the context model {str(ctx_path)!r} exists already; remove it or set another "
                f"{opt.EP_CONTEXT_FILE_PATH}"
            )
        fold = self._options.graph_optimization_level != opt.GraphOptimizationLevel.ORT_DISABLE_ALL
        kernel_ep = next((ep for ep in self._providers if not ep.compiles), None) or create_provider(
            "CPUExecutionProvider"
        )
        builder = StepBuilder(opsets, kernel_ep, fold)
        compiled, from_context = builder.compile_units(units, context_loader)
        if generate:
            if ctx_path is None:
                logger.warning("ep.context_enable=1 but no node was compiled: no context model written")
            else:
                ctx = build_context_model(
                    model=loaded.model,
                    units=units,
                    compiled=compiled,
                    config=config,
                    model_name=model_name_for(loaded.path, ctx_path),
                    source_filename=loaded.path.name if loaded.path is not None else "",
                )
                save_context_model(ctx, ctx_path)
                logger.info("wrote context model %s", ctx_path)
        steps = builder.steps_for_units(units, {**compiled, **from_context})
        self._plan = build_plan(list(graph.inputs), list(graph.outputs), steps, fold_constants=fold)
        self._inputs = [node_arg(v) for v in graph.inputs if v.const_value is None]
        self._overridable = [node_arg(v) for v in graph.inputs if v.const_value is not None]
        self._outputs = [node_arg(v) for v in graph.outputs]
        self._binder = FeedBinder(list(graph.inputs))
        self._output_index = {o.name: i for i, o in enumerate(self._outputs)}
        logger.debug(
            "session ready: %d units on %s", len(units), ", ".join(ep.name for ep in self._providers)
        )

    # -- running -------------------------------------------------------------------------------------
    def run(
        self,
        output_names: Sequence[str] | None,
        input_feed: Mapping[str, Any],
        run_options: opt.RunOptions | None = None,
    ) -> list[Any]:
        results = self._plan.run(self._binder.bind(input_feed))
        if output_names is None:
            return [_as_output(r) for r in results]
        index = self._output_index
        picked = []
        for name in output_names:
            i = index.get(name)
            if i is None:
                raise InvalidArgument(f"invalid output name {name!r}; the model's outputs are {list(index)}")
            picked.append(_as_output(results[i]))
        return picked

    # -- introspection -------------------------------------------------------------------------------
    def get_inputs(self) -> list[NodeArg]:
        return list(self._inputs)

    def get_outputs(self) -> list[NodeArg]:
        return list(self._outputs)

    def get_overridable_initializers(self) -> list[NodeArg]:
        return list(self._overridable)

    def get_providers(self) -> list[str]:
        return [ep.name for ep in self._providers]

    def get_provider_options(self) -> dict[str, dict[str, str]]:
        return {ep.name: ep.provider_options() for ep in self._providers}

    def get_session_options(self) -> opt.SessionOptions:
        return self._options

    def get_modelmeta(self) -> ModelMetadata:
        model = self._loaded.model
        return ModelMetadata(
            producer_name=model.producer_name or "",
            graph_name=model.graph.name or "",
            domain=model.domain or "",
            description=model.doc_string or "",
            graph_description=model.graph.doc_string or "",
            version=model.model_version or 0,
            custom_metadata_map=dict(model.metadata_props),
        )

    @property
    def model(self) -> ir.Model:
        """The session's model (after loading; read-only by convention)."""
        return self._loaded.model


def _as_output(value: Any) -> Any:
    """Outputs are the caller's own arrays: views (of inputs, weights or cached constants) are copied."""
    if isinstance(value, np.ndarray):
        return value if value.base is None and value.flags.writeable else value.copy()
    if value is None or isinstance(value, list):
        return value
    return np.asarray(value)


def resolve_providers(
    providers: Sequence[ProviderSpec] | None,
    provider_options: Sequence[Mapping[str, Any]] | None,
    config: Mapping[str, str],
) -> list[ExecutionProvider]:
    """Providers in precedence order; the CPU EP appended last unless CPU fallback is disabled."""
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
