"""onnxruntime's ``com.microsoft::DynamicQuantizeLSTM`` (what ``onnxruntime.quantization.quantize_dynamic`` makes of
an LSTM): the LSTM of ``rnn`` with int8 weights, each of its products computed as onnxruntime's CPU kernel does.

Its W is ``(directions, input, 4 * hidden)`` and R ``(directions, hidden, 4 * hidden)`` (the transposes of the
LSTM's), quantized, with a scale and zero point per direction or per column. Each product quantizes its left
operand as ``DynamicQuantizeLinear`` does (uint8, over the whole operand: every time step's input at once, then
each step's hidden state), multiplies the integers exactly and scales the sums by the operand's scale times the
weight's: the same numbers as onnxruntime's (its quantized GEMM), not those of the float LSTM."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from epctx.ep import Kernel
from epctx.providers.cpu.kernels.quant import _Centered, _operands, dynamic_quantize
from epctx.providers.cpu.kernels.rnn import lstm_loop, prepare_run
from epctx.providers.cpu.registry import NodeInfo, kernel

__all__: list[str] = []


def _quantized_product(a: np.ndarray, w: _Centered, scale: np.ndarray) -> np.ndarray:
    """``a`` (float32 rows) quantized to uint8 over all its values, times the centered weight ``w``, scaled by the
    product of their scales (``scale``: the weight's, one or one per column)."""
    q, a_scale, zp = dynamic_quantize(a)
    centered = _Centered(q, np.asarray(zp, dtype=np.float32))
    acc = np.matmul(*_operands(centered, w, a.shape[-1])).astype(np.float32)
    acc *= (a_scale * scale).astype(np.float32)
    return acc


def _direction_weights(w: np.ndarray, scale: np.ndarray, zp: Any, d: int) -> tuple[_Centered, np.ndarray]:
    """Direction ``d``'s weight, centered on its zero point, and its scale (a scalar or one per column)."""
    s = np.asarray(scale, dtype=np.float32)
    s = s.reshape(w.shape[0], -1)[d]
    z = None if zp is None else np.asarray(zp).reshape(w.shape[0], -1)[d].astype(np.float32)
    return _Centered(w[d], None if z is None else (z.reshape(()) if z.size == 1 else z)), (
        s.reshape(()) if s.size == 1 else s
    )


@kernel("DynamicQuantizeLSTM", domain="com.microsoft", since=1)
def _dynamic_quantize_lstm(info: NodeInfo) -> Kernel:
    prepare = prepare_run(info)
    loop = lstm_loop(info)

    def run(
        x: np.ndarray, w: np.ndarray, r: np.ndarray, b: Any = None, seq_lens: Any = None, h0: Any = None,
        c0: Any = None, p: Any = None, w_scale: Any = None, w_zp: Any = None, r_scale: Any = None, r_zp: Any = None,
    ) -> list[Any]:  # fmt: skip
        directions = w.shape[0]
        ws = [_direction_weights(w, w_scale, w_zp, d) for d in range(directions)]
        rs = [_direction_weights(r, r_scale, r_zp, d) for d in range(directions)]

        def project(rows: np.ndarray) -> np.ndarray:
            return np.concatenate([_quantized_product(rows, wd, sd) for wd, sd in ws], axis=1)

        def recurrence(d: int) -> Callable[[np.ndarray], np.ndarray]:
            rd, sd = rs[d]
            return lambda h: _quantized_product(np.ascontiguousarray(h, dtype=np.float32), rd, sd)

        prepared = prepare(np.asarray(x, dtype=np.float32), w, seq_lens, project)
        return loop(prepared, recurrence, r.shape[1], b, h0, c0, p, np.float32)

    return run
