"""Where the windows of a convolution or pooling lie (geometry, padding, strided views) and the scratch arrays
the kernels reuse from call to call. Shared by the Conv, pooling and quantized-conv kernels."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import as_strided

from epctx.errors import InvalidArgument

__all__ = [
    "ALL",
    "SCRATCH",
    "Geometry",
    "ScratchPool",
    "ints",
    "pad_input",
    "release_padded",
    "spatial_geometry",
    "window_slices",
    "window_view",
]

ALL = _ALL = slice(None)


class Geometry:
    """Where the windows of a conv/pool lie along the spatial axes of one input shape."""

    __slots__ = ("dilations", "kernel", "out", "pad_begin", "pad_end", "padded", "strides")

    def __init__(
        self,
        kernel: tuple[int, ...],
        strides: tuple[int, ...],
        dilations: tuple[int, ...],
        out: tuple[int, ...],
        pad_begin: tuple[int, ...],
        pad_end: tuple[int, ...],
        padded: tuple[int, ...],
    ) -> None:
        self.kernel = kernel
        self.strides = strides
        self.dilations = dilations
        self.out = out
        self.pad_begin = pad_begin
        self.pad_end = pad_end
        # Extent of the padded buffer the windows read: covers the input and every window.
        self.padded = padded

    @property
    def needs_pad(self) -> bool:
        return any(self.pad_begin) or any(self.pad_end)


def ints(value: Any, n: int, default: int) -> tuple[int, ...]:
    """An INTS attribute as a tuple of ``n`` ints (``default`` each when missing or empty)."""
    if value is None or len(value) == 0:
        return (default,) * n
    return tuple(int(v) for v in value)


def spatial_geometry(
    in_sp: Sequence[int],
    kernel: Sequence[int],
    strides: Sequence[int],
    dilations: Sequence[int],
    pads: Sequence[int] | None,
    auto_pad: str,
    *,
    ceil_mode: bool = False,
    node: str = "",
) -> Geometry:
    """Output size and pads per spatial axis, with onnxruntime's rules for auto_pad and ceil_mode."""
    n = len(in_sp)
    out: list[int] = []
    pb: list[int] = []
    pe: list[int] = []
    padded: list[int] = []
    for i in range(n):
        size, k, s, d = int(in_sp[i]), int(kernel[i]), int(strides[i]), int(dilations[i])
        dk = (k - 1) * d + 1
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            o = -(-size // s)
            total = max(0, (o - 1) * s + dk - size)
            head = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
            tail = total - head
        else:
            if auto_pad == "VALID" or not pads:
                head = tail = 0
            else:
                head, tail = int(pads[i]), int(pads[i + n])
            span = size + head + tail - dk
            if span < 0:
                raise InvalidArgument(
                    f"node {node!r}: kernel extent {dk} exceeds padded input size {size + head + tail} "
                    f"on spatial axis {i}"
                )
            if ceil_mode:
                o = -(-span // s) + 1
                if (o - 1) * s >= size + head:  # the last window must start inside the input or head pad
                    o -= 1
            else:
                o = span // s + 1
        out.append(o)
        pb.append(head)
        pe.append(tail)
        padded.append(max(head + size + tail, (o - 1) * s + dk))
    return Geometry(
        tuple(int(k) for k in kernel),
        tuple(int(s) for s in strides),
        tuple(int(d) for d in dilations),
        tuple(out),
        tuple(pb),
        tuple(pe),
        tuple(padded),
    )


class ScratchPool:
    """Scratch arrays reused from call to call, keyed by shape and dtype (or by a key of the caller's).

    Fresh multi-megabyte temporaries cost page faults on every call once the C heap has trimmed them
    (measured 2x on an isolated conv layer). Each caller takes its own array and gives it back when done,
    so concurrent runs never share one; at most ``limit`` bytes are kept; a fresh array is ``fresh(shape,
    dtype=dtype)`` (``np.empty``, or ``np.zeros`` for a pool whose arrays come back with zeros where it matters).
    """

    __slots__ = ("_free", "_fresh", "kept", "limit")

    def __init__(self, limit: int, fresh: Callable[..., np.ndarray] = np.empty) -> None:
        self._free: dict[Any, list[np.ndarray]] = {}
        self._fresh = fresh
        self.kept = 0
        self.limit = limit

    def take(self, shape: tuple[int, ...], dtype: Any, key: Any = None) -> np.ndarray:
        free = self._free.get((shape, np.dtype(dtype)) if key is None else key)
        if free:
            try:
                arr = free.pop()
            except IndexError:  # another thread took the last one
                return self._fresh(shape, dtype=dtype)
            self.kept -= arr.nbytes
            return arr
        return self._fresh(shape, dtype=dtype)

    def give(self, *arrays: np.ndarray, key: Any = None) -> None:
        for arr in arrays:
            if self.kept + arr.nbytes <= self.limit:
                self._free.setdefault((arr.shape, arr.dtype) if key is None else key, []).append(arr)
                self.kept += arr.nbytes


SCRATCH = ScratchPool(128 << 20)


def pad_input(x: np.ndarray, geo: Geometry, fill: Any = 0) -> np.ndarray:
    """``x`` (N, C, *spatial) copied into a buffer of ``geo.padded`` spatial extent filled with ``fill``.

    The buffer comes from ``SCRATCH``: give it back with ``release_padded(x, buf)`` when done.
    """
    in_sp = x.shape[2:]
    if tuple(in_sp) == geo.padded:
        return x
    buf = SCRATCH.take(x.shape[:2] + geo.padded, x.dtype)
    buf.fill(fill)
    inner = (_ALL, _ALL) + tuple(slice(b, b + s) for b, s in zip(geo.pad_begin, in_sp))
    buf[inner] = x
    return buf


def release_padded(x: np.ndarray, xp: np.ndarray) -> None:
    if xp is not x:
        SCRATCH.give(xp)


def window_view(xp: np.ndarray, geo: Geometry) -> np.ndarray:
    """A read-only (N, C, *kernel, *out) view of the windows of the padded input ``xp``."""
    st = xp.strides
    sp_st = st[2:]
    shape = xp.shape[:2] + geo.kernel + geo.out
    strides = (
        st[:2]
        + tuple(s * d for s, d in zip(sp_st, geo.dilations))
        + tuple(s * t for s, t in zip(sp_st, geo.strides))
    )
    return as_strided(xp, shape=shape, strides=strides, writeable=False)


def window_slices(geo: Geometry) -> list[tuple[tuple[int, ...], tuple[slice, ...]]]:
    """For each kernel offset: the offset and the (N, C, *out) slice of the padded input it reads."""
    result = []
    for offs in itertools.product(*(range(k) for k in geo.kernel)):
        src = (_ALL, _ALL) + tuple(
            slice(o * d, o * d + s * (n - 1) + 1, s)
            for o, d, s, n in zip(offs, geo.dilations, geo.strides, geo.out)
        )
        result.append((offs, src))
    return result
