"""Squeeze-excitation blocks as one kernel: ``GlobalAveragePool -> 1x1 Conv -> act -> 1x1 Conv -> act`` (the
activations Relu, HardSigmoid, HardSwish or Clip, Identity nodes anywhere between), whose result scales the
pool's input (``Mul(x, scale)``), computed by the pool's kernel.

MobileNetV3's blocks run these four to six nodes on a few hundred values: each kernel call costs more in
Python and numpy overhead than in arithmetic. The pool's kernel computes the pooled vector, both 1x1 convs as
small matrix products and both activations in one call and returns the scale; the nodes after it pass their
input on (``passes_input``: the session's plan gives their outputs the pool's slot and drops their steps),
so the scale reaches the ``Mul`` unchanged. Active only once every node of the block runs on the CPU EP
(``join``, decided at the first call), with constant float32 weights, one reader per value up to the ``Mul``
and no graph output among the block's values; otherwise each node runs its own kernel.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx_ir as ir

from epctx.ep import Kernel, to_numpy
from epctx.errors import InvalidArgument
from epctx.providers.cpu import fusion
from epctx.providers.cpu.registry import constant_node_value

__all__ = ["Block", "block_for", "join"]

_ACTIVATIONS = ("Relu", "HardSigmoid", "HardSwish", "Clip")
# node of a block -> the block (weak: nothing here outlives the session's graph)
_MEMBERS: weakref.WeakKeyDictionary[ir.Node, Block] = weakref.WeakKeyDictionary()


class Block:
    """A squeeze-excitation block: its pool, its nodes after the pool, and the two convs' parameters."""

    __slots__ = ("__weakref__", "_active", "channels", "joined", "members", "pool", "steps")

    def __init__(
        self,
        pool: ir.Node,
        members: list[ir.Node],
        steps: list[Callable[[np.ndarray], np.ndarray]],
        channels: int,
    ) -> None:
        self.pool = pool
        self.channels = channels  # of the pool's input and of the scale
        self.members = frozenset(members)
        self.steps = steps  # on the pooled (N, C) matrix, in order
        self.joined: set[ir.Node] = set()
        self._active: bool | None = None

    def active(self) -> bool:
        if self._active is None:
            self._active = self.joined == self.members | {self.pool}
        return self._active

    def scale(self, pooled: np.ndarray) -> np.ndarray:
        if pooled.ndim != 4 or pooled.shape[1] != self.channels:
            raise InvalidArgument(
                f"Conv node {next(iter(self.members)).name!r} of a squeeze-excitation block: input has "
                f"{pooled.shape[1] if pooled.ndim > 1 else 0} channels, weight expects {self.channels}"
            )
        s = pooled.reshape(pooled.shape[0], -1)
        for step in self.steps:
            s = step(s)
        return s.reshape(*s.shape, 1, 1)


def _sole_reader(value: ir.Value) -> ir.Node | None:
    readers = list(dict.fromkeys(node for node, _ in value.uses()))
    if value.is_graph_output() or len(readers) != 1 or readers[0].domain not in ("", "ai.onnx"):
        return None
    return readers[0]


def _constant(value: ir.Value | None) -> np.ndarray | None:
    if value is None or value.is_graph_input():
        return None
    return to_numpy(value.const_value) if value.const_value is not None else constant_node_value(value)


def _ints(node: ir.Node, name: str) -> list[int]:
    attr = node.attributes.get(name)
    return [] if attr is None else [int(v) for v in attr.value]


def _conv_step(
    node: ir.Node, channels: int | None
) -> tuple[Callable[[np.ndarray], np.ndarray], int, int] | None:
    """A 1x1 conv of one group on (N, C) as ``s @ W^T + b`` (C: ``channels`` when given), with its output and
    input channels."""
    auto_pad = node.attributes.get("auto_pad")
    if len(node.inputs) < 2 or any(_ints(node, "pads")) or any(v != 1 for v in _ints(node, "strides")):
        return None
    if auto_pad is not None and str(auto_pad.value) not in ("NOTSET", "VALID", "b'NOTSET'", "b'VALID'"):
        return None
    group = node.attributes.get("group")
    w = _constant(node.inputs[1])
    has_bias = len(node.inputs) > 2 and node.inputs[2] is not None
    b = _constant(node.inputs[2]) if has_bias else None
    if (group is not None and int(group.value) != 1) or w is None or w.dtype != np.float32:
        return None
    if has_bias and b is None:  # a bias fed at run time
        return None
    if w.ndim != 4 or w.shape[2:] != (1, 1) or (channels is not None and w.shape[1] != channels):
        return None
    if b is not None and b.shape != (w.shape[0],):
        return None
    wt = np.ascontiguousarray(w.reshape(w.shape[0], w.shape[1]).T)
    bias = None if b is None else b.astype(np.float32)

    def step(s: np.ndarray) -> np.ndarray:
        out = s @ wt
        if bias is not None:
            out += bias
        return out

    return step, w.shape[0], w.shape[1]


def _activation(node: ir.Node) -> Callable[[np.ndarray], np.ndarray] | None:
    act = fusion.activation_of(node)
    if act is None:
        return None

    def step(s: np.ndarray) -> np.ndarray:
        act(s)
        return s

    return step


def block_for(pool: ir.Node) -> Block | None:
    """The block ``pool`` (a GlobalAveragePool) heads, registered for its nodes' kernels to ``join``."""
    if len(pool.inputs) != 1 or pool.inputs[0] is None or len(pool.outputs) != 1:
        return None
    x, value = pool.inputs[0], pool.outputs[0]
    members: list[ir.Node] = []
    steps: list[Callable[[np.ndarray], np.ndarray]] = []
    channels: list[int] = []  # the input channels of the first conv, then the output channels of each
    while (node := _sole_reader(value)) is not None and node.op_type != "Mul":
        found: Any = None
        if node.op_type == "Identity":
            found = lambda s: s  # noqa: E731
        elif node.op_type == "Conv" and len(channels) < 3 and node.inputs[0] is value:
            conv = _conv_step(node, channels[-1] if channels else None)
            if conv is not None:
                found, count, inputs = conv
                channels += [inputs, count] if not channels else [count]
        elif node.op_type in _ACTIVATIONS and node.inputs[0] is value:
            found = _activation(node)
        if found is None or len(node.outputs) != 1:
            return None
        value = node.outputs[0]
        members.append(node)
        steps.append(found)
    if node is None or len(channels) != 3 or channels[0] != channels[2] or len(node.inputs) != 2:
        return None
    if set(node.inputs) != {x, value}:
        return None
    block = Block(pool, members, steps, channels[0])
    for member in (pool, *members):
        _MEMBERS[member] = block
    return block


def join(node: ir.Node, fn: Kernel) -> Kernel:
    """The kernel of ``node`` as the CPU EP runs it: the pool of an active block returns the block's scale,
    the block's other nodes pass their input on; ``fn`` otherwise."""
    block = _MEMBERS.get(node)
    if block is None and node.op_type == "GlobalAveragePool" and node.domain in ("", "ai.onnx"):
        block = block_for(node)
    if block is None:
        return fn
    block.joined.add(node)
    if node is block.pool:

        def pool(*inputs: Any) -> Any:
            (pooled,) = fn(*inputs)
            if block.active() and pooled.dtype == np.float32:
                return (block.scale(pooled),)
            return (pooled,)

        return pool

    def passing(*inputs: Any) -> Any:
        return (inputs[0],) if block.active() else fn(*inputs)

    passing.passes_input = lambda: 0 if block.active() else None  # type: ignore[attr-defined]
    return passing
