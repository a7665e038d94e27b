"""The session's side of the measured rule (``epctx.partition.measured``): the nodes of a compiled partition run
on the kernel EP, as a plan of their own, for the rule to time them against the compiled partition."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from epctx.ep._contract import Partition
from epctx.ep._partition import ir_nodes
from epctx.session.builder import StepBuilder
from epctx.session.plan import build_plan

__all__ = ["kernel_runner"]


def kernel_runner(builder: StepBuilder) -> Callable[[Partition], Callable[..., Sequence[Any]]]:
    """partition -> a callable running its nodes on ``builder.kernel_ep`` (one array per partition input)."""

    def runner(partition: Partition) -> Callable[..., Sequence[Any]]:
        steps = [builder.node_step(builder.kernel_ep, node) for node in ir_nodes(partition.nodes)]
        plan = build_plan(partition.inputs, partition.outputs, steps, fold_constants=builder.fold)
        return lambda *inputs: plan.run(inputs)

    return runner
