"""Kernel registry of the CPU EP: ``@kernel("Op", since=N)`` registers a factory for opsets >= N."""

from __future__ import annotations

import bisect
import importlib
from collections.abc import Callable
from typing import Any

import onnx_ir as ir

from epctx.ep import Kernel, NodeContext, to_numpy
from epctx.providers.cpu.kernel_index import module_for

__all__ = ["NodeInfo", "find_factory", "kernel"]

Factory = Callable[["NodeInfo"], Kernel]

# (domain, op_type) -> sorted list of (since_version, factory)
_REGISTRY: dict[tuple[str, str], list[tuple[int, Factory]]] = {}


def kernel(*op_types: str, domain: str = "", since: int = 1) -> Callable[[Factory], Factory]:
    """Register ``factory`` for ``op_types`` in ``domain`` from opset ``since`` on."""

    def register(factory: Factory) -> Factory:
        for op_type in op_types:
            entries = _REGISTRY.setdefault((domain, op_type), [])
            bisect.insort(entries, (since, factory), key=lambda e: e[0])
        return factory

    return register


def find_factory(domain: str, op_type: str, opset: int) -> Factory | None:
    """The own kernel factory for ``op_type`` at ``opset``, or None (the reference fallback takes it). The
    kernel's module is imported on first use (``kernel_index``), so a session imports the kernels it runs."""
    key = (_norm_domain(domain), op_type)
    if key not in _REGISTRY:
        module = module_for(*key)
        if module is None:
            return None
        importlib.import_module(module)  # registers its kernels
    entries = _REGISTRY.get(key)
    if not entries:
        return None
    best = None
    for since, factory in entries:
        if since <= opset:
            best = factory
    return best


def _norm_domain(domain: str) -> str:
    return "" if domain == "ai.onnx" else domain


def _attr_value(attr: ir.Attr) -> Any:
    value = attr.value
    if attr.type == ir.AttributeType.TENSOR:
        return to_numpy(value)
    if attr.type in (ir.AttributeType.INTS, ir.AttributeType.FLOATS, ir.AttributeType.STRINGS):
        return list(value)
    if attr.type == ir.AttributeType.TENSORS:
        return [t.numpy() for t in value]
    return value


class NodeInfo:
    """A node as a kernel factory sees it: attributes already converted to Python values."""

    __slots__ = ("attrs", "ctx", "domain", "name", "node", "num_inputs", "num_outputs", "op_type", "opset")

    def __init__(self, ctx: NodeContext) -> None:
        node = ctx.node
        self.ctx = ctx
        self.node = node
        self.op_type = node.op_type
        self.domain = _norm_domain(node.domain)
        self.name = node.name or ""
        self.opset = ctx.opset
        self.num_inputs = len(node.inputs)
        self.num_outputs = len(node.outputs)
        self.attrs: dict[str, Any] = {
            name: _attr_value(attr) for name, attr in node.attributes.items() if isinstance(attr, ir.Attr)
        }

    def get(self, name: str, default: Any = None) -> Any:
        return self.attrs.get(name, default)

    def has_input(self, i: int) -> bool:
        """True when optional input ``i`` is present (not omitted with an empty name)."""
        return i < self.num_inputs and self.node.inputs[i] is not None

    def has_output(self, i: int) -> bool:
        return i < self.num_outputs and bool(self.node.outputs[i].name)

    def const_input(self, i: int) -> Any:
        """The numpy value of input ``i`` when it is an initializer or constant, else None: None too for an
        initializer that is also a graph input, which a feed may replace (onnxruntime runs with the fed value)."""
        if i >= self.num_inputs:
            return None
        value = self.node.inputs[i]
        if value is None or value.is_graph_input():
            return None
        if value.const_value is not None:
            return to_numpy(value.const_value)
        return constant_node_value(value)


def constant_node_value(value: ir.Value) -> Any:
    """The tensor of a ``Constant`` node (its ``value`` attribute) that produces ``value``, else None: Paddle
    exports give their weights so, not as initializers."""
    node = value.producer()
    if node is None or node.op_type != "Constant" or node.domain not in ("", "ai.onnx"):
        return None
    attr = node.attributes.get("value")
    if not isinstance(attr, ir.Attr) or attr.type != ir.AttributeType.TENSOR:
        return None
    return to_numpy(attr.value)
