"""The ``com.microsoft::EPContext`` op: constants and a typed, validated view of one node.

Attributes and defaults are those of ONNX Runtime's contrib op (see EP_CONTEXT_SPEC.md): ``main_context``
INT = 1, ``ep_cache_context`` STRING, ``embed_mode`` INT = 1, ``ep_sdk_version``, ``onnx_model_filename``,
``hardware_architecture``, ``partition_name``, ``source``, ``notes`` (STRING), ``max_size`` INT = 0. Unknown
extra attributes are kept (EPs add their own, e.g. QNN's ``is_multi_soc_ep_context``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from epctx.errors import InvalidGraph

if TYPE_CHECKING:
    import onnx_ir as ir

    from epctx.model.view import NodeView

__all__ = ["DOMAIN", "OP_TYPE", "OPSET_VERSION", "EPContextNode", "is_ep_context"]

DOMAIN = "com.microsoft"
OP_TYPE = "EPContext"
OPSET_VERSION = 1

_INT_ATTRS = {"main_context": 1, "embed_mode": 1, "max_size": 0}
_STRING_ATTRS = (
    "ep_cache_context",
    "ep_sdk_version",
    "onnx_model_filename",
    "hardware_architecture",
    "partition_name",
    "source",
    "notes",
)


# AttributeProto.AttributeType: the numbers both onnx-ir and the lean reader (epctx.model.lean) give.
_INT, _STRING = 2, 3
_TYPE_NAMES = dict(
    enumerate(
        [
            "UNDEFINED",
            "FLOAT",
            "INT",
            "STRING",
            "TENSOR",
            "GRAPH",
            "FLOATS",
            "INTS",
            "STRINGS",
            "TENSORS",
            "GRAPHS",
            "SPARSE_TENSOR",
            "SPARSE_TENSORS",
            "TYPE_PROTO",
            "TYPE_PROTOS",
        ]
    )
)


class _Node(Protocol):
    @property
    def op_type(self) -> str: ...
    @property
    def domain(self) -> str: ...


def is_ep_context(node: _Node) -> bool:
    return node.op_type == OP_TYPE and node.domain == DOMAIN


@dataclasses.dataclass(frozen=True, slots=True)
class EPContextNode:
    """One EPContext node, attributes typed and checked. ``ep_cache_context`` stays bytes: with
    embed_mode=1 it is the binary itself, with embed_mode=0 the (UTF-8) relative path of the binary."""

    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    main_context: int = 1
    ep_cache_context: bytes | None = None
    embed_mode: int = 1
    ep_sdk_version: str | None = None
    onnx_model_filename: str | None = None
    hardware_architecture: str | None = None
    partition_name: str | None = None
    source: str | None = None
    notes: str | None = None
    max_size: int = 0
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_node(cls, node: NodeView) -> EPContextNode:
        """Read and validate ``node`` (either loader's); a wrong type or value is InvalidGraph naming the node
        and attribute."""
        where = f"EPContext node {node.name!r}"
        if not is_ep_context(node):
            raise InvalidGraph(f"{where} is {node.domain}::{node.op_type}, not {DOMAIN}::{OP_TYPE}")
        attributes: dict[str, tuple[int, Any]] = {}
        for name, attr in node.attributes.items():
            if attr.ref_attr_name is not None:
                raise InvalidGraph(f"{where}: attribute {name!r} is a reference, expected a value")
            attributes[name] = (int(attr.type), attr.value)
        return cls.from_parts(
            node.name or "",
            tuple(v.name or "" if v is not None else "" for v in node.inputs),
            tuple(v.name or "" for v in node.outputs),
            attributes,
        )

    @classmethod
    def from_parts(
        cls,
        name: str,
        inputs: Sequence[str],
        outputs: Sequence[str],
        attributes: Mapping[str, tuple[int, Any]],
    ) -> EPContextNode:
        """Read and validate a node given as names and attributes (AttributeProto type number, value as onnx-ir
        gives it): the one place where attribute types and values are checked, for either loader."""
        where = f"EPContext node {name!r}"
        if not inputs or not outputs:
            raise InvalidGraph(f"{where} must have at least one input and one output")
        values: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        for key, (kind, raw) in attributes.items():
            if key in _INT_ATTRS:
                if kind != _INT:
                    raise InvalidGraph(f"{where}: attribute {key!r} must be INT, found {_type_name(kind)}")
                values[key] = int(raw)
            elif key in _STRING_ATTRS:
                if kind != _STRING:
                    raise InvalidGraph(f"{where}: attribute {key!r} must be STRING, found {_type_name(kind)}")
                if key == "ep_cache_context":
                    values[key] = raw if isinstance(raw, bytes) else str(raw).encode()
                else:
                    values[key] = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
            else:
                extra[key] = raw
        view = cls(name=name, inputs=tuple(inputs), outputs=tuple(outputs), extra=extra, **values)
        view.validate()
        return view

    def validate(self) -> None:
        where = f"EPContext node {self.name!r}"
        if self.main_context not in (0, 1):
            raise InvalidGraph(f"{where}: main_context must be 0 or 1, found {self.main_context}")
        if self.embed_mode not in (0, 1):
            raise InvalidGraph(f"{where}: embed_mode must be 0 or 1, found {self.embed_mode}")
        if self.main_context == 1 and not self.ep_cache_context:
            raise InvalidGraph(f"{where}: main_context=1 requires a non-empty ep_cache_context")
        if self.main_context == 0 and not self.partition_name:
            raise InvalidGraph(f"{where}: main_context=0 requires partition_name (the graph it runs)")
        if not self.source:
            raise InvalidGraph(f"{where}: attribute 'source' (the EP that made it) is missing")

    @property
    def cache_path(self) -> str:
        """With embed_mode=0: the binary's path relative to the model folder."""
        if self.embed_mode != 0 or self.ep_cache_context is None:
            raise InvalidGraph(f"EPContext node {self.name!r} embeds its binary; it has no path")
        try:
            return self.ep_cache_context.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidGraph(f"EPContext node {self.name!r}: ep_cache_context is not a UTF-8 path") from exc

    def attributes(self) -> list[ir.Attr]:
        """The node's attributes in a fixed order (deterministic output), defaults included."""
        import onnx_ir as ir

        attrs = [ir.AttrInt64("main_context", self.main_context)]
        if self.ep_cache_context is not None:
            # Binary payloads (embed_mode=1) are not UTF-8; onnx-ir keeps bytes as they are.
            attrs.append(ir.Attr("ep_cache_context", ir.AttributeType.STRING, self.ep_cache_context))
        attrs.append(ir.AttrInt64("embed_mode", self.embed_mode))
        for name in ("ep_sdk_version", "onnx_model_filename", "hardware_architecture", "partition_name"):
            value = getattr(self, name)
            if value is not None:
                attrs.append(ir.AttrString(name, value))
        if self.source is not None:
            attrs.append(ir.AttrString("source", self.source))
        if self.notes is not None:
            attrs.append(ir.AttrString("notes", self.notes))
        if self.max_size:
            attrs.append(ir.AttrInt64("max_size", self.max_size))
        return attrs

    def to_ir(self, inputs: Sequence[ir.Value], outputs: Sequence[ir.Value]) -> ir.Node:
        """A node for a new graph; ``outputs`` must be fresh values (not produced by another node)."""
        import onnx_ir as ir

        return ir.Node(DOMAIN, OP_TYPE, inputs, attributes=self.attributes(), outputs=outputs, name=self.name)


def _type_name(kind: int) -> str:
    return _TYPE_NAMES.get(kind, str(kind))
