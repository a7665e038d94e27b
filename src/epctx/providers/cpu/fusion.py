"""Conv epilogues: the activation after a Conv computed in place on the Conv's fresh output.

A Conv whose only readers are an activation (Relu, Clip with constant bounds, HardSigmoid, HardSwish), the
pair of SiLU (``Sigmoid(y)`` and ``Mul(y, Sigmoid(y))``, as PyTorch exports it) or the chain of a HardSwish
as Paddle exports it (``Div(Mul(y, Clip(Add(y, 3), 0, 6)), 6)``) gets an :class:`Epilogue`: the Conv kernel
applies the activation to its output while it is in cache, and the readers' kernels pass their input through
(the Mul of SiLU passes the Conv's output, which already holds ``y * sigmoid(y)``; each node of the HardSwish
chain passes on the value before it, which already holds the HardSwish). This saves a temporary and a pass
per activation, two of each for SiLU, four kernels for Paddle's HardSwish. A passing reader's kernel says so
(``passes_input``): the session's plan then gives its output the Conv's slot and drops its step.

The Conv and its readers agree through the epilogue: it is active only once every reader's kernel was built by
the CPU EP (``join``). A reader that another EP runs never joins, so the Conv then leaves its output alone. The
Conv's output must not be a graph output, everything must be in one graph, and the weights float32 constants.
"""

from __future__ import annotations

import importlib
import math
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx_ir as ir

from epctx.ep import Kernel, to_numpy
from epctx.providers.cpu.registry import constant_node_value

__all__ = [
    "HARD_SWISH_SCALE",
    "Epilogue",
    "NativeForm",
    "activation_of",
    "claim",
    "claimed",
    "clip_ufunc",
    "epilogue_for",
    "join",
    "native_form",
    "native_split",
    "prescaled",
    "register_native",
]

Activation = Callable[[np.ndarray], None]  # in place

# reader node -> the epilogue of the Conv before it (weak: nothing here outlives the session's graph)
_READERS: weakref.WeakKeyDictionary[ir.Node, Epilogue] = weakref.WeakKeyDictionary()


class Epilogue:
    """An activation the Conv applies in place, and the reader nodes whose kernels pass through."""

    __slots__ = (
        "__weakref__",
        "_active",
        "activation",
        "chain",
        "joined",
        "output",
        "passing",
        "readers",
        "result",
    )

    def __init__(
        self,
        activation: Activation,
        output: ir.Value,
        readers: Sequence[ir.Node],
        chain: Sequence[ir.Value] = (),
        passing: Mapping[ir.Node, int] | None = None,
    ) -> None:
        self.activation = activation
        self.output = output  # the Conv's (the head's, for a chain of ``chains.py``)
        self.chain = frozenset((output, *chain))  # values that hold the activated output once active
        self.readers = frozenset(readers)
        # the input a reader passes on where it reads no value of the chain (its output then read by no one
        # but a reader that passes on another input: a rotary pattern's second Slice)
        self.passing = dict(passing or {})
        # the value the nodes after the pattern read: the reader's output that no other reader reads
        self.result = next(
            o for r in readers for o in r.outputs if not any(n in self.readers for n, _ in o.uses())
        )
        self.joined: set[ir.Node] = set()
        self._active: bool | None = None

    def source_of(self, reader: ir.Node) -> int:
        """The input ``reader`` passes on once active."""
        found = self.passing.get(reader)
        if found is not None:
            return found
        return next(k for k, value in enumerate(reader.inputs) if value in self.chain)

    def active(self) -> bool:
        """True when every reader runs on the CPU EP (decided at the first call, once all kernels exist)."""
        if self._active is None:
            self._active = self.joined == self.readers
        return self._active


# An activation as the native kernels apply it (``csrc/common.h``, ``activate``): (code, a, b, hi); code 1
# min(max(v, a), hi), 2 v * min(max(v * a + b, 0), hi), 3 min(max(v * a + b, 0), hi), 4 t * sigmoid(t), t = v * a.
NativeForm = tuple[int, float, float, float]
_NATIVE_FORMS: weakref.WeakKeyDictionary[Activation, NativeForm] = weakref.WeakKeyDictionary()


def native_form(activation: Activation) -> NativeForm | None:
    """How the native kernels apply ``activation``, or None (they leave it to numpy)."""
    return _NATIVE_FORMS.get(activation)


def native_split(activation: Activation | None) -> tuple[NativeForm | None, Activation | None]:
    """(the form a native kernel applies ``activation`` in, or None; what numpy applies after it, or None)."""
    form = None if activation is None else native_form(activation)
    return form, (None if form is not None else activation)


def register_native(activation: Activation, form: NativeForm) -> Activation:
    _NATIVE_FORMS[activation] = form
    return activation


def _relu(y: np.ndarray) -> None:
    np.maximum(y, 0, out=y)


register_native(_relu, (1, 0.0, 0.0, math.inf))


# numpy's clip ufunc itself: np.clip wraps it in Python (2.1 against 0.6 us on 200 values, measured here)
def _findclip_ufunc() -> Any:
    for module in ("numpy._core.umath", "numpy.core.umath"):  # numpy 2, numpy 1
        try:
            return importlib.import_module(module).clip
        except (ImportError, AttributeError):
            continue
    return np.clip


clip_ufunc = _findclip_ufunc()

# Values per pass of a multi-pass activation: 256 KB of float32 stay in cache from one pass to the next
# (HardSwish on 32x112x112: 389 -> 192 us, on 256x14x14: 34 -> 22 us, measured here).
_CHUNK = 1 << 16

Step = Callable[[np.ndarray, np.ndarray], None]  # (values, scratch of the same size), in place


# The scratch of a step that uses none (no array made for it at each call): any use of it fails loudly.
_NO_SCRATCH = np.empty(0, dtype=np.float32)
_NO_SCRATCH.flags.writeable = False


def _chunked(step: Step, *, scratch: bool = True) -> Activation:
    """``step`` over ``_CHUNK`` values at a time; ``scratch``: whether it uses its scratch (else it gets
    ``_NO_SCRATCH``, and no array is made at each call)."""

    def run(y: np.ndarray) -> None:
        if not y.flags.c_contiguous or y.size <= _CHUNK:
            step(y, np.empty_like(y) if scratch else _NO_SCRATCH)
            return
        flat = y.reshape(-1)
        buffer = np.empty(_CHUNK, dtype=y.dtype) if scratch else _NO_SCRATCH
        for start in range(0, flat.size, _CHUNK):
            part = flat[start : start + _CHUNK]
            step(part, buffer[: part.size])

    return run


def _clip(lo: float | None, hi: float | None) -> Activation:
    """In one pass over all values (chunks only pay off between passes)."""
    if lo is None and hi is None:  # a Clip without bounds passes its input on
        return register_native(lambda y: None, (0, 0.0, 0.0, 0.0))

    def clip(y: np.ndarray) -> None:
        if lo is not None and hi is not None:
            clip_ufunc(y, y.dtype.type(lo), y.dtype.type(hi), out=y)
        elif lo is not None:
            np.maximum(y, y.dtype.type(lo), out=y)
        else:
            np.minimum(y, y.dtype.type(hi), out=y)

    return register_native(clip, (1, -math.inf if lo is None else lo, 0.0, math.inf if hi is None else hi))


def _hard_sigmoid(alpha: float, beta: float) -> Activation:
    def hard_sigmoid(y: np.ndarray, _scratch: np.ndarray) -> None:
        y *= y.dtype.type(alpha)
        y += y.dtype.type(beta)
        clip_ufunc(y, y.dtype.type(0), y.dtype.type(1), out=y)

    return register_native(_chunked(hard_sigmoid, scratch=False), (3, alpha, beta, 1.0))


def _hard_swish_step(y: np.ndarray, t: np.ndarray) -> None:
    np.multiply(y, y.dtype.type(1.0 / 6.0), out=t)
    t += y.dtype.type(0.5)
    clip_ufunc(t, y.dtype.type(0), y.dtype.type(1), out=t)
    y *= t


_hard_swish = register_native(_chunked(_hard_swish_step), (2, 1.0 / 6.0, 0.5, 1.0))

# HardSwish of y computed on u = y / sqrt(6), which a Conv gets by scaling its weights and bias once:
# y * clip(y + 3, 0, 6) / 6 == u * clip(u + 3 / sqrt(6), 0, sqrt(6)), three passes instead of four
# (16 x 112 x 112: 81 -> 65 us, 240 x 14 x 14: 17.4 -> 13.4 us, one thread, measured here).
HARD_SWISH_SCALE = 1.0 / math.sqrt(6.0)


def _hard_swish_scaled_step(u: np.ndarray, t: np.ndarray) -> None:
    one = u.dtype.type
    np.add(u, one(3.0 * HARD_SWISH_SCALE), out=t)
    clip_ufunc(t, one(0), one(math.sqrt(6.0)), out=t)
    u *= t


_hard_swish_scaled = register_native(
    _chunked(_hard_swish_scaled_step), (2, 1.0, 3.0 * HARD_SWISH_SCALE, math.sqrt(6.0))
)


def prescaled(epilogue: Epilogue) -> tuple[float, Activation] | None:
    """(scale, activation) when ``epilogue``'s activation runs in fewer passes on its input times ``scale``
    (the Conv scales its weights and bias instead), else None."""
    return (HARD_SWISH_SCALE, _hard_swish_scaled) if epilogue.activation is _hard_swish else None


def _silu(y: np.ndarray) -> None:
    t = np.negative(y)
    np.exp(t, out=t)  # overflows to inf for very negative y: 1 / inf = 0, the right limit
    t += 1
    np.divide(y, t, out=y)


register_native(_silu, (4, 1.0, 0.0, 0.0))


def _scalar(value: ir.Value | None, rank: int = 0) -> float | None:
    """A constant's one value (None for an omitted input); ValueError when it is no constant of one value, or
    has more than ``rank`` dimensions where ``rank`` is given (it would widen what it is broadcast with)."""
    if value is None:
        return None
    if value.is_graph_input():
        raise ValueError("not a constant")
    array = to_numpy(value.const_value) if value.const_value is not None else constant_node_value(value)
    if array is None:
        raise ValueError("not a constant")
    if array.size != 1 or (rank and array.ndim > rank):
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


def activation_of(node: ir.Node) -> Activation | None:
    """The in-place activation ``node`` computes (Relu, HardSwish, HardSigmoid, Clip with constant bounds),
    else None."""
    return _unary(node)


Found = tuple[Activation, list[ir.Node], list[ir.Value]]  # activation, readers, values passed on


def _pattern(y: ir.Value, rank: int) -> Found | None:
    readers = list(dict.fromkeys(node for node, _ in y.uses()))
    if len(readers) == 1:
        act = _unary(readers[0])
        return None if act is None else (act, readers, [])
    if len(readers) != 2:
        return None
    sig = next((r for r in readers if r.op_type == "Sigmoid"), None)
    mul = next((r for r in readers if r.op_type == "Mul"), None)
    if mul is None or len(mul.inputs) != 2:
        return None
    if sig is None:
        return _paddle_hard_swish(y, readers, mul, rank)
    s = sig.outputs[0]
    if set(mul.inputs) != {y, s} or not _only_reader(s, mul):
        return None
    return _silu, [sig, mul], []


def _only_reader(value: ir.Value, node: ir.Node) -> bool:
    """``node`` is the one reader of ``value``, which is no graph output."""
    return not value.is_graph_output() and [n for n, _ in value.uses()] == [node]


def _is_scalar(value: ir.Value | None, expected: float, rank: int) -> bool:
    try:
        found = _scalar(value, rank)
    except ValueError:
        return False
    return found is not None and abs(found - expected) <= 1e-6 * max(1.0, abs(expected))


def _next(value: ir.Value, op: str) -> ir.Node | None:
    """The one reader of ``value`` when it is an ``op`` of two inputs (``value`` first or second)."""
    readers = [n for n, _ in value.uses()]
    if value.is_graph_output() or len(readers) != 1 or readers[0].op_type != op:
        return None
    return readers[0]


def _paddle_hard_swish(y: ir.Value, readers: list[ir.Node], mul: ir.Node, rank: int) -> Found | None:
    """``Div(Mul(y, Clip(Add(y, 3), 0, 6)), 6)`` (or the Mul by 1/6), Paddle's export of HardSwish; ``rank``
    is y's (its constants must not widen it)."""
    add = next((r for r in readers if r.op_type == "Add"), None)
    if add is None or len(add.inputs) != 2 or list(add.inputs).count(y) != 1:
        return None
    if not _is_scalar(add.inputs[1 - list(add.inputs).index(y)], 3.0, rank):
        return None
    clip = _next(add.outputs[0], "Clip")
    if clip is None or len(clip.inputs) != 3 or clip.inputs[0] is not add.outputs[0]:
        return None
    if not (_is_scalar(clip.inputs[1], 0.0, rank) and _is_scalar(clip.inputs[2], 6.0, rank)):
        return None
    if set(mul.inputs) != {y, clip.outputs[0]} or not _only_reader(clip.outputs[0], mul):
        return None
    last = _next(mul.outputs[0], "Div") or _next(mul.outputs[0], "Mul")
    if last is None or len(last.inputs) != 2 or last.inputs[0] is not mul.outputs[0]:
        return None
    if not _is_scalar(last.inputs[1], 6.0 if last.op_type == "Div" else 1.0 / 6.0, rank):
        return None
    return _hard_swish, [add, clip, mul, last], [add.outputs[0], clip.outputs[0], mul.outputs[0]]


def epilogue_for(conv: ir.Node, weight: np.ndarray | None) -> Epilogue | None:
    """The epilogue of ``conv`` when its readers form a pattern above (the readers may still not join)."""
    if weight is None or weight.dtype != np.float32 or len(conv.outputs) != 1:
        return None
    y = conv.outputs[0]
    if y.is_graph_output():
        return None
    found = _pattern(y, weight.ndim)
    if found is None:
        return None
    act, readers, chain = found
    if any(r.graph is not conv.graph or r.domain not in ("", "ai.onnx") for r in readers):
        return None
    return claim(Epilogue(act, y, readers, chain))


def claimed(node: ir.Node) -> bool:
    """Whether ``node`` is a reader of an epilogue already (a Conv's activation, a chain of ``chains.py``)."""
    return node in _READERS


def claim(epilogue: Epilogue) -> Epilogue:
    """Make ``epilogue``'s readers pass their input on once it is active (``join``)."""
    for r in epilogue.readers:
        _READERS[r] = epilogue
    return epilogue


def join(node: ir.Node, fn: Kernel) -> Kernel:
    """The kernel of ``node`` as the CPU EP runs it: passed through while the Conv before it applies the
    activation (the Mul of SiLU passes the Conv's output on, a node of a chain the value before it), ``fn``
    otherwise."""
    epilogue = _READERS.get(node)
    if epilogue is None:
        return fn
    epilogue.joined.add(node)
    source = epilogue.source_of(node)

    def run(*inputs: Any) -> Any:
        if epilogue.active():
            return (inputs[source],)
        return fn(*inputs)

    def passes_input() -> int | None:  # asked by the session's plan once every kernel exists
        return source if epilogue.active() else None

    run.passes_input = passes_input  # type: ignore[attr-defined]
    return run
