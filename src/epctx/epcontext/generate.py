"""Write the context model: EPContext nodes for compiled partitions, CPU-fallback nodes kept as they are.

The generated model copies the source's graph inputs and outputs (in order), opset imports and metadata,
keeps only the initializers still used (embedded, or all in ``ep.context_model_external_initializers_file_name``),
adds ``ep_compatibility_info.<EP>`` metadata, and never references a file of the source model. Files are
written atomically: binaries first, the model last.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnx
import onnx_ir as ir

from epctx import __version__
from epctx import options as opt
from epctx.epcontext import paths
from epctx.epcontext.container import ContextBinaryWriter
from epctx.epcontext.schema import DOMAIN, OPSET_VERSION, EPContextNode
from epctx.epcontext.store import ContextStore
from epctx.epcontext.workspace import workspace
from epctx.errors import Fail, InvalidArgument
from epctx.model.scopes import outer_scope_values
from epctx.partition import Unit
from epctx.providers.base import CompiledPartition, ExecutionProvider

if TYPE_CHECKING:
    from epctx.session.pipeline import Pipeline

__all__ = ["ContextModel", "Placement", "build_context_model", "save_context_model", "write_atomic"]

# Where an initializer left in the context model goes: None embeds it; a file name appends it to that file
# (relative to the model); (location, offset, length) references data already in a file.
Placement = Callable[[ir.Value], "str | tuple[str, int, int] | None"]

logger = logging.getLogger("epctx")


@dataclasses.dataclass(frozen=True, slots=True)
class ContextModel:
    """A generated context model: the model proto and the binaries to write beside it (relative name -> writer)."""

    model: onnx.ModelProto
    binaries: Mapping[str, ContextBinaryWriter]
    external_files: Mapping[str, bytes]  # external initializer files of ours (relative name -> content)


def build_context_model(
    pipeline: Pipeline,
    ctx_path: Path,
    *,
    embed: bool | None = None,
    placement: Placement | None = None,
) -> ContextModel:
    """The context model of a compiled pipeline, to be saved as ``ctx_path``. ``embed`` and ``placement``
    default to the session options (``ep.context_embed_mode``, ``ep.context_model_external_initializers_file_name``)."""
    config = pipeline.config
    model = pipeline.loaded.model
    units = pipeline.units
    compiled = pipeline.compiled
    source_path = pipeline.loaded.path
    model_name = paths.model_name_for(source_path, ctx_path)
    source_filename = source_path.name if source_path is not None else ""
    if embed is None:
        embed = opt.config_flag(config, opt.EP_CONTEXT_EMBED_MODE)
    if placement is None:
        ext_name = config.get(opt.EP_CONTEXT_EXTERNAL_INITIALIZERS_FILE, "")
        placement = (lambda value: ext_name) if ext_name else (lambda value: None)
    prefix = config.get(opt.EP_CONTEXT_NODE_NAME_PREFIX, "")
    share = opt.config_flag(config, opt.SHARE_EP_CONTEXTS)
    if share and embed:
        raise InvalidArgument(
            "ep.share_ep_contexts=1 shares one binary file among models: it needs ep.context_embed_mode=0"
        )
    graph = model.graph
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
            if share:
                writer, file_names[ep.name] = workspace(ep.name).generation_target(
                    ep, model_name, ctx_path.parent
                )
            else:
                writer = ContextBinaryWriter(
                    ep_name=ep.name, sdk_version=ep.sdk_version(), hardware=ep.hardware()
                )
                file_names[ep.name] = paths.binary_file_name(model_name, ep.name)
            writers[ep.name] = writer
            eps[ep.name] = ep
        # Graphs of several models share a binary: their names carry the model's name.
        graph_name = f"{prefix}{model_name}_{part.name}" if share else f"{prefix}{part.name}"
        # A shared writer takes graphs from concurrent sessions of the group: one at a time.
        with workspace(ep.name).lock if share else contextlib.nullcontext():
            ep.save_partition(part, compiled[k], ContextStore(writer, graph_name))
        is_main = ep.name not in mains
        view = EPContextNode(
            name=graph_name,
            inputs=tuple(v.name or "" for v in part.inputs),
            outputs=tuple(v.name or "" for v in part.outputs),
            main_context=1 if is_main else 0,
            ep_cache_context=None,
            embed_mode=1 if embed else 0,
            ep_sdk_version=ep.sdk_version(),
            onnx_model_filename=source_filename or None,
            hardware_architecture=ep.hardware() or None,
            partition_name=graph_name,
            source=ep.name,
        )
        mains.add(ep.name)
        views.append((len(nodes), view))
        nodes.append(onnx.NodeProto())  # filled below, once the EP's binary holds all its graphs
    binaries: dict[str, ContextBinaryWriter] = {}
    for index, view in views:
        payload: bytes | None = None
        if view.main_context:
            writer = writers[ep_name_of(view)]
            if embed:
                payload = writer.to_bytes()
            else:
                payload = file_names[ep_name_of(view)].encode()
        nodes[index] = _node_proto(dataclasses.replace(view, ep_cache_context=payload))
    stop = opt.config_flag(config, opt.STOP_SHARE_EP_CONTEXTS)
    for name, writer in writers.items():
        if embed:
            continue
        if not share:
            binaries[file_names[name]] = writer
        elif stop:  # the last session of the group writes the shared binary and clears the workspace
            binaries[file_names[name]] = writer
            workspace(name).finish_generation()

    initializers = _used_initializers(graph, units, compiled)
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
    for key, value in sorted(metadata.items()):
        out.metadata_props.add(key=key, value=value)
    g = out.graph
    g.name = graph.name or "main_graph"
    g.input.extend(ir.serde.serialize_value(v) for v in graph.inputs)
    g.output.extend(ir.serde.serialize_value(v) for v in graph.outputs)
    g.node.extend(nodes)
    external = _add_initializers(g, initializers, placement)
    return ContextModel(model=out, binaries=binaries, external_files=external)


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
    g: onnx.GraphProto, values: Sequence[ir.Value], placement: Placement
) -> dict[str, bytes]:
    """Embed each initializer, append it to an external file of ours, or reference an existing file."""
    files: dict[str, bytearray] = {}
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
            blob = files.setdefault(where, bytearray())
            blob.extend(b"\0" * ((-len(blob)) % 64))
            raw = proto.raw_data or array.tobytes()
            location, offset, length = where, len(blob), len(raw)
            blob.extend(raw)
        else:
            location, offset, length = where
        proto.ClearField("raw_data")
        proto.data_location = onnx.TensorProto.EXTERNAL
        for key, item in (("location", location), ("offset", str(offset)), ("length", str(length))):
            proto.external_data.add(key=key, value=item)
        g.initializer.append(proto)
    return {name: bytes(blob) for name, blob in files.items()}


def write_atomic(path: Path, write: Callable[[Callable[[bytes], object]], object]) -> None:
    """Write ``path`` through a temporary file in its folder, then rename (never a half file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh.write)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def save_context_model(ctx: ContextModel, path: Path) -> None:
    """Binaries first, then the external initializers, then the model (atomic each)."""
    folder = path.parent
    folder.mkdir(parents=True, exist_ok=True)
    for name, writer in ctx.binaries.items():
        writer.write(folder / name)
    for name, blob in ctx.external_files.items():
        write_bytes_atomic(folder / name, blob)
    data = ctx.model.SerializeToString(deterministic=True)
    if len(data) >= 2**31:
        raise Fail(f"the context model {str(path)!r} would exceed 2 GB; use embed mode 0")
    write_bytes_atomic(path, data)


def write_bytes_atomic(path: Path, data: bytes) -> None:
    write_atomic(path, lambda write: write(data))
