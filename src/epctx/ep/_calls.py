"""The framework's side of the contract: how it asks an EP for its capability and has it compile.

:func:`compile_partitions` is the single compile point: every ``ExecutionProvider.compile`` call goes through
it, after the guard. EPs written against the first contract (``get_capability(graph, opset_imports)``
returning nodes, an optional ``declined_nodes()``, ``compile(partitions)``) are called through the same two
functions, adapted by their signatures.
"""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from epctx.ep._compiling import Capability, CapabilityContext, CompileContext
from epctx.errors import Fail

if TYPE_CHECKING:
    import onnx_ir as ir

    from epctx.ep._contract import CompiledPartition, ExecutionProvider, Partition

__all__ = ["ask_capability", "compile_partitions"]


@functools.cache
def _takes_context(method: Callable[..., Any], positional: int) -> bool:
    """Whether ``method`` (an EP class's function) takes a context after its ``positional`` arguments."""
    try:
        params = list(inspect.signature(method).parameters.values())[1:]  # without self
    except (TypeError, ValueError):
        return True
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params):
        return True
    return sum(p.kind in kinds for p in params) > positional


def ask_capability(
    ep: ExecutionProvider, graph: ir.Graph, opset_imports: Mapping[str, int], ctx: CapabilityContext
) -> Capability:
    """``ep.get_capability`` as a :class:`Capability` value, whichever contract the EP implements."""
    if _takes_context(type(ep).get_capability, 2):
        result = ep.get_capability(graph, opset_imports, ctx)
    else:  # the first contract: nodes, and the reasons through declined_nodes()
        result = ep.get_capability(graph, opset_imports)  # type: ignore[call-arg]
    if isinstance(result, Capability):
        return result
    declined = getattr(ep, "declined_nodes", None)
    return Capability(tuple(result), dict(declined()) if callable(declined) else {})


def compile_partitions(
    ep: ExecutionProvider, partitions: Sequence[Partition], ctx: CompileContext
) -> list[CompiledPartition]:
    """The single compile point: the guard, then ``ep.compile`` with all the partitions at once; each partition
    the EP did not report through ``ctx.progress`` is reported when it returns."""
    ctx.guard.check(ep.name, len(partitions))
    reported: set[str] = set()
    lock = threading.Lock()  # an EP may report from its compile threads

    def progress(partition: Partition) -> None:
        with lock:
            if partition.name not in reported:
                reported.add(partition.name)
                ctx.progress(partition)

    call = CompileContext(ctx.guard, ctx.artefacts, progress, ctx.target)
    if _takes_context(type(ep).compile, 1):
        results = list(ep.compile(partitions, call))
    else:  # the first contract
        results = list(ep.compile(partitions))  # type: ignore[call-arg]
    if len(results) != len(partitions):
        raise Fail(f"{ep.name}.compile returned {len(results)} results for {len(partitions)} partition(s)")
    for partition in partitions:
        progress(partition)
    return results
