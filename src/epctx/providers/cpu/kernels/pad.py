"""CPU kernel: Pad (opsets 2 and 11+; negative pads crop). Its reflect, edge and wrap modes are gathers: each
is an index mapping along each padded axis, so the indices (``np.pad`` of ``arange``, numpy's own rule, pads larger than the axis included) are made once per
(extent, pads, mode) and a call is one ``take`` per padded axis (silero-vad's reflect pad of (1, 512) by 64:
35 us through ``np.pad``, measured here)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from epctx.ep import Kernel
from epctx.providers.cpu.fallback import reference_kernel
from epctx.providers.cpu.registry import NodeInfo, kernel

__all__ = ["PadGathers", "index_pad", "sides"]

_INDICES: dict[tuple[int, int, int, str], np.ndarray] = {}
_MAX_KEPT = 256  # distinct (extent, pads, mode) kept; past it the indices are made per call


def _indices(dim: int, before: int, after: int, mode: str) -> np.ndarray:
    key = (dim, before, after, mode)
    found = _INDICES.get(key)
    if found is None:
        found = np.pad(np.arange(dim, dtype=np.intp), (before, after), mode=mode)  # type: ignore[call-overload]
        if len(_INDICES) < _MAX_KEPT:
            _INDICES[key] = found
    return found


def index_pad(x: np.ndarray, before: list[int], after: list[int], mode: str) -> Any:
    """``np.pad(x, zip(before, after), mode)`` for ``mode`` in reflect, edge, wrap (pads >= 0)."""
    if any(dim == 0 for dim, b, e in zip(x.shape, before, after) if b or e):
        return np.pad(x, list(zip(before, after)), mode=mode)  # type: ignore[call-overload]  # numpy's error
    out = x
    for axis, (dim, b, e) in enumerate(zip(x.shape, before, after)):
        if b or e:
            out = out.take(_indices(dim, b, e, mode), axis=axis)
    return out if out is not x else x.copy()


def sides(pads: Sequence[int], axes: Sequence[int] | None, ndim: int) -> tuple[list[int], list[int]]:
    """ONNX ``pads`` (all begins, then all ends; over ``axes`` or every axis) as per-axis begin and end lists."""
    n = len(pads) // 2
    before = [0] * ndim
    after = [0] * ndim
    for i in range(n):
        a = i if axes is None else axes[i] % ndim
        before[a] = pads[i]
        after[a] = pads[i + n]
    return before, after


class PadGathers:
    """The reflect, edge or wrap Pads of one node: for each (input shape, pads, axes) met, the axes to gather
    along and their indices, found once (silero-vad's reflect pad, whose pads the plan folds from a Concat:
    7 -> 3 us a call, measured here). Pads with a negative entry or an empty padded axis are no gather
    (``None``: the caller pads as usual)."""

    __slots__ = ("mode", "plans")

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.plans: dict[Any, list[tuple[int, np.ndarray]] | None] = {}

    def _plan(
        self, shape: tuple[int, ...], pads: Sequence[int], axes: Sequence[int] | None
    ) -> list[tuple[int, np.ndarray]] | None:
        if min(pads, default=0) < 0:
            return None
        before, after = sides(pads, axes, len(shape))
        if any(dim == 0 for dim, b, e in zip(shape, before, after) if b or e):
            return None
        found = zip(shape, before, after)
        return [(axis, _indices(dim, b, e, self.mode)) for axis, (dim, b, e) in enumerate(found) if b or e]

    def __call__(self, x: np.ndarray, pads: tuple[int, ...], axes: tuple[int, ...] | None) -> Any:
        """``x`` padded, or None when these pads are no gather."""
        key = (x.shape, pads, axes)
        if key in self.plans:
            plan = self.plans[key]
        else:
            plan = self._plan(x.shape, pads, axes)
            if len(self.plans) < _MAX_KEPT:
                self.plans[key] = plan
        if plan is None:
            return None
        out = x
        for axis, idx in plan:
            out = out.take(idx, axis=axis)
        return out if out is not x else x.copy()


# --------------------------------------------------------------------------------------------- kernels
def _ints(value: Any) -> list[int]:
    return [int(v) for v in np.asarray(value).reshape(-1).tolist()]


_PAD_MODES: dict[str, Any] = {"constant": "constant", "reflect": "reflect", "edge": "edge", "wrap": "wrap"}


def _pad(x: Any, pads: list[int], axes: list[int] | None, mode: str, value: Any) -> Any:
    before, after = sides(pads, axes, x.ndim)
    if min(before, default=0) < 0 or min(after, default=0) < 0:  # negative pads crop
        x = x[tuple(slice(max(-b, 0), dim - max(-e, 0)) for b, e, dim in zip(before, after, x.shape))]
        before = [max(b, 0) for b in before]
        after = [max(e, 0) for e in after]
    if mode == "constant":
        shape = tuple(dim + b + e for dim, b, e in zip(x.shape, before, after))
        out = np.full(shape, value, dtype=x.dtype)
        out[tuple(slice(b, b + dim) for b, dim in zip(before, x.shape))] = x
        return out
    return index_pad(x, before, after, _PAD_MODES[mode])


@kernel("Pad", since=2)
def _pad_attr(info: NodeInfo) -> Kernel:
    pads = _ints(info.get("pads", []))
    mode = str(info.get("mode", "constant"))
    value = float(info.get("value", 0.0))
    if mode not in _PAD_MODES:
        return reference_kernel(info)
    return lambda x: (_pad(x, pads, None, mode, value),)


@kernel("Pad", since=11)
def _pad_input(info: NodeInfo) -> Kernel:
    mode = str(info.get("mode", "constant"))
    if mode not in _PAD_MODES:
        return reference_kernel(info)
    gathers = None if mode == "constant" else PadGathers(_PAD_MODES[mode])

    def run(x: Any, pads: Any, value: Any = None, axes: Any = None) -> tuple[Any]:
        if gathers is not None and pads.ndim == 1 and (axes is None or axes.ndim == 1):
            y = gathers(x, tuple(pads.tolist()), None if axes is None else tuple(axes.tolist()))
            if y is not None:
                return (y,)
        fill = 0 if value is None or value.size == 0 else np.asarray(value).reshape(-1)[0]
        return (_pad(x, _ints(pads), None if axes is None else _ints(axes), mode, fill),)

    return run
