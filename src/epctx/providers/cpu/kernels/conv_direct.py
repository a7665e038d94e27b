"""A Conv's route: what a call does for an input shape, with every choice made once. When the Conv's weights
and bias are constants (and the input of their dtype), a call's route is fixed once the first call has settled
the weights (``conv_weights.Weights``) and the hand-off (``layout.py``): the route made then, with the prepared
weights, the bias, the activation, the method to call and whether it needs BLAS's one-thread gate bound in, is
kept, and the later calls go straight to the arithmetic (no per-call lookups of the plan's form, the hand-off
or the weights; no gate where no BLAS call could use more than one thread). Weights fed at run time get a
route per call.

The arithmetic is the plan's own (``conv.py``'s ``_ConvPlan`` methods).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from epctx.providers.cpu import fusion
from epctx.providers.cpu.kernels.conv_short import short_conv, short_fits
from epctx.providers.cpu.kernels.im2col import biased_weights, im2col_gemm

__all__ = ["Route", "bias_rows", "channels_last_bias", "gate_of", "route_for"]

Route = Callable[[np.ndarray], tuple[np.ndarray]]
Gate = Callable[..., Any]


class _Plan(Protocol):
    """What a route reads of ``conv._ConvPlan``."""

    channels_last: Any
    depthwise: bool
    direct: Any
    geo: Any
    group: int
    pointwise: bool
    w_shape: tuple[int, ...]
    x_shape: tuple[int, ...]
    lean: bool
    nhwc: str
    out_shape: tuple[int, ...]
    pointwise_one: bool
    im2col_one: bool
    tiny: bool
    shared: bool

    @property
    def serial(self) -> Gate | None: ...  # read-only here: the plan's is the gate's own type

    def run(self, x: np.ndarray, prep: dict[str, Any]) -> np.ndarray: ...
    def lean_gemm(self, w2: np.ndarray) -> Callable[[np.ndarray], np.ndarray]: ...
    def pointwise_last(
        self, prep: dict[str, Any], bias: np.ndarray | None = ..., activation: fusion.Activation | None = ...
    ) -> Callable[[np.ndarray], np.ndarray]: ...
    def im2col_channels_last(
        self,
        x: np.ndarray,
        prep: dict[str, Any],
        bias: np.ndarray | None = ...,
        activation: fusion.Activation | None = ...,
    ) -> np.ndarray: ...


def gate_of(plan: _Plan) -> Gate | None:
    """The one-thread gate ``plan``'s calls need, or None: none for a large conv (its work is shared in bands,
    ``parallel.py``), none when no BLAS call of it could use more than one thread: OpenBLAS keeps a GEMM of
    under 2^18 multiply-adds on one thread itself (``plan.tiny``: each GEMM of a conv is at most the conv), and a
    channels-last depthwise conv calls no BLAS (under the gate, a large one's row sharing saw one runner, the
    gate's count, and never shared)."""
    if plan.serial is None:
        return None
    if plan.channels_last is not None:
        return None
    return None if plan.tiny else plan.serial


def route_for(
    plan: _Plan,
    prep: dict[str, Any],
    bias: np.ndarray | None,
    activation: fusion.Activation | None,
    handing: bool,
    *,
    constant_bias: bool,
) -> Route:
    """The call of ``plan``: ``prep`` the prepared weights, ``bias`` the bias as a column (M, 1) or None (an
    im2col conv adds it in its GEMM when it is ``constant_bias``, the same array at every call), ``activation``
    the epilogue's, ``handing`` whether the conv hands its result over channels-last (``layout.py``)."""
    # a dense conv in C, float32: its result channels-last whenever its readers take it (that costs it nothing)
    direct = plan.direct
    if direct is not None and prep["w2"].dtype == np.float32:
        fallback = _general(plan, prep, bias, activation)  # an input of another dtype
        return direct.route(prep, bias, activation, handing, fallback)  # type: ignore[no-any-return]
    if handing and plan.nhwc:
        return _channels_last(plan, prep, bias, activation, constant_bias)
    native = getattr(plan.channels_last, "route", None)  # a native depthwise conv: bias and activation in C
    if native is not None:
        return native(prep, bias, activation, False)  # type: ignore[no-any-return]
    if _short(plan, prep):
        return short_conv(plan.x_shape, plan.geo, prep["w2"], bias, activation)
    if constant_bias and bias is not None and plan.im2col_one:
        general = _im2col_biased(plan, prep, bias, activation)
    else:
        general = _general(plan, prep, bias, activation)
    if not (handing and plan.pointwise_one):
        return general
    last = _channels_last(plan, prep, bias, activation, constant_bias)

    def either(x: np.ndarray) -> tuple[np.ndarray]:
        # a 1x1 conv of one image reading channels-last memory writes channels-last at no cost
        if not x.flags.c_contiguous and x.transpose(0, 2, 3, 1).flags.c_contiguous:
            return last(x)
        return general(x)

    return either


def _short(plan: _Plan, prep: dict[str, Any]) -> bool:
    """A small dense 1-D conv of one signal (``conv_short.py``), its weights float32 or float64."""
    if plan.pointwise or plan.depthwise or "w2" not in prep or prep["w2"].dtype.kind != "f":
        return False
    return prep["w2"].dtype.itemsize >= 4 and short_fits(plan.x_shape, plan.w_shape, plan.geo, plan.group)


def _channels_last(
    plan: _Plan,
    prep: dict[str, Any],
    bias: np.ndarray | None,
    activation: fusion.Activation | None,
    constant_bias: bool,
) -> Route:
    """The conv (depthwise; 1x1 as the GEMM x^T W^T; im2col as cols^T W^T), its bias and its epilogue's
    activation channels-last, returned as an NCHW view of that memory. An im2col conv adds a constant bias in
    its GEMM (``im2col_channels_last``, which keeps the weights with the bias in ``prep``)."""
    native = getattr(plan.channels_last, "route", None)  # a native depthwise conv: bias and activation in C
    if native is not None:
        return native(prep, bias, activation, True)  # type: ignore[no-any-return]
    add = None if bias is None else bias.reshape(-1)
    pixels = plan.out_shape[0] * math.prod(plan.out_shape[2:])
    args: tuple[Any, ...] = (prep,)
    fn: Callable[..., np.ndarray]
    if plan.channels_last is not None:
        fn = plan.channels_last.run_channels_last
    elif plan.nhwc == "im2col":  # the bias in the GEMM, the activation by band, where the bias is constant
        fn = plan.im2col_channels_last
        if add is None or constant_bias:
            args, add, activation = (prep, add, activation), None, None
    else:  # a constant bias written under the product, which the GEMM adds to it; then the activation
        fused = add is None or constant_bias
        fn, args = (
            plan.pointwise_last(prep, add if constant_bias else None, activation if fused else None),
            (),
        )
        add, activation = None if constant_bias else add, None if fused else activation
    gate = gate_of(plan)
    biased = None if add is None else channels_last_bias(add, pixels)

    def route(x: np.ndarray) -> tuple[np.ndarray]:
        y = fn(x, *args) if gate is None else gate(fn, x, *args)
        if biased is not None:
            biased(y)
        if activation is not None:
            activation(y)
        return (y.transpose(0, 3, 1, 2),)

    return route


# A bias added to channels-last memory goes over rows of about this many values: the bias tiled along a row,
# so that numpy's inner loop runs that long, not C values (the bias broadcast over (pixels, C) rows).
_BIAS_ROW = 2048


def channels_last_bias(add: np.ndarray, pixels: int) -> Callable[[np.ndarray], None]:
    """Adds ``add`` (C,) in place to a contiguous channels-last result of ``pixels`` pixels (N * H * W, C), over
    rows of T pixels (T the largest divisor of ``pixels`` with T * C <= ``_BIAS_ROW``) with the bias tiled T
    times, laid out once: 12544 x 16 62 -> 28 us, 12544 x 32 76 -> 54, 3136 x 72 41 -> 30, 784 x 88 12 -> 9
    (one thread, load 3.3, measured here); one pixel a row where no T above 1 fits (C >= 1024)."""
    row, shape = bias_rows(add, pixels)

    def tiled(y: np.ndarray) -> None:
        rows = y.view()
        rows.shape = shape  # (raises rather than copy: the result is contiguous)
        rows += row

    return tiled


def bias_rows(bias: np.ndarray, pixels: int) -> tuple[np.ndarray, tuple[int, int]]:
    """The bias tiled T times and the (pixels / T, T * C) rows of a channels-last array it spans (one pixel a
    row, the bias as it is, when no T above 1 fits)."""
    c = bias.size
    tile = max(1, min(pixels, _BIAS_ROW // max(1, c)))
    while pixels % tile:
        tile -= 1
    return (np.tile(bias, tile) if tile > 1 else bias.reshape(-1)), (pixels // tile, tile * c)


def _im2col_biased(
    plan: _Plan, prep: dict[str, Any], bias: np.ndarray, activation: fusion.Activation | None
) -> Route:
    """A dense im2col conv of one image with a constant bias, NCHW: the bias added in the GEMM
    (``im2col.im2col_gemm``), a large conv in bands shared with helper threads."""
    w2b = biased_weights(prep, bias.reshape(-1))
    shared = plan.shared
    gate = gate_of(plan)
    geo, shape = plan.geo, plan.out_shape

    def route(x: np.ndarray) -> tuple[np.ndarray]:
        if gate is None:
            return (im2col_gemm(x, geo, w2b, shape, shared, activation),)
        return (gate(im2col_gemm, x, geo, w2b, shape, shared, activation),)

    return route


def _general(
    plan: _Plan, prep: dict[str, Any], bias: np.ndarray | None, activation: fusion.Activation | None
) -> Route:
    """The NCHW call: the lean 1x1 GEMM or the plan's ``run``, then the bias and the activation."""
    fn: Callable[..., np.ndarray]
    args: tuple[Any, ...]
    if plan.lean:
        fn, args, gate = plan.lean_gemm(prep["w2"]), (), None  # it gates its own GEMM when not tiny
    else:
        fn, args, gate = plan.run, (prep,), gate_of(plan)
    add = (
        None if bias is None or math.prod(plan.out_shape) == 0 else bias
    )  # an empty batch has no -1 to infer
    rows = plan.out_shape[:2] + (-1,)

    def route(x: np.ndarray) -> tuple[np.ndarray]:
        y = fn(x, *args) if gate is None else gate(fn, x, *args)
        if add is not None:
            y3 = y.reshape(rows)
            y3 += add
        if activation is not None:
            activation(y)
        return (y,)

    return route
