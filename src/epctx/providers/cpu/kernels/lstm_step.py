"""One LSTM time step (a streaming model's call: silero-vad runs its LSTM on one step per audio chunk) without
the sequence machinery of ``rnn.py``: for each direction two GEMMs (input and recurrent, the weights read
transposed in place by BLAS, no copy), the biases added, the gates activated in place and the states written
straight into the outputs. Taken for seq_length 1, layout 0, the default activations, no clip, no
``input_forget``, no peepholes and no ``sequence_lens``; a reverse direction over one step is the forward one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["lstm_step"]

Step = Callable[..., list[Any]]


def _sigmoid_(a: np.ndarray) -> None:
    """In place, as ``rnn._sigmoid``: 0.5 * (1 + tanh(a / 2))."""
    a *= 0.5
    np.tanh(a, out=a)
    a += 1
    a *= 0.5


def _direction(
    x0: np.ndarray, w: np.ndarray, r: np.ndarray, b: Any, h: Any, c: Any, h_out: np.ndarray, c_out: np.ndarray
) -> None:
    hid = r.shape[-1]
    gates = x0 @ w.T  # (batch, 4H): i, o, f, c
    if h is not None:
        gates += h @ r.T
    if b is not None:
        gates += b[: 4 * hid] + b[4 * hid :]
    _sigmoid_(gates[:, : 3 * hid])
    cand = np.tanh(gates[:, 3 * hid :])
    cand *= gates[:, :hid]
    if c is not None:
        np.multiply(gates[:, 2 * hid : 3 * hid], c, out=c_out)
        c_out += cand
    else:
        c_out[...] = cand
    np.tanh(c_out, out=h_out)
    h_out *= gates[:, hid : 2 * hid]


def lstm_step(num_directions: int, want_y: bool, want_c: bool, n_out: int) -> Step:
    """``run(x, w, r, b, h0, c0)`` for x (1, batch, input): the LSTM's outputs (Y, Y_h, Y_c as wanted)."""

    def run(x: np.ndarray, w: np.ndarray, r: np.ndarray, b: Any, h0: Any, c0: Any) -> list[Any]:
        batch, hid = x.shape[1], r.shape[-1]
        dtype = np.result_type(x.dtype, w.dtype, r.dtype)
        hs = np.empty((num_directions, batch, hid), dtype=dtype)
        cs = np.empty((num_directions, batch, hid), dtype=dtype)
        for d in range(num_directions):
            _direction(
                x[0],
                w[d],
                r[d],
                None if b is None else b[d],
                None if h0 is None else h0[d],
                None if c0 is None else c0[d],
                hs[d],
                cs[d],
            )
        outs: list[Any] = [hs.reshape(1, num_directions, batch, hid).copy() if want_y else None, hs]
        if want_c:
            outs.append(cs)
        return (outs + [None] * n_out)[:n_out]

    return run
