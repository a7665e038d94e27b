"""The compile API: ``ModelCompiler`` turns a model into a context model without running it."""

from __future__ import annotations

import dataclasses
import enum
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from epctx import options as opt
from epctx.config import PARTITION_MEASURED_RULE
from epctx.errors import EPCtxError, Fail, InvalidArgument

if TYPE_CHECKING:
    import onnx_ir as ir

    from epctx.ep._contract import ExecutionProvider
    from epctx.epcontext.generate import ContextModel
    from epctx.partition.placement import NodePlacement
    from epctx.session.stages import CompiledUnits

__all__ = ["CompileFlags", "ExternalInitializerInfo", "ModelCompiler"]

logger = logging.getLogger("epctx")

_TWO_GB = 2**31
_STREAM_CHUNK = 1 << 20


class CompileFlags(enum.IntFlag):
    NONE = 0
    ERROR_IF_NO_NODES_COMPILED = 1
    ERROR_IF_OUTPUT_FILE_EXISTS = 2


@dataclasses.dataclass(frozen=True, slots=True)
class ExternalInitializerInfo:
    """Where an initializer's data lives: ``filepath`` relative to the model, ``file_offset``, ``byte_size``."""

    filepath: str
    file_offset: int
    byte_size: int


InitializerLocationFunc = Callable[
    [str, Any, "ExternalInitializerInfo | None"], "ExternalInitializerInfo | None"
]


class ModelCompiler:
    """Compile ``input_model_path_or_bytes`` with the EPs added to ``sess_options`` (``add_provider``)."""

    def __init__(
        self,
        sess_options: opt.SessionOptions,
        input_model_path_or_bytes: str | os.PathLike[str] | bytes,
        embed_compiled_data_into_model: bool = False,
        external_initializers_file_path: str | os.PathLike[str] | None = None,
        external_initializers_size_threshold: int = 1024,
        flags: int = CompileFlags.NONE,
        graph_optimization_level: opt.GraphOptimizationLevel = opt.GraphOptimizationLevel.ORT_DISABLE_ALL,
        get_initializer_location_func: InitializerLocationFunc | None = None,
    ) -> None:
        if isinstance(input_model_path_or_bytes, (bytes, bytearray, memoryview)):
            if len(input_model_path_or_bytes) == 0:
                raise ValueError("the input model bytes are empty")
        elif not os.fspath(input_model_path_or_bytes):
            raise ValueError("the input model path is empty")
        if external_initializers_file_path is not None and get_initializer_location_func is not None:
            raise ValueError(
                "give external_initializers_file_path or get_initializer_location_func, not both"
            )
        # A compiled model is made for where it will run, and is the same wherever it is compiled (a package's
        # targets, the compile farm's nodes): the measured rule, on by default for sessions, times partitions on
        # this machine under its load, so it runs here only when asked for by name.
        # (The caller's options are never changed: the compile's config says it.)
        unless_asked = (
            {} if PARTITION_MEASURED_RULE in sess_options.config else {PARTITION_MEASURED_RULE: "0"}
        )
        self._options = sess_options
        # parsed once, now (as onnxruntime copies the options at creation): an unknown epctx.* key fails here
        self._config = opt.SessionConfig.of(opt.with_config(sess_options, unless_asked))
        self._source = input_model_path_or_bytes
        self._embed = bool(embed_compiled_data_into_model)
        self._ext_path = (
            os.fspath(external_initializers_file_path) if external_initializers_file_path else None
        )
        self._threshold = int(external_initializers_size_threshold)
        self._flags = CompileFlags(flags)
        self._level = graph_optimization_level
        self._location_func = get_initializer_location_func
        self._data_write: Callable[[str, bytes], Any] | None = None
        self._nodes: list[NodePlacement] = []

    def set_ep_context_data_write_func(self, write_func: Callable[[str, bytes], Any] | None) -> None:
        """``write_func(name, data)`` receives each context binary instead of epctx writing it to disk (e.g. to
        store it encrypted; ``epctx.trust.hooks``); the model records ``name``, which a session's
        ``SessionOptions.set_ep_context_data_read_func`` is asked for. None clears it. onnxruntime:
        ``ModelCompilationOptions_SetEpContextDataWriteFunc``."""
        if write_func is not None and not callable(write_func):
            raise InvalidArgument(
                f"the EPContext data write function must be callable, got {type(write_func).__name__}"
            )
        self._data_write = write_func

    # -- outputs -------------------------------------------------------------------------------------
    def compile_to_file(self, output_model_path: str | os.PathLike[str] | None = None) -> None:
        from epctx.epcontext.generate import generate_context_model
        from epctx.epcontext.paths import context_model_path

        overwrite = not self._flags & CompileFlags.ERROR_IF_OUTPUT_FILE_EXISTS
        # checked before compiling: no compile is wasted on an output we cannot write
        if output_model_path:
            self._check_output(Path(output_model_path), overwrite)
        elif isinstance(self._source, (str, os.PathLike)):
            self._check_output(context_model_path(Path(self._source)), overwrite)
        if self._embed:
            self._check_source_size()
        self._check_data_write()
        from epctx.trust.sign import check_sign_key, sign_generated

        check_sign_key(self._config)  # a signing key that cannot be used fails before compiling
        try:
            compiled = self._compile(Path(output_model_path) if output_model_path else None)
            loaded = compiled.partitioning.loaded
            path = Path(output_model_path) if output_model_path else context_model_path(loaded.path)
            self._check_output(path, overwrite)
            if self._data_write is not None and not self._config.share_ep_contexts:
                from epctx.epcontext.generate import save_context_model

                save_context_model(self._send_binaries(self._build(compiled, path, embed=False)), path,
                                   overwrite=overwrite)  # fmt: skip
                written = True
            else:
                written = generate_context_model(
                    compiled.result(self._config),
                    path,
                    overwrite=overwrite,
                    embed=self._embed,
                    placement=self._placement(compiled, path),
                    data_write=self._data_write,  # a sharing group's binaries: to the callback, once
                )
            if written:
                sign_generated(self._config, path)
        except BaseException as exc:
            if self._config.share_ep_contexts:
                from epctx.epcontext.workspace import abort_open_group

                abort_open_group(exc)  # a failed compile of a sharing group rolls the group back
            raise

    def compile_to_bytes(self) -> bytes:
        return self._serialize(self._output_without_file())

    def compile_to_stream(self, write_function: Callable[[bytes], Any]) -> None:
        data = self._serialize(self._output_without_file())
        view = memoryview(data)
        try:
            for start in range(0, len(view), _STREAM_CHUNK):
                write_function(bytes(view[start : start + _STREAM_CHUNK]))
        except EPCtxError:
            raise
        except Exception as exc:
            raise Fail(f"the write function failed: {exc}") from exc

    def get_node_placement(self) -> list[NodePlacement]:
        """Where each node ran in the last compile: as ``InferenceSession.get_node_placement`` ([] before
        a compile). epctx extension (onnxruntime's ModelCompiler has no such call)."""
        return list(self._nodes)

    # -- internals -----------------------------------------------------------------------------------
    def _check_output(self, path: Path, overwrite: bool) -> None:
        from epctx.epcontext.files import check_writable

        if check_writable(path, what="the output model") and not overwrite:
            raise Fail(f"the output model {str(path)!r} exists already (ERROR_IF_OUTPUT_FILE_EXISTS)")

    def _compile(self, output: Path | None = None) -> CompiledUnits:
        """Load, partition and compile: the compile stage's value. ``output``: the context model's path when writing a file (None there:
        ``<stem>_ctx.onnx``), so a sharing session joins its group before compiling."""
        from epctx.epcontext.generate import generation_target
        from epctx.epcontext.paths import check_not_inputs, context_model_path
        from epctx.session.pipeline import Pipeline, resolve_providers

        options, config = self._options, self._config
        chooses = options.selection_policy is not None or options.selection_policy_delegate is not None
        if not options.provider_entries and not chooses:
            logger.info("ModelCompiler: no provider added to the session options; only the CPU EP takes part")
        eps = resolve_providers(None, None, options, source=self._source, config=config)
        pipeline = Pipeline.of(eps, options, config=config, optimization_level=self._level)
        partitioning = pipeline.partition(pipeline.load(self._source))
        self._nodes = pipeline.placement(partitioning)
        source = partitioning.loaded.path
        target = output
        if target is None and source is not None:
            target = context_model_path(source)
        if target is not None and source is not None:
            check_not_inputs([source], self._planned_files(target, eps))
        compiled = pipeline.compile(partitioning, generation_target(config, target))
        if not compiled.compiled and self._flags & CompileFlags.ERROR_IF_NO_NODES_COMPILED:
            raise Fail(
                "Unable to compile any nodes: no execution provider compiled a partition of this model"
            )
        if not compiled.compiled:
            logger.warning("ModelCompiler: no node was compiled; the output model runs on the CPU EP")
        return compiled

    def _planned_files(self, target: Path, eps: list[ExecutionProvider]) -> list[Path]:
        """The files writing ``target`` will make: the model, each compiling EP's binary (unless embedded, and
        under its preferred name), the external-initializers file."""
        from epctx.epcontext.paths import binary_file_name, model_name_for

        planned = [target]
        if not self._embed:
            name = model_name_for(target)
            planned += [target.parent / binary_file_name(name, ep.name) for ep in eps if ep.compiles]
        external = self._ext_path or self._config.ep_context_external_initializers_file
        if external:
            planned.append(target.parent / external)
        return planned

    def _output_without_file(self) -> ContextModel:
        """For bytes / stream output: binaries are embedded unless ep.context_file_path says where files go."""
        from epctx.epcontext.generate import check_model_size, write_files
        from epctx.epcontext.transaction import Transaction, rename_references

        config = self._config
        if config.share_ep_contexts:
            raise InvalidArgument(
                "ep.share_ep_contexts writes a group of models beside one shared binary: use compile_to_file"
            )
        given = config.ep_context_file_path
        self._check_data_write()
        embed = (self._embed or not given) and self._data_write is None
        if embed:
            self._check_source_size()
        elif (
            given
        ):  # binaries go beside ep.context_file_path: that folder must take them, checked before compiling
            from epctx.epcontext.files import check_writable

            check_writable(Path(given), what=f"{opt.EP_CONTEXT_FILE_PATH}")
        compiled = self._compile()
        if not self._embed and not given and self._data_write is None:
            logger.info(
                "ModelCompiler: bytes/stream output without ep.context_file_path: binaries are embedded"
            )
        path = Path(given) if given else Path("model_ctx.onnx")
        ctx = self._build(compiled, path, embed=embed)
        if self._data_write is not None:
            ctx = self._send_binaries(ctx)
        check_model_size(ctx.model, "the compiled model")
        if ctx.binaries or ctx.external_files:
            with Transaction(path.parent) as tx:
                rename_references(ctx.model, write_files(tx, ctx))
        return ctx

    def _check_data_write(self) -> None:
        """Before compiling: a write callback takes binaries that are files otherwise (embed mode 0)."""
        if self._data_write is None:
            return
        if self._embed:
            raise InvalidArgument(
                "an EPContext data write function takes the binaries that are not embedded: "
                "embed_compiled_data_into_model=True leaves it nothing (the binaries go inside the model)"
            )

    def _send_binaries(self, ctx: ContextModel) -> ContextModel:
        """Each binary to the write callback (never to disk); the model keeps their names."""
        from epctx.trust.hooks import write_named_buffer

        for name, writer in ctx.binaries.items():
            write_named_buffer(self._data_write, name, writer.to_bytes())  # type: ignore[arg-type]
        return dataclasses.replace(ctx, binaries={})

    def _check_source_size(self) -> None:
        """Refuse in seconds, before compiling, a bytes/stream/embedded output that cannot fit in protobuf's
        2 GB: the source's initializers alone are over it (compiled binaries hold the weights)."""
        size = _initializer_bytes(self._source)
        if size >= _TWO_GB:
            raise Fail(
                f"the model's initializers are {size} bytes, over protobuf's 2 GB limit for a model in one "
                "buffer; compile to a file with embed_compiled_data_into_model=False (binaries beside the model)"
            )

    def _build(self, compiled: CompiledUnits, path: Path, *, embed: bool) -> ContextModel:
        from epctx.epcontext.generate import build_context_model

        return build_context_model(
            compiled.result(self._config), path, embed=embed, placement=self._placement(compiled, path)
        )

    def _placement(
        self, compiled: CompiledUnits, out_path: Path
    ) -> Callable[[ir.Value], str | tuple[str, int, int] | None] | None:
        import onnx_ir as ir

        if self._location_func is not None:
            func = self._location_func
            base = compiled.partitioning.loaded.base_dir

            def by_callback(value: ir.Value) -> str | tuple[str, int, int] | None:
                tensor = value.const_value
                info = None
                if isinstance(tensor, ir.ExternalTensor):
                    info = ExternalInitializerInfo(
                        str(tensor.location), int(tensor.offset or 0), int(tensor.length or tensor.nbytes)
                    )
                try:
                    where = func(value.name or "", tensor.numpy() if tensor is not None else None, info)
                except Exception as exc:
                    raise Fail(f"get_initializer_location_func failed for {value.name!r}: {exc}") from exc
                if where is None:
                    return None
                if not isinstance(where, ExternalInitializerInfo):
                    raise Fail(
                        f"get_initializer_location_func returned {type(where).__name__} for {value.name!r}; "
                        "expected ExternalInitializerInfo or None"
                    )
                return _relative_location(where, base, out_path), where.file_offset, where.byte_size

            return by_callback
        if self._ext_path is not None:
            name = self._ext_path
            threshold = self._threshold

            def by_size(value: ir.Value) -> str | None:
                tensor = value.const_value
                return name if tensor is not None and tensor.nbytes >= threshold else None

            return by_size
        return None  # the session options decide (ep.context_model_external_initializers_file_name)

    @staticmethod
    def _serialize(ctx: ContextModel) -> bytes:
        from epctx.epcontext.generate import check_model_size

        check_model_size(ctx.model, "the compiled model")
        return ctx.model.SerializeToString(deterministic=True)


def _initializer_bytes(source: str | os.PathLike[str] | bytes) -> int:
    """Bytes of the model's initializers, embedded and external, without reading external data (0 when the
    model cannot be parsed: the pipeline reports that properly)."""
    import onnx

    model = onnx.ModelProto()
    try:
        if isinstance(source, (bytes, bytearray, memoryview)):
            model.ParseFromString(bytes(source))
        else:
            model = onnx.load(os.fspath(source), load_external_data=False)
    except Exception:
        return 0
    total = 0
    for tensor in model.graph.initializer:
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            info = {item.key: item.value for item in tensor.external_data}
            total += int(info["length"]) if info.get("length", "").isdigit() else 0
        else:
            total += tensor.ByteSize()
    return total


def _relative_location(info: ExternalInitializerInfo, source_dir: Path | None, out_path: Path) -> str:
    """An external location for the output model: paths are relative to the output model's folder and must
    stay inside it."""
    candidate = Path(info.filepath)
    if not candidate.is_absolute() and source_dir is not None:
        candidate = source_dir / candidate
    out_dir = out_path.resolve().parent
    target = candidate.resolve()
    if out_dir not in target.parents:
        raise Fail(
            f"external initializer file {info.filepath!r} is outside the output model's folder "
            f"{str(out_dir)!r}; context models only reference files beside them"
        )
    return target.relative_to(out_dir).as_posix()
