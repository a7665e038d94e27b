"""FeedBinder: checks a feed dict against the graph inputs and orders it for the plan (hot path)."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from epctx.errors import InvalidArgument
from epctx.session.node_arg import is_tensor_type, tensor_type_string, type_string
from epctx.session.ortvalue import OrtValue

if TYPE_CHECKING:
    from epctx.model.view import ValueView

__all__ = ["FeedBinder", "InputSpec", "StatedFeedBinder", "feed_binder"]


class InputSpec:
    """What the feed of one graph input is checked against: dtype None accepts any value (non-tensors)."""

    __slots__ = ("default", "dims", "dtype", "name", "rank", "type")

    def __init__(
        self,
        name: str,
        type: str,
        dtype: np.dtype[Any] | None,
        shape: Sequence[object] | None,
        default: np.ndarray | None = None,
    ) -> None:
        self.name = name
        self.type = type
        self.default = default
        self.dtype = dtype
        self.rank: int | None = None
        self.dims: tuple[tuple[int, int], ...] = ()
        if dtype is not None and shape is not None:
            self.rank = len(shape)
            # Negative sizes (paddle2onnx writes -1) mean dynamic, as in onnxruntime.
            self.dims = tuple((i, d) for i, d in enumerate(shape) if isinstance(d, int) and d >= 0)

    @classmethod
    def from_value(cls, value: ValueView) -> InputSpec:
        """The spec of a graph input of either loader; a constant input's value is its default."""
        from epctx.model.dtypes import numpy_dtype

        dtype: np.dtype[Any] | None = None
        if is_tensor_type(value.type) and value.dtype is not None:
            dtype = numpy_dtype(int(value.dtype))
            numpy = getattr(value.dtype, "numpy", None)  # onnx-ir's DataType knows float8 / int4 too
            if dtype is None and numpy is not None:
                with contextlib.suppress(Exception):
                    dtype = np.dtype(numpy())
        default = None
        if value.const_value is not None:
            from epctx.model.tensors import to_numpy

            default = to_numpy(value.const_value)
        shape = list(value.shape) if value.shape is not None else None
        return cls(value.name or "", type_string(value.type), dtype, shape, default)


class FeedBinder:
    """Checks a feed against the graph inputs and orders it for the plan. The common feed (every input given as
    an array of its dtype, rank and static sizes) takes a fast path over per-input (name, dtype, rank, static
    dims) tuples made once; anything else (a missing, unknown or converted input, a wrong one) takes the full
    check, which converts what it may and words each refusal as onnxruntime."""

    __slots__ = ("_checks", "_count", "_names", "_specs")

    def __init__(self, specs: Sequence[InputSpec]) -> None:
        self._specs = list(specs)
        self._names = {s.name for s in self._specs}
        self._count = len(self._specs)
        tensors = all(s.dtype is not None and s.rank is not None for s in self._specs)
        self._checks = tuple((s.name, s.dtype, s.rank, s.dims) for s in self._specs) if tensors else None

    def bind(self, feed: Mapping[str, Any]) -> list[Any]:
        checks = self._checks
        if checks is None or len(feed) != self._count:
            return self._bind(feed)
        bound = []
        ndarray = np.ndarray
        try:
            for name, dtype, rank, dims in checks:
                value = feed[name]
                if type(value) is not ndarray or value.ndim != rank or value.dtype != dtype:
                    return self._bind(feed)
                if dims:
                    shape = value.shape
                    for i, d in dims:
                        if shape[i] != d:
                            return self._bind(feed)
                bound.append(value)
        except KeyError:  # a name the feed lacks (and another it has instead)
            return self._bind(feed)
        return bound

    def _bind(self, feed: Mapping[str, Any]) -> list[Any]:
        bound = []
        used = 0
        for spec in self._specs:
            value = feed.get(spec.name, _MISSING)
            if value is _MISSING:
                if spec.default is None:
                    raise InvalidArgument(
                        f"missing input {spec.name!r} ({spec.type}); the feed has {list(feed)}"
                    )
                bound.append(spec.default)
                continue
            used += 1
            if spec.dtype is not None:
                value = _check_tensor(spec, value)
            bound.append(value)
        if used != len(feed):
            unknown = [k for k in feed if k not in self._names]
            raise InvalidArgument(
                f"invalid input name(s) {unknown}; the model's inputs are {[s.name for s in self._specs]}"
            )
        return bound


_MISSING = object()


class StatedFeedBinder(FeedBinder):
    """A FeedBinder for a model folded for stated input values (``epctx.input_values``): a feed must give each
    with that value (a session without stated values keeps FeedBinder's bind, with nothing more to check)."""

    __slots__ = ("_stated",)

    def __init__(self, specs: Sequence[InputSpec], stated: Sequence[tuple[str, float]]) -> None:
        super().__init__(specs)
        index = {s.name: i for i, s in enumerate(self._specs)}
        self._stated = tuple((index[name], name, value) for name, value in stated if name in index)

    def bind(self, feed: Mapping[str, Any]) -> list[Any]:
        bound = super().bind(feed)
        for i, name, value in self._stated:
            given = np.asarray(bound[i])
            if given.size != 1 or given.reshape(-1)[0] != value:
                raise InvalidArgument(
                    f"input {name!r} is {given.tolist()!r}, but this session was made for {name}={value} "
                    "(epctx.input_values): its graph was folded for that value"
                )
        return bound


def feed_binder(specs: Sequence[InputSpec], stated: Sequence[tuple[str, float]] = ()) -> FeedBinder:
    """The binder of a session's inputs: StatedFeedBinder when values were stated, else FeedBinder."""
    return StatedFeedBinder(specs, stated) if stated else FeedBinder(specs)


def _check_tensor(spec: InputSpec, value: Any) -> np.ndarray:
    if not isinstance(value, np.ndarray):
        if isinstance(value, OrtValue):
            value = value.numpy()
        elif isinstance(value, (list, tuple, int, float, bool, np.generic)):
            value = _from_python(spec, value)
        else:
            raise InvalidArgument(
                f"input {spec.name!r} must be a numpy array ({spec.type}), got {type(value).__name__}"
            )
    expected = spec.dtype
    if value.dtype != expected:
        if expected == np.object_ and value.dtype.kind in "US":
            value = value.astype(object)
        else:
            raise InvalidArgument(_bad_type(spec, value.dtype))
    if spec.rank is not None:
        shape = value.shape
        if len(shape) != spec.rank:
            raise InvalidArgument(
                f"Invalid rank for input: {spec.name} Got: {len(shape)} Expected: {spec.rank} Please fix "
                f"either the inputs/outputs or the model. (input {spec.name!r} has rank {len(shape)} (shape "
                f"{list(shape)}), expected rank {spec.rank})"
            )
        for i, d in spec.dims:
            if shape[i] != d:
                raise InvalidArgument(_bad_dims(spec, shape))
    return value


def _from_python(spec: InputSpec, value: Any) -> np.ndarray:
    """A Python list (or tuple, or scalar) becomes an array of the input's element type, as onnxruntime
    converts a list; onnxruntime rejects tuples and scalars, epctx converts them the same way."""
    dtype = spec.dtype
    if dtype is not None and dtype != np.object_:
        try:
            return np.asarray(value, dtype=dtype)
        except (TypeError, ValueError) as exc:
            raise InvalidArgument(
                f"input {spec.name!r} ({spec.type}): the Python value cannot be converted to {dtype}: {exc}"
            ) from exc
    return np.asarray(value, dtype=object) if dtype == np.object_ else np.asarray(value)


# Error messages (cold path): onnxruntime's words first, then epctx's detail (the whole shape or dtype).
def _bad_type(spec: InputSpec, dtype: np.dtype[Any]) -> str:
    from epctx.model.dtypes import onnx_elem_type

    elem_type = onnx_elem_type(dtype)
    actual = tensor_type_string(elem_type) if elem_type else f"numpy {dtype}"
    return (
        f"Unexpected input data type. Actual: ({actual}) , expected: ({spec.type}) (input {spec.name!r} has "
        f"dtype {dtype}, expected {spec.dtype})"
    )


def _bad_dims(spec: InputSpec, shape: tuple[int, ...]) -> str:
    wrong = [(i, d) for i, d in spec.dims if shape[i] != d]
    indices = "".join(f" index: {i} Got: {shape[i]} Expected: {d}\n" for i, d in wrong)
    i, d = wrong[0]
    return (
        f"Got invalid dimensions for input: {spec.name} for the following indices\n{indices}"
        f" Please fix either the inputs/outputs or the model. (input {spec.name!r} has shape {list(shape)}, "
        f"expected dimension {i} to be {d})"
    )
