"""Linear quantization: QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear and the integer ops
MatMulInteger, ConvInteger, QLinearMatMul, QLinearConv, all in numpy.

Rounding and saturation follow onnxruntime's CPU kernels bit for bit: ``x / scale`` in float32, round half
to even, saturate to the target type (NaN gives the type's minimum); requantization multiplies the int32
accumulator by ``a_scale * b_scale / y_scale`` in float32. Integer products are summed by float BLAS, in
float32 where the sums provably stay exact and in float64 otherwise. Float8, 4-bit, 2-bit and bfloat16
variants, and type combinations onnxruntime itself rejects, go to the onnx.reference fallback.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from epctx.ep import Kernel
from epctx.errors import InvalidArgument
from epctx.providers.cpu.fallback import reference_kernel
from epctx.providers.cpu.kernels.windows import pad_input, spatial_geometry, window_view
from epctx.providers.cpu.registry import NodeInfo, kernel

__all__ = ["dynamic_quantize"]

_F32 = np.dtype(np.float32)
_F16 = np.dtype(np.float16)
_FLOATS = (_F32, _F16)
_U8 = np.dtype(np.uint8)
_I8 = np.dtype(np.int8)
_I32 = np.dtype(np.int32)
# Saturation bounds of the integer types quantization targets.
_RANGE: dict[np.dtype[Any], tuple[float, float]] = {
    _I8: (-128.0, 127.0),
    _U8: (0.0, 255.0),
    np.dtype(np.int16): (-32768.0, 32767.0),
    np.dtype(np.uint16): (0.0, 65535.0),
}
_INT8S = (_I8, _U8)
# TensorProto data type numbers of the types above (for the output_dtype attribute).
_ONNX_TO_NP: dict[int, np.dtype[Any]] = {
    1: _F32,
    10: _F16,
    2: _U8,
    3: _I8,
    4: np.dtype(np.uint16),
    5: np.dtype(np.int16),
    6: _I32,
}


class _Fallback:
    """onnx.reference's implementation of the node, built on first use (for types kept out of numpy)."""

    __slots__ = ("_impl", "_info")

    def __init__(self, info: NodeInfo) -> None:
        self._info = info
        self._impl: Kernel | None = None

    def __call__(self, *args: Any) -> Any:
        if self._impl is None:
            self._impl = reference_kernel(self._info)
        return self._impl(*args)


def _input_dtype(info: NodeInfo, i: int) -> np.dtype[Any] | None:
    """The element type of input ``i`` when the graph declares it, else None."""
    if not info.has_input(i):
        return None
    value = info.node.inputs[i]
    dtype = None if value is None else value.dtype
    if dtype is None:
        return None
    try:
        return np.dtype(dtype.numpy())
    except Exception:
        return None


def _expand(param: np.ndarray, x_shape: tuple[int, ...], axis: int, block: int) -> np.ndarray:
    """Scale or zero point shaped to broadcast against x: per tensor, per axis or blocked."""
    if param.size == 1 and not block:
        return param.reshape(())
    ndim = len(x_shape)
    ax = axis + ndim if axis < 0 else axis
    if not 0 <= ax < ndim:
        raise InvalidArgument(f"axis {axis} is out of range for an input of rank {ndim}")
    if block:
        if param.ndim != ndim:
            raise InvalidArgument(
                f"blocked quantization needs a scale of rank {ndim}, found shape {param.shape}"
            )
        return np.repeat(param, block, axis=ax)[(slice(None),) * ax + (slice(0, x_shape[ax]),)]
    if param.ndim != 1 or param.shape[0] != x_shape[ax]:
        raise InvalidArgument(
            f"per-axis quantization needs a 1-D scale of length {x_shape[ax]} (axis {axis}), "
            f"found shape {param.shape}"
        )
    return param.reshape((-1,) + (1,) * (ndim - ax - 1))


def _saturate(q: np.ndarray, zp: Any, out: np.dtype[Any]) -> np.ndarray:
    """Round ``q`` (float32, modified in place) half to even, add ``zp``, saturate and cast to ``out``."""
    lo, hi = _RANGE[out]
    np.rint(q, out=q)
    if zp is not None:
        q += zp
    np.fmax(q, lo, out=q)  # fmax/fmin map NaN to the bound, as onnxruntime's vector kernels do
    np.fmin(q, hi, out=q)
    return q.astype(out)


@kernel("QuantizeLinear", since=10)
def _quantize(info: NodeInfo) -> Kernel:
    axis = int(info.get("axis", 1))
    block = int(info.get("block_size", 0))
    if info.has_input(2):  # the zero point's type is the output type (None: known only at run time)
        fixed = _input_dtype(info, 2)
        supported = fixed is None or fixed in _RANGE
    else:
        fixed = _ONNX_TO_NP.get(int(info.get("output_dtype", 0)) or 2)
        supported = fixed in _RANGE
    if not supported or int(info.get("precision", 0)):
        return reference_kernel(info)
    fallback = _Fallback(info)
    default_out = fixed if fixed is not None else _U8

    def run(x: np.ndarray, scale: np.ndarray, zp: np.ndarray | None = None) -> Any:
        out = default_out if zp is None else zp.dtype
        if x.dtype not in _FLOATS or scale.dtype != x.dtype or out not in _RANGE:
            return fallback(x, scale, zp)
        q = np.divide(x, _expand(scale, x.shape, axis, block), dtype=np.float32)
        zpf = None if zp is None else _expand(zp, x.shape, axis, block).astype(np.float32)
        return (_saturate(q, zpf, out),)

    return run


@kernel("DequantizeLinear", since=10)
def _dequantize(info: NodeInfo) -> Kernel:
    axis = int(info.get("axis", 1))
    block = int(info.get("block_size", 0))
    out_attr = int(info.get("output_dtype", 0))
    out_fixed = _ONNX_TO_NP.get(out_attr) if out_attr else None
    x_type = _input_dtype(info, 0)
    if (out_attr and out_fixed not in _FLOATS) or (
        x_type is not None and x_type not in _RANGE and x_type != _I32
    ):
        return reference_kernel(info)
    fallback = _Fallback(info)

    def run(x: np.ndarray, scale: np.ndarray, zp: np.ndarray | None = None) -> Any:
        out = out_fixed or scale.dtype
        if scale.dtype not in _FLOATS or out not in _FLOATS or (x.dtype not in _RANGE and x.dtype != _I32):
            return fallback(x, scale, zp)
        if zp is not None and zp.dtype != x.dtype:
            return fallback(x, scale, zp)
        if x.dtype == _I32:
            v = x if zp is None else x - _expand(zp, x.shape, axis, block)
            v = v.astype(np.float32)
        else:
            v = x.astype(np.float32)
            if zp is not None:
                v -= _expand(zp, x.shape, axis, block).astype(np.float32)
        v *= _expand(scale, x.shape, axis, block).astype(np.float32, copy=False)
        if out == _F32:
            return (v,)
        with np.errstate(over="ignore"):  # out-of-range values become inf, as in onnxruntime
            return (v.astype(out),)

    return run


def dynamic_quantize(x: np.ndarray) -> tuple[np.ndarray, np.float32, np.float32]:
    """``x`` (float32) as ``DynamicQuantizeLinear`` quantizes it: (uint8 values, scale, zero point as float32);
    the range is x's widened to hold 0."""
    zero = np.float32(0)
    lo = min(x.min(), zero) if x.size else zero
    hi = max(x.max(), zero) if x.size else zero
    scale = np.float32(1) if hi == lo else (hi - lo) / np.float32(255)
    zp = np.rint(np.fmin(np.fmax(zero - lo / scale, zero), np.float32(255)))
    return _saturate(np.divide(x, scale, dtype=np.float32), zp, _U8), scale, zp


@kernel("DynamicQuantizeLinear", since=11)
def _dynamic_quantize(info: NodeInfo) -> Kernel:
    fallback = _Fallback(info)

    def run(x: np.ndarray) -> Any:
        if x.dtype != _F32:
            return fallback(x)
        q, scale, zp = dynamic_quantize(x)
        return q, np.array(scale, dtype=np.float32), np.array(zp, dtype=np.uint8)

    return run


# ----------------------------------------------------------------------------------------------------
# Integer matmul / conv: operands minus their zero points go through float BLAS. float32 when every partial
# sum provably stays below 2**24 (so each is an exact integer), float64 otherwise (exact for any sane size).

_EXACT_F32 = float(2**24)


class _Centered:
    """An integer operand minus its zero point, held as float32 (exact), with a bound on its magnitude."""

    __slots__ = ("_f64", "bound", "f32")

    def __init__(self, v: np.ndarray, zp: np.ndarray | None, *, exact_bound: bool = False) -> None:
        f = v.astype(np.float32)
        if zp is not None:
            f -= zp
        self.f32 = f
        self._f64: np.ndarray | None = None
        if exact_bound or v.dtype not in _RANGE:
            self.bound = float(np.abs(f).max()) if f.size else 0.0
        else:  # from the type's range: no pass over the data
            lo, hi = _RANGE[v.dtype]
            z = np.zeros(1, dtype=np.float32) if zp is None else zp
            self.bound = float(max(hi - z.min(), z.max() - lo))

    def f64(self) -> np.ndarray:
        if self._f64 is None:
            self._f64 = self.f32.astype(np.float64)
        return self._f64


def _operands(a: _Centered, b: _Centered, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Both operands in the narrowest float type whose sums of ``k`` products are exact."""
    if k * a.bound * b.bound <= _EXACT_F32:
        return a.f32, b.f32
    return a.f64(), b.f64()


def _zp(zp: Any, shape: tuple[int, ...] | None = None) -> np.ndarray | None:
    """A zero point as float32: a scalar, or reshaped to ``shape`` when it has more than one element."""
    if zp is None:
        return None
    z = np.asarray(zp).astype(np.float32)
    return z.reshape(()) if z.size == 1 else (z if shape is None else z.reshape(shape))


def _requantize(acc: np.ndarray, multiplier: Any, y_zp: np.ndarray, node: str) -> np.ndarray:
    """The int32 accumulator (exact in float) times the float32 multiplier, rounded and saturated."""
    out = y_zp.dtype
    if y_zp.size != 1:
        raise InvalidArgument(
            f"node {node!r}: the output zero point must be a scalar, found shape {y_zp.shape}"
        )
    v = acc if acc.dtype == _F32 else acc.astype(np.float32)  # acc is a temporary: scaled in place
    v *= multiplier
    return _saturate(v, np.float32(y_zp.reshape(())), out)


def _const_operand(info: NodeInfo, value: int, zp: int, shape: tuple[int, ...] | None) -> _Centered | None:
    """The centered operand of a constant input with a constant (or no) zero point, else None."""
    v = info.const_input(value)
    if v is None or (info.has_input(zp) and info.const_input(zp) is None):
        return None
    z = info.const_input(zp) if info.has_input(zp) else None
    return _Centered(v, _zp(z, shape), exact_bound=True)


@kernel("MatMulInteger", since=10)
def _matmul_integer(info: NodeInfo) -> Kernel:
    b_const = _const_operand(info, 1, 3, None)

    def run(a: np.ndarray, b: np.ndarray, a_zp: Any = None, b_zp: Any = None) -> Any:
        bc = b_const if b_const is not None else _Centered(b, _zp(b_zp))
        ac = _Centered(a, _zp(a_zp, (-1, 1)))  # a 1-D zero point of A is per row
        return (np.matmul(*_operands(ac, bc, a.shape[-1])).astype(np.int32),)

    return run


def _scale(s: np.ndarray) -> Any:
    return s.reshape(()) if s.size == 1 else s


@kernel("QLinearMatMul", since=10)
def _qlinear_matmul(info: NodeInfo) -> Kernel:
    fallback = _Fallback(info)
    node = info.name
    b_const = _const_operand(info, 3, 5, None)

    def run(
        a: np.ndarray,
        a_s: np.ndarray,
        a_zp: np.ndarray,
        b: np.ndarray,
        b_s: np.ndarray,
        b_zp: np.ndarray,
        y_s: np.ndarray,
        y_zp: np.ndarray,
    ) -> Any:
        if (
            a.dtype not in _INT8S
            or b.dtype not in _INT8S
            or y_zp.dtype not in _INT8S
            or a_s.dtype != _F32
            or b_s.dtype != _F32
            or y_s.dtype != _F32
        ):
            return fallback(a, a_s, a_zp, b, b_s, b_zp, y_s, y_zp)
        bc = b_const if b_const is not None else _Centered(b, _zp(b_zp))
        acc = np.matmul(*_operands(_Centered(a, _zp(a_zp, (-1, 1))), bc, a.shape[-1]))
        # onnxruntime's order: (a_scale * b_scale) / y_scale, in float32
        multiplier = _scale(a_s) * _scale(b_s) / _scale(y_s)
        return (_requantize(acc, multiplier, y_zp, node),)

    return run


def _conv_setup(info: NodeInfo) -> tuple[Any, ...]:
    group = int(info.get("group", 1))
    auto_pad = info.get("auto_pad", "NOTSET") or "NOTSET"
    if isinstance(auto_pad, bytes):
        auto_pad = auto_pad.decode()
    return group, info.get("strides"), info.get("dilations"), info.get("pads"), auto_pad


def _int_conv(
    x: _Centered, w: _Centered, w_shape: tuple[int, ...], setup: tuple[Any, ...], node: str
) -> np.ndarray:
    """Convolution of centered operands (zero padding): im2col, then one batched matmul per group."""
    group, strides, dilations, pads, auto_pad = setup
    n, c = x.f32.shape[0], x.f32.shape[1]
    m = w_shape[0]
    nsp = x.f32.ndim - 2
    if c != w_shape[1] * group or m % group:
        raise InvalidArgument(
            f"node {node!r}: input has {c} channels and weight shape {w_shape}, which does not fit group {group}"
        )
    geo = spatial_geometry(
        x.f32.shape[2:],
        w_shape[2:],
        strides or (1,) * nsp,
        dilations or (1,) * nsp,
        list(pads) if pads else None,
        auto_pad,
        node=node,
    )
    xf, wf = _operands(x, w, math.prod(w_shape[1:]))
    l_out = math.prod(geo.out)
    cols = window_view(pad_input(xf, geo), geo).reshape(n, group, -1, l_out)
    y = np.matmul(wf.reshape(group, m // group, -1), cols)
    return y.reshape((n, m) + geo.out)


def _per_channel(ndim: int) -> tuple[int, ...]:
    return (-1,) + (1,) * (ndim - 1)


@kernel("ConvInteger", since=10)
def _conv_integer(info: NodeInfo) -> Kernel:
    setup = _conv_setup(info)
    node = info.name
    w_value = info.const_input(1)
    w_const = None if w_value is None else _const_operand(info, 1, 3, _per_channel(w_value.ndim))

    def run(x: np.ndarray, w: np.ndarray, x_zp: Any = None, w_zp: Any = None) -> Any:
        wc = w_const if w_const is not None else _Centered(w, _zp(w_zp, _per_channel(w.ndim)))
        acc = _int_conv(_Centered(x, _zp(x_zp)), wc, w.shape, setup, node)
        return (acc.astype(np.int32),)

    return run


@kernel("QLinearConv", since=10)
def _qlinear_conv(info: NodeInfo) -> Kernel:
    setup = _conv_setup(info)
    node = info.name
    fallback = _Fallback(info)
    w_value = info.const_input(3)
    w_const = None if w_value is None else _const_operand(info, 3, 5, _per_channel(w_value.ndim))

    def run(
        x: np.ndarray,
        x_s: np.ndarray,
        x_zp: np.ndarray,
        w: np.ndarray,
        w_s: np.ndarray,
        w_zp: np.ndarray,
        y_s: np.ndarray,
        y_zp: np.ndarray,
        bias: np.ndarray | None = None,
    ) -> Any:
        if (
            x.dtype not in _INT8S
            or w.dtype not in _INT8S
            or y_zp.dtype not in _INT8S
            or x_s.dtype != _F32
            or w_s.dtype != _F32
            or y_s.dtype != _F32
        ):
            return fallback(x, x_s, x_zp, w, w_s, w_zp, y_s, y_zp, bias)
        per_channel = _per_channel(x.ndim - 1)
        wc = w_const if w_const is not None else _Centered(w, _zp(w_zp, _per_channel(w.ndim)))
        acc = _int_conv(_Centered(x, _zp(x_zp)), wc, w.shape, setup, node)
        if bias is not None:  # int32 sum: exact in float64, rounded once to float32 by _requantize
            acc = acc.astype(np.float64)
            acc += bias.astype(np.float64).reshape(per_channel)
        multiplier = _scale(x_s) * (w_s.reshape(per_channel) if w_s.size > 1 else _scale(w_s)) / _scale(y_s)
        return (_requantize(acc, multiplier, y_zp, node),)

    return run
