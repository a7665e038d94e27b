"""NodeArg and ModelMetadata: what get_inputs() / get_outputs() / get_modelmeta() return."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from epctx.model.view import ModelView, ValueView

__all__ = [
    "ModelMetadata",
    "NodeArg",
    "is_tensor_type",
    "model_metadata",
    "node_arg",
    "tensor_type_string",
    "type_string",
]


@dataclasses.dataclass(frozen=True, slots=True)
class NodeArg:
    name: str
    type: str
    shape: list[int | str | None] | None

    def __repr__(self) -> str:
        return f"NodeArg(name={self.name!r}, type={self.type!r}, shape={self.shape!r})"


@dataclasses.dataclass(frozen=True, slots=True)
class ModelMetadata:
    producer_name: str
    graph_name: str
    domain: str
    description: str
    graph_description: str
    version: int
    custom_metadata_map: dict[str, str]


# ONNX TensorProto.DataType numbers (onnx-ir's DataType has the same values) -> onnxruntime's spelling.
_ELEM_NAMES = {
    1: "float",
    2: "uint8",
    3: "int8",
    4: "uint16",
    5: "int16",
    6: "int32",
    7: "int64",
    8: "string",
    9: "bool",
    10: "float16",
    11: "double",
    12: "uint32",
    13: "uint64",
    14: "complex64",
    15: "complex128",
    16: "bfloat16",
}


def tensor_type_string(elem_type: int, fallback: str = "") -> str:
    """``tensor(float)`` for ONNX element type 1."""
    return f"tensor({_ELEM_NAMES.get(int(elem_type), fallback or str(elem_type))})"


def is_tensor_type(t: object) -> bool:
    """Whether a value's ``type`` (either loader's) is a tensor type; onnx-ir is asked only for its own."""
    from epctx.model.lean import LeanTensorType

    if t is None or isinstance(t, LeanTensorType):
        return t is not None
    import onnx_ir as ir

    return isinstance(t, ir.TensorType)


def type_string(t: object) -> str:
    """onnxruntime's spelling: tensor(float), seq(tensor(int64)), optional(tensor(float)), map(...)."""
    from epctx.model.lean import LeanTensorType

    if t is None:
        return "unknown"
    if isinstance(t, LeanTensorType):  # the lean reader's: no onnx-ir
        return tensor_type_string(t.dtype)
    import onnx_ir as ir

    if isinstance(t, ir.TensorType):
        return tensor_type_string(t.dtype, t.dtype.name.lower())
    if isinstance(t, ir.SparseTensorType):
        return f"sparse_tensor({_ELEM_NAMES.get(t.dtype, t.dtype.name.lower())})"
    if isinstance(t, ir.SequenceType):
        return f"seq({type_string(t.elem_type)})"
    if isinstance(t, ir.OptionalType):
        return f"optional({type_string(t.elem_type)})"
    return str(t)


def node_arg(value: ValueView) -> NodeArg:
    """get_inputs() / get_outputs()'s entry for a value of either loader."""
    shape: list[int | str | None] | None = None
    if value.shape is not None:
        shape = []
        for dim in value.shape:
            if isinstance(dim, int):
                shape.append(dim if dim >= 0 else None)  # a negative size means dynamic
            else:
                shape.append(dim.value)
    return NodeArg(name=value.name or "", type=type_string(value.type), shape=shape)


def model_metadata(model: ModelView) -> ModelMetadata:
    """get_modelmeta()'s answer for a model of either loader."""
    return ModelMetadata(
        producer_name=model.producer_name or "",
        graph_name=model.graph.name or "",
        domain=model.domain or "",
        description=model.doc_string or "",
        graph_description=model.graph.doc_string or "",
        version=model.model_version or 0,
        custom_metadata_map=dict(model.metadata_props),
    )
