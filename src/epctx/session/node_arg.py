"""NodeArg and ModelMetadata: what get_inputs() / get_outputs() / get_modelmeta() return."""

from __future__ import annotations

import dataclasses

import onnx_ir as ir

__all__ = ["ModelMetadata", "NodeArg", "node_arg", "type_string"]


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


_ELEM_NAMES = {
    ir.DataType.FLOAT: "float",
    ir.DataType.DOUBLE: "double",
    ir.DataType.FLOAT16: "float16",
    ir.DataType.BFLOAT16: "bfloat16",
    ir.DataType.INT8: "int8",
    ir.DataType.INT16: "int16",
    ir.DataType.INT32: "int32",
    ir.DataType.INT64: "int64",
    ir.DataType.UINT8: "uint8",
    ir.DataType.UINT16: "uint16",
    ir.DataType.UINT32: "uint32",
    ir.DataType.UINT64: "uint64",
    ir.DataType.BOOL: "bool",
    ir.DataType.STRING: "string",
    ir.DataType.COMPLEX64: "complex64",
    ir.DataType.COMPLEX128: "complex128",
}


def type_string(t: ir.TypeProtocol | None) -> str:
    """onnxruntime's spelling: tensor(float), seq(tensor(int64)), optional(tensor(float)), map(...)."""
    if t is None:
        return "unknown"
    if isinstance(t, ir.TensorType):
        return f"tensor({_ELEM_NAMES.get(t.dtype, t.dtype.name.lower())})"
    if isinstance(t, ir.SparseTensorType):
        return f"sparse_tensor({_ELEM_NAMES.get(t.dtype, t.dtype.name.lower())})"
    if isinstance(t, ir.SequenceType):
        return f"seq({type_string(t.elem_type)})"
    if isinstance(t, ir.OptionalType):
        return f"optional({type_string(t.elem_type)})"
    return str(t)


def node_arg(value: ir.Value) -> NodeArg:
    shape: list[int | str | None] | None = None
    if value.shape is not None:
        shape = []
        for dim in value.shape:
            if isinstance(dim, int):
                shape.append(dim if dim >= 0 else None)  # a negative size means dynamic
            else:
                shape.append(dim.value if getattr(dim, "value", None) is not None else None)
    return NodeArg(name=value.name or "", type=type_string(value.type), shape=shape)
