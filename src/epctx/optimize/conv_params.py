"""What the Conv folds share: reading constants, finding the Conv a reader follows, rewriting its parameters.

A constant is an initializer (not a graph input: it may be fed) or the output of a ``Constant`` node (its
``value`` tensor): Paddle exports feed every Conv weight and BatchNormalization parameter from Constant nodes.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from epctx.model.tensors import to_numpy

__all__ = ["const_array", "conv_params", "rewrite_conv", "sole_reader"]

_DOMAINS = ("", "ai.onnx")


def const_array(value: ir.Value | None) -> np.ndarray | None:
    """The array of an initializer, of a ``Constant`` node's output or of a ``Reshape`` of those (Paddle
    reshapes each Conv bias it adds separately so), else None."""
    if value is None or value.is_graph_input():
        return None
    if value.const_value is not None:
        return to_numpy(value.const_value)
    node = value.producer()
    if node is None or node.domain not in _DOMAINS:
        return None
    if node.op_type == "Reshape":
        return _reshaped(node)
    if node.op_type != "Constant":
        return None
    attr = node.attributes.get("value")
    if not isinstance(attr, ir.Attr) or attr.type != ir.AttributeType.TENSOR:
        return None
    return to_numpy(attr.value)


def _reshaped(node: ir.Node) -> np.ndarray | None:
    """A Reshape's result when its data and shape are constants (0 copies the input's size unless allowzero)."""
    if len(node.inputs) != 2 or len(node.outputs) != 1:
        return None
    data, shape = const_array(node.inputs[0]), const_array(node.inputs[1])
    if data is None or shape is None or shape.dtype != np.int64 or shape.ndim != 1:
        return None
    attr = node.attributes.get("allowzero")
    allowzero = attr is not None and bool(attr.value)
    dims = [int(d) if d != 0 or allowzero or i >= data.ndim else data.shape[i] for i, d in enumerate(shape)]
    try:
        return data.reshape(dims)
    except ValueError:
        return None


def sole_reader(graph: ir.Graph, x: ir.Value) -> ir.Node | None:
    """The one node of ``graph`` that reads ``x`` once, when ``x`` is no graph output."""
    uses = list(x.uses())
    if len(uses) != 1 or x.is_graph_output():
        return None
    node = uses[0][0]
    return node if node.graph is graph and node.domain in _DOMAINS else None


def conv_params(conv: ir.Node) -> tuple[np.ndarray, np.ndarray | None] | None:
    """The Conv's constant float weight and bias (None when it has none), or None when either is not constant."""
    weight = const_array(conv.inputs[1]) if len(conv.inputs) > 1 else None
    if weight is None or weight.dtype not in (np.float32, np.float64):
        return None
    has_bias = len(conv.inputs) > 2 and conv.inputs[2] is not None
    bias = const_array(conv.inputs[2]) if has_bias else None
    if has_bias and bias is None:
        return None
    return weight, bias


def _initializer(graph: ir.Graph, name: str, array: np.ndarray) -> ir.Value:
    value = ir.Value(
        name=name, const_value=ir.Tensor(array)
    )  # not ir.tensor: its protocol checks cost 0.1 ms
    value.type = ir.TensorType(ir.DataType.from_numpy(array.dtype))
    value.shape = ir.Shape(array.shape)
    graph.register_initializer(value)
    return value


def rewrite_conv(
    graph: ir.Graph, conv: ir.Node, readers: list[ir.Node], weight: np.ndarray, bias: np.ndarray
) -> None:
    """Gives ``conv`` the new ``weight`` and ``bias`` (computed in float64, stored in ``weight``'s dtype as
    given by the caller) and removes ``readers``, a chain of one-reader nodes after it: the Conv's output
    becomes the last one's (under its name). Initializers, Constant nodes and Reshapes of constants that
    nothing reads any more are removed."""
    x = conv.outputs[0]
    base = conv.name or x.name
    w_value = _initializer(graph, _fresh(graph, f"{base}_fold_W"), weight)
    b_value = _initializer(graph, _fresh(graph, f"{base}_fold_B"), bias)
    chain = {x, *(r.outputs[0] for r in readers)}
    old = [v for v in (*conv.inputs[1:3], *(i for r in readers for i in r.inputs)) if v is not None]
    conv.replace_input_with(1, w_value)
    if len(conv.inputs) < 3:
        conv.resize_inputs(3)
    conv.replace_input_with(2, b_value)
    out = readers[-1].outputs[0]
    name = out.name
    out.replace_all_uses_with(x, replace_graph_outputs=True)
    for reader in reversed(readers):
        graph.remove(reader, safe=True)
    x.name = name
    _drop_unread(graph, [v for v in dict.fromkeys(old) if v not in chain])


def _fresh(graph: ir.Graph, name: str) -> str:
    """``name``, or ``name_2``, ``name_3``... when an initializer has it already."""
    taken = graph.initializers
    if name not in taken:
        return name
    k = 2
    while f"{name}_{k}" in taken:
        k += 1
    return f"{name}_{k}"


def _drop_unread(graph: ir.Graph, values: list[ir.Value]) -> None:
    """Initializers, ``Constant`` nodes and ``Reshape`` nodes of constants among ``values`` (and what those
    read) that nothing reads any more are removed."""
    pending = list(values)
    while pending:
        value = pending.pop()
        if value.uses() or value.is_graph_output() or value.is_graph_input():
            continue
        producer = value.producer()
        if producer is not None and producer.graph is graph and producer.op_type in ("Constant", "Reshape"):
            inputs = [v for v in producer.inputs if v is not None]
            graph.remove(producer, safe=True)
            pending.extend(inputs)
        elif value.name and value.name in graph.initializers:
            del graph.initializers[value.name]
