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
import weakref
from collections.abc import Iterator, Mapping

from epctx.model.wire import LEN, VARINT, WireError, fields, signed, text, varints

__all__ = [
    "LeanAttribute",
    "LeanDim",
    "LeanGraph",
    "LeanModel",
    "LeanNode",
    "LeanTensorType",
    "LeanValue",
    "read_context_model",
]

_EP_CONTEXT = ("com.microsoft", "EPContext")
_PAYLOAD = "ep_cache_context"  # bytes on both load paths: a binary or the UTF-8 path of one
# IR versions taken here: those of the onnx releases epctx supports (onnx 1.23 writes and checks IR 14);
# anything else goes to the full loader, whose onnx checks decide.
_IR_VERSIONS = range(3, 15)

# AttributeProto.AttributeType values this reader keeps (others send the model to the full loader).
_FLOAT, _INT, _STRING, _FLOATS, _INTS, _STRINGS = 1, 2, 3, 6, 7, 8


class _NotLean(Exception):
    """The model needs the full loader (not an error: the full loader decides)."""


# Plain slotted classes rather than dataclasses: this module is on the path of every process that loads a
# context model, and building a frozen, slotted dataclass costs about 0.8 ms at import. Each satisfies its
# protocol of ``epctx.model.view`` (checked by mypy in tests/typing_view.py), as onnx-ir's classes do.
class LeanDim:
    """A symbolic dimension (``view.DimView``): equal to its name, as onnx-ir's SymbolicDim is."""

    __slots__ = ("value",)

    def __init__(self, value: str | None) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        if other is None or isinstance(other, str):
            return self.value == other
        return self.value == getattr(other, "value", self)  # another symbolic dim (onnx-ir's SymbolicDim)

    def __hash__(self) -> int:
        return hash(self.value)

    def __repr__(self) -> str:
        return f"LeanDim({self.value!r})"


class LeanTensorType:
    """A tensor type (the lean reader takes tensor inputs and outputs only): ``dtype`` as ONNX numbers it."""

    __slots__ = ("dtype",)

    def __init__(self, dtype: int) -> None:
        self.dtype = dtype

    def __repr__(self) -> str:
        return f"LeanTensorType({self.dtype})"


class LeanValue:
    """A value (``view.ValueView``): ``dtype`` ONNX's TensorProto.DataType (None when not known: an
    intermediate value), ``shape`` None when unranked, each dim an int (>= 0) or a LeanDim. Compared by
    identity, as onnx-ir values are."""

    # The producer is held weakly: a node holds its values, so a strong back reference would make every node and
    # its values a reference cycle, freed only by the cyclic collector, late (and with them the EPContext
    # payload a backend may still map: 10,000 sessions grew RSS by ~18 KiB each).
    __slots__ = ("_producer", "dtype", "name", "shape")
    const_value = None  # never a constant here

    def __init__(self, name: str, dtype: int | None, shape: tuple[int | LeanDim, ...] | None) -> None:
        self.name = name
        self.dtype = dtype
        self.shape = shape
        self._producer: weakref.ref[LeanNode] | None = None

    @property
    def type(self) -> LeanTensorType | None:
        return None if self.dtype is None else LeanTensorType(self.dtype)

    def producer(self) -> LeanNode | None:
        return None if self._producer is None else self._producer()

    def __repr__(self) -> str:
        return f"LeanValue({self.name!r}, {self.dtype}, {self.shape!r})"


class LeanAttribute:
    """An attribute as onnx-ir gives it (``view.AttrView``): ``type`` is AttributeProto's type number; STRING
    values are ``str`` when UTF-8, else ``bytes``; ``ep_cache_context`` is always ``bytes`` (as the full
    loader keeps it)."""

    __slots__ = ("type", "value")
    ref_attr_name = None  # never a reference (function attributes are the full loader's business)

    def __init__(self, type: int, value: object) -> None:
        self.type = type
        self.value = value

    def __repr__(self) -> str:
        return f"LeanAttribute({self.type}, {self.value!r})"


class LeanNode:
    """A node (``view.NodeView``); its inputs and outputs are the graph's LeanValue objects."""

    __slots__ = ("__weakref__", "attributes", "domain", "inputs", "name", "op_type", "outputs")

    def __init__(
        self,
        name: str,
        domain: str,
        op_type: str,
        inputs: tuple[LeanValue, ...],
        outputs: tuple[LeanValue, ...],
        attributes: Mapping[str, LeanAttribute],
    ) -> None:
        self.name = name
        self.domain = domain
        self.op_type = op_type
        self.inputs = inputs
        self.outputs = outputs
        self.attributes = attributes

    def __repr__(self) -> str:
        names = (tuple(v.name for v in self.inputs), tuple(v.name for v in self.outputs))
        return f"LeanNode({self.name!r}, {self.domain}::{self.op_type}, {names[0]} -> {names[1]})"


class LeanGraph:
    """The graph (``view.GraphView``): iterating it gives its nodes in order."""

    __slots__ = ("doc_string", "inputs", "name", "nodes", "outputs")

    def __init__(self) -> None:
        self.name = ""
        self.doc_string = ""
        self.inputs: list[LeanValue] = []
        self.outputs: list[LeanValue] = []
        self.nodes: list[LeanNode] = []

    def __iter__(self) -> Iterator[LeanNode]:
        return iter(self.nodes)


class LeanModel:
    """What a session needs of the model (``view.ModelView``)."""

    __slots__ = (
        "doc_string",
        "domain",
        "graph",
        "ir_version",
        "metadata_props",
        "model_version",
        "opset_imports",
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
        self.graph = LeanGraph()


# A node as read, before its names are wired to values: name, domain, op type, input and output names,
# attributes.
_RawNode = tuple[str, str, str, tuple[str, ...], tuple[str, ...], dict[str, "LeanAttribute"]]


def read_context_model(data: bytes | memoryview) -> LeanModel | None:
    """The model, when it is a context model this reader takes whole; None sends it to the full loader."""
    try:
        return _model(memoryview(data))
    except (WireError, _NotLean, RecursionError):
        return None


def _model(buf: memoryview) -> LeanModel:
    numbers: dict[int, int] = {}  # ir_version, model_version
    texts: dict[int, str] = {}  # producer name and version, domain, doc string
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
            numbers[number] = signed(_int(kind, value))
        elif number in (2, 3, 4, 6):
            texts[number] = text(value)
        else:  # training info, functions, configuration...: the full loader's business
            raise _NotLean
    ir_version = numbers.get(1, 0)
    if graph is None or ir_version not in _IR_VERSIONS or opsets.get(_EP_CONTEXT[0], 0) < 1:
        raise _NotLean
    model = LeanModel(
        ir_version=ir_version,
        producer_name=texts.get(2, ""),
        domain=texts.get(4, ""),
        model_version=numbers.get(5, 0),
        doc_string=texts.get(6, ""),
        opset_imports=opsets,
        metadata_props=metadata,
    )
    _wire(model.graph, _graph(graph, model.graph))
    return model


def _graph(buf: memoryview, graph: LeanGraph) -> list[_RawNode]:
    nodes: list[_RawNode] = []
    for number, _, value in fields(buf):
        if number == 1:
            nodes.append(_node(_len(value)))
        elif number == 2:
            graph.name = text(value)
        elif number == 10:
            graph.doc_string = text(value)
        elif number == 11:
            graph.inputs.append(_value_info(_len(value)))
        elif number == 12:
            graph.outputs.append(_value_info(_len(value)))
        elif number == 13:
            continue  # value_info of intermediate values: not needed to run EPContext nodes
        else:  # initializers, sparse initializers, annotations: the full loader's business
            raise _NotLean
    return nodes


def _node(buf: memoryview) -> _RawNode:
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
    return name, domain, op_type, tuple(inputs), tuple(outputs), attributes


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
            scalars[4] = _len(value)  # decoded below: the payload stays bytes
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
    return name, _attribute_value(name, kind_of, scalars, repeated)


def _attribute_value(
    name: str, kind_of: int, scalars: dict[int, object], repeated: list[object]
) -> LeanAttribute:
    """The value of an attribute read by ``_attribute``: one scalar field or one repeated kind, as declared."""
    scalar_field = {_FLOAT: 2, _INT: 3, _STRING: 4}.get(kind_of)
    if scalar_field is not None:
        if repeated or set(scalars) - {scalar_field}:
            raise _NotLean
        default: object = {_FLOAT: 0.0, _INT: 0, _STRING: ""}[kind_of]
        found = scalars.get(scalar_field, default)
        if isinstance(found, memoryview):  # a payload is bytes, as the full loader gives it (never decoded)
            found = bytes(found) if name == _PAYLOAD else _string(found)
        return LeanAttribute(kind_of, found)
    if kind_of in (_FLOATS, _INTS, _STRINGS) and not scalars:
        return LeanAttribute(kind_of, repeated)
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


def _tensor_type(buf: memoryview) -> tuple[int, tuple[int | LeanDim, ...] | None]:
    tensor: memoryview | None = None
    for number, _, value in fields(buf):
        if number == 1 and tensor is None:
            tensor = _len(value)
        elif number != 6:  # denotation; sequences, maps, optionals... go to the full loader
            raise _NotLean
    if tensor is None:
        raise _NotLean
    elem_type = 0
    dims: tuple[int | LeanDim, ...] | None = None
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


def _dim(buf: memoryview) -> int | LeanDim:
    dim: int | str | None = None
    for number, kind, value in fields(buf):
        if number == 1:
            size = signed(_int(kind, value))
            dim = size if size >= 0 else None  # a negative size means dynamic, as in onnxruntime
        elif number == 2:
            dim = text(value) or None
        elif number != 3:  # denotation
            raise _NotLean
    return dim if isinstance(dim, int) else LeanDim(dim)


def _wire(graph: LeanGraph, raw: list[_RawNode]) -> None:
    """Nodes made of values, as onnx-ir's: inputs unique; each node reads graph inputs or earlier nodes'
    outputs; every graph output is a graph input or a node's output value (its producer set)."""
    known = {v.name: v for v in graph.inputs}
    if len(known) != len(graph.inputs) or not raw:
        raise _NotLean
    declared = {v.name: v for v in graph.outputs}
    if not declared or len(declared) != len(graph.outputs):
        raise _NotLean
    for name, domain, op_type, input_names, output_names, attributes in raw:
        if not input_names or not output_names or any(n not in known for n in input_names):
            raise _NotLean
        outputs: list[LeanValue] = []
        for n in output_names:
            if not n or n in known:
                raise _NotLean
            known[n] = declared.get(n) or LeanValue(n, None, None)
            outputs.append(known[n])
        node = LeanNode(
            name, domain, op_type, tuple(known[n] for n in input_names), tuple(outputs), attributes
        )
        for value in outputs:
            value._producer = weakref.ref(node)
        graph.nodes.append(node)
    if any(name not in known for name in declared):
        raise _NotLean
    graph.outputs = [known[v.name] for v in graph.outputs]  # a graph input read out: the input's value


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
