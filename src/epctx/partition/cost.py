"""The partition stage's cost rule: a compiling EP's partition whose boundaries cost more than it saves is left to
the next EP. Each boundary crossing costs a call into the backend and a copy of every value crossing it (tens of
microseconds on IREE's CPU device); a partition without a heavy op and with few nodes saves less than that, and
splits the model in more pieces around it. The EP sets the threshold (``ExecutionProvider.min_partition_nodes``);
a partition that is the whole graph is never refused (it has no boundary to cross but the model's own)."""

from __future__ import annotations

from collections.abc import Sequence

import onnx_ir as ir

__all__ = ["HEAVY_OPS", "cost_rule_reason"]

# Ops whose work grows faster than their inputs' size: worth a boundary crossing on their own.
HEAVY_OPS = frozenset(
    {
        "Conv", "ConvTranspose", "ConvInteger", "QLinearConv", "MatMul", "MatMulInteger", "QLinearMatMul",
        "Gemm", "Einsum", "LSTM", "GRU", "RNN", "Attention", "MultiHeadAttention", "DeformConv",
    }
)  # fmt: skip


def cost_rule_reason(members: Sequence[ir.Node], graph_size: int, min_nodes: int) -> str | None:
    """Why the partition of ``members`` should be left to the next EP (None: keep it)."""
    if min_nodes <= 0 or len(members) >= min_nodes or len(members) == graph_size:
        return None
    if any(n.op_type in HEAVY_OPS for n in members):
        return None
    inside = set(members)
    crossing = {
        v
        for n in members
        for v in (*n.inputs, *n.outputs)
        if v is not None and v.const_value is None and _crosses(v, inside)
    }
    return (
        f"cost rule: a partition of {len(members)} node(s) (fewer than {min_nodes}, no convolution, matrix "
        f"product or recurrence) between other EPs' nodes; crossing its {len(crossing)} boundary value(s) costs "
        "more than compiling it saves"
    )


def _crosses(value: ir.Value, inside: set[ir.Node]) -> bool:
    producer = value.producer()
    if producer is None or producer not in inside:
        return True
    return any(consumer not in inside for consumer, _ in value.uses())
