"""Conv epilogues: the activation after a Conv computed in place on the Conv's fresh output.

A Conv whose only readers are an activation (Relu, Clip with constant bounds, HardSigmoid, HardSwish) or the
pair of SiLU (``Sigmoid(y)`` and ``Mul(y, Sigmoid(y))``, as PyTorch exports it) gets an :class:`Epilogue`:
the Conv kernel applies the activation to its output while it is in cache, and the readers' kernels pass
their input through (the Mul of SiLU passes the Conv's output, which already holds ``y * sigmoid(y)``). This
saves a temporary and a pass per activation, two of each for SiLU.

The Conv and its readers agree through the epilogue: it is active only once every reader's kernel was built by
the CPU EP (``join``). A reader that another EP runs never joins, so the Conv then leaves its output alone. The
Conv's output must not be a graph output, everything must be in one graph, and the weights float32 constants.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnx_ir as ir

from epctx.ep import Kernel, to_numpy
from epctx.providers.cpu.registry import constant_node_value

__all__ = ["Epilogue", "epilogue_for", "join"]

Activation = Callable[[np.ndarray], None]  # in place

# reader node -> the epilogue of the Conv before it (weak: nothing here outlives the session's graph)
_READERS: weakref.WeakKeyDictionary[ir.Node, Epilogue] = weakref.WeakKeyDictionary()


class Epilogue:
    """An activation the Conv applies in place, and the reader nodes whose kernels pass through."""

    __slots__ = ("__weakref__", "_active", "activation", "joined", "output", "readers")

    def __init__(self, activation: Activation, output: ir.Value, readers: Sequence[ir.Node]) -> None:
        self.activation = activation
        self.output = output  # the Conv's
        self.readers = frozenset(readers)
        self.joined: set[ir.Node] = set()
        self._active: bool | None = None

    def active(self) -> bool:
        """True when every reader runs on the CPU EP (decided at the first call, once all kernels exist)."""
        if self._active is None:
            self._active = self.joined == self.readers
        return self._active


def _relu(y: np.ndarray) -> None:
    np.maximum(y, 0, out=y)


def _clip(lo: float | None, hi: float | None) -> Activation:
    def clip(y: np.ndarray) -> None:
        if lo is not None:
            np.maximum(y, y.dtype.type(lo), out=y)
        if hi is not None:
            np.minimum(y, y.dtype.type(hi), out=y)

    return clip


def _hard_sigmoid(alpha: float, beta: float) -> Activation:
    def hard_sigmoid(y: np.ndarray) -> None:
        y *= y.dtype.type(alpha)
        y += y.dtype.type(beta)
        np.maximum(y, 0, out=y)
        np.minimum(y, 1, out=y)

    return hard_sigmoid


def _hard_swish(y: np.ndarray) -> None:
    t = y * y.dtype.type(1.0 / 6.0)
    t += y.dtype.type(0.5)
    np.maximum(t, 0, out=t)
    np.minimum(t, 1, out=t)
    y *= t


def _silu(y: np.ndarray) -> None:
    t = np.negative(y)
    np.exp(t, out=t)  # overflows to inf for very negative y: 1 / inf = 0, the right limit
    t += 1
    np.divide(y, t, out=y)


def _scalar(value: ir.Value | None) -> float | None:
    if value is None:
        return None
    if value.is_graph_input():
        raise ValueError("not a constant")
    array = to_numpy(value.const_value) if value.const_value is not None else constant_node_value(value)
    if array is None:
        raise ValueError("not a constant")
    if array.size != 1:
        raise ValueError("not a scalar")
    return float(array.reshape(()))


def _attr(node: ir.Node, name: str, default: float) -> float:
    attr = node.attributes.get(name)
    return default if attr is None else float(attr.value)


def _unary(node: ir.Node) -> Activation | None:
    op = node.op_type
    if op == "Relu":
        return _relu
    if op == "HardSwish":
        return _hard_swish
    if op == "HardSigmoid":
        return _hard_sigmoid(_attr(node, "alpha", 0.2), _attr(node, "beta", 0.5))
    if op == "Clip":
        if len(node.inputs) == 1 and ("min" in node.attributes or "max" in node.attributes):  # opset < 11
            lo, hi = node.attributes.get("min"), node.attributes.get("max")
            return _clip(None if lo is None else float(lo.value), None if hi is None else float(hi.value))
        try:
            bounds = [_scalar(node.inputs[i]) if i < len(node.inputs) else None for i in (1, 2)]
        except ValueError:
            return None
        return _clip(*bounds)
    return None


def _pattern(y: ir.Value) -> tuple[Activation, list[ir.Node]] | None:
    readers = list(dict.fromkeys(node for node, _ in y.uses()))
    if len(readers) == 1:
        act = _unary(readers[0])
        return None if act is None else (act, readers)
    if len(readers) != 2:
        return None
    sig = next((r for r in readers if r.op_type == "Sigmoid"), None)
    mul = next((r for r in readers if r.op_type == "Mul"), None)
    if sig is None or mul is None or len(mul.inputs) != 2:
        return None
    s = sig.outputs[0]
    if set(mul.inputs) != {y, s} or s.is_graph_output() or [n for n, _ in s.uses()] != [mul]:
        return None
    return _silu, [sig, mul]


def epilogue_for(conv: ir.Node, weight: np.ndarray | None) -> Epilogue | None:
    """The epilogue of ``conv`` when its readers form a pattern above (the readers may still not join)."""
    if weight is None or weight.dtype != np.float32 or len(conv.outputs) != 1:
        return None
    y = conv.outputs[0]
    if y.is_graph_output():
        return None
    found = _pattern(y)
    if found is None:
        return None
    act, readers = found
    if any(r.graph is not conv.graph or r.domain not in ("", "ai.onnx") for r in readers):
        return None
    epilogue = Epilogue(act, y, readers)
    for r in readers:
        _READERS[r] = epilogue
    return epilogue


def join(node: ir.Node, fn: Kernel) -> Kernel:
    """The kernel of ``node`` as the CPU EP runs it: passed through while the Conv before it applies the
    activation (the Mul of SiLU passes the Conv's output on), ``fn`` otherwise."""
    epilogue = _READERS.get(node)
    if epilogue is None:
        return fn
    epilogue.joined.add(node)
    source = list(node.inputs).index(epilogue.output)

    def run(*inputs: Any) -> Any:
        if epilogue.active():
            return (inputs[source],)
        return fn(*inputs)

    return run
