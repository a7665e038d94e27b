"""Chains of small nodes computed by the first one's kernel (issue 21: the LLM pair's per-node cost), as
``fusion.py`` does for a Conv's activation: the head node's kernel computes the chain's last value, and every
other node of the chain passes its input on (``passes_input``: the plan drops its step). Each chain reads no
value from outside but the head's input and constants, its values in between are read by no one outside it
(nor are they graph outputs), and it computes the same numpy operations in the same order as the nodes' own
kernels, so the results are the same bits (but for RMSNorm over one row, a decode step's: its sum of squares
is a BLAS dot and the rest numpy scalars, the same float32 operations summed in another order, 2.3 against
4.8 us, measured here):

* **RMSNorm** as PyTorch exports it: ``Pow(x, 2) -> ReduceMean(last axis, keepdims) -> Add(eps) -> Sqrt ->
  Div(1, .) -> Mul(x, .)`` and, where it follows, ``Mul(., weight)`` with a 1-D constant weight (7 steps);
* **SiLU** after a MatMul: ``Sigmoid(g)`` read only by ``Mul(g, Sigmoid(g))`` (2 steps; after a Conv the Conv
  takes it, ``fusion.py``);
* **rotate-half** of rotary embeddings: ``Concat(Neg(Slice(x, h:)), Slice(x, :h))`` along the sliced axis
  (4 steps), constant slices of step 1.

The chain is active only when every one of its nodes' kernels was built by the CPU EP (``fusion.join``); until
then, or when another EP runs one of them, each node runs its own kernel.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import onnx_ir as ir

from epctx.ep import Kernel, to_numpy
from epctx.providers.cpu.fusion import Epilogue, claim, claimed
from epctx.providers.cpu.registry import constant_node_value

__all__ = ["head_kernel"]

Compute = Callable[..., Any]  # the head's inputs -> the chain's last value
Match = tuple[
    Compute, list[ir.Node], dict[ir.Node, int]
]  # compute, readers, inputs passed where no chain value


def _const(value: ir.Value | None) -> np.ndarray | None:
    """The array of a constant: an initializer that cannot be fed, a Constant node's output, or an Identity of
    one (PyTorch exports tied weights so: the llm pair's norm weights are Identities of one initializer)."""
    for _ in range(8):
        if value is None or value.is_graph_input():
            return None
        if value.const_value is not None:
            return to_numpy(value.const_value)
        node = value.producer()
        if node is None or node.op_type != "Identity" or node.domain not in ("", "ai.onnx"):
            break
        value = node.inputs[0] if node.inputs else None
    found = None if value is None else constant_node_value(value)
    return None if found is None else np.asarray(found)


def _sole_reader(value: ir.Value, *ops: str) -> ir.Node | None:
    """The one reader of ``value`` (no graph output, same graph, default domain) when it is one of ``ops``."""
    readers = list(dict.fromkeys(n for n, _ in value.uses()))
    if value.is_graph_output() or len(readers) != 1:
        return None
    node = readers[0]
    if node.op_type not in ops or node.domain not in ("", "ai.onnx") or node.graph is not value.graph:
        return None
    return node


def _scalar_equal(value: ir.Value | None, expected: float) -> bool:
    array = _const(value)
    return array is not None and array.size == 1 and array.ndim <= 1 and float(array.reshape(())) == expected


def _other(node: ir.Node, value: ir.Value) -> ir.Value | None:
    """The other input of a two-input node that reads ``value`` once."""
    inputs = list(node.inputs)
    if len(inputs) != 2 or inputs.count(value) != 1:
        return None
    return inputs[1 - inputs.index(value)]


def _attr(node: ir.Node, name: str, default: Any) -> Any:
    attr = node.attributes.get(name)
    return default if attr is None else attr.value


# ------------------------------------------------------------------------------------------------ RMSNorm
def _last_axis_mean(node: ir.Node) -> bool:
    """A ReduceMean over the last axis (given as -1) that keeps its dimension."""
    if int(_attr(node, "keepdims", 1)) != 1:
        return False
    axes = _attr(node, "axes", None)
    if axes is None and len(node.inputs) > 1:
        found = _const(node.inputs[1])
        axes = None if found is None else found.reshape(-1).tolist()
    return axes is not None and list(axes) == [-1]


def _rms_chain(pow_node: ir.Node) -> tuple[list[ir.Node], np.ndarray] | None:
    """The nodes after ``Pow(x, 2)`` up to ``Mul(x, 1 / sqrt(mean + eps))`` and the eps constant."""
    x = pow_node.inputs[0]
    mean = _sole_reader(pow_node.outputs[0], "ReduceMean")
    if x is None or mean is None or not _last_axis_mean(mean):
        return None
    add = _sole_reader(mean.outputs[0], "Add")
    eps = None if add is None else _const(_other(add, mean.outputs[0]))
    if (
        add is None
        or eps is None
        or eps.size != 1
        or eps.ndim > 1
        or eps.dtype not in (np.float32, np.float64)
    ):
        return None
    sqrt = _sole_reader(add.outputs[0], "Sqrt")
    if sqrt is None:
        return None
    div = _sole_reader(sqrt.outputs[0], "Div")
    if div is None or list(div.inputs).index(sqrt.outputs[0]) != 1 or not _scalar_equal(div.inputs[0], 1.0):
        return None
    mul = _sole_reader(div.outputs[0], "Mul")
    if mul is None or _other(mul, div.outputs[0]) is not x:
        return None
    return [mean, add, sqrt, div, mul], eps


def _rms_norm(node: ir.Node) -> Match | None:
    if node.op_type != "Pow" or len(node.inputs) != 2 or not _scalar_equal(node.inputs[1], 2.0):
        return None
    found = _rms_chain(node)
    if found is None:
        return None
    readers, eps = found
    scale = _sole_reader(readers[-1].outputs[0], "Mul")
    weight = None if scale is None else _const(_other(scale, readers[-1].outputs[0]))
    if scale is not None and weight is not None and weight.ndim == 1 and weight.dtype == eps.dtype:
        readers.append(scale)
    else:
        weight = None
    one = eps.dtype.type(1)

    def rms_norm(x: Any, *_: Any) -> Any:
        if x.size == x.shape[-1] and x.dtype == eps.dtype:  # one row (a decode step): on numpy scalars
            flat = x.reshape(-1)
            scale = one / np.sqrt(np.dot(flat, flat) / eps.dtype.type(x.shape[-1]) + eps)
            y = np.multiply(x, scale)
            return y if weight is None else np.multiply(y, weight, out=y)
        # the nodes' kernels' own operations: x * x, add.reduce / count, + eps, sqrt, 1 / ., x * ., * weight
        t = x * x
        r = np.add.reduce(t, axis=-1, keepdims=True)
        np.true_divide(r, x.shape[-1], out=r)
        np.add(r, eps, out=r)
        np.sqrt(r, out=r)
        np.divide(one, r, out=r)
        y = np.multiply(x, r, out=t)  # x's temporary square, done with
        return y if weight is None else np.multiply(y, weight, out=y)

    return rms_norm, readers, {}


# ------------------------------------------------------------------------------------------------ SiLU
def _silu(node: ir.Node) -> Match | None:
    if node.op_type != "Sigmoid" or len(node.inputs) != 1 or node.inputs[0] is None:
        return None
    g, s = node.inputs[0], node.outputs[0]
    mul = _sole_reader(s, "Mul")
    if mul is None or _other(mul, s) is not g:
        return None

    def silu(x: Any, sigmoid: Callable[..., Any]) -> Any:
        (y,) = sigmoid(x)
        if y is x or y.shape != x.shape or y.dtype != x.dtype:
            return np.multiply(x, y)
        return np.multiply(x, y, out=y)  # the Sigmoid kernel's fresh array

    return silu, [mul], {}


# ------------------------------------------------------------------------------------------------ rotate half
def _slice_of(node: ir.Node) -> tuple[int, int, int] | None:
    """(start, end, axis) of a Slice with constant inputs, one axis, step 1 (opset >= 10)."""
    if node.op_type != "Slice" or not 4 <= len(node.inputs) <= 5:
        return None
    arrays = [_const(v) for v in node.inputs[1:]]
    if any(a is None or a.size != 1 or a.dtype.kind != "i" for a in arrays):
        return None
    start, end, axis, *step = (int(a.reshape(())) for a in arrays if a is not None)
    return None if step and step[0] != 1 else (start, end, axis)


def _rotate_half(node: ir.Node) -> Match | None:
    """``node`` is the ``Slice(x, h:)`` whose ``Neg`` is the first input of the Concat."""
    upper = _slice_of(node)
    neg = None if upper is None else _sole_reader(node.outputs[0], "Neg")
    concat = None if neg is None else _sole_reader(neg.outputs[0], "Concat")
    if upper is None or neg is None or concat is None or len(concat.inputs) != 2:
        return None
    low_value = concat.inputs[1]
    if concat.inputs[0] is not neg.outputs[0] or low_value is None or low_value is node.outputs[0]:
        return None
    low = low_value.producer()
    lower = None if low is None else _slice_of(low)
    if (
        low is None
        or lower is None
        or low.inputs[0] is not node.inputs[0]
        or _sole_reader(low_value, "Concat") is None
    ):
        return None
    if low.domain not in ("", "ai.onnx") or low.graph is not node.graph:
        return None
    concat_axis = int(_attr(concat, "axis", 0))
    keys: dict[int, tuple[tuple[slice, ...], tuple[slice, ...]]] = {}  # rank -> both slices' keys

    def rotate_half(x: Any, *_: Any) -> Any:
        key = keys.get(x.ndim)
        if key is None:
            high = (slice(None),) * (upper[2] % x.ndim) + (slice(upper[0], upper[1]),)
            rest = (slice(None),) * (lower[2] % x.ndim) + (slice(lower[0], lower[1]),)
            key = keys[x.ndim] = (high, rest)
        return np.concatenate((np.negative(x[key[0]]), x[key[1]]), axis=concat_axis)

    return rotate_half, [neg, low, concat], {low: 0}


_MATCHERS = (_rms_norm, _silu, _rotate_half)


def head_kernel(node: ir.Node, fn: Kernel) -> Kernel:
    """The kernel of ``node``: ``fn``, or, where ``node`` heads a chain above, one that computes the chain once
    every node of it runs on the CPU EP."""
    if node.domain not in ("", "ai.onnx") or len(node.outputs) != 1:
        return fn
    for matcher in _MATCHERS:
        found = matcher(node)
        if found is not None:
            break
    else:
        return fn
    compute, readers, passing = found
    if claimed(node) or any(claimed(r) for r in readers):  # a Conv's epilogue holds them (fusion.py)
        return fn
    epilogue = claim(Epilogue(_no_activation, node.outputs[0], readers, _chain_values(readers), passing))
    silu = matcher is _silu

    def run(*inputs: Any) -> Any:
        if not epilogue.active():
            return fn(*inputs)
        if silu:
            return (compute(inputs[0], fn),)
        return (compute(*inputs),)

    return run


def _chain_values(readers: list[ir.Node]) -> list[ir.Value]:
    """The readers' outputs but the last one's: values that hold the chain's result once active."""
    return [r.outputs[0] for r in readers[:-1]]


def _no_activation(y: np.ndarray) -> None:
    return None
