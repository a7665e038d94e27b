"""InferenceSession, mirroring ``onnxruntime.InferenceSession``."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx_ir as ir

from epctx import options as opt
from epctx.epcontext.generate import generate_context_model, generation_scope
from epctx.epcontext.paths import context_model_path
from epctx.epcontext.workspace import abort_open_group
from epctx.errors import Fail, InvalidArgument
from epctx.session.feeds import FeedBinder
from epctx.session.node_arg import ModelMetadata, NodeArg, node_arg
from epctx.session.pipeline import Pipeline, resolve_providers
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
        self._providers = resolve_providers(providers, provider_options, self._options, source=path_or_bytes)
        generate = opt.config_flag(config, opt.EP_CONTEXT_ENABLE)
        try:
            pipeline = Pipeline.partition(path_or_bytes, self._providers, self._options)
            loaded = self._loaded = pipeline.loaded
            ctx_path = context_model_path(loaded.path, config) if generate and pipeline.to_compile else None
            if ctx_path is not None and ctx_path.exists():
                raise Fail(
                    f"the context model {str(ctx_path)!r} exists already; remove it or set another "
                    f"{opt.EP_CONTEXT_FILE_PATH}"
                )
            with generation_scope(config, ctx_path):
                pipeline.compile()
            if generate:
                if ctx_path is None:
                    logger.warning("ep.context_enable=1 but no node was compiled: no context model written")
                elif generate_context_model(pipeline.result(), ctx_path, overwrite=False):
                    logger.info("wrote context model %s", ctx_path)
        except BaseException as exc:
            if generate and opt.config_flag(config, opt.SHARE_EP_CONTEXTS):
                abort_open_group(exc)  # a failed session of a sharing group rolls the group back
            raise
        graph = loaded.model.graph
        self._units = pipeline.units
        self._declined = pipeline.declined
        steps = pipeline.builder.steps_for_units(
            pipeline.units, {**pipeline.compiled, **pipeline.from_context}
        )
        self._plan = build_plan(
            list(graph.inputs), list(graph.outputs), steps, fold_constants=pipeline.builder.fold
        )
        self._inputs = [node_arg(v) for v in graph.inputs if v.const_value is None]
        self._overridable = [node_arg(v) for v in graph.inputs if v.const_value is not None]
        self._outputs = [node_arg(v) for v in graph.outputs]
        self._binder = FeedBinder(list(graph.inputs))
        self._output_index = {o.name: i for i, o in enumerate(self._outputs)}
        logger.debug(
            "session ready: %d units on %s", len(pipeline.units), ", ".join(ep.name for ep in self._providers)
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

    def get_partitions(self) -> list[tuple[str, list[str]]]:
        """Where the graph runs, one entry per step in execution order: (EP name, names of the nodes it runs).
        A compiled partition lists its nodes; a partition loaded from a context model, its EPContext node;
        a kernel EP (the CPU EP), one node per entry. Read-only: building it changes nothing."""
        return [(unit.ep.name, [node.name or "" for node in unit.nodes]) for unit in self._units]

    def get_fallback_reasons(self) -> dict[str, dict[str, str]]:
        """Why nodes run where they do when an EP before declined them with a reason: node name -> {EP name:
        reason} (e.g. IREE could not compile the node, so it runs on the CPU EP). Nodes an EP simply does not
        claim are not listed. epctx extension (onnxruntime has no such call)."""
        return {node: dict(reasons) for node, reasons in self._declined.items()}

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
