"""Fold an inference BatchNormalization into the Conv that feeds it (as onnxruntime does at level BASIC).

Conv(x, W, b) -> BatchNormalization(scale, B, mean, var, eps) becomes Conv(x, W * f, (b - mean) * f + B)
with f = scale / sqrt(var + eps) per output channel, when W, b and the BN parameters are constants, the Conv
output feeds only the BatchNormalization, and the BatchNormalization is in inference mode.

A constant is an initializer or the output of a ``Constant`` node (its ``value`` tensor): Paddle exports feed
every Conv weight and BatchNormalization parameter from Constant nodes (PP-OCR's det, rec and cls models, 35
of cls's 53 Convs). Constant nodes left without readers by a fold are removed with it.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from epctx.model.tensors import to_numpy

__all__ = ["fold_conv_batchnorm"]


def _const(value: ir.Value | None) -> np.ndarray | None:
    """The array of an initializer (not a graph input: it may be fed) or of a ``Constant`` node's output."""
    if value is None or value.is_graph_input():
        return None
    if value.const_value is not None:
        return to_numpy(value.const_value)
    node = value.producer()
    if node is None or node.op_type != "Constant" or node.domain not in ("", "ai.onnx"):
        return None
    attr = node.attributes.get("value")
    if not isinstance(attr, ir.Attr) or attr.type != ir.AttributeType.TENSOR:
        return None
    return to_numpy(attr.value)


def fold_conv_batchnorm(graph: ir.Graph) -> int:
    """Fold every eligible Conv -> BatchNormalization pair of ``graph``; returns how many were folded."""
    folded = 0
    for bn in list(graph):
        if bn.op_type != "BatchNormalization" or bn.domain not in ("", "ai.onnx") or len(bn.outputs) != 1:
            continue
        if bn.attributes.get("training_mode") is not None and bn.attributes["training_mode"].value:
            continue
        x = bn.inputs[0]
        conv = x.producer() if x is not None else None
        if (
            conv is None
            or conv.op_type != "Conv"
            or conv.domain not in ("", "ai.onnx")
            or conv.graph is not graph
        ):
            continue
        if x is None or len(x.uses()) != 1 or x.is_graph_output():
            continue
        weight = _const(conv.inputs[1])
        bias = _const(conv.inputs[2]) if len(conv.inputs) > 2 and conv.inputs[2] is not None else None
        params = [_const(v) for v in bn.inputs[1:5]]
        if weight is None or weight.dtype not in (np.float32, np.float64) or any(p is None for p in params):
            continue
        if len(conv.inputs) > 2 and conv.inputs[2] is not None and bias is None:
            continue
        scale, shift, mean, var = (np.asarray(p, dtype=np.float64) for p in params)  # type: ignore[arg-type]
        eps = bn.attributes["epsilon"].value if "epsilon" in bn.attributes else 1e-5
        factor = scale / np.sqrt(var + eps)
        if factor.shape != (weight.shape[0],):
            continue
        new_w = (weight.astype(np.float64) * factor.reshape((-1,) + (1,) * (weight.ndim - 1))).astype(
            weight.dtype
        )
        base = np.zeros(weight.shape[0]) if bias is None else bias.astype(np.float64)
        new_b = ((base - mean) * factor + shift).astype(weight.dtype)
        w_value = ir.Value(name=f"{conv.name or x.name}_bnfold_W", const_value=ir.tensor(new_w))
        b_value = ir.Value(name=f"{conv.name or x.name}_bnfold_B", const_value=ir.tensor(new_b))
        w_value.type = ir.TensorType(ir.DataType.from_numpy(new_w.dtype))
        b_value.type = ir.TensorType(ir.DataType.from_numpy(new_b.dtype))
        w_value.shape = ir.Shape(new_w.shape)
        b_value.shape = ir.Shape(new_b.shape)
        old_conv_inputs = list(conv.inputs[1:3])
        graph.register_initializer(w_value)
        graph.register_initializer(b_value)
        conv.replace_input_with(1, w_value)
        if len(conv.inputs) < 3:
            conv.resize_inputs(3)
        conv.replace_input_with(2, b_value)
        replaced = list(dict.fromkeys(v for v in (*bn.inputs[1:5], *old_conv_inputs) if v is not None))
        out = bn.outputs[0]
        name = out.name
        out.replace_all_uses_with(x, replace_graph_outputs=True)
        graph.remove(bn, safe=True)
        x.name = name
        _drop_unused_initializers(graph, replaced)
        folded += 1
    return folded


def _drop_unused_initializers(graph: ir.Graph, values: list[ir.Value]) -> None:
    """Initializers and ``Constant`` nodes among ``values`` that nothing reads any more are removed."""
    for value in values:
        shared = value.uses() or value.is_graph_output() or value.is_graph_input()
        if shared:
            continue
        producer = value.producer()
        if producer is not None and producer.op_type == "Constant" and producer.graph is graph:
            graph.remove(producer, safe=True)
        elif value.name and value.name in graph.initializers:
            del graph.initializers[value.name]
