"""Lowering: a partition of ONNX nodes becomes an example-EP program (the example EP's compile)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx_ir as ir

from epctx.ep import Partition, ir_nodes, ir_values
from epctx.errors import InvalidGraph
from epctx.providers.example.interpreter import CompiledProgram, build_op
from epctx.providers.example.program import Instruction, Program, WeightSpec

__all__ = ["lower_partition"]


# -- lowering -------------------------------------------------------------------------------------------
class _Lowering:
    """Builds a program from ONNX nodes. Values get symbolic ids in creation order; ``finish`` drops what is
    not needed and numbers the survivors into the program's slot layout."""

    def __init__(self, partition: Partition) -> None:
        self.where = f"partition {partition.name!r}"
        self.ids: dict[ir.Value, int] = {}
        self.count = 0
        self.constants: dict[int, np.ndarray] = {}  # id -> value known at compile time
        self.code: list[tuple[str, tuple[int, ...], int, dict[str, Any]]] = []
        for value in ir_values(partition.inputs):
            self.ids[value] = self._new()

    def _new(self) -> int:
        self.count += 1
        return self.count - 1

    def ref(self, value: ir.Value | None) -> int:
        if value is None:
            raise InvalidGraph(f"{self.where}: a required input is missing")
        if value not in self.ids:
            if value.const_value is None or value.is_graph_input():
                raise InvalidGraph(f"{self.where}: value {value.name!r} is neither computed nor constant")
            self.ids[value] = self.constant(value.const_value.numpy())
        return self.ids[value]

    def constant(self, array: np.ndarray) -> int:
        k = self._new()
        self.constants[k] = np.ascontiguousarray(array)
        return k

    def emit(self, op: str, inputs: Sequence[int], attrs: dict[str, Any] | None = None) -> int:
        attrs = attrs or {}
        if all(i in self.constants for i in inputs):  # constant folding: run it now, keep the result
            fn = build_op(Instruction(op, tuple(inputs), 0, attrs), self.where)
            return self.constant(np.asarray(fn(*[self.constants[i] for i in inputs])))
        out = self._new()
        self.code.append((op, tuple(inputs), out, attrs))
        return out

    def finish(self, partition: Partition) -> CompiledProgram:
        out_ids = [self.ref(v) for v in ir_values(partition.outputs)]
        live = set(out_ids)
        kept = []
        for op, ins, out, attrs in reversed(self.code):  # dead code elimination
            if out in live:
                kept.append((op, ins, out, attrs))
                live.update(ins)
        kept.reverse()
        weight_ids = sorted(k for k in self.constants if k in live)
        slot = {self.ids[v]: s for s, v in enumerate(ir_values(partition.inputs))}
        slot.update({k: len(slot) + j for j, k in enumerate(weight_ids)})
        instructions = []
        for op, ins, out, attrs in kept:
            slot[out] = len(slot)
            instructions.append(Instruction(op, tuple(slot[i] for i in ins), slot[out], attrs))
        weights = [self.constants[k] for k in weight_ids]
        for k, w in zip(weight_ids, weights):
            if w.dtype != np.float32:
                raise InvalidGraph(f"{self.where}: constant {k} is {w.dtype}, this EP stores float32 weights")
        program = Program(
            inputs=tuple(v.name or "" for v in partition.inputs),
            weights=tuple(WeightSpec("float32", tuple(int(d) for d in w.shape)) for w in weights),
            instructions=tuple(instructions),
            outputs=tuple((v.name or "", slot[k]) for v, k in zip(partition.outputs, out_ids)),
        )
        return CompiledProgram(program, weights, where=self.where)


def _lower_gemm(lw: _Lowering, node: ir.Node) -> int:
    a, b = lw.ref(node.inputs[0]), lw.ref(node.inputs[1])
    c = lw.ref(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] is not None else None
    trans_a = node.attributes.get_int("transA", 0)
    trans_b = node.attributes.get_int("transB", 0)
    alpha = node.attributes.get_float("alpha", 1.0)
    beta = node.attributes.get_float("beta", 1.0)
    if b in lw.constants and (trans_b or alpha != 1.0):  # pre-transposed, pre-scaled weight
        weight = lw.constants[b].T if trans_b else lw.constants[b]
        b = lw.constant(weight * np.float32(alpha) if alpha != 1.0 else weight)
        trans_b, alpha = 0, 1.0
    if c is not None and beta == 0.0:
        c = None  # onnxruntime ignores C when beta is 0
    elif c is not None and c in lw.constants and beta != 1.0:
        c, beta = lw.constant(lw.constants[c] * np.float32(beta)), 1.0
    attrs = {"trans_a": trans_a, "trans_b": trans_b, "alpha": float(alpha), "beta": float(beta)}
    return lw.emit("Gemm", [a, b] if c is None else [a, b, c], attrs)


def _lower_reshape(lw: _Lowering, node: ir.Node) -> int:
    shape_value = node.inputs[1]
    if shape_value is None or shape_value.const_value is None:
        raise InvalidGraph(f"{lw.where}: Reshape {node.name!r} needs a constant shape")
    shape = [int(d) for d in shape_value.const_value.numpy().reshape(-1)]
    if shape.count(-1) > 1:
        raise InvalidGraph(f"{lw.where}: Reshape {node.name!r}: more than one -1 in shape {shape}")
    allow_zero = node.attributes.get_int("allowzero", 0)
    copy_dims = [] if allow_zero else [i for i, d in enumerate(shape) if d == 0]
    attrs: dict[str, Any] = {"shape": shape}
    if copy_dims:
        attrs["copy_dims"] = copy_dims
    return lw.emit("Reshape", [lw.ref(node.inputs[0])], attrs)


def _lower_transpose(lw: _Lowering, node: ir.Node) -> int:
    perm = node.attributes.get_ints("perm")
    return lw.emit("Transpose", [lw.ref(node.inputs[0])], {} if perm is None else {"perm": list(perm)})


def _lower_softmax(lw: _Lowering, node: ir.Node) -> int:
    return lw.emit("Softmax", [lw.ref(node.inputs[0])], {"axis": node.attributes.get_int("axis", -1)})


def _lower_plain(lw: _Lowering, node: ir.Node) -> int:
    return lw.emit(node.op_type, [lw.ref(v) for v in node.inputs])


_LOWER: Mapping[str, Callable[[_Lowering, ir.Node], int]] = {
    "Gemm": _lower_gemm,
    "Reshape": _lower_reshape,
    "Transpose": _lower_transpose,
    "Softmax": _lower_softmax,
    "Identity": lambda lw, node: lw.ref(node.inputs[0]),  # no instruction: the output aliases the input
}


def lower_partition(partition: Partition) -> CompiledProgram:
    """Lower the partition's nodes, in order, into a program and build it."""
    lw = _Lowering(partition)
    for node in ir_nodes(partition.nodes):
        lw.ids[node.outputs[0]] = _LOWER.get(node.op_type, _lower_plain)(lw, node)
    return lw.finish(partition)
