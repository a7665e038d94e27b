"""CPUExecutionProvider: a kernel EP that claims every node it has a kernel for."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from epctx import errors
from epctx.ep import (
    Capability,
    CapabilityContext,
    ExecutionProvider,
    Kernel,
    NodeContext,
    blas_thread_limit,
    opset_of,
    settle_backends,
)
from epctx.errors import InvalidArgument, NotImplemented

if TYPE_CHECKING:
    import onnx_ir as ir

__all__ = ["CPUExecutionProvider"]


class CPUExecutionProvider(ExecutionProvider):
    """Option ``intra_op_num_threads`` (a positive integer; the framework passes
    ``SessionOptions.intra_op_num_threads`` here): numpy's BLAS threads during each run (threadpoolctl; at 1,
    numpy's OpenBLAS set directly where it is one, ``blas_serial.one_thread``)."""

    name = "CPUExecutionProvider"
    intra_op_threads_option = "intra_op_num_threads"

    def __init__(self, options: Mapping[str, str] | None = None) -> None:
        super().__init__(options)
        self._threads = _thread_count(self.options.get(self.intra_op_threads_option))

    def run_scope(self) -> contextlib.AbstractContextManager[Any] | None:
        if self._threads == 1:
            from epctx.providers.cpu.blas_serial import one_thread

            scope = one_thread()  # numpy's OpenBLAS through two ctypes calls, not threadpoolctl
            if scope is not None:
                return scope
        return blas_thread_limit(self._threads) if self._threads else None

    def get_capability(
        self, graph: ir.Graph, opset_imports: Mapping[str, int], ctx: CapabilityContext
    ) -> Capability:
        settle_backends()  # Conv, RNN, Einsum... call BLAS too: not while a backend the user imported still forks
        return Capability(tuple(n for n in graph if self.supports(n, opset_imports)))

    def supports(self, node: ir.Node, opset_imports: Mapping[str, int]) -> bool:
        from epctx.providers.cpu.reference import has_reference
        from epctx.providers.cpu.registry import find_factory

        domain = node.domain or ""
        opset = opset_of(node, opset_imports)
        return find_factory(domain, node.op_type, opset) is not None or has_reference(node, opset)

    def create_kernel(self, ctx: NodeContext) -> Kernel:
        from epctx.providers.cpu import squeeze
        from epctx.providers.cpu.chains import head_kernel
        from epctx.providers.cpu.fusion import join
        from epctx.providers.cpu.layout import built
        from epctx.providers.cpu.reference import reference_kernel
        from epctx.providers.cpu.registry import NodeInfo, find_factory

        info = NodeInfo(ctx)
        factory = find_factory(info.domain, info.op_type, info.opset)
        if factory is not None:
            built(ctx.node)
            return squeeze.join(ctx.node, join(ctx.node, head_kernel(ctx.node, factory(info))))
        try:
            return reference_kernel(info)
        except NotImplemented:
            raise
        except Exception as exc:
            raise errors.NotImplemented(
                f"CPU kernel for node {info.name!r} ({info.op_type}, domain {info.domain or 'ai.onnx'!r}, "
                f"opset {info.opset}) could not be created: {exc}"
            ) from exc


def _thread_count(value: str | None) -> int:
    if value is None:
        return 0
    try:
        count = int(value)
    except ValueError:
        count = -1
    if count < 0:
        raise InvalidArgument(
            f"CPUExecutionProvider option intra_op_num_threads must be an integer >= 0, got {value!r}"
        )
    return count
