"""The prepared session: the last stage's value, what both load paths hand ``InferenceSession`` (which adopts it in
one method). Imports nothing of onnx, onnx-ir or the partitioner: the lean path builds it too."""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from epctx.session.feeds import InputSpec
from epctx.session.node_arg import ModelMetadata, NodeArg, model_metadata, node_arg
from epctx.session.plan import ExecutionPlan

if TYPE_CHECKING:
    from epctx.model import LoadedModel
    from epctx.model.view import ModelView
    from epctx.partition.placement import NodePlacement

__all__ = ["Partitions", "PreparedSession", "prepare"]

# Where the graph runs, one entry per step: (EP name, names of the nodes it runs).
Partitions = tuple[tuple[str, tuple[str, ...]], ...]


@dataclasses.dataclass(frozen=True, slots=True)
class PreparedSession:
    """A session ready to run, as either load path made it: the plan, the model's interface, where each node
    runs and why. Made by ``prepare``; read, never changed, by ``InferenceSession``."""

    plan: ExecutionPlan
    inputs: tuple[NodeArg, ...]  # the graph inputs that are not initializers
    outputs: tuple[NodeArg, ...]
    overridable: tuple[NodeArg, ...]  # the initializers that are graph inputs too (a feed may replace them)
    specs: tuple[InputSpec, ...]  # what each graph input's feed is checked against, in graph order
    partitions: Partitions
    # node name -> {EP name: why that EP declined it} (the node runs on a later EP)
    declined: Mapping[str, Mapping[str, str]]
    metadata: ModelMetadata
    # Where each node runs (``InferenceSession.get_node_placement``); None on the lean path, where it is made
    # from ``partitions`` when asked (a context model's EPContext nodes), so that loading imports no onnx-ir.
    placement: tuple[NodePlacement, ...] | None
    loaded: LoadedModel | None  # the model as the full loader loaded it; None on the lean path
    output_index: Mapping[str, int]  # output name -> its position among the outputs

    def node_placement(self) -> tuple[NodePlacement, ...]:
        """Where each node runs: the full path's placement, or a context model's EPContext nodes on their EPs."""
        if self.placement is not None:
            return self.placement
        from epctx.partition.placement import NodePlacement

        return tuple(
            NodePlacement(
                index=k,
                name=nodes[0],
                op_type="EPContext",
                domain="com.microsoft",
                provider=ep,
                partition=nodes[0],
            )
            for k, (ep, nodes) in enumerate(self.partitions)
        )


def prepare(
    model: ModelView,
    plan: ExecutionPlan,
    partitions: Sequence[tuple[str, Sequence[str]]],
    *,
    declined: Mapping[str, Mapping[str, str]] | None = None,
    placement: Sequence[NodePlacement] | None = None,
    loaded: LoadedModel | None = None,
) -> PreparedSession:
    """The prepared session over ``model`` (either loader's) and its ``plan``: the interface read from the
    model's graph once, here, for both load paths."""
    graph = model.graph
    inputs: list[NodeArg] = []
    overridable: list[NodeArg] = []
    for v in graph.inputs:
        (inputs if v.const_value is None else overridable).append(node_arg(v))
    outputs = tuple([node_arg(v) for v in graph.outputs])
    reasons = {node: types.MappingProxyType(dict(why)) for node, why in declined.items()} if declined else {}
    return PreparedSession(
        plan=plan,
        inputs=tuple(inputs),
        outputs=outputs,
        overridable=tuple(overridable),
        specs=tuple([InputSpec.from_value(v) for v in graph.inputs]),
        partitions=tuple([(ep, tuple(nodes)) for ep, nodes in partitions]),
        declined=types.MappingProxyType(reasons),
        metadata=model_metadata(model),
        placement=tuple(placement) if placement is not None else None,
        loaded=loaded,
        output_index=types.MappingProxyType({o.name: i for i, o in enumerate(outputs)}),
    )
