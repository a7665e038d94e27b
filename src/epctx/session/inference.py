"""InferenceSession, mirroring ``onnxruntime.InferenceSession``."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from epctx import options as opt
from epctx.errors import Fail, InvalidArgument
from epctx.session.creation import lean_allowed, warn_sequential, write_optimized_model
from epctx.session.feeds import feed_binder
from epctx.session.iobinding import SessionIOBinding
from epctx.session.lifecycle import heal_options, prepare_source
from epctx.session.logs import severity_scope
from epctx.session.node_arg import ModelMetadata, NodeArg
from epctx.session.ortvalue import OrtValue, owned_array, owned_arrays
from epctx.session.profiling import Profiler
from epctx.session.run_hooks import run_observed

if TYPE_CHECKING:
    from pathlib import Path

    import onnx_ir as ir

    from epctx.ep._contract import ExecutionProvider
    from epctx.model import LoadedModel
    from epctx.partition.placement import NodePlacement
    from epctx.session.pipeline import Pipeline
    from epctx.session.prepared import PreparedSession
    from epctx.session.specialize import ShapeSpecialization, ShapeSpecializer
    from epctx.session.stages import CompiledUnits

__all__ = ["InferenceSession", "ProviderSpec"]

logger = logging.getLogger("epctx")

ProviderSpec = str | tuple[str, Mapping[str, Any]]
_NO_OUTPUT = "At least one output should be requested."  # onnxruntime's words, for a model without outputs


class InferenceSession:
    """Load a model, split it among EPs, compile what compiles, and run it. Over a model with dynamic input
    dimensions and a compiling EP that static shapes help (IREE), runs of an input-shape signature seen twice go
    to a session compiled for those shapes once it is made (``epctx.specialize_shapes``,
    ``epctx.session.specialize``); IOBinding runs stay on this session's own plan."""

    _shapes: ShapeSpecializer | None = None  # per-shape specialization, when it applies
    _compiling_for_cache = False  # compiling into the transparent cache (session/lifecycle.py)

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
        if not isinstance(path_or_bytes, (bytes, bytearray)) and os.path.isfile(
            os.path.join(path_or_bytes, "manifest.json")
        ):
            from epctx.package.context import open_for_session  # a model package: its best variant here

            path_or_bytes, sess_options, providers, provider_options = open_for_session(
                path_or_bytes, sess_options, providers, provider_options
            )
        self._source = path_or_bytes
        self._options = sess_options if sess_options is not None else opt.SessionOptions()
        self._profiler: Profiler | None = None
        self._loaded: LoadedModel | None = None
        self._overwrite_context = False  # a self-heal compiles a context model again in place
        self._context_metadata: dict[str, str] = {}  # added to a generated context (epctx.context_key)
        with severity_scope(self._options.log_severity_level):
            self._create(providers, provider_options)

    def _create(
        self, providers: Sequence[ProviderSpec] | None, provider_options: Sequence[Mapping[str, Any]] | None
    ) -> None:
        if self._shapes is not None:  # set_providers: the old session's specializations go with it
            self._shapes.stop()
            self._shapes = None
        self._create_session(providers, provider_options)
        self._specialize_later((providers, provider_options))

    def _create_session(
        self, providers: Sequence[ProviderSpec] | None, provider_options: Sequence[Mapping[str, Any]] | None
    ) -> None:
        options, source = self._options, self._source
        if options.enable_profiling and self._profiler is None:
            self._profiler = Profiler(options.profile_file_prefix)
        profiler = self._profiler
        warn_sequential(options)
        config = opt.SessionConfig.of(options)  # parsed once: an unknown epctx.* key fails here, first
        with _span(profiler, "session_initialization"):
            self._providers = _resolve_providers(providers, provider_options, options, source, config)
            loading = "model_loading_array" if isinstance(source, (bytes, bytearray)) else "model_loading_uri"
            heal_later = functools.partial(
                _heal_in_place, spec=(providers, provider_options), options=options
            )
            prepared = prepare_source(self, source, loading, config, heal_later)
            if prepared is None:  # healed, reused or cached by compiling: this session is made
                return
            source, options, config = prepared
            data: bytes | None = None
            if lean_allowed(options, config):
                from epctx.session.lean import open_lean

                with _span(profiler, loading):
                    phase = profiler.phase if profiler is not None else None
                    read = options.ep_context_data_read_func
                    lean = open_lean(source, self._providers, config, phase=phase, read_func=read)
                if lean is not None and not isinstance(lean, bytes):  # a context model, prepared:
                    self._adopt(lean)  # no onnx, no partitioning, no compiling
                    return
                data = lean
            with self._options_as(options):
                self._create_full(source, loading, data, config)

    def _specialize_later(self, spec: tuple[Any, Any]) -> None:
        """Per-shape specialization, when a compiling EP of the session says static shapes help it and the model
        keeps dynamic input dimensions, or a scalar input decides an If a compiling EP may then take
        (``epctx.session.specialize``, ``epctx.model.fold_static``): run() then takes the routing path."""
        if not any(ep.compiles for ep in self._providers):
            return
        config = opt.SessionConfig.of(self._options)
        if config.specialize_shapes == "off" or config.input_values:
            return
        deciding: list[str] = []
        if self._loaded is not None:  # a context model loaded the lean way has no graph here (nor onnx)
            from epctx.model.fold_static import deciding_scalars

            deciding = deciding_scalars(self._loaded.model.graph)
        if not deciding and not any(ep.compiles and ep.static_shapes_help for ep in self._providers):
            return
        from epctx.session.specialize import specializer_for

        self._shapes = specializer_for(
            self, InferenceSession, spec, self._source, self._options, config, deciding
        )
        if self._shapes is not None:
            self._plain = False

    @contextlib.contextmanager
    def _options_as(self, options: opt.SessionOptions) -> Iterator[None]:
        """Create with ``options`` (derived from the user's, who keeps theirs in get_session_options)."""
        user, self._options = self._options, options
        try:
            yield
        finally:
            self._options = user

    def _create_full(
        self,
        source: str | os.PathLike[str] | bytes,
        loading: str,
        data: bytes | None,
        config: opt.SessionConfig,
    ) -> None:
        """The full path: load with onnx-ir, partition, compile or load, and generate a context model."""
        from epctx.epcontext.workspace import abort_open_group
        from epctx.session.pipeline import Pipeline

        options, profiler = self._options, self._profiler
        hooks = (profiler.phase, profiler.ended) if profiler is not None else (None, None)
        try:
            pipeline = Pipeline.of(self._providers, options, config=config, phase=hooks[0], ended=hooks[1])
            compiled = self._compile(pipeline, source, loading, data)
        except BaseException as exc:
            if config.ep_context_enable and config.share_ep_contexts:
                abort_open_group(exc)  # a failed session of a sharing group rolls the group back
            raise
        self._adopt(pipeline.plan(compiled))
        logger.debug(
            "session ready: %d units on %s",
            len(compiled.partitions),
            ", ".join(ep.name for ep in self._providers),
        )

    def _compile(
        self, pipeline: Pipeline, source: str | os.PathLike[str] | bytes, loading: str, data: bytes | None
    ) -> CompiledUnits:
        """Load, partition, compile or load the contexts, and write the context model when asked."""
        from epctx.epcontext.files import check_writable
        from epctx.epcontext.generate import generation_target
        from epctx.epcontext.paths import context_model_path

        options, config = pipeline.options, pipeline.config
        with _span(self._profiler, loading):
            partitioning = pipeline.partition(pipeline.load(source, data))
        if options.optimized_model_filepath:
            write_optimized_model(partitioning.loaded.model, options.optimized_model_filepath)
        self._loaded = partitioning.loaded
        generate = config.ep_context_enable
        ctx_path = (
            context_model_path(self._loaded.path, config) if generate and partitioning.to_compile else None
        )
        exists = ctx_path is not None and check_writable(ctx_path, what="the context model")
        if exists and not self._overwrite_context:
            raise Fail(
                f"the context model {str(ctx_path)!r} exists already; remove it or set another "
                f"{opt.EP_CONTEXT_FILE_PATH}"
            )
        compiled = pipeline.compile(partitioning, generation_target(config, ctx_path))
        # The value compiled holds the partitioning without its capability artefacts (they may hold compiled
        # code, e.g. IREE's probes): they go no further than the compile.
        del partitioning
        if generate:
            self._generate(compiled, ctx_path, config)
        return compiled

    def _generate(self, compiled: CompiledUnits, ctx_path: Path | None, config: opt.SessionConfig) -> None:
        from epctx.epcontext.generate import generate_context_model

        if ctx_path is None:
            if not self._compiling_for_cache:  # the transparent cache says it at INFO
                logger.warning("ep.context_enable=1 but no node was compiled: no context model written")
        elif generate_context_model(
            compiled.result(config),
            ctx_path,
            overwrite=self._overwrite_context,
            extra_metadata=self._context_metadata,
        ):
            logger.info("wrote context model %s", ctx_path)
            if config.trust_sign_key:
                from epctx.trust.sign import sign_generated

                sign_generated(config, ctx_path)

    def _adopt(self, prepared: PreparedSession) -> None:
        """The one place a session takes what creation prepared, on either load path. ``run()`` reads the plan,
        the binder, the outputs and their index from attributes of its own (one lookup each)."""
        self._prepared = prepared
        self._plan = prepared.plan
        self._outputs = prepared.outputs
        self._output_index = prepared.output_index
        self._binder = feed_binder(prepared.specs, opt.SessionConfig.of(self._options).input_values)
        if prepared.loaded is not None:
            self._loaded = prepared.loaded
        if self._profiler is not None and prepared.placement is not None:
            self._profiler.placement(prepared.placement)
        self._prepare_run()

    def _prepare_run(self) -> None:
        # EPs with something to do around each run (a thread limit): run() pays for them only when present, and
        # only for an EP that runs a step (the CPU EP's BLAS limit cost 17 us a run on an LLM decode that IREE
        # runs whole, where onnxruntime's whole run is 53 us). Control flow bodies run inside their node's step.
        running = {provider for _, _, provider in self._plan.info}
        self._scoped = [ep for ep in self._providers if ep.name in running and ep.run_scope() is not None]
        self._plain = self._profiler is None and not self._scoped  # run() needs no scope, hook or profile

    # -- running -------------------------------------------------------------------------------------
    def _execute(
        self, inputs: list[Any], run_options: opt.RunOptions | None, routed: bool = True
    ) -> list[Any]:
        # A specialized session's steps run here, under this session's profile (its events name its EPs).
        target = self
        if routed and self._shapes is not None:
            target = self._shapes.route(inputs) or self
        profiler = self._profiler if self._profiler is not None and self._profiler.active else None
        if run_options is None and profiler is None and not target._scoped:
            return target._plan.run(inputs)
        return run_observed(target._plan, inputs, run_options, profiler, target._scoped)

    def run(
        self,
        output_names: Sequence[str] | None,
        input_feed: Mapping[str, Any],
        run_options: opt.RunOptions | None = None,
    ) -> list[Any]:
        """The outputs named (None or []: every output, as onnxruntime) for ``input_feed``."""
        inputs = self._binder.bind(input_feed)
        if not self._outputs:
            raise InvalidArgument(_NO_OUTPUT)
        if run_options is None and self._plain:  # the common call: the plan's loop and nothing around it
            results = self._plan.run(inputs)
        else:
            results = self._execute(inputs, run_options)
        if not output_names:
            return owned_arrays(results)
        return owned_arrays([results[i] for i in self._pick(output_names)])

    def _pick(self, output_names: Sequence[str] | None) -> list[int]:
        if not output_names:
            return list(range(len(self._outputs)))
        index = self._output_index
        picked = []
        for name in output_names:
            i = index.get(name)
            if i is None:
                raise InvalidArgument(f"invalid output name {name!r}; the model's outputs are {list(index)}")
            picked.append(i)
        return picked

    def run_with_ort_values(
        self,
        output_names: Sequence[str] | None,
        input_dict_ort_values: Mapping[str, OrtValue],
        run_options: opt.RunOptions | None = None,
    ) -> list[OrtValue]:
        feed = {name: _array_of(name, value) for name, value in input_dict_ort_values.items()}
        inputs = self._binder.bind(feed)
        if not self._outputs:
            raise InvalidArgument(_NO_OUTPUT)
        results = self._execute(inputs, run_options)
        return [OrtValue(owned_array(results[i])) for i in self._pick(output_names)]

    def run_async(
        self,
        output_names: Sequence[str] | None,
        input_feed: Mapping[str, Any],
        callback: Callable[[list[Any], Any, str], None],
        user_data: Any,
        run_options: opt.RunOptions | None = None,
    ) -> None:
        """Run on a worker thread, then ``callback(outputs, user_data, err)`` (``err`` "" on success)."""
        if not callable(callback):
            raise InvalidArgument(f"run_async: callback must be callable, got {callback!r}")
        feed = dict(input_feed)
        from epctx.session import run_async  # its thread pool module: imported on first use

        run_async.submit(lambda: self.run(output_names, feed, run_options), callback, user_data)

    def io_binding(self) -> SessionIOBinding:
        return SessionIOBinding(self)

    def run_with_iobinding(
        self, iobinding: SessionIOBinding, run_options: opt.RunOptions | None = None
    ) -> None:
        """Run on the bound inputs and outputs; always on this session's own plan (a shape specialization,
        ``epctx.specialize_shapes``, serves run() and run_with_ort_values() only)."""
        if not isinstance(iobinding, SessionIOBinding):
            raise InvalidArgument(
                f"run_with_iobinding takes session.io_binding(), got {type(iobinding).__name__}"
            )
        iobinding.run(lambda feed: self._execute(self._binder.bind(feed), run_options, routed=False))

    # -- profiling and providers ---------------------------------------------------------------------
    def end_profiling(self) -> str:
        """Write the profile (Chrome-trace JSON, onnxruntime's schema) and return its path; "" if profiling
        is off (as onnxruntime)."""
        if self._profiler is None or not self._profiler.active:
            return ""
        return self._profiler.end()

    def get_profiling_start_time_ns(self) -> int:
        return self._profiler.start_ns if self._profiler is not None else 0

    def set_providers(
        self,
        providers: Sequence[ProviderSpec] | None = None,
        provider_options: Sequence[Mapping[str, Any]] | None = None,
    ) -> None:
        """Rebuild the session on ``providers`` (as onnxruntime re-initialises it)."""
        with severity_scope(self._options.log_severity_level):
            self._create(providers, provider_options)

    # -- introspection -------------------------------------------------------------------------------
    def get_inputs(self) -> list[NodeArg]:
        return list(self._prepared.inputs)

    def get_outputs(self) -> list[NodeArg]:
        return list(self._outputs)

    def get_overridable_initializers(self) -> list[NodeArg]:
        return list(self._prepared.overridable)

    def get_providers(self) -> list[str]:
        return [ep.name for ep in self._providers]

    def get_partitions(self) -> list[tuple[str, list[str]]]:
        """Where the graph runs, one entry per step in execution order: (EP name, names of the nodes it runs).
        A compiled partition lists its nodes; a partition loaded from a context model, its EPContext node;
        a kernel EP (the CPU EP), one node per entry. Read-only: building it changes nothing."""
        return [(ep, list(nodes)) for ep, nodes in self._prepared.partitions]

    def get_fallback_reasons(self) -> dict[str, dict[str, str]]:
        """Why nodes run where they do when an EP before declined them with a reason: node name -> {EP name:
        reason} (e.g. IREE could not compile the node, so it runs on the CPU EP). Nodes an EP simply does not
        claim are not listed. epctx extension (onnxruntime has no such call)."""
        return {node: dict(reasons) for node, reasons in self._prepared.declined.items()}

    def get_node_placement(self) -> list[NodePlacement]:
        """Where each node of the model runs, in graph order: one ``NodePlacement`` per node with the EP that
        runs it, the partition holding it (None for a node a kernel EP runs alone) and, for every EP ahead of
        that EP in the provider list, why it declined the node (its own reason, e.g. OpenVINO's conversion
        report or IREE's compile error; ``NO_REASON`` when it gave none). The nodes of a control-flow body follow
        their If / Loop / Scan, ``graph`` naming the body. A session loaded from a context model lists its
        EPContext nodes, with nothing declined. ``NodePlacement.to_dict()`` gives plain data. epctx extension
        (onnxruntime has no such call)."""
        return list(self._prepared.node_placement())

    def get_shape_specializations(self) -> dict[str, ShapeSpecialization]:
        """Per-shape specialization (``epctx.specialize_shapes``): signature (``epctx.input_shapes``' form, every
        input) -> its ``ShapeSpecialization`` (state pending / ready / failed, why it failed, seconds, nodes per EP
        of the specialized session); {} when the session does not specialize. epctx extension."""
        return self._shapes.report() if self._shapes is not None else {}

    def get_provider_options(self) -> dict[str, dict[str, str]]:
        return {ep.name: ep.provider_options() for ep in self._providers}

    def get_session_options(self) -> opt.SessionOptions:
        return self._options

    def get_modelmeta(self) -> ModelMetadata:
        return self._prepared.metadata

    @property
    def model(self) -> ir.Model:
        """The session's model (read-only by convention). A session made on the lean path (a context model)
        loads it with onnx-ir on first access."""
        if self._loaded is None:
            from epctx.model import load_model

            self._loaded = load_model(self._source)
        return self._loaded.model


def _resolve_providers(
    providers: Sequence[ProviderSpec] | None,
    provider_options: Sequence[Mapping[str, Any]] | None,
    options: opt.SessionOptions,
    source: str | os.PathLike[str] | bytes,
    config: opt.SessionConfig,
) -> list[ExecutionProvider]:
    from epctx.providers.selection import resolve_providers

    return resolve_providers(providers, provider_options, options, source=source, config=config)


def _span(profiler: Profiler | None, name: str) -> contextlib.AbstractContextManager[None]:
    return profiler.span("Session", name) if profiler is not None else contextlib.nullcontext()


def _array_of(name: str, value: Any) -> Any:
    if not isinstance(value, OrtValue):
        raise InvalidArgument(
            f"run_with_ort_values: input {name!r} must be an OrtValue, got {type(value).__name__}"
        )
    return value.numpy()


def _heal_in_place(plan: Any, *, spec: tuple[Any, Any], options: opt.SessionOptions) -> None:
    """A background heal: a session of its own compiles the context again over the old one (a transaction)."""
    derived = heal_options(plan, options)
    session = InferenceSession.__new__(InferenceSession)
    session._source, session._options, session._profiler, session._loaded = (
        str(plan.source),
        derived,
        None,
        None,
    )
    session._overwrite_context = True
    session._context_metadata = {}
    config = opt.SessionConfig.of(derived)
    session._providers = _resolve_providers(spec[0], spec[1], derived, str(plan.source), config)
    session._create_full(str(plan.source), "model_loading_uri", None, config)
