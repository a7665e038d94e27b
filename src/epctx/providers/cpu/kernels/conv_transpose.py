"""CPU kernel: ConvTranspose (matmul + col2im scatter-add)."""

from __future__ import annotations

import itertools
import math

import numpy as np

from epctx.ep import Kernel
from epctx.errors import InvalidArgument
from epctx.providers.cpu.kernels.conv import _conv_attrs, _half_in_float32
from epctx.providers.cpu.kernels.windows import ints
from epctx.providers.cpu.registry import NodeInfo, kernel

__all__: list[str] = []

_ALL = slice(None)


@kernel("ConvTranspose", since=1)
def _conv_transpose(info: NodeInfo) -> Kernel:
    group = int(info.get("group", 1))
    w_const = info.const_input(1)
    node = info.name
    cache: dict[tuple[int, ...], _ConvTransposePlan] = {}
    wt_const = None if w_const is None else _transpose_weight(w_const, group)

    def run(x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None) -> tuple[np.ndarray]:
        plan = cache.get(x.shape)
        if plan is None or plan.w_shape != w.shape:
            plan = cache[x.shape] = _ConvTransposePlan(info, x.shape, w.shape, group, node)
        wt = wt_const if wt_const is not None else _transpose_weight(w, group)
        y = plan.run(x, wt)
        if b is not None and y.size:
            y3 = y.reshape(y.shape[0], y.shape[1], -1)
            y3 += b.reshape(-1, 1)
        return (y,)

    return _half_in_float32(run)


def _transpose_weight(w: np.ndarray, group: int) -> np.ndarray:
    # W (C, M/group, *K) -> (group, M/group * K, C/group)
    c = w.shape[0]
    return np.ascontiguousarray(w.reshape(group, c // group, -1).transpose(0, 2, 1))


class _ConvTransposePlan:
    __slots__ = ("crop", "full", "group", "m", "slices", "w_shape", "x_shape")

    def __init__(
        self, info: NodeInfo, x_shape: tuple[int, ...], w_shape: tuple[int, ...], group: int, node: str
    ) -> None:
        nd = len(x_shape) - 2
        kshape = tuple(int(k) for k in w_shape[2:])
        strides, dilations, pads, auto_pad = _conv_attrs(info, nd)
        out_pad = ints(info.get("output_padding"), nd, 0)
        out_shape = info.get("output_shape")
        if x_shape[1] != w_shape[0]:
            raise InvalidArgument(
                f"ConvTranspose node {node!r}: input has {x_shape[1]} channels, weight expects {w_shape[0]}"
            )
        self.x_shape = x_shape
        self.w_shape = w_shape
        self.group = group
        self.m = w_shape[1] * group
        in_sp = x_shape[2:]
        full: list[int] = []
        crop: list[slice] = []
        self.slices: list[tuple[tuple[int, ...], tuple[slice, ...]]] = []
        for i in range(nd):
            size, k, s, d, op = in_sp[i], kshape[i], strides[i], dilations[i], out_pad[i]
            natural = s * (size - 1) + op + (k - 1) * d + 1
            if out_shape:
                o = int(list(out_shape)[-nd:][i])
                total = max(0, natural - o)
                head = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
            elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
                o = size * s
                total = max(0, natural - o)
                head = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
            else:
                head, tail = (0, 0) if auto_pad == "VALID" or not pads else (int(pads[i]), int(pads[i + nd]))
                o = natural - head - tail
            if o < 0:
                raise InvalidArgument(
                    f"ConvTranspose node {node!r}: negative output size on spatial axis {i}"
                )
            full.append(max(natural, head + o))
            crop.append(slice(head, head + o))
        self.full = tuple(full)
        self.crop = (_ALL, _ALL) + tuple(crop)
        for offs in itertools.product(*(range(k) for k in kshape)):
            dst = (_ALL, _ALL) + tuple(
                slice(o * d, o * d + s * (n - 1) + 1, s)
                for o, d, s, n in zip(offs, dilations, strides, in_sp)
            )
            self.slices.append((offs, dst))

    def run(self, x: np.ndarray, wt: np.ndarray) -> np.ndarray:
        n, c = x.shape[0], x.shape[1]
        g = self.group
        l_in = math.prod(x.shape[2:])
        cols = np.matmul(wt, x.reshape(n, g, c // g, l_in))  # (N, G, M/G * K, L)
        kshape = self.w_shape[2:]
        cols = cols.reshape((n, self.m) + tuple(kshape) + tuple(x.shape[2:]))
        buf = np.zeros((n, self.m) + self.full, dtype=cols.dtype)
        for offs, dst in self.slices:
            buf[dst] += cols[(_ALL, _ALL) + offs]
        return np.ascontiguousarray(buf[self.crop])
