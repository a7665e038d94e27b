"""The model view: protocols that both loaders' objects satisfy (onnx-ir's and the lean reader's).

In the style of onnx-ir's ``_protocols.py``: what the stages after loading read of a value, a node, a graph
and a model, as read-only structural types. ``onnx_ir.Value`` / ``Node`` / ``Graph`` / ``Model`` satisfy
them, and so do ``epctx.model.lean``'s classes (``tests/typing_view.py`` has mypy check both), so a
``Partition``, a plan, feeds, node args and metadata are typed on these and each consumer is written once.

Numbers are ONNX's: ``dtype`` is a TensorProto.DataType (onnx-ir's ``DataType`` is an IntEnum with the same
values), an attribute's ``type`` an AttributeProto.AttributeType. A dimension is an int (>= 0; onnx-ir keeps
a negative size as written) or a symbolic dim whose ``value`` is its name, None when unnamed.

Only ``typing`` and ``collections.abc`` are imported: this module is on the lean load path."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Protocol

__all__ = ["AttrView", "DimView", "GraphView", "ModelView", "NodeView", "ShapeView", "ValueView"]


class DimView(Protocol):
    """A symbolic dimension: onnx-ir's SymbolicDim, the lean reader's LeanDim (equal to its name as str)."""

    @property
    def value(self) -> str | None: ...


class ShapeView(Protocol):
    """A shape: onnx-ir's Shape, the lean reader's tuple of dims."""

    def __len__(self) -> int: ...
    def __iter__(self) -> Iterator[int | DimView]: ...
    def __getitem__(self, index: int, /) -> int | DimView: ...


class ValueView(Protocol):
    """A value (graph input or output, node input or output). Hashable, compared by identity."""

    @property
    def name(self) -> str | None: ...
    @property
    def shape(self) -> ShapeView | None: ...
    @property
    def dtype(self) -> int | None: ...
    @property
    def type(self) -> Any: ...  # onnx-ir's TypeProtocol; the lean reader's LeanTensorType (tensors only)
    @property
    def const_value(self) -> Any: ...  # a tensor (onnx-ir's TensorProtocol) or None; always None when lean
    def producer(self) -> NodeView | None: ...


class AttrView(Protocol):
    """An attribute's value: ``type`` an AttributeProto.AttributeType number, ``value`` as onnx-ir gives it."""

    @property
    def type(self) -> int: ...
    @property
    def value(self) -> Any: ...
    @property
    def ref_attr_name(self) -> str | None: ...  # set on a reference to a function's attribute


class NodeView(Protocol):
    @property
    def name(self) -> str | None: ...
    @property
    def domain(self) -> str: ...
    @property
    def op_type(self) -> str: ...
    @property
    def inputs(self) -> Sequence[ValueView | None]: ...
    @property
    def outputs(self) -> Sequence[ValueView]: ...
    @property
    def attributes(self) -> Mapping[str, AttrView]: ...


class GraphView(Protocol):
    """A graph: its inputs, outputs and (iterating it) its nodes in topological order."""

    @property
    def name(self) -> str | None: ...
    @property
    def doc_string(self) -> str | None: ...
    @property
    def inputs(self) -> Sequence[ValueView]: ...
    @property
    def outputs(self) -> Sequence[ValueView]: ...
    def __iter__(self) -> Iterator[NodeView]: ...


class ModelView(Protocol):
    @property
    def graph(self) -> GraphView: ...
    @property
    def producer_name(self) -> str | None: ...
    @property
    def domain(self) -> str | None: ...
    @property
    def doc_string(self) -> str | None: ...
    @property
    def model_version(self) -> int | None: ...
    @property
    def opset_imports(self) -> Mapping[str, int]: ...
    @property
    def metadata_props(self) -> Mapping[str, str]: ...
