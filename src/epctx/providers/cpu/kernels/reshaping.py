"""Squeeze and Unsqueeze as a reshape: the result's shape depends only on the input's, so the numpy call
(``np.expand_dims`` / ``np.squeeze``: axis normalisation in Python, 2-3 us a call on silero-vad's small
tensors) runs once per input shape, checks the axes and gives the shape; later calls of that shape are one
``reshape`` (a view, as the numpy call's result is: only dims of size 1 are inserted or dropped)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["by_reshape"]

_MAX_SHAPES = 64  # input shapes kept per node; past it the numpy call runs each time


def by_reshape(op: Callable[[Any], Any]) -> Callable[[Any], tuple[Any]]:
    """A kernel of ``op`` (a numpy call that only inserts or drops dims of size 1): ``op`` for an input shape
    met first, a reshape to the shape it gave later."""
    shapes: dict[tuple[int, ...], tuple[int, ...]] = {}

    def run(x: Any) -> tuple[Any]:
        shape = shapes.get(x.shape)
        if shape is None:
            y = op(x)
            if len(shapes) < _MAX_SHAPES:
                shapes[x.shape] = y.shape
            return (y,)
        return (x.reshape(shape),)

    return run
