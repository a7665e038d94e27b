"""A test-only compiling EP: claims nodes by predicate and runs each compiled partition with CPU kernels.

``make_fusing_ep(claim)`` returns a fresh ExecutionProvider subclass (``compiles = True``). Its ``compile``
turns every Partition into a callable that really executes the partition's nodes (CPU kernels, in the
partition's order, over a dict of values) and records the Partition in the class attribute ``compiled`` so
tests can inspect what was fused. Register the class for a test with :func:`registered` (or
``epctx.providers.registry.register_provider_class``) and select it by ``cls.name``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import onnx_ir as ir

from epctx.ep._compiling import Capability, CapabilityContext, CompileContext
from epctx.ep._contract import CompiledPartition, ExecutionProvider, NodeContext, Partition, opset_of
from epctx.model.scopes import outer_scope_values
from epctx.providers import registry
from epctx.providers.cpu.provider import CPUExecutionProvider

__all__ = ["FusingEP", "make_fusing_ep", "registered"]


class _Interpreter:
    """Runs nodes in order with CPU kernels; subgraph attributes get runners built the same way."""

    def __init__(self, nodes: Sequence[ir.Node], opset_imports: Mapping[str, int]) -> None:
        self.opset_imports = dict(opset_imports)
        self.cpu = CPUExecutionProvider()
        self.steps = [self._step(node) for node in nodes]

    def _step(self, node: ir.Node) -> tuple[Any, tuple[ir.Value | None, ...], tuple[ir.Value, ...]]:
        outer = outer_scope_values(node)
        ctx = NodeContext(
            node=node,
            opset=opset_of(node, self.opset_imports),
            outer_values=outer,
            build_subgraph=self._build_subgraph,
        )
        return self.cpu.create_kernel(ctx), (*node.inputs, *outer), tuple(node.outputs)

    def _build_subgraph(self, graph: ir.Graph, outer: tuple[ir.Value, ...]) -> Callable[..., list[Any]]:
        inner = _Interpreter(list(graph), self.opset_imports)
        formal = tuple(graph.inputs)
        results = tuple(graph.outputs)

        def run(inputs: Sequence[Any], outer_args: Sequence[Any]) -> list[Any]:
            env: dict[ir.Value, Any] = dict(zip(formal, inputs))
            env.update(zip(outer, outer_args))
            inner.run(env)
            return [_lookup(env, v) for v in results]

        return run

    def run(self, env: dict[ir.Value, Any]) -> None:
        for fn, ins, outs in self.steps:
            values = fn(*[None if v is None else _lookup(env, v) for v in ins])
            env.update(zip(outs, values))


def _lookup(env: Mapping[ir.Value, Any], value: ir.Value) -> Any:
    if value in env:
        return env[value]
    if value.const_value is not None:
        return value.const_value.numpy()
    raise KeyError(f"value {value.name!r} is neither computed nor constant (partition inputs are incomplete)")


class FusingEP(ExecutionProvider):
    """Base of the classes ``make_fusing_ep`` creates (each has its own ``claim`` and ``compiled`` list)."""

    name: ClassVar[str] = "TestFusingExecutionProvider"
    compiles: ClassVar[bool] = True
    claim: ClassVar[Callable[[ir.Node], bool]]
    compiled: ClassVar[list[Partition]]
    calls: ClassVar[list[int]]  # the number of partitions of each compile call

    def get_capability(
        self, graph: ir.Graph, opset_imports: Mapping[str, int], ctx: CapabilityContext
    ) -> Capability:
        claim = type(self).claim
        return Capability(tuple(node for node in graph if claim(node)))

    def compile(self, partitions: Sequence[Partition], ctx: CompileContext) -> list[CompiledPartition]:
        type(self).compiled.extend(partitions)
        type(self).calls.append(len(partitions))
        return [_compile_one(p) for p in partitions]


def _compile_one(partition: Partition) -> CompiledPartition:
    interp = _Interpreter(partition.nodes, partition.opset_imports)
    inputs = partition.inputs
    outputs = partition.outputs
    constants = {v: v.const_value.numpy() for v in partition.initializers if v.const_value is not None}

    def run(*args: np.ndarray) -> list[np.ndarray]:
        if len(args) != len(inputs):
            raise TypeError(f"{partition.name}: {len(args)} inputs for {len(inputs)} partition inputs")
        env: dict[ir.Value, Any] = dict(constants)
        env.update(zip(inputs, args))
        interp.run(env)
        return [env[v] for v in outputs]

    return run


def make_fusing_ep(
    claim: Callable[[ir.Node], bool], name: str = "TestFusingExecutionProvider"
) -> type[FusingEP]:
    """A new compiling EP class named ``name`` that claims the nodes for which ``claim(node)`` is true."""
    return type(
        f"FusingEP_{name}",
        (FusingEP,),
        {"name": name, "claim": staticmethod(claim), "compiled": [], "calls": []},
    )


@contextlib.contextmanager
def registered(*classes: type[ExecutionProvider]) -> Iterator[None]:
    """Register EP classes for the duration of a block, then restore the registry as it was."""
    saved = dict(registry._REGISTERED)
    try:
        for cls in classes:
            registry.register_provider_class(cls)
        yield
    finally:
        registry._REGISTERED.clear()
        registry._REGISTERED.update(saved)
