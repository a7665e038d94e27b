"""CPU kernels: shape and data movement (Reshape, Transpose, Concat, Gather*, Slice, Split, Scatter*,
TopK, ...) and tensor creation (Constant, ConstantOfShape, Range, OneHot). Pad is in ``pad.py``."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from epctx.ep import Kernel
from epctx.providers.cpu.fallback import reference_kernel
from epctx.providers.cpu.kernels.reshaping import by_reshape
from epctx.providers.cpu.registry import NodeInfo, kernel

__all__: list[str] = []


def _ints(value: Any) -> list[int]:
    """A 1-D (or scalar) integer tensor or attribute as a list of Python ints."""
    return [int(v) for v in np.asarray(value).reshape(-1).tolist()]


def _scalar(value: Any) -> Any:
    return np.asarray(value).reshape(-1)[0]


def _along(axis: int, ndim: int, index: Any) -> tuple[Any, ...]:
    """An indexing key that applies ``index`` on ``axis`` and takes everything on the other axes."""
    return (slice(None),) * (axis % ndim) + (index,)


# ------------------------------------------------------------------------------------------ reshape
def _reshape_target(in_shape: tuple[int, ...], shape: list[int], allowzero: bool) -> list[int]:
    if allowzero:
        return shape
    return [in_shape[i] if d == 0 else d for i, d in enumerate(shape)]


@kernel("Reshape", since=1)
def _reshape_attr(info: NodeInfo) -> Kernel:
    shape = _ints(info.get("shape", []))

    def run(x: Any) -> tuple[Any]:
        return (x.reshape(_reshape_target(x.shape, shape, False)),)

    return run


@kernel("Reshape", since=5)
def _reshape(info: NodeInfo) -> Kernel:
    allowzero = bool(info.get("allowzero", 0))
    const = info.const_input(1)
    if const is not None:
        target = tuple(_ints(const))
        if allowzero or 0 not in target:
            return lambda x, shape: (x.reshape(target),)
        shape_list = list(target)
        return lambda x, shape: (x.reshape(_reshape_target(x.shape, shape_list, False)),)

    def run(x: Any, shape: Any) -> tuple[Any]:
        return (x.reshape(_reshape_target(x.shape, shape.tolist(), allowzero)),)

    return run


@kernel("Flatten", since=1)
def _flatten(info: NodeInfo) -> Kernel:
    axis = int(info.get("axis", 1))

    def run(x: Any) -> tuple[Any]:
        return (x.reshape(math.prod(x.shape[:axis]), math.prod(x.shape[axis:])),)

    return run


@kernel("Squeeze", since=1)
def _squeeze_attr(info: NodeInfo) -> Kernel:
    axes = info.get("axes")
    axes = None if not axes else tuple(int(a) for a in axes)
    return by_reshape(lambda x: np.squeeze(x, axis=axes))


@kernel("Squeeze", since=13)
def _squeeze(info: NodeInfo) -> Kernel:
    const = info.const_input(1) if info.has_input(1) else None
    if const is not None and const.size:
        fixed = by_reshape(lambda x: np.squeeze(x, axis=tuple(_ints(const))))
        return lambda x, a: fixed(x)

    def run(x: Any, axes: Any = None) -> tuple[Any]:
        if axes is None or axes.size == 0:
            return (np.squeeze(x),)
        return (np.squeeze(x, axis=tuple(_ints(axes))),)

    return run


@kernel("Unsqueeze", since=1)
def _unsqueeze_attr(info: NodeInfo) -> Kernel:
    axes = tuple(int(a) for a in info.get("axes", []))
    return by_reshape(lambda x: np.expand_dims(x, axes))


@kernel("Unsqueeze", since=13)
def _unsqueeze(info: NodeInfo) -> Kernel:
    const = info.const_input(1)
    if const is not None:
        axes = tuple(_ints(const))
        fixed = by_reshape(lambda x: np.expand_dims(x, axes))
        return lambda x, a: fixed(x)
    return lambda x, a: (np.expand_dims(x, tuple(_ints(a))),)


@kernel("Transpose", since=1)
def _transpose(info: NodeInfo) -> Kernel:
    perm = info.get("perm")
    if perm is None:
        return lambda x: (np.transpose(x),)
    axes = tuple(int(p) for p in perm)
    return lambda x: (np.transpose(x, axes),)


def _broadcast_shape(a: tuple[int, ...], b: list[int]) -> tuple[int, ...]:
    """numpy's (and ONNX's bidirectional) broadcast of two shapes: ``np.broadcast_shapes`` is 1.5 us."""
    rank = max(len(a), len(b))
    a_full = (1,) * (rank - len(a)) + a
    b_full = [1] * (rank - len(b)) + b
    out = []
    for p, q in zip(a_full, b_full):
        if p != q and p != 1 and q != 1:
            raise ValueError(f"shapes {a} and {tuple(b)} cannot be broadcast together (dimension {p} vs {q})")
        out.append(q if p == 1 else p)
    return tuple(out)


@kernel("Expand", since=8)
def _expand(info: NodeInfo) -> Kernel:
    # (x's shape, the shape's bytes) -> the result's shape: 0.3 us against 1.5 to read and broadcast the shape
    # (an LLM's K / V repeated per query head, with the same shapes at every layer); a few entries.
    shapes: dict[tuple[tuple[int, ...], bytes], tuple[int, ...]] = {}

    def run(x: Any, shape: Any) -> tuple[Any]:
        key = (x.shape, shape.tobytes() if isinstance(shape, np.ndarray) and shape.dtype == np.int64 else b"")
        out_shape = shapes.get(key) if key[1] else None
        if out_shape is None:
            out_shape = _broadcast_shape(x.shape, _ints(shape))
            if key[1]:
                if len(shapes) >= 32:
                    shapes.clear()
                shapes[key] = out_shape
        out = np.empty(out_shape, dtype=x.dtype)
        np.copyto(out, x)  # broadcasts x into it: 0.8 us against broadcast_to(...).copy()'s 2.8 (GQA's K / V)
        return (out,)

    return run


@kernel("Shape", since=1)
def _shape(info: NodeInfo) -> Kernel:
    start = int(info.get("start", 0))
    end = info.get("end")
    end = None if end is None else int(end)
    return lambda x: (np.array(np.shape(x)[start:end], dtype=np.int64),)


@kernel("Size", since=1)
def _size(info: NodeInfo) -> Kernel:
    return lambda x: (np.array(np.size(x), dtype=np.int64),)


# ----------------------------------------------------------------------------------------- creation
def _strings(values: Sequence[Any]) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    out[:] = [v.decode() if isinstance(v, bytes) else str(v) for v in values]
    return out


def _constant_value(info: NodeInfo) -> Any:
    attrs = info.attrs
    if "value" in attrs:
        value = np.asarray(attrs["value"])
        if value.dtype.kind in "SU":
            value = _strings(value.reshape(-1).tolist()).reshape(value.shape)
        return value
    if "value_float" in attrs:
        return np.array(attrs["value_float"], dtype=np.float32)
    if "value_floats" in attrs:
        return np.array(attrs["value_floats"], dtype=np.float32).reshape(-1)
    if "value_int" in attrs:
        return np.array(attrs["value_int"], dtype=np.int64)
    if "value_ints" in attrs:
        return np.array(attrs["value_ints"], dtype=np.int64).reshape(-1)
    if "value_string" in attrs:
        return _strings([attrs["value_string"]]).reshape(())
    if "value_strings" in attrs:
        return _strings(list(attrs["value_strings"]))
    return None


@kernel("Constant", since=1)
def _constant(info: NodeInfo) -> Kernel:
    value = _constant_value(info)
    if value is None:  # sparse_value
        return reference_kernel(info)
    return lambda: (value,)


@kernel("ConstantOfShape", since=9)
def _constant_of_shape(info: NodeInfo) -> Kernel:
    attr = info.get("value")
    fill = np.zeros((), dtype=np.float32) if attr is None else np.asarray(attr).reshape(-1)[0]
    dtype = fill.dtype

    def run(shape: Any) -> tuple[Any]:
        out = np.empty(
            np.asarray(shape).reshape(-1).tolist(), dtype=dtype
        )  # np.full's own steps, 0.3 against 1.5 us
        out.fill(fill)
        return (out,)

    return run


@kernel("Range", since=11)
def _range(info: NodeInfo) -> Kernel:
    stash = bool(info.get("stash_type", 1))

    def run(start: Any, limit: Any, delta: Any) -> tuple[Any]:
        dtype = start.dtype
        s, lim, d = _scalar(start), _scalar(limit), _scalar(delta)
        if dtype.kind in "fV":
            n = max(math.ceil(float(lim - s) / float(d)), 0)
            # float16 / bfloat16 accumulate in float32 (opset 27's default stash_type); all accumulate like
            # a C loop (value += delta), as onnxruntime does.
            acc = dtype if dtype.itemsize >= 4 or not stash else np.dtype(np.float32)
            out = np.full(n, d, dtype=acc)
            if n:
                out[0] = s
                np.cumsum(out, out=out)
            return (out if acc == dtype else out.astype(dtype),)
        si, li, di = int(s), int(lim), int(d)
        n = max(-((si - li) // di), 0)
        return (np.arange(n, dtype=dtype) * dtype.type(di) + dtype.type(si),)

    return run


@kernel("OneHot", since=9)
def _one_hot(info: NodeInfo) -> Kernel:
    axis = int(info.get("axis", -1))

    def run(indices: Any, depth: Any, values: Any) -> tuple[Any]:
        d = int(_scalar(depth))
        idx = np.asarray(indices).astype(np.int64)
        idx = np.where(idx < 0, idx + d, idx)
        out_ndim = idx.ndim + 1
        ax = axis + out_ndim if axis < 0 else axis
        shape = [1] * out_ndim
        shape[ax] = d
        hot = np.expand_dims(idx, ax) == np.arange(d, dtype=np.int64).reshape(shape)
        flat = values.reshape(-1)
        return (np.where(hot, flat[1], flat[0]),)

    return run


# --------------------------------------------------------------------------------- join and split
@kernel("Concat", since=1)
def _concat(info: NodeInfo) -> Kernel:
    axis = int(info.get("axis", 1))
    return lambda *xs: (np.concatenate(xs, axis=axis),)


def _split_sizes(dim: int, sizes: list[int] | None, n: int) -> list[int]:
    if sizes is not None:
        return sizes
    chunk = -(-dim // n)
    return [chunk] * (n - 1) + [dim - chunk * (n - 1)]


def _split(x: Any, axis: int, sizes: list[int] | None, n: int) -> list[Any]:
    ax = axis % x.ndim
    head = (slice(None),) * ax
    out = []
    begin = 0
    for size in _split_sizes(x.shape[ax], sizes, n):
        out.append(x[head + (slice(begin, begin + size),)])
        begin += size
    return out


@kernel("Split", since=2)
def _split_attr(info: NodeInfo) -> Kernel:
    axis = int(info.get("axis", 0))
    split = info.get("split")
    sizes = None if not split else [int(s) for s in split]
    n = info.num_outputs
    return lambda x: _split(x, axis, sizes, n)


@kernel("Split", since=13)
def _split_input(info: NodeInfo) -> Kernel:
    axis = int(info.get("axis", 0))
    n = info.num_outputs
    const = info.const_input(1)
    if const is not None or not info.has_input(1):
        sizes = None if const is None or const.size == 0 else _ints(const)
        return lambda x, split=None: _split(x, axis, sizes, n)

    def run(x: Any, split: Any = None) -> list[Any]:
        return _split(x, axis, None if split is None or split.size == 0 else _ints(split), n)

    return run


@kernel("Tile", since=6)
def _tile(info: NodeInfo) -> Kernel:
    return lambda x, repeats: (np.tile(x, _ints(repeats)),)


# --------------------------------------------------------------------------------------- gathering
@kernel("Gather", since=1)
def _gather(info: NodeInfo) -> Kernel:
    axis = int(info.get("axis", 0))
    # the array's own take: np.take's Python wrapper cost 0.5 us of 0.7 on silero-vad's Shape -> Gather pairs
    return lambda data, indices: (np.asarray(data).take(indices, axis=axis),)


@kernel("GatherElements", since=11)
def _gather_elements(info: NodeInfo) -> Kernel:
    axis = int(info.get("axis", 0))

    def run(data: Any, indices: Any) -> tuple[Any]:
        if data.shape != indices.shape:
            ax = axis % data.ndim
            data = data[tuple(slice(None) if i == ax else slice(0, n) for i, n in enumerate(indices.shape))]
        return (np.take_along_axis(data, indices, axis),)

    return run


@kernel("GatherND", since=11)
def _gather_nd(info: NodeInfo) -> Kernel:
    b = int(info.get("batch_dims", 0))

    def run(data: Any, indices: Any) -> tuple[Any]:
        k = indices.shape[-1]
        batch = data.shape[:b]
        nb = math.prod(batch)
        m = math.prod(indices.shape[b:-1])
        d = data.reshape((nb, *data.shape[b:]))
        idx = indices.reshape(nb, m, k)
        key = (np.arange(nb)[:, None], *(idx[..., j] for j in range(k)))
        out = d[key]
        return (out.reshape(batch + indices.shape[b:-1] + data.shape[b + k :]),)

    return run


def _slice_key(
    ndim: int, starts: list[int], ends: list[int], axes: list[int] | None, steps: list[int] | None
) -> tuple[slice, ...]:
    key = [slice(None)] * ndim
    for i, (s, e) in enumerate(zip(starts, ends)):
        a = i if axes is None else axes[i]
        key[a] = slice(s, e, 1 if steps is None else steps[i])
    return tuple(key)


@kernel("Slice", since=1)
def _slice_attr(info: NodeInfo) -> Kernel:
    starts = _ints(info.get("starts", []))
    ends = _ints(info.get("ends", []))
    axes = info.get("axes")
    axes = None if axes is None else _ints(axes)
    return lambda x: (x[_slice_key(x.ndim, starts, ends, axes, None)],)


@kernel("Slice", since=10)
def _slice(info: NodeInfo) -> Kernel:
    present = [info.has_input(i) for i in range(5)]
    consts = [info.const_input(i) if present[i] else None for i in range(5)]
    if all(consts[i] is not None or not present[i] for i in range(1, 5)):
        starts, ends = _ints(consts[1]), _ints(consts[2])
        axes = None if consts[3] is None else _ints(consts[3])
        steps = None if consts[4] is None else _ints(consts[4])
        if axes is None or min(axes, default=0) >= 0:
            key = _slice_key(max(axes, default=-1) + 1 if axes else len(starts), starts, ends, axes, steps)
            return lambda x, *rest: (x[key],)
        keys: dict[int, tuple[slice, ...]] = {}

        def run_const(x: Any, *rest: Any) -> tuple[Any]:
            key = keys.get(x.ndim)
            if key is None:
                key = keys[x.ndim] = _slice_key(x.ndim, starts, ends, [a % x.ndim for a in axes], steps)
            return (x[key],)

        return run_const

    # (rank, the inputs' values) -> the indexing key: 1 us against 2.5 to read them as ints each call (the LLM
    # prefill's rotary slices at half a size read from the shapes); a few entries
    found: dict[tuple[Any, ...], tuple[slice, ...]] = {}

    def run(x: Any, starts: Any, ends: Any, axes: Any = None, steps: Any = None) -> tuple[Any]:
        sig = (x.ndim, _values(starts), _values(ends), _values(axes), _values(steps))
        key = found.get(sig)
        if key is None:
            ax = None if axes is None else [a % x.ndim for a in _ints(axes)]
            st = None if steps is None else _ints(steps)
            key = _slice_key(x.ndim, _ints(starts), _ints(ends), ax, st)
            if len(found) >= 64:
                found.clear()
            found[sig] = key
        return (x[key],)

    return run


def _values(v: Any) -> Any:
    """A hashable stand-in for an integer input's values (its dtype and bytes), None for an omitted one."""
    if v is None:
        return None
    if isinstance(v, np.ndarray):
        return (v.dtype.str, v.shape, v.tobytes())
    return tuple(_ints(v))


# ---------------------------------------------------------------------------------------- scatter
_SCATTER_UFUNC: dict[str, Any] = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def _scatter_into(out: np.ndarray, key: tuple[Any, ...], updates: Any, reduction: str) -> np.ndarray:
    if reduction == "none":
        out[key] = updates
    else:
        _SCATTER_UFUNC[reduction].at(out, key, updates)
    return out


@kernel("Scatter", since=9)
@kernel("ScatterElements", since=11)
def _scatter_elements(info: NodeInfo) -> Kernel:
    axis = int(info.get("axis", 0))
    reduction = str(info.get("reduction", "none"))

    def run(data: Any, indices: Any, updates: Any) -> tuple[Any]:
        key = list(np.indices(indices.shape, sparse=True))
        key[axis % data.ndim] = indices
        return (_scatter_into(data.copy(), tuple(key), updates, reduction),)

    return run


@kernel("ScatterND", since=11)
def _scatter_nd(info: NodeInfo) -> Kernel:
    reduction = str(info.get("reduction", "none"))

    def run(data: Any, indices: Any, updates: Any) -> tuple[Any]:
        key = tuple(np.moveaxis(indices, -1, 0))
        return (_scatter_into(data.copy(), key, updates, reduction),)

    return run


# -------------------------------------------------------------------------------- rearrangements
@kernel("DepthToSpace", since=1)
def _depth_to_space(info: NodeInfo) -> Kernel:
    bs = int(info.get("blocksize", 1))
    crd = info.get("mode", "DCR") == "CRD"

    def run(x: Any) -> tuple[Any]:
        n, c, h, w = x.shape
        cc = c // (bs * bs)
        if crd:
            t = x.reshape(n, cc, bs, bs, h, w).transpose(0, 1, 4, 2, 5, 3)
        else:
            t = x.reshape(n, bs, bs, cc, h, w).transpose(0, 3, 4, 1, 5, 2)
        return (t.reshape(n, cc, h * bs, w * bs),)

    return run


@kernel("SpaceToDepth", since=1)
def _space_to_depth(info: NodeInfo) -> Kernel:
    bs = int(info.get("blocksize", 1))
    # The inverse of DepthToSpace; ``mode`` exists from opset 28 on.
    perm = (0, 1, 3, 5, 2, 4) if info.get("mode", "DCR") == "CRD" else (0, 3, 5, 1, 2, 4)

    def run(x: Any) -> tuple[Any]:
        n, c, h, w = x.shape
        t = x.reshape(n, c, h // bs, bs, w // bs, bs).transpose(perm)
        return (t.reshape(n, c * bs * bs, h // bs, w // bs),)

    return run


@kernel("Trilu", since=14)
def _trilu(info: NodeInfo) -> Kernel:
    fn = np.triu if int(info.get("upper", 1)) else np.tril

    def run(x: Any, k: Any = None) -> tuple[Any]:
        return (fn(x, 0 if k is None else int(_scalar(k))),)

    return run


@kernel("CumSum", since=11)
def _cumsum(info: NodeInfo) -> Kernel:
    exclusive = bool(info.get("exclusive", 0))
    reverse = bool(info.get("reverse", 0))

    def run(x: Any, axis: Any) -> tuple[Any]:
        ax = int(_scalar(axis)) % x.ndim
        y = np.flip(x, ax) if reverse else x
        out = np.cumsum(y, axis=ax, dtype=x.dtype)
        if exclusive:
            shifted = np.zeros_like(out)
            shifted[_along(ax, x.ndim, slice(1, None))] = out[_along(ax, x.ndim, slice(None, -1))]
            out = shifted
        return (np.flip(out, ax) if reverse else out,)

    return run


# ------------------------------------------------------------------------------------ selection
@kernel("NonZero", since=9)
def _nonzero(info: NodeInfo) -> Kernel:
    def run(x: Any) -> tuple[Any]:
        if np.ndim(x) == 0:  # onnxruntime treats a scalar as a 1-element vector
            return (np.zeros((1, int(bool(x))), dtype=np.int64),)
        return (np.array(np.nonzero(x), dtype=np.int64).reshape(x.ndim, -1),)

    return run


def _top_k(x: Any, k: int, axis: int, largest: bool) -> list[Any]:
    ax = axis % x.ndim
    n = x.shape[ax]
    if largest:
        # Stable ascending sort of the reversed axis, read backwards: descending values, ties by lower index.
        order = np.argsort(np.flip(x, ax), axis=ax, kind="stable")
        idx = (n - 1) - np.take(order, np.arange(n - 1, n - k - 1, -1), axis=ax)
    else:
        idx = np.take(np.argsort(x, axis=ax, kind="stable"), np.arange(k), axis=ax)
    return [np.take_along_axis(x, idx, ax), idx.astype(np.int64, copy=False)]


@kernel("TopK", since=1)
def _top_k_attr(info: NodeInfo) -> Kernel:
    k = int(info.get("k", 1))
    axis = int(info.get("axis", -1))
    return lambda x: _top_k(x, k, axis, True)


@kernel("TopK", since=10)
def _top_k_input(info: NodeInfo) -> Kernel:
    # ``sorted=0`` lets the runtime pick any order; the sorted order is one of them.
    axis = int(info.get("axis", -1))
    largest = bool(info.get("largest", 1))
    return lambda x, k: _top_k(x, int(_scalar(k)), axis, largest)
