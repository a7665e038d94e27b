"""The measured rule's inputs (``epctx.partition.measured``): one array per partition input, of its shape and type,
with a size chosen for each dimension the model leaves dynamic, and values a real feed could hold.

Sizes of dynamic dimensions (the session's free-dimension overrides were applied at load, so a dimension still
dynamic here is one the user did not state):

- a dimension named like a batch (``batch``, ``N``) or met first on axis 0 of an input: ``LEADING_DIM`` (1), what
  one request holds (a leading axis is a batch in every dynamic model of the corpus: resnet18, mobilenetv3,
  yolo, magika, the PP-OCR models, MiniLM);
- any other: two sizes, ``OTHER_DIM`` (128) and ``SMALL_DIM`` (32), and the partition is handed back only when
  it is slower at both (``size_choices``; a size that a side cannot run, such as a 32-pixel image through
  five poolings, is left out): a sequence of 128 tokens (MiniLM's feed) or of 32 (the LLM pair's
  prefill feeds 16), a 128- or 32-pixel side for an image whose height and width are dynamic (the PP-OCR
  models). The model states no size for these anywhere (its value_info carries the same names), and which
  EP is faster depends on the size (the LLM prefill on IREE: 5x faster than the CPU EP at 16 tokens, slower
  at 128), so one size would be a guess at the user's feed; the reason of a hand-back names the sizes
  measured, and the user states the real ones with free-dimension overrides (then nothing is chosen).
- when neither of those two runs on both sides (a model that only runs at one size of a dimension: PP-OCRv4's
  recogniser must be fed a height of 48, its backbone collapses the height to 1 before a Squeeze, and at 128
  its Reshape fails, at 32 its AveragePool), further sizes, ``FURTHER_DIMS`` (48, 64, 96, 224, 256, 320, 640,
  16, 8: common feed sizes, text-line heights and model input sides first, then small ones), each given to
  every such dimension at once, tried in turn (``further_choices``) and stopping at the first size at which
  both sides run: the partition is measured (and judged) at that size alone. A failing try costs one run of
  each side at most (the warm-up: the EP's side runs first, the kernel EP's only when it passed); the list is
  the cap on the number of tries, and the tries stop once they have cost ``BUDGET_S`` (the measurement's
  budget, ``epctx.partition.measured``) in all; each is logged. Past the list, the partition is not measured
  and its EP keeps it.

The model's own hints come first: a dimension whose name is a number (``"48"``, as some exporters name a
dimension they know the size of) is that size at every choice, never guessed. The sizes of a dimension are
not read from elsewhere: no model of the corpus states one (ppocr_rec carries no value_info, its dimensions
are named ``p2o.DynamicDimension.0``, ``?`` and ``p2o.DynamicDimension.1``, counters, not sizes).

A dimension with a name gets one size wherever it appears (two inputs sharing ``sequence`` agree); an
anonymous one (no name, ``?``, or a negative size) its own. A name that is an expression of other names, as
shape inference writes for a value computed from a dynamic input (nudenet's feature maps:
``(floor(floor(height/2 - 1/2)/2) + 1)*(...)``), is evaluated with the sizes of those names, so that the
partition's inputs agree with each other as the model's own values do (sized independently, its Concat of
three scales refuses them).

Values: floats uniform in [0, 1); integers and booleans of an input whose name contains ``mask`` are ones
(True): a mask of zeros masks everything out, which makes an attention partition take a degenerate path (all
scores -inf or -10000 before the softmax) that a real feed never takes; other integers are zeros (indices stay
in range whatever the table's size), other booleans False."""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

__all__ = [
    "LEADING_DIM",
    "OTHER_DIM",
    "FURTHER_DIMS",
    "SMALL_DIM",
    "chosen_sizes",
    "describe_sizes",
    "further_choices",
    "size_choices",
    "synthetic_inputs",
]

LEADING_DIM = 1
OTHER_DIM = 128
SMALL_DIM = 32
# Tried in turn when neither OTHER_DIM nor SMALL_DIM runs on both sides (see the module): also the cap on tries
FURTHER_DIMS = (48, 64, 96, 224, 256, 320, 640, 16, 8)
_BATCH_NAMES = ("batch", "n")
_ANONYMOUS = ("", "?")


def _dim_key(dim: Any, value_name: str, axis: int) -> str | None:
    """A static dimension: None; a dynamic one: its name, or ``value[axis]`` when anonymous."""
    if isinstance(dim, int):
        return None if dim >= 0 else f"{value_name}[{axis}]"
    name = getattr(dim, "value", None)
    if isinstance(name, int):
        return None if name >= 0 else f"{value_name}[{axis}]"
    return f"{value_name}[{axis}]" if name is None or str(name) in _ANONYMOUS else str(name)


_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "floor": math.floor,
    "ceil": math.ceil,
    "Min": min,
    "Max": max,
    "min": min,
    "max": max,
}
_OPERATORS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
}  # fmt: skip


def _base_size(name: str, other: int) -> int:
    return LEADING_DIM if name.lower() in _BATCH_NAMES or "batch" in name.lower() else other


def _evaluate(node: ast.AST, other: int) -> Any:
    """An arithmetic expression of dimension names (``+ - * / // %``, floor, ceil, min, max), each name at its
    own size; ValueError for anything else."""
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        return node.value
    if isinstance(node, ast.Name):
        return _base_size(node.id, other)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](_evaluate(node.left, other), _evaluate(node.right, other))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_evaluate(node.operand, other)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS:
        return _FUNCTIONS[node.func.id](*(_evaluate(arg, other) for arg in node.args))
    raise ValueError(f"not a size expression: {ast.dump(node)}")


def _expression_size(name: str, other: int) -> int | None:
    """The size of a dimension named by an expression of other names (None: a plain name, or not one)."""
    if not any(c in name for c in "()+-*/"):
        return None
    try:
        value = _evaluate(ast.parse(name, mode="eval").body, other)
    except (SyntaxError, ValueError, TypeError, ZeroDivisionError, RecursionError):
        return None
    size = int(value)
    return size if size == value and size > 0 else None


def chosen_sizes(values: Sequence[Any], other: int = OTHER_DIM) -> dict[str, int] | None:
    """The size chosen for each dynamic dimension of ``values`` (partition inputs), by name (``value[axis]`` for
    an anonymous one): ``LEADING_DIM`` for a batch, ``other`` for the rest, the number a dimension's name
    states for it (a hint of the model's); None when a value's shape is unknown (its rank, say)."""
    sizes: dict[str, int] = {}
    for value in values:
        shape = getattr(value, "shape", None)
        if shape is None:
            return None
        for axis, dim in enumerate(shape):
            key = _dim_key(dim, str(value.name), axis)
            if key is None or key in sizes:
                continue
            computed = int(key) if key.isdigit() and int(key) > 0 else _expression_size(key, other)
            batch = axis == 0 or key.lower() in _BATCH_NAMES or "batch" in key.lower()
            sizes[key] = computed if computed is not None else LEADING_DIM if batch else other
    return sizes


def size_choices(values: Sequence[Any]) -> list[dict[str, int]] | None:
    """The sizes to measure ``values`` at: one set when every dynamic dimension is a batch (or none is dynamic),
    else two, ``OTHER_DIM`` then ``SMALL_DIM`` for the other dimensions; None when a shape is unknown."""
    large = chosen_sizes(values, OTHER_DIM)
    small = chosen_sizes(values, SMALL_DIM)
    if large is None or small is None:
        return None
    return [large] if small == large else [large, small]


def further_choices(values: Sequence[Any], tried: Sequence[Mapping[str, int]] = ()) -> list[dict[str, int]]:
    """The further sizes to try ``values`` at, in turn, when none of ``tried`` (``size_choices``) runs: one set
    per size of ``FURTHER_DIMS`` for the dimensions that are not a batch, each set once, none of ``tried``
    nor of ``size_choices`` ([] when a shape is unknown, or every dynamic dimension is a batch)."""
    tried = [*tried, *(size_choices(values) or [])]
    found: list[dict[str, int]] = []
    for size in FURTHER_DIMS:
        sizes = chosen_sizes(values, size)
        if sizes is None:
            return []
        if sizes not in found and sizes not in tried:
            found.append(sizes)
    return found


def describe_sizes(sizes: Mapping[str, int]) -> str:
    """For a reason: ``batch=1, sequence=128``, or ``static shapes``."""
    return ", ".join(f"{k}={v}" for k, v in sizes.items()) if sizes else "static shapes"


def _shape(value: Any, sizes: Mapping[str, int]) -> tuple[int, ...]:
    dims = []
    for axis, dim in enumerate(value.shape):
        key = _dim_key(dim, str(value.name), axis)
        dims.append(int(dim) if key is None else sizes[key])
    return tuple(dims)


def _array(
    name: str, dims: tuple[int, ...], np_type: np.dtype[Any], rng: np.random.Generator
) -> np.ndarray | None:
    if np_type.kind == "f":
        return rng.random(dims).astype(np_type)
    if np_type.kind in "iub":
        fill = 1 if "mask" in name.lower() else 0
        return np.full(dims, fill, np_type)
    return None


def synthetic_inputs(
    values: Sequence[Any], sizes: Mapping[str, int] | None = None, seed: int = 0
) -> list[np.ndarray] | None:
    """One array per value of ``values`` (partition inputs), dynamic dimensions sized by ``sizes`` (default:
    ``chosen_sizes(values)``); None when a value's shape or type is not known or not a number type."""
    sizes = chosen_sizes(values) if sizes is None else sizes
    if sizes is None:
        return None
    rng = np.random.default_rng(seed)
    arrays = []
    for value in values:
        dtype = getattr(value, "dtype", None)
        try:
            np_type = np.dtype(dtype.numpy())  # type: ignore[union-attr]
        except (TypeError, ValueError, AttributeError):
            return None
        array = _array(str(value.name), _shape(value, sizes), np_type, rng)
        if array is None:
            return None
        arrays.append(array)
    return arrays
