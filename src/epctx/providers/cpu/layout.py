"""Channels-last hand-off: a conv leaves its result channels-last for the kernels that read it.

A depthwise conv runs channels-last (``kernels/depthwise.py``) and copied its result back to NCHW; the 1x1 conv
after it (directly, or through the Mul of a squeeze-excitation block) read it as a (C, H * W) matrix. When
every reader can take the channels-last memory as it is, the conv returns its (N, H, W, C) result as an NCHW
*view* (``transpose``: the value's shape and elements are those of the NCHW result, only the strides differ)
and skips the copy back (20-40% of a depthwise conv's time). A 1x1 conv of one image on a large map before a
depthwise conv does the same (the GEMM x^T W^T writes channels-last), so that the depthwise conv's copy into
its channels-last buffer is a plain row copy. The readers that qualify:

* a 1x1 conv of stride 1, no padding, one group: a (C, H * W) matrix over channels-last memory is the
  transposed (H * W, C) matrix, which BLAS multiplies as it is (``kernels/conv.py``);
* GlobalAveragePool: a gemv over the (H * W, C) matrix (``kernels/pool.py``);
* a Mul (of a squeeze-excitation block) or an Add (a residual) whose readers all qualify (up to three such
  nodes deep): numpy's ufuncs give their result the layout of their operands, so the result is channels-last
  too (a 1x1 conv reading channels-last memory writes channels-last when its own readers qualify:
  ``kernels/conv.py``);
* a depthwise conv (it transposes its input into a channels-last buffer anyway).

The hand-off is active only when each of those nodes runs on the CPU EP (its kernel was built here:
``built``), decided at the conv's first call, once every kernel exists; a value read by another EP, or that
is a graph output, stays contiguous NCHW.
"""

from __future__ import annotations

import weakref

import numpy as np
import onnx_ir as ir

from epctx.ep import to_numpy
from epctx.providers.cpu.registry import constant_node_value

__all__ = ["HANDOFFS", "Handoff", "built", "handoff_for"]

# nodes whose kernel the CPU EP built (weak: nothing here outlives the session's graph)
_BUILT: weakref.WeakSet[ir.Node] = weakref.WeakSet()
# value handed over -> its hand-off (for tests and profiles to see which convs hand over)
HANDOFFS: weakref.WeakKeyDictionary[ir.Value, Handoff] = weakref.WeakKeyDictionary()


def built(node: ir.Node) -> None:
    """``node``'s kernel is the CPU EP's."""
    _BUILT.add(node)


class Handoff:
    """The readers a depthwise conv's channels-last result goes to, and whether they all run here."""

    __slots__ = ("_active", "nodes")

    def __init__(self, nodes: list[ir.Node]) -> None:
        self.nodes = tuple(nodes)
        self._active: bool | None = None

    def active(self) -> bool:
        if self._active is None:
            self._active = all(node in _BUILT for node in self.nodes)
        return self._active


def _readers(value: ir.Value) -> list[ir.Node]:
    return list(dict.fromkeys(node for node, _ in value.uses()))


def _ints(node: ir.Node, name: str) -> list[int]:
    attr = node.attributes.get(name)
    return [] if attr is None else [int(v) for v in attr.value]


def _pointwise_reader(node: ir.Node, value: ir.Value) -> bool:
    """A float32 1x1 Conv of stride 1, no padding and one group that reads ``value`` as its data input only."""
    if node.op_type != "Conv" or node.domain not in ("", "ai.onnx") or len(node.inputs) < 2:
        return False
    if node.inputs[0] is not value or value in node.inputs[1:]:
        return False
    group = node.attributes.get("group")
    if (group is not None and int(group.value) != 1) or any(_ints(node, "pads")):
        return False
    if any(s != 1 for s in _ints(node, "strides")):
        return False
    array = _weight(node)
    return array is not None and array.ndim == 4 and array.shape[2:] == (1, 1)


def _weight(node: ir.Node) -> np.ndarray | None:
    weight = node.inputs[1]
    if weight is None or weight.is_graph_input():
        return None
    return to_numpy(weight.const_value) if weight.const_value is not None else constant_node_value(weight)


def _depthwise_reader(node: ir.Node, value: ir.Value) -> bool:
    """A depthwise Conv reading ``value`` as its data input only: it copies its input channels-last into its
    padded buffer, a plain row copy when the input is channels-last already."""
    if node.op_type != "Conv" or node.domain not in ("", "ai.onnx") or len(node.inputs) < 2:
        return False
    if node.inputs[0] is not value or value in node.inputs[1:]:
        return False
    group = node.attributes.get("group")
    array = _weight(node)
    return group is not None and int(group.value) > 1 and array is not None and array.shape[1:2] == (1,)


def handoff_for(value: ir.Value) -> Handoff | None:
    """The hand-off of ``value`` (a conv's result as its readers see it: the end of its epilogue's chain when
    it has one), or None when a reader cannot take channels-last memory."""
    nodes = _taking(value, _ELEMENTWISE_DEPTH)
    if nodes is None:
        return None
    found = HANDOFFS[value] = Handoff(nodes)
    return found


# How many Mul / Add nodes deep a hand-off may go (squeeze-excitation's Mul, then a residual Add, ...).
_ELEMENTWISE_DEPTH = 3


def _taking(value: ir.Value, depth: int) -> list[ir.Node] | None:
    """The nodes that read ``value`` (and, through a Mul or Add, what those results go to) when every one takes
    channels-last memory; None otherwise."""
    readers = _readers(value)
    if value.is_graph_output() or not readers:
        return None
    nodes: list[ir.Node] = []
    for node in readers:
        pool = node.op_type == "GlobalAveragePool" and node.domain in ("", "ai.onnx")
        if pool or _pointwise_reader(node, value) or _depthwise_reader(node, value):
            nodes.append(node)
            continue
        binary = node.op_type in ("Mul", "Add") and node.domain in ("", "ai.onnx") and len(node.inputs) == 2
        after = _taking(node.outputs[0], depth - 1) if binary and depth > 0 else None
        if after is None:
            return None
        nodes += [node, *after]
    return nodes
