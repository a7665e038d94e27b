"""Write the context model: EPContext nodes for compiled partitions, CPU-fallback nodes kept as they are.

The generated model copies the source's graph inputs and outputs (in order), opset imports and metadata,
keeps only the initializers still used (embedded, or all in ``ep.context_model_external_initializers_file_name``),
adds ``ep_compatibility_info.<EP>`` metadata, records in each EPContext node the identity of the payload it
needs (``identity.py``), and never references a file of the source model. Files are written as one
transaction (``transaction.py``): binaries and external files first, the model last.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnx
import onnx_ir as ir

from epctx import options as opt
from epctx._version import __version__
from epctx.ep._context_io import BinaryLayout
from epctx.ep._context_node import DOMAIN, OPSET_VERSION, EPContextNode
from epctx.ep._contract import CompiledPartition, ExecutionProvider, Partition
from epctx.epcontext import paths
from epctx.epcontext.identity import IDENTITY_ATTRIBUTE, SOURCE_FILES_KEY, graph_identity
from epctx.epcontext.io_names import IO_KEY, io_document
from epctx.epcontext.store import ContextStore
from epctx.epcontext.transaction import Transaction, rename_references
from epctx.epcontext.workspace import (
    ExternalFile,
    GenerationGroup,
    close_group,
    generation_group,
    group_target,
)
from epctx.epcontext.writer import ContextBinaryWriter
from epctx.errors import Fail, InvalidArgument
from epctx.model.scopes import outer_scope_values
from epctx.partition import CompiledModel, Unit

if TYPE_CHECKING:
    from epctx.trust.hooks import WriteFunc  # the policy off, nothing of epctx.trust is imported

__all__ = [
    "ContextModel",
    "Placement",
    "build_context_model",
    "generate_context_model",
    "generation_target",
    "save_context_model",
    "write_files",
]

# Where an initializer left in the context model goes: None embeds it; a file name appends it to that file
# (relative to the model); (location, offset, length) references data already in a file.
Placement = Callable[[ir.Value], "str | tuple[str, int, int] | None"]

logger = logging.getLogger("epctx")

_TWO_GB = 2**31


@dataclasses.dataclass(frozen=True, slots=True)
class ContextModel:
    """A generated context model: the model proto and the binaries to write beside it (relative name -> writer)."""

    model: onnx.ModelProto
    binaries: Mapping[str, ContextBinaryWriter]
    external_files: Mapping[
        str, ExternalFile
    ]  # external initializer files of ours (relative name -> content)


def build_context_model(
    result: CompiledModel,
    ctx_path: Path,
    *,
    embed: bool | None = None,
    placement: Placement | None = None,
    group: GenerationGroup | None = None,
    extra_metadata: Mapping[str, str] | None = None,
) -> ContextModel:
    """The context model of a compiled model, to be saved as ``ctx_path``. ``embed`` and ``placement``
    default to the session options (``ep.context_embed_mode``, ``ep.context_model_external_initializers_file_name``);
    ``extra_metadata`` is added to the model's metadata (``epctx.context_key``: cache/reuse.py).
    With ``group`` (weight sharing), binaries and external files are the group's; the model's binary and file
    names are the preferred ones, which the transaction may change (``transaction.rename_references``)."""
    config, units, compiled = result.config, result.units, result.compiled
    model_name = paths.model_name_for(ctx_path)
    embed, placement = _embed_and_placement(config, embed, placement, group)
    prefix = config.ep_context_node_name_prefix
    writers: dict[str, ContextBinaryWriter] = {}
    file_names: dict[str, str] = {}
    eps: dict[str, ExecutionProvider] = {}
    nodes: list[onnx.NodeProto] = []
    mains: set[str] = set()  # EPs whose main context node is placed
    views: list[tuple[int, EPContextNode]] = []  # (index in ``nodes``, node still without payload)
    for k, unit in enumerate(units):
        part = unit.partition
        if part is None or k not in compiled:
            nodes.extend(ir.serde.serialize_node(n) for n in unit.nodes)
            continue
        ep = unit.ep
        writer = writers.get(ep.name)
        if writer is None:
            writer, file_names[ep.name] = _new_writer(ep, model_name, group)
            writers[ep.name] = writer
            eps[ep.name] = ep
        # Graphs of several models share a binary: their names carry the model's name.
        graph_name = f"{prefix}{model_name}_{part.name}" if group is not None else f"{prefix}{part.name}"
        identity = _save_graph(ep, part, compiled[k], writer, graph_name, group)
        view = _context_view(ep, part, graph_name, identity, result.source_path, main=ep.name not in mains)
        mains.add(ep.name)
        views.append((len(nodes), dataclasses.replace(view, embed_mode=1 if embed else 0)))
        nodes.append(onnx.NodeProto())  # filled below, once the EP's binary holds all its graphs
    if embed:
        _check_embedded_size(writers, ctx_path)
    for index, view in views:  # the main node of each EP holds its binary (or the binary's file name)
        payload: bytes | None = None
        if view.main_context:
            name = ep_name_of(view)
            payload = writers[name].to_bytes() if embed else file_names[name].encode()
        nodes[index] = _node_proto(dataclasses.replace(view, ep_cache_context=payload))
    binaries = {} if embed or group is not None else {file_names[name]: w for name, w in writers.items()}

    out, external = _finish_model(
        result, nodes, eps, placement, group, _with_refusals(result, extra_metadata)
    )
    return ContextModel(model=out, binaries=binaries, external_files=external)


def _with_refusals(
    result: CompiledModel, extra_metadata: Mapping[str, str] | None
) -> Mapping[str, str] | None:
    """``extra_metadata`` with the record of the measured rule's hand-backs (``epctx.measured_refusals``), when
    the session handed some back: a session over the context refuses them again instead of compiling and
    measuring them again. onnxruntime reads no such key (metadata_props are free-form)."""
    if not result.refused:
        return extra_metadata
    from epctx.partition.measured import REFUSALS_KEY, refusal_record

    record = refusal_record(result.refused)
    return extra_metadata if record is None else {**(extra_metadata or {}), REFUSALS_KEY: record}


def _embed_and_placement(
    config: opt.SessionConfig, embed: bool | None, placement: Placement | None, group: GenerationGroup | None
) -> tuple[bool, Placement]:
    """``embed`` and ``placement`` as given, else from the session options; a sharing group needs files."""
    embed = config.ep_context_embed_mode if embed is None else embed
    if placement is None:
        placement = _config_placement(config.ep_context_external_initializers_file)
    if group is not None and embed:
        raise InvalidArgument(
            "ep.share_ep_contexts=1 shares one binary file among models: it needs ep.context_embed_mode=0"
        )
    return bool(embed), placement


def _finish_model(
    result: CompiledModel,
    nodes: list[onnx.NodeProto],
    eps: Mapping[str, ExecutionProvider],
    placement: Placement,
    group: GenerationGroup | None,
    extra_metadata: Mapping[str, str] | None = None,
) -> tuple[onnx.ModelProto, dict[str, ExternalFile]]:
    """The context model around ``nodes`` (its header, graph inputs and outputs, the initializers the nodes
    left in it still read) and the external initializer files it needs (none of its own in a group)."""
    graph = result.model.graph
    initializers = _used_initializers(graph, result.units, result.compiled)
    out = _model_header(result.model, eps, result.source_path, extra_metadata)
    g = out.graph
    g.name = graph.name or "main_graph"
    g.input.extend(ir.serde.serialize_value(v) for v in graph.inputs)
    g.output.extend(ir.serde.serialize_value(v) for v in graph.outputs)
    g.node.extend(nodes)
    files = group.files if group is not None else {}
    with group.lock if group is not None else contextlib.nullcontext():
        used = _add_initializers(g, initializers, placement, files)
    return out, ({} if group is not None else {name: files[name] for name in used})


def _config_placement(ext_name: str | None) -> Placement:
    """The session options' placement: every initializer in ``ext_name`` when set, else in the model."""
    return (lambda value: ext_name) if ext_name else (lambda value: None)


def _context_view(
    ep: ExecutionProvider, part: Partition, graph_name: str, identity: str, source: Path | None, *, main: bool
) -> EPContextNode:
    """The EPContext node of a saved partition, still without its payload (embed mode 0)."""
    return EPContextNode(
        name=graph_name,
        inputs=tuple(v.name or "" for v in part.inputs),
        outputs=tuple(v.name or "" for v in part.outputs),
        main_context=1 if main else 0,
        ep_cache_context=None,
        embed_mode=0,
        ep_sdk_version=ep.sdk_version(),
        onnx_model_filename=(source.name if source is not None else "") or None,
        hardware_architecture=ep.hardware() or None,
        partition_name=graph_name,
        source=ep.name,
        extra={IDENTITY_ATTRIBUTE: identity},
    )


def _new_writer(
    ep: ExecutionProvider, model_name: str, group: GenerationGroup | None
) -> tuple[ContextBinaryWriter, str]:
    """The writer of ``ep``'s binary and the binary's file name: the group's when weights are shared."""
    if group is not None:
        return group.writer_for(ep, model_name)
    writer = ContextBinaryWriter(ep_name=ep.name, sdk_version=ep.sdk_version(), hardware=ep.hardware())
    return writer, paths.binary_file_name(model_name, ep.name)


def _save_graph(
    ep: ExecutionProvider,
    part: Partition,
    compiled: CompiledPartition,
    writer: ContextBinaryWriter,
    graph_name: str,
    group: GenerationGroup | None,
) -> str:
    """``ep`` saves ``part`` as ``graph_name`` into ``writer``, with its I/O document; the graph's identity."""
    # A shared writer takes graphs from concurrent sessions of the group: one at a time.
    with group.lock if group is not None else contextlib.nullcontext():
        store = ContextStore(writer, graph_name)
        _check_compiled_type(ep, part.name, compiled)
        ep.save_partition(part, compiled, store)
        store.add(IO_KEY, io_document(part), kind="io")
        return graph_identity(graph_name, writer.entry_rows(store.names), writer.checksum_algorithm)


def _model_header(
    model: ir.Model,
    eps: Mapping[str, ExecutionProvider],
    source_path: Path | None,
    extra_metadata: Mapping[str, str] | None = None,
) -> onnx.ModelProto:
    """The context model without its graph: versions, opsets (the EPContext domain added) and metadata (each
    EP's compatibility info, the source files, onnxruntime's weightless mode)."""
    out = onnx.ModelProto()
    out.ir_version = max(model.ir_version, 8)
    out.producer_name = "epctx"
    out.producer_version = __version__
    out.domain = model.domain or ""
    out.model_version = model.model_version or 0
    out.doc_string = model.doc_string or ""
    opsets = dict(model.opset_imports)
    opsets[DOMAIN] = OPSET_VERSION
    for domain, version in sorted(opsets.items()):
        out.opset_import.add(domain=domain, version=version)
    metadata = dict(model.metadata_props)
    for name, ep in sorted(eps.items()):
        metadata[f"ep_compatibility_info.{name}"] = ep.compatibility_info()
    if (
        source_path is not None
    ):  # the source, bound by digest: what a stale context heals from (cache/heal.py)
        metadata[SOURCE_FILES_KEY] = source_files_record(source_path, model)
    modes = {int(ep.weightless.mode) for ep in eps.values()} - {0}
    if modes:  # onnxruntime's "weightless_mode" metadata: the one mode the session asked for
        metadata["weightless_mode"] = str(max(modes))
    metadata.update(extra_metadata or {})
    for key, value in sorted(metadata.items()):
        out.metadata_props.add(key=key, value=value)
    return out


def _check_compiled_type(ep: ExecutionProvider, partition: str, compiled: CompiledPartition) -> None:
    """An EP saves only what it compiled (``ExecutionProvider.compiled_type``)."""
    expected = ep.compiled_type
    if expected is not None and not isinstance(compiled, expected):
        raise InvalidArgument(
            f"{ep.name}.save_partition: {partition!r} was not compiled by this EP ({type(compiled).__name__})"
        )


def _check_embedded_size(writers: Mapping[str, ContextBinaryWriter], ctx_path: Path) -> None:
    """Refuse, before assembling anything, an embedded model that protobuf cannot hold (2 GB)."""
    total = sum(w.planned_size() for w in writers.values())
    if total >= _TWO_GB:
        raise Fail(
            f"the context model {ctx_path.name!r} would embed {total} bytes of context binaries, over protobuf's "
            "2 GB limit; write the binaries to files beside the model instead (embed mode 0, "
            "embed_compiled_data_into_model=False, or no --embed)"
        )


def ep_name_of(view: EPContextNode) -> str:
    return view.source or ""


def _node_proto(view: EPContextNode) -> onnx.NodeProto:
    proto = onnx.NodeProto()
    proto.op_type = "EPContext"
    proto.domain = DOMAIN
    proto.name = view.name
    proto.input.extend(view.inputs)
    proto.output.extend(view.outputs)
    for attr in view.attributes():
        if attr.name == "ep_cache_context":
            # A binary payload is not UTF-8: written as raw bytes, as onnxruntime's EPs do.
            proto.attribute.append(onnx.helper.make_attribute(attr.name, view.ep_cache_context))
        else:
            proto.attribute.append(ir.serde.serialize_attribute(attr))
    for name, value in sorted(view.extra.items()):
        proto.attribute.append(onnx.helper.make_attribute(name, value))
    return proto


def _used_initializers(
    graph: ir.Graph, units: Sequence[Unit], compiled: Mapping[int, CompiledPartition]
) -> list[ir.Value]:
    """Initializers read by the nodes that stay in the model (CPU fallback), in the source's order."""
    used: set[ir.Value] = set()
    for k, unit in enumerate(units):
        if k in compiled:
            continue
        for node in unit.nodes:
            used.update(v for v in (*node.inputs, *outer_scope_values(node)) if v is not None)
    outputs = set(graph.outputs)
    return [v for v in graph.initializers.values() if v in used or v in outputs]


def _add_initializers(
    g: onnx.GraphProto, values: Sequence[ir.Value], placement: Placement, files: dict[str, ExternalFile]
) -> list[str]:
    """Embed each initializer, append it to an external file of ours (``files``, shared by a sharing group:
    identical tensors stored once), or reference an existing file. Returns the names of ``files`` used."""
    used: list[str] = []
    for value in values:
        tensor = value.const_value
        if tensor is None:
            continue
        array = np.asarray(tensor.numpy())
        proto = onnx.numpy_helper.from_array(array, value.name or "")
        where = placement(value) if array.dtype != object else None
        if where is None:
            g.initializer.append(proto)
            continue
        if isinstance(where, str):
            raw = proto.raw_data or array.tobytes()
            location, offset, length = where, files.setdefault(where, ExternalFile()).add(raw), len(raw)
            if where not in used:
                used.append(where)
        else:
            location, offset, length = where
        proto.ClearField("raw_data")
        proto.data_location = onnx.TensorProto.EXTERNAL
        for key, item in (("location", location), ("offset", str(offset)), ("length", str(length))):
            proto.external_data.add(key=key, value=item)
        g.initializer.append(proto)
    return used


def write_files(tx: Transaction, ctx: ContextModel) -> dict[str, str]:
    """Place a context model's binaries and external files (preferred name -> name used)."""
    names = {name: tx.place_binary(name, writer) for name, writer in ctx.binaries.items()}
    names.update({name: tx.place_file(name, bytes(f.data)) for name, f in ctx.external_files.items()})
    return names


def check_model_size(model: onnx.ModelProto, what: str) -> None:
    size = model.ByteSize()
    if size >= _TWO_GB:
        raise Fail(
            f"{what} would be {size} bytes, over protobuf's 2 GB limit; write the context binaries to files "
            "(embed mode 0) and large initializers to an external file"
        )


def save_context_model(ctx: ContextModel, path: Path, *, overwrite: bool = False) -> None:
    """Write one context model as a transaction: binaries and files first, the model last."""
    check_model_size(ctx.model, f"the context model {str(path)!r}")
    with Transaction(path.parent) as tx:
        tx.check_model_path(path, overwrite=overwrite)
        rename_references(ctx.model, write_files(tx, ctx))
        tx.commit_model(path, ctx.model, overwrite=overwrite)


def generation_target(
    config: opt.SessionConfig, ctx_path: Path | None
) -> Callable[[ExecutionProvider], BinaryLayout] | None:
    """For a generating session's compile: with ``ep.share_ep_contexts`` the session joins the sharing group
    now (its folder is checked before any compile) and EPs are given the writer they will save into
    (``CompileContext.target_binary``); None otherwise."""
    if ctx_path is None or not config.share_ep_contexts:
        return None
    return group_target(generation_group(ctx_path.parent), paths.model_name_for(ctx_path))


def generate_context_model(
    result: CompiledModel,
    ctx_path: Path,
    *,
    overwrite: bool,
    embed: bool | None = None,
    placement: Placement | None = None,
    data_write: WriteFunc | None = None,
    extra_metadata: Mapping[str, str] | None = None,
) -> bool:
    """Build and write the context model of a compiled model; with ``ep.share_ep_contexts`` the model
    joins the sharing group, which the session with ``ep.stop_share_ep_contexts`` writes whole (``data_write``:
    the group's EPContext data write callback, which then receives each shared binary once instead of the
    disk). Returns whether files were written now."""
    config = result.config
    if not config.share_ep_contexts:
        save_context_model(
            build_context_model(
                result, ctx_path, embed=embed, placement=placement, extra_metadata=extra_metadata
            ),
            ctx_path,
            overwrite=overwrite,
        )
        return True
    group = generation_group(ctx_path.parent)
    try:
        ctx = build_context_model(
            result, ctx_path, embed=embed, placement=placement, group=group, extra_metadata=extra_metadata
        )
        check_model_size(ctx.model, f"the context model {str(ctx_path)!r}")
        group.use_data_write(data_write)
        group.keep(ctx_path, ctx.model, overwrite=overwrite)
        if not config.stop_share_ep_contexts:
            logger.info(
                "ep.share_ep_contexts: %s is written with its sharing group, by the session that sets "
                "ep.stop_share_ep_contexts=1",
                ctx_path,
            )
            return False
        _write_group(group)
    except BaseException as exc:
        close_group(group, failed=exc)
        raise
    close_group(group)
    return True


def _write_group(group: GenerationGroup) -> None:
    write = group.data_write[0] if group.data_write else None
    with group.lock, Transaction(group.folder) as tx:
        for pending in group.models:
            tx.check_model_path(pending.path, overwrite=pending.overwrite)
        if write is not None:  # each shared binary to the callback, once, under the name every model records
            from epctx.trust.hooks import write_named_buffer

            for writer, name in group.binaries.values():
                write_named_buffer(write, name, writer.to_bytes())
            names = {}
        else:
            names = {name: tx.place_binary(name, writer) for writer, name in group.binaries.values()}
        names.update({name: tx.place_file(name, bytes(f.data)) for name, f in group.files.items()})
        for pending in group.models:
            rename_references(pending.model, names)
            tx.commit_model(pending.path, pending.model, overwrite=pending.overwrite)


def source_files_record(source_path: Path, model: ir.Model) -> str:
    """JSON [[location, size, xxh3-128], ...]: the source ``.onnx`` (its file name) then its external data files
    (locations relative to its folder), as they were when this context was compiled from them."""
    from epctx.ep._weightless import file_digest

    folder = source_path.resolve().parent
    files = [source_path.resolve()]
    for value in model.graph.initializers.values():
        tensor = value.const_value
        location = getattr(tensor, "location", None)
        path = getattr(tensor, "path", None)
        if isinstance(location, str) and location and path is not None:
            resolved = Path(path).resolve()
            if resolved not in files and folder in resolved.parents:
                files.append(resolved)
    rows = [[f.relative_to(folder).as_posix(), *file_digest(f)] for f in files]
    return json.dumps(rows, separators=(",", ":"))
