"""The lean reader: what a session needs of a context model, read straight from the protobuf wire format.

A context model is a handful of ``com.microsoft::EPContext`` nodes between the graph's inputs and outputs.
Loading one through onnx and onnx-ir costs about 110 ms of imports before the backend starts; this reader
costs well under a millisecond and imports nothing. It reads the graph's inputs and outputs (types and
shapes), the EPContext nodes and their attributes, opset imports and the model's metadata.

It takes only what it fully understands: a model with any other node, an initializer, a function, a
subgraph, a non-tensor input, a name that is not UTF-8, or bytes that are not well-formed gives ``None``, and
the session loads it with the full loader (``epctx.model.load``), whose checks and typed errors are the ones
users see. So a file is never accepted here that the full loader would refuse."""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import NamedTuple

from epctx.model.wire import LEN, VARINT, WireError, fields, signed, text, varints

__all__ = ["LeanAttribute", "LeanModel", "LeanNode", "LeanValue", "read_context_model"]

_EP_CONTEXT = ("com.microsoft", "EPContext")
# IR versions taken here: those of the onnx releases epctx supports (onnx 1.23 writes and checks IR 14);
# anything else goes to the full loader, whose onnx checks decide.
_IR_VERSIONS = range(3, 15)

# AttributeProto.AttributeType values this reader keeps (others send the model to the full loader).
_FLOAT, _INT, _STRING, _FLOATS, _INTS, _STRINGS = 1, 2, 3, 6, 7, 8


class _NotLean(Exception):
    """The model needs the full loader (not an error: the full loader decides)."""


# Plain slotted classes rather than dataclasses: this module is on the path of every process that loads a
# context model, and building a frozen, slotted dataclass costs about 0.8 ms at import.
class LeanValue:
    """A graph input or output: ``elem_type`` is ONNX's TensorProto.DataType, ``dims`` None when unranked,
    each dim an int (>= 0), a symbolic name, or None. Compared by identity, as onnx-ir values are."""

    __slots__ = ("dims", "elem_type", "name")
    const_value = None  # the plan's view of a value: never a constant here

    def __init__(self, name: str, elem_type: int, dims: tuple[int | str | None, ...] | None) -> None:
        self.name = name
        self.elem_type = elem_type
        self.dims = dims

    def producer(self) -> None:
        return None

    def __repr__(self) -> str:
        return f"LeanValue({self.name!r}, {self.elem_type}, {self.dims!r})"


class LeanAttribute(NamedTuple):
    """An attribute as onnx-ir gives it: ``type`` is AttributeProto's type number; STRING values are ``str``
    when UTF-8, else ``bytes`` (EPContext payloads)."""

    type: int
    value: object


class LeanNode:
    __slots__ = ("attributes", "domain", "inputs", "name", "op_type", "outputs")

    def __init__(
        self,
        name: str,
        domain: str,
        op_type: str,
        inputs: tuple[str, ...],
        outputs: tuple[str, ...],
        attributes: Mapping[str, LeanAttribute],
    ) -> None:
        self.name = name
        self.domain = domain
        self.op_type = op_type
        self.inputs = inputs
        self.outputs = outputs
        self.attributes = attributes

    def __repr__(self) -> str:
        return f"LeanNode({self.name!r}, {self.domain}::{self.op_type}, {self.inputs} -> {self.outputs})"


class LeanModel:
    """What a session needs of the model; the graph's fields are filled as the reader goes."""

    __slots__ = (
        "doc_string",
        "domain",
        "graph_doc_string",
        "graph_name",
        "inputs",
        "ir_version",
        "metadata_props",
        "model_version",
        "nodes",
        "opset_imports",
        "outputs",
        "producer_name",
    )

    def __init__(
        self,
        *,
        ir_version: int,
        producer_name: str,
        domain: str,
        model_version: int,
        doc_string: str,
        opset_imports: dict[str, int],
        metadata_props: dict[str, str],
    ) -> None:
        self.ir_version = ir_version
        self.producer_name = producer_name
        self.domain = domain
        self.model_version = model_version
        self.doc_string = doc_string
        self.opset_imports = opset_imports
        self.metadata_props = metadata_props
        self.graph_name = ""
        self.graph_doc_string = ""
        self.inputs: list[LeanValue] = []
        self.outputs: list[LeanValue] = []
        self.nodes: list[LeanNode] = []


def read_context_model(data: bytes | memoryview) -> LeanModel | None:
    """The model, when it is a context model this reader takes whole; None sends it to the full loader."""
    try:
        return _model(memoryview(data))
    except (WireError, _NotLean, RecursionError):
        return None


def _model(buf: memoryview) -> LeanModel:
    head: dict[int, object] = {}
    graph: memoryview | None = None
    opsets: dict[str, int] = {}
    metadata: dict[str, str] = {}
    for number, kind, value in fields(buf):
        if number == 7:
            if graph is not None or not isinstance(value, memoryview):
                raise _NotLean
            graph = value
        elif number == 8:
            domain, version = _opset(_len(value))
            if domain in opsets:
                raise _NotLean  # duplicate imports: the full loader's checks decide
            opsets[domain] = version
        elif number == 14:
            key, val = _entry(_len(value))
            metadata[key] = val
        elif number in (1, 5):
            head[number] = signed(_int(kind, value))
        elif number in (2, 3, 4, 6):
            head[number] = text(value)
        else:  # training info, functions, configuration...: the full loader's business
            raise _NotLean
    ir_version = head.get(1, 0)
    if graph is None or ir_version not in _IR_VERSIONS or opsets.get(_EP_CONTEXT[0], 0) < 1:
        raise _NotLean
    model = LeanModel(
        ir_version=int(ir_version),  # type: ignore[call-overload]
        producer_name=str(head.get(2, "")),
        domain=str(head.get(4, "")),
        model_version=int(head.get(5, 0)),  # type: ignore[call-overload]
        doc_string=str(head.get(6, "")),
        opset_imports=opsets,
        metadata_props=metadata,
    )
    _graph(graph, model)
    _check_wiring(model)
    return model


def _graph(buf: memoryview, model: LeanModel) -> None:
    for number, _, value in fields(buf):
        if number == 1:
            model.nodes.append(_node(_len(value)))
        elif number == 2:
            model.graph_name = text(value)
        elif number == 10:
            model.graph_doc_string = text(value)
        elif number == 11:
            model.inputs.append(_value_info(_len(value)))
        elif number == 12:
            model.outputs.append(_value_info(_len(value)))
        elif number == 13:
            continue  # value_info of intermediate values: not needed to run EPContext nodes
        else:  # initializers, sparse initializers, annotations: the full loader's business
            raise _NotLean


def _node(buf: memoryview) -> LeanNode:
    inputs: list[str] = []
    outputs: list[str] = []
    attributes: dict[str, LeanAttribute] = {}
    name = domain = op_type = ""
    for number, _, value in fields(buf):
        if number == 1:
            inputs.append(text(value))
        elif number == 2:
            outputs.append(text(value))
        elif number == 3:
            name = text(value)
        elif number == 4:
            op_type = text(value)
        elif number == 5:
            attr_name, attr = _attribute(_len(value))
            if attr_name in attributes:
                raise _NotLean
            attributes[attr_name] = attr
        elif number == 7:
            domain = text(value)
        elif number == 6:
            continue  # doc_string
        else:
            raise _NotLean
    if (domain, op_type) != _EP_CONTEXT:
        raise _NotLean
    return LeanNode(name, domain, op_type, tuple(inputs), tuple(outputs), attributes)


def _attribute(buf: memoryview) -> tuple[str, LeanAttribute]:
    name = ""
    kind_of = 0
    scalars: dict[int, object] = {}
    repeated: list[object] = []
    for number, kind, value in fields(buf):
        if number == 1:
            name = text(value)
        elif number == 20:
            kind_of = _int(kind, value)
        elif number == 2:
            scalars[2] = _float(value)
        elif number == 3:
            scalars[3] = signed(_int(kind, value))
        elif number == 4:
            scalars[4] = _string(_len(value))
        elif number == 7:
            repeated.extend(_floats(kind, value))
        elif number == 8:
            repeated.extend(_ints(kind, value))
        elif number == 9:
            repeated.append(_string(_len(value)))
        elif number == 13:
            continue  # doc_string
        else:  # tensors, graphs, type protos, references: the full loader's business
            raise _NotLean
    if not name:
        raise _NotLean
    scalar_field = {_FLOAT: 2, _INT: 3, _STRING: 4}.get(kind_of)
    if scalar_field is not None:
        if repeated or set(scalars) - {scalar_field}:
            raise _NotLean
        default: object = {_FLOAT: 0.0, _INT: 0, _STRING: ""}[kind_of]
        return name, LeanAttribute(kind_of, scalars.get(scalar_field, default))
    if kind_of in (_FLOATS, _INTS, _STRINGS) and not scalars:
        return name, LeanAttribute(kind_of, repeated)
    raise _NotLean


def _value_info(buf: memoryview) -> LeanValue:
    name = ""
    type_proto: memoryview | None = None
    for number, _, value in fields(buf):
        if number == 1:
            name = text(value)
        elif number == 2:
            type_proto = _len(value)
        elif number not in (3, 4):  # doc_string, metadata_props
            raise _NotLean
    if not name or type_proto is None:
        raise _NotLean
    elem_type, dims = _tensor_type(type_proto)
    return LeanValue(name, elem_type, dims)


def _tensor_type(buf: memoryview) -> tuple[int, tuple[int | str | None, ...] | None]:
    tensor: memoryview | None = None
    for number, _, value in fields(buf):
        if number == 1 and tensor is None:
            tensor = _len(value)
        elif number != 6:  # denotation; sequences, maps, optionals... go to the full loader
            raise _NotLean
    if tensor is None:
        raise _NotLean
    elem_type = 0
    dims: tuple[int | str | None, ...] | None = None
    for number, kind, value in fields(tensor):
        if number == 1:
            elem_type = _int(kind, value)
        elif number == 2:
            dims = tuple(_dim(_len(d)) for n, _, d in fields(_len(value)) if n == 1)
        else:
            raise _NotLean
    if not 1 <= elem_type <= 16:  # the standard tensor types; newer ones go to the full loader
        raise _NotLean
    return elem_type, dims


def _dim(buf: memoryview) -> int | str | None:
    dim: int | str | None = None
    for number, kind, value in fields(buf):
        if number == 1:
            size = signed(_int(kind, value))
            dim = size if size >= 0 else None  # a negative size means dynamic, as in onnxruntime
        elif number == 2:
            dim = text(value) or None
        elif number != 3:  # denotation
            raise _NotLean
    return dim


def _check_wiring(model: LeanModel) -> None:
    """Inputs unique; each node reads graph inputs or earlier nodes' outputs; every graph output is made."""
    known = {v.name for v in model.inputs}
    if len(known) != len(model.inputs) or not model.nodes:
        raise _NotLean
    for node in model.nodes:
        if not node.inputs or not node.outputs or any(name not in known for name in node.inputs):
            raise _NotLean
        for name in node.outputs:
            if not name or name in known:
                raise _NotLean
            known.add(name)
    outputs = [v.name for v in model.outputs]
    if not outputs or len(set(outputs)) != len(outputs) or any(name not in known for name in outputs):
        raise _NotLean


def _opset(buf: memoryview) -> tuple[str, int]:
    domain, version = "", 0
    for number, kind, value in fields(buf):
        if number == 1:
            domain = text(value)
        elif number == 2:
            version = signed(_int(kind, value))
    return ("" if domain == "ai.onnx" else domain), version


def _entry(buf: memoryview) -> tuple[str, str]:
    key = val = ""
    for number, _, value in fields(buf):
        if number == 1:
            key = text(value)
        elif number == 2:
            val = text(value)
    return key, val


def _len(value: int | memoryview) -> memoryview:
    if not isinstance(value, memoryview):
        raise WireError("expected a message, found a varint")
    return value


def _int(kind: int, value: int | memoryview) -> int:
    if kind != VARINT or not isinstance(value, int):
        raise WireError("expected a varint")
    return value


def _float(value: int | memoryview) -> float:
    if not isinstance(value, memoryview) or len(value) != 4:
        raise WireError("expected a 32-bit float")
    return float(struct.unpack("<f", value)[0])


def _floats(kind: int, value: int | memoryview) -> list[float]:
    if kind == LEN and isinstance(value, memoryview) and len(value) % 4 == 0:  # packed
        return [float(x) for x in struct.unpack(f"<{len(value) // 4}f", value)]
    return [_float(value)]


def _ints(kind: int, value: int | memoryview) -> list[int]:
    if kind == LEN and isinstance(value, memoryview):  # packed
        return [signed(v) for v in varints(value)]
    return [signed(_int(kind, value))]


def _string(value: memoryview) -> str | bytes:
    """A STRING attribute value: text when UTF-8 (as onnx-ir gives it), else the raw bytes (payloads)."""
    raw = bytes(value)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw
