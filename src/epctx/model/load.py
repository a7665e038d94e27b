"""Load a model from a path or from bytes into onnx-ir, validated, with external data memory-mapped."""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
import onnx_ir.passes.common
from google.protobuf.message import DecodeError

from epctx.errors import InvalidArgument, InvalidGraph
from epctx.model.dims import override_proto_dims, state_input_shapes
from epctx.model.external import allowed_folders, confine_external_file
from epctx.model.source import read_model_file
from epctx.model.type_check import check_types

__all__ = ["LoadedModel", "load_model", "parse_model_proto", "read_model_file"]

logger = logging.getLogger("epctx")


class _BinaryPayloadFilter(logging.Filter):
    """EPContext payloads (embed_mode=1) are bytes in a STRING attribute, as onnxruntime writes them;
    onnx-ir warns about every such attribute. That is the format, not a defect: drop those warnings."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "'ep_cache_context'" not in record.getMessage()


logging.getLogger("onnx_ir.serde").addFilter(_BinaryPayloadFilter())

# onnx.checker refuses protos over 2 GiB (after hiding large initializers, see _checkable).
_CHECKER_LIMIT = 2**31 - 1
# Initializers larger than this are hidden from onnx.checker (see _checkable).
_HEAVY_INITIALIZER = 4096


@dataclasses.dataclass(frozen=True, slots=True)
class LoadedModel:
    """A model in memory. ``path`` is the source file (None for bytes); ``base_dir`` resolves external data."""

    model: ir.Model
    path: Path | None
    base_dir: Path | None


def load_model(
    source: str | os.PathLike[str] | bytes,
    *,
    external_data_folder: str | None = None,
    infer_types: bool = False,
    data: bytes | None = None,
    free_dims: tuple[Mapping[str, int], Mapping[str, int]] | None = None,
    input_shapes: Sequence[tuple[str, tuple[int, ...]]] = (),
    input_values: Sequence[tuple[str, float]] = (),
) -> LoadedModel:
    """Parse, check and convert a model. External tensors stay on disk (onnx-ir memory-maps them on use).
    ``infer_types`` runs ONNX shape inference so intermediate values carry types (compiling EPs need them).
    ``data``: the file's bytes when the caller has read them already (``source`` is then its path).
    ``free_dims``: (by name, by denotation) free dimension overrides, set before type inference (``dims``);
    ``input_shapes``: whole input shapes (epctx.input_shapes), set before them, checked against the model;
    ``input_values``: scalar input values (epctx.input_values), folded with the control flow they decide."""
    data, path, base_dir, lookup_dir, what = _source(source, external_data_folder, data)
    proto = parse_model_proto(data, what)
    payloads = _take_payloads(proto)
    stated = bool(input_shapes) and state_input_shapes(proto.graph, input_shapes, *(free_dims or ({}, {})))
    overridden = free_dims is not None and override_proto_dims(proto.graph, *free_dims)
    overridden = overridden or stated
    if input_values:
        from epctx.model.fold_static import fold_stated_values

        fold_stated_values(proto, input_values, what)
        overridden = True
    checkable, inferable = _checkable(proto, data, stripped=bool(payloads) or overridden)
    del data  # parsed: the file's bytes would be a second copy of the weights from here on
    if len(checkable) < _CHECKER_LIMIT:
        _run_checker(checkable, what)
    try:
        model = ir.serde.deserialize_model(proto)
    except Exception as exc:
        bad = _non_utf8_name(proto.graph)
        if bad is not None:
            raise InvalidGraph(
                f"{what}: {bad[0]} is not UTF-8 text: {_show(bad[1])} (ONNX strings are UTF-8)"
            ) from exc
        cause = f" ({exc.__cause__})" if exc.__cause__ is not None else ""
        raise InvalidGraph(f"{what} could not be read: {exc}{cause}") from exc
    _check_strings(model, what)
    _own_tensors(model)
    del proto  # the tensors own their data now (see _own_tensors): the parsed copy is freed
    _restore_payloads(model, payloads)
    if model.functions:
        # Model-local functions are inlined so every node left is a plain operator.
        onnx_ir.passes.common.InlinePass()(model)
    _check_external_data(model, lookup_dir, path, what)
    if len(inferable) < _CHECKER_LIMIT:
        inferred = check_types(inferable, what)  # once per load: the check and the types EPs see
        if infer_types and inferred is not None:
            _copy_types(model, inferred)
    return LoadedModel(model=model, path=path, base_dir=base_dir)


def _source(
    source: str | os.PathLike[str] | bytes, external_data_folder: str | None, data: bytes | None
) -> tuple[bytes, Path | None, Path | None, Path | None, str]:
    """(bytes, path, base_dir, directory external data is looked up in, how messages name the model) of
    ``load_model``'s source."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        data = bytes(source)
        if not data:
            raise InvalidArgument("model bytes are empty")
        base_dir = Path(external_data_folder).absolute() if external_data_folder else None
        return data, None, base_dir, base_dir, "model bytes"
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if data is None:
            data = read_model_file(path)
        # as onnxruntime: external data beside the path given, links followed later
        return data, path, path.resolve().parent, path.absolute().parent, f"model file {str(path)!r}"
    raise InvalidArgument(f"expected a model path or bytes, got {type(source).__name__}")


def _run_checker(checkable: bytes, what: str) -> None:
    """onnx's checker over the serialized model (large payloads stripped), its failures as InvalidGraph."""
    try:
        onnx.checker.check_model(checkable)
    except onnx.checker.ValidationError as exc:
        raise InvalidGraph(f"{what} is not a valid ONNX model: {str(exc).strip()}") from exc
    except UnicodeDecodeError as exc:
        # The checker's message quotes a name that is not UTF-8 (protobuf does not check proto2 strings).
        message = exc.object.decode("utf-8", "backslashreplace") if isinstance(exc.object, bytes) else ""
        raise InvalidGraph(
            f"{what} is not a valid ONNX model (a name in it is not UTF-8): {message.strip()}"
        ) from exc


# Data types whose raw bytes numpy reads as they are (little-endian), so a tensor can own them as an array.
_NUMPY_DTYPES = frozenset(
    {
        ir.DataType.FLOAT, ir.DataType.DOUBLE, ir.DataType.FLOAT16, ir.DataType.INT8, ir.DataType.UINT8,
        ir.DataType.INT16, ir.DataType.UINT16, ir.DataType.INT32, ir.DataType.UINT32, ir.DataType.INT64,
        ir.DataType.UINT64, ir.DataType.BOOL,
    }
)  # fmt: skip


def _own_tensors(model: ir.Model) -> None:
    """Detach every tensor from the parsed proto, so that the proto (and the copy of the weights it holds) is
    freed when loading ends: onnx-ir's proto-backed tensors keep the whole ``ModelProto`` alive (protobuf
    sub-messages share their root's memory), and their ``numpy()`` copies ``raw_data`` on every call.

    Initializers with ``raw_data`` of a type numpy reads as is become ``ir.Tensor`` over one array, the bytes
    copied once (so the weights are held once, and ``numpy()`` returns that array, not a copy); any other
    proto-backed tensor (typed fields, strings, sub-byte types, attribute tensors) keeps its own small copy
    of its ``TensorProto``. External tensors are not touched (they stay memory-mapped from their file)."""
    for graph in (model.graph, *model.graph.subgraphs()):
        for value in graph.initializers.values():
            tensor = value.const_value
            if isinstance(tensor, ir.serde.TensorProtoTensor):
                value.const_value = _owned(tensor)
        for node in graph:
            for attr in node.attributes.values():
                if attr.type == ir.AttributeType.TENSOR and isinstance(
                    attr.value, ir.serde.TensorProtoTensor
                ):
                    node.attributes[attr.name] = ir.AttrTensor(attr.name, _standalone(attr.value))
                elif attr.type == ir.AttributeType.TENSORS and any(
                    isinstance(t, ir.serde.TensorProtoTensor) for t in attr.value
                ):
                    tensors = [
                        _standalone(t) if isinstance(t, ir.serde.TensorProtoTensor) else t for t in attr.value
                    ]
                    node.attributes[attr.name] = ir.AttrTensors(attr.name, tensors)


def _owned(tensor: ir.serde.TensorProtoTensor) -> ir.TensorProtocol:
    proto = tensor.raw
    if tensor.dtype not in _NUMPY_DTYPES or not proto.HasField("raw_data") or proto.metadata_props:
        return _standalone(tensor)
    raw = proto.raw_data  # one copy of the bytes (protobuf hands out a new bytes object)
    dtype = np.dtype(tensor.dtype.numpy()).newbyteorder("<")
    shape = tuple(int(d) for d in proto.dims)
    if len(raw) != dtype.itemsize * math.prod(shape):
        return _standalone(tensor)  # malformed: onnx-ir reports it on use, as before
    array = np.frombuffer(raw, dtype).reshape(shape)
    return ir.Tensor(array, dtype=tensor.dtype, name=proto.name or None, doc_string=proto.doc_string or None)


def _standalone(tensor: ir.serde.TensorProtoTensor) -> ir.serde.TensorProtoTensor:
    copy = onnx.TensorProto()
    copy.CopyFrom(tensor.raw)
    return ir.serde.TensorProtoTensor(copy)


def _copy_types(model: ir.Model, inferred: onnx.ModelProto) -> None:
    """Copy types and shapes from ONNX shape inference onto values that lack them: the main graph's and those
    of its subgraphs (If / Loop / Scan bodies, which EPs may take a part of)."""
    _copy_graph_types(model.graph, inferred.graph)


def _copy_graph_types(graph: ir.Graph, inferred: onnx.GraphProto) -> None:
    """One graph at a time (sibling bodies may reuse a name): inference keeps the nodes in their order, so
    subgraphs pair up by node position and attribute name."""
    by_name = {v.name: v for node in graph for v in node.outputs if v.name}
    for info in (*inferred.value_info, *inferred.output):
        value = by_name.get(info.name)
        if value is None or not info.type.HasField("tensor_type"):
            continue
        if value.type is None:
            value.type = ir.serde.deserialize_type_proto_for_type(info.type)
        if value.shape is None and info.type.tensor_type.HasField("shape"):
            value.shape = ir.serde.deserialize_type_proto_for_shape(info.type)
    nodes = list(graph)
    if len(nodes) != len(inferred.node):
        return  # not the same graph any more (functions inlined): its bodies keep the types they declare
    for node, proto in zip(nodes, inferred.node):
        for attr in proto.attribute:
            if attr.HasField("g"):
                sub = node.attributes.get(attr.name)
                if isinstance(sub, ir.Attr) and sub.type == ir.AttributeType.GRAPH:
                    _copy_graph_types(sub.as_graph(), attr.g)


def parse_model_proto(data: bytes, what: str) -> onnx.ModelProto:
    """Parse ``data`` as a ModelProto; anything that is not an ONNX model is InvalidGraph naming ``what``."""
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except (DecodeError, ValueError, RecursionError) as exc:
        raise InvalidGraph(f"{what} is not a valid ONNX protobuf (not an ONNX model): {exc}") from exc
    if not proto.HasField("graph") or not proto.ir_version:
        raise InvalidGraph(f"{what} is not an ONNX model (no graph or IR version)")
    return proto


def _check_strings(model: ir.Model, what: str) -> None:
    """ONNX strings are UTF-8, but protobuf does not check proto2 strings: a name that is not UTF-8 reaches
    onnx-ir as ``bytes``. Names (graphs, nodes, values, op types, domains, attributes) are InvalidGraph naming
    the file and where; free text (doc strings, producer, metadata) is decoded with U+FFFD replacements."""
    for key in ("producer_name", "producer_version", "domain", "doc_string"):
        raw = getattr(model, key)
        if isinstance(raw, bytes):
            setattr(model, key, raw.decode("utf-8", "replace"))
    props = model.metadata_props
    if any(isinstance(k, bytes) or isinstance(v, bytes) for k, v in props.items()):
        fixed = {_text(k): _text(v) for k, v in props.items()}
        props.clear()
        props.update(fixed)
    for domain in model.opset_imports:
        if type(domain) is not str:
            _not_utf8(what, "an opset_import domain", domain)
    for graph in (model.graph, *model.graph.subgraphs()):
        _check_graph_strings(graph, what)


def _check_graph_strings(graph: ir.Graph, what: str) -> None:
    """``_check_strings`` for one graph (not its subgraphs)."""
    if isinstance(graph.doc_string, bytes):
        graph.doc_string = graph.doc_string.decode("utf-8", "replace")
    if graph.name is not None and type(graph.name) is not str:
        _not_utf8(what, "the graph name", graph.name)
    for value in (*graph.inputs, *graph.outputs):
        if value.name is not None and type(value.name) is not str:
            _not_utf8(what, f"graph {_show(graph.name)}: an input or output name", value.name)
    for name in graph.initializers:
        if type(name) is not str:
            _not_utf8(what, f"graph {_show(graph.name)}: an initializer name", name)
    for index, node in enumerate(graph):
        # One cheap test per node (this runs on every load); the slow path says what is wrong.
        if (
            type(node.name) not in _STR_OR_NONE
            or type(node.op_type) is not str
            or type(node.domain) is not str
            or type(node.doc_string) not in _STR_OR_NONE
        ):
            _node_strings(node, index, graph, what)
        for value in node.outputs:
            if type(value.name) not in _STR_OR_NONE:
                _not_utf8(what, f"node {_show(node.name)}: an output name", value.name)
        for attr_name in node.attributes:
            if type(attr_name) is not str:
                _not_utf8(what, f"node {_show(node.name)}: an attribute name", attr_name)


_STR_OR_NONE = frozenset({str, type(None)})


def _node_strings(node: ir.Node, index: int, graph: ir.Graph, what: str) -> None:
    for label in ("name", "op_type", "domain"):
        raw = getattr(node, label)
        if raw is not None and type(raw) is not str:
            _not_utf8(what, f"node {index} of graph {_show(graph.name)}: its {label}", raw)
    if isinstance(node.doc_string, bytes):
        node.doc_string = node.doc_string.decode("utf-8", "replace")


def _non_utf8_name(graph: onnx.GraphProto) -> tuple[str, object] | None:
    """Where a name of ``graph`` (or its subgraphs) is not UTF-8: protobuf hands such strings over as bytes.
    Only called when onnx-ir failed, to say why."""
    where = f"graph {_show(graph.name)}"
    if isinstance(graph.name, bytes):
        return "the graph name", graph.name
    for kind, values in (("input", graph.input), ("output", graph.output), ("value_info", graph.value_info)):
        for value in values:
            if isinstance(value.name, bytes):
                return f"{where}: {kind} name", value.name
    for tensor in graph.initializer:
        if isinstance(tensor.name, bytes):
            return f"{where}: initializer name", tensor.name
    for index, node in enumerate(graph.node):
        found = _non_utf8_node_name(node, f"{where}: node {index} ({_show(node.name)})")
        if found is not None:
            return found
    return None


def _non_utf8_node_name(node: onnx.NodeProto, label: str) -> tuple[str, object] | None:
    """``_non_utf8_name`` for one node and the graphs in its attributes."""
    for field in ("name", "op_type", "domain"):
        if isinstance(getattr(node, field), bytes):
            return f"{label}: its {field}", getattr(node, field)
    for name in (*node.input, *node.output):
        if isinstance(name, bytes):
            return f"{label}: an input or output name", name
    for attr in node.attribute:
        if isinstance(attr.name, bytes):
            return f"{label}: an attribute name", attr.name
        for sub in (*([attr.g] if attr.HasField("g") else []), *attr.graphs):
            found = _non_utf8_name(sub)
            if found is not None:
                return found
    return None


def _text(raw: str | bytes) -> str:
    return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw


def _show(name: object) -> str:
    return repr(name.decode("utf-8", "backslashreplace")) if isinstance(name, bytes) else repr(name)


def _not_utf8(what: str, where: str, raw: object) -> None:
    raise InvalidGraph(f"{what}: {where} is not UTF-8 text: {_show(raw)} (ONNX strings are UTF-8)")


def _take_payloads(proto: onnx.ModelProto) -> dict[int, bytes]:
    """Take embedded EP context payloads out of the proto (by node index), so the checker, shape inference
    and onnx-ir never copy or decode them; ``_restore_payloads`` puts them back on the onnx-ir nodes."""
    payloads: dict[int, bytes] = {}
    for index, node in enumerate(proto.graph.node):
        if node.op_type != "EPContext":
            continue
        for attr in node.attribute:
            if attr.name == "ep_cache_context":
                payloads[index] = attr.s
                attr.s = b""
    return payloads


def _restore_payloads(model: ir.Model, payloads: dict[int, bytes]) -> None:
    if not payloads:
        return
    for index, node in enumerate(model.graph):
        if index in payloads:
            # Binary payloads are bytes in a STRING attribute (onnxruntime's format); onnx-ir keeps them as is.
            node.attributes["ep_cache_context"] = ir.Attr(
                "ep_cache_context", ir.AttributeType.STRING, payloads[index]
            )


def _checkable(proto: onnx.ModelProto, data: bytes, *, stripped: bool) -> tuple[bytes, bytes]:
    """What onnx.checker should see: the model without the payload of its large initializers; and what type
    inference should see (the same, except that inputs / outputs of unknown rank stay so).

    The checker re-parses whatever it is given, so weights would be parsed twice; and it resolves external
    data against the working directory. Large and external initializers are shown to it as graph inputs of
    the same type and shape (their data is checked by ``_check_external_data`` and by onnx-ir on use).
    """
    graph = proto.graph
    heavy = [
        t
        for t in graph.initializer
        if t.data_location == onnx.TensorProto.EXTERNAL or len(t.raw_data) > _HEAVY_INITIALIZER
    ]
    unshaped = [
        v
        for v in (*graph.input, *graph.output)
        if v.type.HasField("tensor_type") and not v.type.tensor_type.HasField("shape")
    ]
    if not heavy and not unshaped:
        whole = proto.SerializeToString() if stripped else data
        return whole, whole
    heavy_names = {t.name for t in heavy}
    skeleton = onnx.ModelProto()
    _copy_fields(proto, skeleton, skip="graph")
    sk = skeleton.graph
    _copy_fields(graph, sk, skip="initializer")
    sk.initializer.extend(t for t in graph.initializer if t.name not in heavy_names)
    declared = {i.name for i in sk.input}
    for t in heavy:
        if t.name not in declared:
            sk.input.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    inferable = skeleton.SerializeToString()
    if not unshaped:
        return inferable, inferable
    # onnxruntime accepts graph inputs/outputs of unknown rank; onnx.checker insists on a shape field. For the
    # checker only (it infers nothing without full_check), such values get an empty shape: type inference
    # would read it as rank 0, so it sees them without one.
    for v in (*sk.input, *sk.output):
        if v.type.HasField("tensor_type") and not v.type.tensor_type.HasField("shape"):
            v.type.tensor_type.shape.SetInParent()
    return skeleton.SerializeToString(), inferable


def _copy_fields(src: Any, dst: Any, *, skip: str) -> None:
    """Copy every set field of protobuf message ``src`` into ``dst`` except ``skip``."""
    for field, value in src.ListFields():
        if field.name == skip:
            continue
        if field.is_repeated:
            getattr(dst, field.name).extend(value)
        elif field.message_type is not None:
            getattr(dst, field.name).CopyFrom(value)
        else:
            setattr(dst, field.name, value)


def _check_external_data(model: ir.Model, lookup_dir: Path | None, path: Path | None, what: str) -> None:
    """Point external tensors at ``lookup_dir`` and fail early, naming the file, if one is missing, too short,
    or outside the model folder once symlinks are followed (``external.py``: onnxruntime's rule)."""
    external = [
        v.const_value
        for g in (model.graph, *model.graph.subgraphs())
        for v in g.initializers.values()
        if isinstance(v.const_value, ir.ExternalTensor)
    ]
    if not external:
        return
    if lookup_dir is None:
        raise InvalidArgument(
            f"{what} has external initializers (e.g. {external[0].name!r} in {str(external[0].location)!r}); "
            "set session.model_external_initializers_file_folder_path to their folder"
        )
    ir.external_data.set_base_dir(model.graph, lookup_dir)
    roots = allowed_folders(lookup_dir, path)
    for tensor in external:
        name = tensor.name or ""
        file = confine_external_file(str(tensor.location), lookup_dir, roots, tensor=name, what=what)
        end = (tensor.offset or 0) + (tensor.length or 0)
        size = file.stat().st_size
        if end > size:
            raise InvalidGraph(
                f"{what}: initializer {name!r} needs bytes up to {end} of {str(file)!r}, which has {size}"
            )
