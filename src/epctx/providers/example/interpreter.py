"""Runs a lowered :class:`Program` with numpy.

Everything that can be decided before the first call is decided in :class:`CompiledProgram`'s constructor:
each instruction becomes ``(function, input slots, output slot, slots to release)``, attributes are parsed
once into the function's closure, and the weights sit in a slot template. A call copies the template, places
the inputs, and runs the steps: no JSON, no dict lookups, no attribute parsing on the hot path.

Functions never write into their inputs (weights are read-only views of the context binary, inputs may be the
caller's arrays); they write in place only into arrays they have just allocated themselves.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from epctx.errors import InvalidGraph
from epctx.providers.example.program import WEIGHT_DTYPES, Instruction, Program

__all__ = ["OPS", "CompiledProgram", "build_op"]

Fn = Callable[..., Any]


# -- attribute readers (build time only) ------------------------------------------------------------------
def _int(attrs: Mapping[str, Any], key: str, default: int) -> int:
    value = attrs.get(key, default)
    if type(value) is not int:
        raise TypeError(f"attribute {key!r} must be an integer, found {value!r}")
    return value


def _float(attrs: Mapping[str, Any], key: str, default: float) -> np.float32:
    value = attrs.get(key, default)
    if type(value) not in (int, float):
        raise TypeError(f"attribute {key!r} must be a number, found {value!r}")
    return np.float32(value)


def _ints(attrs: Mapping[str, Any], key: str) -> tuple[int, ...] | None:
    value = attrs.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or any(type(v) is not int for v in value):
        raise TypeError(f"attribute {key!r} must be a list of integers, found {value!r}")
    return tuple(value)


# -- op builders: attrs -> function of the input arrays -------------------------------------------------
def _gemm(attrs: Mapping[str, Any]) -> Fn:
    trans_a = bool(_int(attrs, "trans_a", 0))
    trans_b = bool(_int(attrs, "trans_b", 0))
    alpha = _float(attrs, "alpha", 1.0)
    beta = _float(attrs, "beta", 1.0)

    def gemm(a: np.ndarray, b: np.ndarray, c: np.ndarray | None = None) -> np.ndarray:
        y = np.matmul(a.T if trans_a else a, b.T if trans_b else b)  # a new array: safe to update in place
        if alpha != 1:
            y *= alpha
        if c is not None:
            y += c if beta == 1 else beta * c
        return y

    return gemm


def _sigmoid(attrs: Mapping[str, Any]) -> Fn:
    def sigmoid(x: np.ndarray) -> np.ndarray:
        e = np.exp(-np.abs(x))  # in (0, 1]: never overflows
        r = 1 / (1 + e)
        return np.where(x < 0, e * r, r)

    return sigmoid


def _softmax(attrs: Mapping[str, Any]) -> Fn:
    axis = _int(attrs, "axis", -1)

    def softmax(x: np.ndarray) -> np.ndarray:
        e = x - x.max(axis=axis, keepdims=True)
        np.exp(e, out=e)
        e /= e.sum(axis=axis, keepdims=True)
        return e

    return softmax


def _reshape(attrs: Mapping[str, Any]) -> Fn:
    shape = _ints(attrs, "shape")
    if shape is None:
        raise TypeError("attribute 'shape' is required")
    copy_dims = _ints(attrs, "copy_dims") or ()  # positions whose size comes from the input (ONNX's 0)
    if not copy_dims:
        return lambda x: np.reshape(x, shape)

    def reshape(x: np.ndarray) -> np.ndarray:
        dims = list(shape)
        for i in copy_dims:
            dims[i] = x.shape[i]
        return np.reshape(x, dims)

    return reshape


def _transpose(attrs: Mapping[str, Any]) -> Fn:
    perm = _ints(attrs, "perm")
    return np.transpose if perm is None else lambda x: np.transpose(x, perm)


def _fixed(fn: Fn) -> Callable[[Mapping[str, Any]], Fn]:
    return lambda attrs: fn


# op -> (min inputs, max inputs, builder)
OPS: Mapping[str, tuple[int, int, Callable[[Mapping[str, Any]], Fn]]] = {
    "MatMul": (2, 2, _fixed(np.matmul)),
    "Gemm": (2, 3, _gemm),
    "Add": (2, 2, _fixed(np.add)),
    "Sub": (2, 2, _fixed(np.subtract)),
    "Mul": (2, 2, _fixed(np.multiply)),
    "Div": (2, 2, _fixed(np.divide)),
    "Relu": (1, 1, _fixed(lambda x: np.maximum(x, 0))),
    "Sigmoid": (1, 1, _sigmoid),
    "Tanh": (1, 1, _fixed(np.tanh)),
    "Softmax": (1, 1, _softmax),
    "Reshape": (1, 1, _reshape),
    "Transpose": (1, 1, _transpose),
}


def build_op(ins: Instruction, where: str = "program") -> Fn:
    """The function for one instruction; an unknown op, wrong arity or bad attribute is InvalidGraph."""
    spec = OPS.get(ins.op)
    if spec is None:
        raise InvalidGraph(f"{where}: unknown op {ins.op!r} (known: {', '.join(OPS)})")
    low, high, builder = spec
    if not low <= len(ins.inputs) <= high:
        raise InvalidGraph(f"{where}: {ins.op} takes {low}..{high} inputs, found {len(ins.inputs)}")
    try:
        return builder(ins.attrs)
    except TypeError as exc:
        raise InvalidGraph(f"{where}: {ins.op}: {exc}") from exc


class CompiledProgram:
    """A program ready to run: ``fn(*inputs)`` -> one array per program output.

    Holds the :class:`Program` and its weights (``save_partition`` serializes them as they are)."""

    __slots__ = ("_num_inputs", "_outputs", "_steps", "_template", "program", "weights")

    def __init__(self, program: Program, weights: Sequence[np.ndarray], *, where: str = "program") -> None:
        if len(weights) != len(program.weights):
            raise InvalidGraph(f"{where}: {len(weights)} weights for {len(program.weights)} declared")
        for j, (w, spec) in enumerate(zip(weights, program.weights)):
            if w.dtype != np.dtype(WEIGHT_DTYPES[spec.dtype]) or w.shape != spec.shape:
                raise InvalidGraph(
                    f"{where}: weight {j} is {w.dtype}{list(w.shape)}, declared {spec.dtype}{list(spec.shape)}"
                )
        self.program = program
        self.weights = tuple(weights)
        num_inputs = len(program.inputs)
        template: list[Any] = [None] * program.num_slots
        template[num_inputs : num_inputs + len(weights)] = weights
        outputs = tuple(slot for _, slot in program.outputs)
        # Release each slot after its last reader (the slot list is per call: weights stay in the template).
        last_read: dict[int, int] = {}
        for k, ins in enumerate(program.instructions):
            for s in ins.inputs:
                last_read[s] = k
        frees: list[list[int]] = [[] for _ in program.instructions]
        for s, k in last_read.items():
            if s not in outputs:
                frees[k].append(s)
        self._steps = tuple(
            (build_op(ins, f"{where}, instruction {k}"), ins.inputs, ins.output, tuple(sorted(frees[k])))
            for k, ins in enumerate(program.instructions)
        )
        self._template = template
        self._outputs = outputs
        self._num_inputs = num_inputs

    def __call__(self, *inputs: np.ndarray) -> list[np.ndarray]:
        if len(inputs) != self._num_inputs:
            raise TypeError(f"expected {self._num_inputs} inputs, got {len(inputs)}")
        slots = self._template.copy()
        slots[: self._num_inputs] = inputs
        for fn, ins, out, free in self._steps:
            slots[out] = fn(*[slots[i] for i in ins])
            for i in free:
                slots[i] = None
        return [slots[i] for i in self._outputs]
