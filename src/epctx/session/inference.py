"""InferenceSession, mirroring ``onnxruntime.InferenceSession``."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeGuard

from epctx import options as opt
from epctx._warnings import warn_and_log
from epctx.errors import Fail, InvalidArgument
from epctx.providers.registry import create_provider
from epctx.session.feeds import FeedBinder, InputSpec
from epctx.session.iobinding import SessionIOBinding
from epctx.session.logs import severity_scope
from epctx.session.node_arg import ModelMetadata, NodeArg, model_metadata, node_arg
from epctx.session.ortvalue import OrtValue, owned_array
from epctx.session.profiling import Profiler

if TYPE_CHECKING:
    import onnx_ir as ir

    from epctx.ep._contract import ExecutionProvider
    from epctx.model import LoadedModel
    from epctx.partition.placement import NodePlacement
    from epctx.session.lean import LeanSession
    from epctx.session.pipeline import Pipeline

__all__ = ["InferenceSession", "ProviderSpec"]

logger = logging.getLogger("epctx")

ProviderSpec = str | tuple[str, Mapping[str, Any]]
_NO_OUTPUT = "At least one output should be requested."  # onnxruntime's words, for a model without outputs


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
        options, source = self._options, self._source
        if options.enable_profiling and self._profiler is None:
            self._profiler = Profiler(options.profile_file_prefix)
        profiler = self._profiler
        _warn_sequential(options)
        config = opt.SessionConfig.of(options)  # parsed once: an unknown epctx.* key fails here, first
        with _span(profiler, "session_initialization"):
            self._providers = _resolve_providers(providers, provider_options, options, source, config)
            loading = "model_loading_array" if isinstance(source, (bytes, bytearray)) else "model_loading_uri"
            if (
                config.self_heal != "off"
                and not config.context_cache
                and isinstance(source, (str, os.PathLike))
            ):
                healed = self._self_heal(Path(source), loading, (providers, provider_options), config)
                if healed is None:  # this session compiled the stale context again from its source
                    return
                source, options, config = healed
            if config.context_reuse and _reuse_applies(source, config):  # the existing context, or a new one
                reused = self._reuse_context(Path(source), loading, config)
                if reused is None:
                    return
                source, options, config = reused
            if config.context_cache:  # the transparent cache: load what it holds, or compile into it
                cached = self._through_cache(source, loading, config)
                if cached is None:
                    return
                source = str(cached)
                changes: dict[str, str | None] = {opt.CONTEXT_CACHE: None, opt.EP_CONTEXT_ENABLE: None}
                options, config = opt.with_config(options, changes), config.replace(changes)
            data: bytes | None = None
            if _lean_allowed(options, config):
                from epctx.session.lean import LeanSession, open_lean

                with _span(profiler, loading):
                    phase = profiler.phase if profiler is not None else None
                    read = options.ep_context_data_read_func
                    lean = open_lean(source, self._providers, config, phase=phase, read_func=read)
                if isinstance(lean, LeanSession):  # a context model: no onnx, no partitioning, no compiling
                    self._use_lean(lean)
                    return
                data = lean
            with self._options_as(options):
                self._create_full(source, loading, data, config)

    @contextlib.contextmanager
    def _options_as(self, options: opt.SessionOptions) -> Iterator[None]:
        """Create with ``options`` (derived from the user's, who keeps theirs in get_session_options)."""
        user, self._options = self._options, options
        try:
            yield
        finally:
            self._options = user

    def _self_heal(
        self, ctx: Path, loading: str, spec: tuple[Any, Any], config: opt.SessionConfig
    ) -> tuple[str | os.PathLike[str], opt.SessionOptions, opt.SessionConfig] | None:
        """``epctx.self_heal``: what to load (the context, or its source on the CPU EP while a background heal
        runs), or None when this session compiled the context again and serves it (``cache/heal.py``)."""
        from epctx.cache import heal

        options = self._options
        plan = heal.plan_heal(ctx, config)
        if plan is None:
            return ctx, options, config
        logger.warning(
            "epctx.self_heal: %s is %s here (%s); compiling it again from %s (%s)",
            ctx, plan.status, plan.reasons, plan.source, config.self_heal,
        )  # fmt: skip
        if config.self_heal == "foreground":
            with heal.heal_lock(ctx, wait=True):
                if heal.plan_heal(ctx, config) is None:  # healed by another session meanwhile
                    return ctx, options, config
                self._overwrite_context = True
                derived = _heal_options(plan, options)
                with self._options_as(derived):
                    self._create_full(str(plan.source), loading, None, opt.SessionConfig.of(derived))
            logger.warning("epctx.self_heal: %s compiled again; this session serves it", ctx)
            return None
        heal.start_background(plan, functools.partial(_heal_in_place, spec=spec, options=options))
        if plan.runs_here:
            return ctx, options, config
        logger.warning("epctx.self_heal: until then %s is served from %s on the CPU EP", ctx, plan.source)
        self._providers = [create_provider("CPUExecutionProvider")]
        changes: dict[str, str | None] = {opt.SELF_HEAL: None, opt.EP_CONTEXT_ENABLE: None}
        return str(plan.source), opt.with_config(options, changes), config.replace(changes)

    def _reuse_context(
        self, source: Path, loading: str, config: opt.SessionConfig
    ) -> tuple[str, opt.SessionOptions, opt.SessionConfig] | None:
        """``epctx.context_reuse``: (the existing context to load, with options that generate nothing), or None
        once this session compiled the context again (in place) and serves it (``cache/reuse.py``)."""
        from epctx.cache import heal, reuse
        from epctx.epcontext.paths import context_model_path

        ctx = context_model_path(source, config)
        key = reuse.session_key(source, self._providers, self._options, config)
        ctx.parent.mkdir(parents=True, exist_ok=True)
        with heal.heal_lock(ctx, wait=True):
            if reuse.reusable(ctx, key):
                logger.info("epctx.context_reuse: loading %s (key %s)", ctx, key)
                changes: dict[str, str | None] = {opt.EP_CONTEXT_ENABLE: None, opt.CONTEXT_REUSE: None}
                return str(ctx), opt.with_config(self._options, changes), config.replace(changes)
            self._overwrite_context = True
            self._context_metadata = {reuse.CONTEXT_KEY: key}
            self._create_full(source, loading, None, config)
        return None

    def _through_cache(
        self, source: str | os.PathLike[str] | bytes, loading: str, config: opt.SessionConfig
    ) -> Path | None:
        from epctx.cache.transparent import through_cache

        def compile_into(derived: opt.SessionOptions) -> None:
            with self._options_as(derived):
                self._create_full(source, loading, None, opt.SessionConfig.of(derived))

        return through_cache(source, self._providers, self._options, compile_into, config)

    def _create_full(
        self,
        source: str | os.PathLike[str] | bytes,
        loading: str,
        data: bytes | None,
        config: opt.SessionConfig,
    ) -> None:
        """The full path: load with onnx-ir, partition, compile or load, and generate a context model."""
        from epctx.epcontext.files import check_writable
        from epctx.epcontext.generate import generate_context_model, generation_target
        from epctx.epcontext.paths import context_model_path
        from epctx.epcontext.workspace import abort_open_group
        from epctx.session.pipeline import Pipeline

        options, profiler = self._options, self._profiler
        generate = config.ep_context_enable
        try:
            with _span(profiler, loading):
                pipeline = Pipeline.partition(source, self._providers, options, config=config, data=data)
            if options.optimized_model_filepath:
                _write_optimized_model(pipeline.loaded.model, options.optimized_model_filepath)
            if profiler is not None:
                pipeline.builder.phase, pipeline.builder.ended = profiler.phase, profiler.ended
            loaded = self._loaded = pipeline.loaded
            ctx_path = context_model_path(loaded.path, config) if generate and pipeline.to_compile else None
            exists = ctx_path is not None and check_writable(ctx_path, what="the context model")
            if exists and not self._overwrite_context:
                raise Fail(
                    f"the context model {str(ctx_path)!r} exists already; remove it or set another "
                    f"{opt.EP_CONTEXT_FILE_PATH}"
                )
            pipeline.compile(generation_target(config, ctx_path))
            if generate:
                if ctx_path is None:
                    logger.warning("ep.context_enable=1 but no node was compiled: no context model written")
                elif generate_context_model(
                    pipeline.result(),
                    ctx_path,
                    overwrite=self._overwrite_context,
                    extra_metadata=self._context_metadata,
                ):
                    logger.info("wrote context model %s", ctx_path)
                    if config.trust_sign_key:
                        from epctx.trust.sign import sign_generated

                        sign_generated(config, ctx_path)
        except BaseException as exc:
            if generate and config.share_ep_contexts:
                abort_open_group(exc)  # a failed session of a sharing group rolls the group back
            raise
        self._build_plan(pipeline)

    def _use_lean(self, lean: LeanSession) -> None:
        self._plan = lean.plan
        self._inputs, self._outputs = lean.inputs, lean.outputs
        self._overridable: list[NodeArg] = []
        self._binder = FeedBinder(lean.specs)
        self._partitions = lean.partitions
        self._declined: dict[str, dict[str, str]] = {}
        # Made on first ask: the lean path imports no onnx-ir.
        self._placement: list[NodePlacement] | None = None
        self._metadata = lean.metadata
        self._output_index = {o.name: i for i, o in enumerate(self._outputs)}
        self._prepare_run()

    def _build_plan(self, pipeline: Pipeline) -> None:
        from epctx.session.plan import build_plan

        graph = pipeline.loaded.model.graph
        self._partitions = [
            (unit.ep.name, [node.name or "" for node in unit.nodes]) for unit in pipeline.units
        ]
        self._declined = pipeline.declined
        steps = pipeline.builder.steps_for_units(
            pipeline.units, {**pipeline.compiled, **pipeline.from_context}
        )
        self._placement = pipeline.placement()  # after the steps: control-flow bodies are partitioned by then
        if self._profiler is not None:
            self._profiler.placement(self._placement)
        steps = [
            dataclasses.replace(step, provider=unit.ep.name, op_type=_op_type(unit))
            for step, unit in zip(steps, pipeline.units)
        ]
        self._plan = build_plan(
            list(graph.inputs), list(graph.outputs), steps, fold_constants=pipeline.builder.fold
        )
        self._inputs = [node_arg(v) for v in graph.inputs if v.const_value is None]
        self._overridable = [node_arg(v) for v in graph.inputs if v.const_value is not None]
        self._outputs = [node_arg(v) for v in graph.outputs]
        self._binder = FeedBinder([InputSpec.from_value(v) for v in graph.inputs])
        self._output_index = {o.name: i for i, o in enumerate(self._outputs)}
        self._metadata = model_metadata(pipeline.loaded.model)
        self._prepare_run()
        logger.debug(
            "session ready: %d units on %s", len(pipeline.units), ", ".join(ep.name for ep in self._providers)
        )

    def _prepare_run(self) -> None:
        # EPs with something to do around each run (a thread limit): run() pays for them only when present.
        self._scoped = [ep for ep in self._providers if ep.run_scope() is not None]
        self._plain = self._profiler is None and not self._scoped  # run() needs no scope, hook or profile

    # -- running -------------------------------------------------------------------------------------
    def _execute(self, inputs: list[Any], run_options: opt.RunOptions | None) -> list[Any]:
        profiler = self._profiler if self._profiler is not None and self._profiler.active else None
        if run_options is None and profiler is None and not self._scoped:
            return self._plan.run(inputs)
        with contextlib.ExitStack() as stack:
            for ep in self._scoped:
                scope = ep.run_scope()
                if scope is not None:
                    stack.enter_context(scope)
            hooks: tuple[Callable[[int], None], ...] = (_nothing, _nothing)
            if run_options is not None:
                stack.enter_context(severity_scope(run_options.log_severity_level))
                hooks = (_terminate_check(run_options, hooks[0]), hooks[1])
                _terminate_check(run_options, _nothing)(-1)
            if profiler is not None:
                tag = run_options.logid if run_options is not None else ""
                stack.enter_context(profiler.span("Session", "model_run", {"run_tag": tag}))
                before, after = profiler.step_hooks(self._plan.info)
                hooks = (_chain(hooks[0], before), after)
            if hooks[0] is _nothing:
                return self._plan.run(inputs)
            return self._plan.run_observed(inputs, hooks[0], hooks[1])

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
            return [owned_array(r) for r in results]
        return [owned_array(results[i]) for i in self._pick(output_names)]

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
        if not isinstance(iobinding, SessionIOBinding):
            raise InvalidArgument(
                f"run_with_iobinding takes session.io_binding(), got {type(iobinding).__name__}"
            )
        iobinding.run(lambda feed: self._execute(self._binder.bind(feed), run_options))

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
        return [(ep, list(nodes)) for ep, nodes in self._partitions]

    def get_fallback_reasons(self) -> dict[str, dict[str, str]]:
        """Why nodes run where they do when an EP before declined them with a reason: node name -> {EP name:
        reason} (e.g. IREE could not compile the node, so it runs on the CPU EP). Nodes an EP simply does not
        claim are not listed. epctx extension (onnxruntime has no such call)."""
        return {node: dict(reasons) for node, reasons in self._declined.items()}

    def get_node_placement(self) -> list[NodePlacement]:
        """Where each node of the model runs, in graph order: one ``NodePlacement`` per node with the EP that
        runs it, the partition holding it (None for a node a kernel EP runs alone) and, for every EP ahead of
        that EP in the provider list, why it declined the node (its own reason, e.g. OpenVINO's conversion
        report or IREE's compile error; ``NO_REASON`` when it gave none). The nodes of a control-flow body follow
        their If / Loop / Scan, ``graph`` naming the body. A session loaded from a context model lists its
        EPContext nodes, with nothing declined. ``NodePlacement.to_dict()`` gives plain data. epctx extension
        (onnxruntime has no such call)."""
        if self._placement is None:
            self._placement = _lean_placement(self._partitions)
        return list(self._placement)

    def get_provider_options(self) -> dict[str, dict[str, str]]:
        return {ep.name: ep.provider_options() for ep in self._providers}

    def get_session_options(self) -> opt.SessionOptions:
        return self._options

    def get_modelmeta(self) -> ModelMetadata:
        return self._metadata

    @property
    def model(self) -> ir.Model:
        """The session's model (read-only by convention). A session made on the lean path (a context model)
        loads it with onnx-ir on first access."""
        if self._loaded is None:
            from epctx.model import load_model

            self._loaded = load_model(self._source)
        return self._loaded.model


def _lean_allowed(options: opt.SessionOptions, config: opt.SessionConfig) -> bool:
    """Whether a context model may take the lean path: nothing asked of the session needs the model's graph
    (generating a context model, writing the optimized model, overriding dimensions or initializers)."""
    by_name, by_denotation = options.free_dimension_overrides
    return not (
        config.ep_context_enable
        or options.optimized_model_filepath
        or by_name
        or by_denotation
        or options.initializers
    )


def _resolve_providers(
    providers: Sequence[ProviderSpec] | None,
    provider_options: Sequence[Mapping[str, Any]] | None,
    options: opt.SessionOptions,
    source: str | os.PathLike[str] | bytes,
    config: opt.SessionConfig,
) -> list[ExecutionProvider]:
    from epctx.providers.selection import resolve_providers

    return resolve_providers(providers, provider_options, options, source=source, config=config)


def _lean_placement(partitions: Sequence[tuple[str, Sequence[str]]]) -> list[NodePlacement]:
    """A context model's placement (the lean path): each EPContext node on the EP that loaded it."""
    from epctx.partition.placement import NodePlacement

    return [
        NodePlacement(
            index=k,
            name=nodes[0],
            op_type="EPContext",
            domain="com.microsoft",
            provider=ep,
            partition=nodes[0],
        )
        for k, (ep, nodes) in enumerate(partitions)
    ]


def _op_type(unit: Any) -> str:
    if unit.partition is None:
        return str(unit.nodes[0].op_type)
    return "EPContext" if unit.from_context else str(unit.partition.name)


def _span(profiler: Profiler | None, name: str) -> contextlib.AbstractContextManager[None]:
    return profiler.span("Session", name) if profiler is not None else contextlib.nullcontext()


def _nothing(k: int) -> None:
    return None


def _chain(first: Callable[[int], None], second: Callable[[int], None]) -> Callable[[int], None]:
    if first is _nothing:
        return second

    def both(k: int) -> None:
        first(k)
        second(k)

    return both


def _terminate_check(run_options: opt.RunOptions, then: Callable[[int], None]) -> Callable[[int], None]:
    def check(k: int) -> None:
        if run_options.terminate:
            raise Fail("Exiting due to terminate flag being set to true.")
        then(k)

    return check


def _array_of(name: str, value: Any) -> Any:
    if not isinstance(value, OrtValue):
        raise InvalidArgument(
            f"run_with_ort_values: input {name!r} must be an OrtValue, got {type(value).__name__}"
        )
    return value.numpy()


def _reuse_applies(source: object, config: opt.SessionConfig) -> TypeGuard[str | os.PathLike[str]]:
    from epctx.cache.reuse import applies

    return applies(source, config)


def _warn_sequential(options: opt.SessionOptions) -> None:
    """epctx runs plan steps one after the other: ORT_PARALLEL is said, not silently ignored (onnxruntime uses
    inter_op_num_threads in that mode only)."""
    if options.execution_mode == opt.ExecutionMode.ORT_PARALLEL:
        message = (
            "epctx runs the plan's steps sequentially: execution_mode=ORT_PARALLEL / inter_op_num_threads="
            f"{options.inter_op_num_threads} have no effect (intra_op_num_threads sets each EP's threads)"
        )
        warn_and_log(logger, message)


def _write_optimized_model(model: ir.Model, path: str | os.PathLike[str]) -> None:
    """``optimized_model_filepath``: the model after epctx's graph passes, before partitioning (ONNX format)."""
    target = os.fspath(path)
    if target.lower().endswith(".ort"):
        raise InvalidArgument(
            f"optimized_model_filepath {target!r}: epctx writes ONNX models only, not onnxruntime's ORT format"
        )
    import onnx_ir as ir

    ir.save(model, target)
    logger.info("wrote the optimized model %s", target)


def _heal_options(plan: Any, options: opt.SessionOptions) -> opt.SessionOptions:
    """A session's options to compile the context of ``plan`` again, in place, as it was (embedded or not)."""
    return opt.with_config(
        options,
        {
            opt.EP_CONTEXT_ENABLE: "1",
            opt.EP_CONTEXT_FILE_PATH: str(plan.context),
            opt.EP_CONTEXT_EMBED_MODE: "1" if plan.embed else "0",
            opt.SELF_HEAL: None,
        },
    )


def _heal_in_place(plan: Any, *, spec: tuple[Any, Any], options: opt.SessionOptions) -> None:
    """A background heal: a session of its own compiles the context again over the old one (a transaction)."""
    derived = _heal_options(plan, options)
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
