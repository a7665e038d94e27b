"""LSTM, GRU and RNN: one matmul projects the input of every time step, the loop holds the recurrent one.

Semantics follow onnxruntime's CPU kernels where the spec leaves room: activation names are matched
case-insensitively; alpha/beta are consumed in activation order, with onnxruntime's defaults where the
list runs out; ``clip`` bounds every gate's pre-activation (after bias and peephole); steps
past ``sequence_lens`` give zero outputs, and a batch entry of length 0 gives zero final states.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from epctx.ep import Kernel
from epctx.errors import InvalidArgument, InvalidGraph
from epctx.providers.cpu.kernels.lstm_step import lstm_step
from epctx.providers.cpu.registry import NodeInfo, kernel

__all__ = ["lstm_loop", "prepare_run"]

Act = Callable[[np.ndarray], np.ndarray]


def _sigmoid(x: np.ndarray) -> np.ndarray:
    # 0.5 * (1 + tanh(x / 2)): no overflow for large |x|, unlike 1 / (1 + exp(-x)).
    t = x * 0.5
    np.tanh(t, out=t)
    t += 1
    t *= 0.5
    return t


def _make_act(name: str, alpha: float, beta: float) -> Act:
    if name == "sigmoid":
        return _sigmoid
    if name == "tanh":
        return np.tanh
    if name == "relu":
        return lambda x: np.maximum(x, 0)
    if name == "affine":
        return lambda x: x * alpha + beta
    if name == "leakyrelu":
        return lambda x: np.where(x >= 0, x, x * alpha)
    if name == "thresholdedrelu":
        return lambda x: np.where(x > alpha, x, 0)
    if name == "scaledtanh":
        return lambda x: np.tanh(x * beta) * alpha
    if name == "hardsigmoid":
        return lambda x: np.clip(x * alpha + beta, 0, 1)
    if name == "elu":
        return lambda x: np.where(x >= 0, x, np.expm1(np.minimum(x, 0)) * alpha)
    if name == "softsign":
        return lambda x: x / (np.abs(x) + 1)
    if name == "softplus":
        return lambda x: np.logaddexp(x, 0)
    raise AssertionError(name)


# lower-cased name -> (takes alpha, takes beta); defaults of alpha/beta as onnxruntime sets them.
_ARG_USE = {
    "affine": (True, True),
    "relu": (False, False),
    "leakyrelu": (True, False),
    "thresholdedrelu": (True, False),
    "tanh": (False, False),
    "scaledtanh": (True, True),
    "sigmoid": (False, False),
    "hardsigmoid": (True, True),
    "elu": (True, False),
    "softsign": (False, False),
    "softplus": (False, False),
}
_ARG_DEFAULT = {"leakyrelu": (0.01, 0.0), "hardsigmoid": (0.2, 0.5), "elu": (1.0, 0.0)}


def _names(info: NodeInfo, defaults: list[str], num_directions: int) -> list[str]:
    names = [str(n).lower() for n in info.get("activations", [])] or defaults * num_directions
    if info.op_type == "RNN" and num_directions == 1 and len(names) == 2:
        names = names[:1]  # the schema's default is ["Tanh", "Tanh"] even for one direction
    expected = len(defaults) * num_directions
    if len(names) != expected:
        raise InvalidGraph(
            f"{info.op_type} node {info.name!r}: attribute 'activations' needs {expected} "
            f"entries for {num_directions} direction(s), found {len(names)}"
        )
    for name in names:
        if name not in _ARG_USE:
            raise InvalidGraph(
                f"{info.op_type} node {info.name!r}: unsupported activation {name!r} "
                f"(expected one of {', '.join(sorted(_ARG_USE))})"
            )
    return names


def _activations(info: NodeInfo, defaults: list[str], num_directions: int) -> list[Act]:
    """One callable per activation slot, direction-major: [f, g, h] (forward) then [f, g, h] (reverse)."""
    names = _names(info, defaults, num_directions)
    alphas = [float(a) for a in info.get("activation_alpha", [])]
    betas = [float(b) for b in info.get("activation_beta", [])]
    acts = []
    for name in names:
        uses_alpha, uses_beta = _ARG_USE[name]
        alpha, beta = _ARG_DEFAULT.get(name, (0.0, 0.0))
        if uses_alpha and alphas:
            alpha = alphas.pop(0)
        if uses_beta and betas:
            beta = betas.pop(0)
        acts.append(_make_act(name, alpha, beta))
    return acts


class _Spec:
    """Attributes shared by the three ops, parsed once."""

    __slots__ = ("clip", "directions", "layout", "name", "op", "want_y")

    def __init__(self, info: NodeInfo) -> None:
        direction = info.get("direction", "forward")
        if isinstance(direction, bytes):
            direction = direction.decode()
        if direction not in ("forward", "reverse", "bidirectional"):
            raise InvalidGraph(
                f"{info.op_type} node {info.name!r}: attribute 'direction' must be forward, reverse or "
                f"bidirectional, found {direction!r}"
            )
        self.directions = {"forward": (False,), "reverse": (True,), "bidirectional": (False, True)}[direction]
        self.layout = int(info.get("layout", 0))
        clip = info.get("clip")
        self.clip = None if clip is None else float(clip)
        self.op = info.op_type
        self.name = info.name
        self.want_y = info.has_output(0)


def _order(lens: np.ndarray | None, seq: int, batch: int, reverse: bool) -> np.ndarray | slice:
    """Index that puts the steps of each batch entry in processing order (an involution on valid steps)."""
    if not reverse:
        return slice(None)
    if lens is None:
        return slice(None, None, -1)
    t = np.arange(seq)[:, None]
    idx = lens[None, :] - 1 - t
    return (np.where(idx >= 0, idx, t), np.arange(batch)[None, :])  # type: ignore[return-value]


class _Run:
    """Shared driver: layout, sequence lengths, directions and output assembly around a per-op cell loop."""

    def __init__(self, spec: _Spec) -> None:
        self.spec = spec

    def prepare(
        self, x: np.ndarray, w: np.ndarray, seq_lens: Any, project: Callable[[np.ndarray], Any] | None = None
    ) -> tuple[Any, ...]:
        """``project``: rows (seq * batch, input) -> their gates (seq * batch, directions * G * H), in place of
        the float product with ``w`` (G * H rows per direction)."""
        spec = self.spec
        if x.ndim != 3:
            raise InvalidArgument(f"{spec.op} node {spec.name!r}: input X must be 3-D, found shape {x.shape}")
        if spec.layout:
            x = x.transpose(1, 0, 2)
        seq, batch, width = x.shape
        nd = len(spec.directions)
        rows = x.reshape(seq * batch, width)
        # Input projection of every step and every direction in one matmul: (seq * batch, nd * G * H).
        xw = rows @ w.reshape(-1, width).T if project is None else project(rows)
        xw = xw.reshape(seq, batch, nd, -1)
        lens = None
        valid = None
        steps = seq
        if seq_lens is not None:
            lens = np.asarray(seq_lens).astype(np.int64).reshape(-1)
            if lens.shape[0] != batch or (lens < 0).any() or (lens > seq).any():
                raise InvalidArgument(
                    f"{spec.op} node {spec.name!r}: sequence_lens must hold {batch} values in [0, {seq}], "
                    f"found {lens.tolist()}"
                )
            if (lens == seq).all():
                lens = None
            else:
                steps = int(lens.max())
                valid = (np.arange(seq)[:, None] < lens[None, :])[:, :, None]
        return xw, lens, valid, steps, seq, batch

    def state(self, init: Any, d: int, batch: int, hidden: int, dtype: Any) -> np.ndarray:
        if init is None:
            return np.zeros((batch, hidden), dtype=dtype)
        init = np.asarray(init)
        return init[:, d] if self.spec.layout else init[d]

    def finish(self, ys: list[Any], finals: list[list[np.ndarray]]) -> list[Any]:
        spec = self.spec
        outs: list[Any] = []
        if spec.want_y:
            y = np.stack(ys, axis=1)  # (seq, nd, batch, H)
            outs.append(np.ascontiguousarray(y.transpose(2, 0, 1, 3)) if spec.layout else y)
        else:
            outs.append(None)
        for states in finals:
            s = np.stack(states)  # (nd, batch, H)
            outs.append(np.ascontiguousarray(s.transpose(1, 0, 2)) if spec.layout else s)
        return outs


def _seq_out(
    y: np.ndarray | None, order: Any, valid: np.ndarray | None, seq: int, steps: int
) -> np.ndarray | None:
    """Zero the steps past each length and put the processing-order outputs back in time order."""
    if y is None:
        return None
    if valid is not None:
        y[:steps] *= valid[:steps]
    if isinstance(order, tuple):
        y = y[order]
    elif order != slice(None):
        y = y[::-1]
    return y


def _zero_empty(state: np.ndarray, lens: np.ndarray | None) -> np.ndarray:
    if lens is not None and (lens == 0).any():
        state = np.where((lens == 0)[:, None], 0, state).astype(state.dtype, copy=False)
    return state


def _clipper(clip: float | None) -> Callable[[np.ndarray], object]:
    """In-place clip of a pre-activation array (a no-op without the ``clip`` attribute)."""
    if clip is None:
        return lambda a: a
    return lambda a: np.clip(a, -clip, clip, out=a)


def _lstm_cell(clip: Callable[[np.ndarray], Any], input_forget: bool) -> Callable[..., tuple[Any, Any]]:
    """One LSTM time step from its gate pre-activations (``iofc`` blocks, ``hid`` wide each) and the cell state:
    ``cell(gates, c, (f, g, h), peep)`` -> (h, c) new; ``peep``: the peepholes (i, o, f) or None."""

    def cell(gates: np.ndarray, c: np.ndarray, acts: Sequence[Any], peep: Any) -> tuple[Any, Any]:
        f, g, h_act = acts
        hid = c.shape[-1]
        if peep is None:
            clip(gates)
            ifo = f(gates[:, : 3 * hid])
            i, o, fg = ifo[:, :hid], ifo[:, hid : 2 * hid], ifo[:, 2 * hid :]
            if input_forget:
                fg = 1 - i
            c_new = fg * c + i * g(gates[:, 3 * hid :])
            return o * h_act(c_new), c_new
        pi, po, pf = peep
        pre_i = gates[:, :hid] + c * pi
        clip(pre_i)
        i = f(pre_i)
        if input_forget:
            fg = 1 - i
        else:
            pre_f = gates[:, 2 * hid : 3 * hid] + c * pf
            clip(pre_f)
            fg = f(pre_f)
        pre_c = gates[:, 3 * hid :]
        clip(pre_c)
        c_new = fg * c + i * g(pre_c)
        pre_o = gates[:, hid : 2 * hid] + c_new * po
        clip(pre_o)
        return f(pre_o) * h_act(c_new), c_new

    return cell


def _float_recurrence(r: np.ndarray) -> Callable[[int], Callable[[np.ndarray], np.ndarray]]:
    """Direction ``d``'s h -> h @ R[d].T."""

    def recurrence(d: int) -> Callable[[np.ndarray], np.ndarray]:
        rt = r[d].T
        return lambda h: h @ rt  # type: ignore[no-any-return]

    return recurrence


@kernel("LSTM", since=7)
def _lstm(info: NodeInfo) -> Kernel:
    spec = _Spec(info)
    input_forget = bool(info.get("input_forget", 0))
    driver = _Run(spec)
    want_c = info.has_output(2)
    n_out = info.num_outputs
    loop = lstm_loop(info)
    plain = _names(info, ["sigmoid", "tanh", "tanh"], len(spec.directions)) == [
        "sigmoid",
        "tanh",
        "tanh",
    ] * len(spec.directions)
    step = None
    if plain and spec.layout == 0 and spec.clip is None and not input_forget:
        step = lstm_step(len(spec.directions), spec.want_y, want_c, n_out)

    def run(
        x: np.ndarray,
        w: np.ndarray,
        r: np.ndarray,
        b: Any = None,
        seq_lens: Any = None,
        h0: Any = None,
        c0: Any = None,
        p: Any = None,
    ) -> list[Any]:
        if step is not None and seq_lens is None and p is None and x.ndim == 3 and x.shape[0] == 1:
            return step(x, w, r, b, h0, c0)
        prepared = driver.prepare(x, w, seq_lens)
        return loop(prepared, _float_recurrence(r), r.shape[-1], b, h0, c0, p, x.dtype)

    return run


def prepare_run(info: NodeInfo) -> Callable[..., tuple[Any, ...]]:
    """``_Run.prepare`` for the node of ``info``: (x, w, seq_lens, project) -> the ``prepared`` of ``lstm_loop``."""
    return _Run(_Spec(info)).prepare


def lstm_loop(info: NodeInfo) -> Callable[..., list[Any]]:
    """The LSTM of ``info`` from its projected inputs: ``loop(prepared, recurrence, hidden, b, h0, c0, p, dtype)``,
    ``prepared`` as ``_Run.prepare`` gives it, ``recurrence(d)`` direction ``d``'s h -> its recurrent gates (the
    float product with R, or DynamicQuantizeLSTM's quantized one)."""
    spec = _Spec(info)
    acts = _activations(info, ["sigmoid", "tanh", "tanh"], len(spec.directions))
    cell = _lstm_cell(_clipper(spec.clip), bool(info.get("input_forget", 0)))
    driver = _Run(spec)
    want_c = info.has_output(2)
    n_out = info.num_outputs

    def loop(
        prepared: tuple[Any, ...], recurrence: Callable[[int], Any], hid: int, b: Any, h0: Any, c0: Any, p: Any,
        dtype: Any,
    ) -> list[Any]:  # fmt: skip
        xw, lens, valid, steps, seq, batch = prepared
        ys: list[np.ndarray | None] = []
        hs, cs = [], []
        for d, reverse in enumerate(spec.directions):
            f, g, h_act = acts[3 * d : 3 * d + 3]
            order = _order(lens, seq, batch, reverse)
            xd = xw[:, :, d]
            if b is not None:
                xd = xd + (b[d, : 4 * hid] + b[d, 4 * hid :])
            xd = xd[order]
            recur = recurrence(d)
            h = driver.state(h0, d, batch, hid, dtype)
            c = driver.state(c0, d, batch, hid, dtype)
            peep = None if p is None else (p[d, :hid], p[d, hid : 2 * hid], p[d, 2 * hid :])  # i, o, f
            y = np.zeros((seq, batch, hid), dtype=dtype) if spec.want_y else None
            for t in range(steps):
                gates = recur(h)
                gates += xd[t]
                h_new, c_new = cell(gates, c, (f, g, h_act), peep)
                if y is not None:
                    y[t] = h_new
                if valid is None:
                    h, c = h_new, c_new
                else:
                    m = valid[t]
                    h, c = np.where(m, h_new, h), np.where(m, c_new, c)
            ys.append(_seq_out(y, order, valid, seq, steps))
            hs.append(_zero_empty(h, lens))
            cs.append(_zero_empty(c, lens))
        outs = driver.finish(ys, [hs, cs] if want_c else [hs])
        return (outs + [None] * n_out)[:n_out]

    return loop


@kernel("GRU", since=7)
def _gru(info: NodeInfo) -> Kernel:
    spec = _Spec(info)
    acts = _activations(info, ["sigmoid", "tanh"], len(spec.directions))
    lbr = bool(info.get("linear_before_reset", 0))
    clip = _clipper(spec.clip)
    driver = _Run(spec)
    n_out = info.num_outputs

    def run(
        x: np.ndarray, w: np.ndarray, r: np.ndarray, b: Any = None, seq_lens: Any = None, h0: Any = None
    ) -> list[Any]:
        xw, lens, valid, steps, seq, batch = driver.prepare(x, w, seq_lens)
        hid = r.shape[-1]
        ys: list[np.ndarray | None] = []
        hs = []
        for d, reverse in enumerate(spec.directions):
            f, g = acts[2 * d : 2 * d + 2]
            order = _order(lens, seq, batch, reverse)
            xd = xw[:, :, d]
            rbh = None
            if b is not None:
                wb, rb = b[d, : 3 * hid], b[d, 3 * hid :]
                if lbr:
                    rbh = rb[2 * hid :]
                    xd = xd + np.concatenate([wb[: 2 * hid] + rb[: 2 * hid], wb[2 * hid :]])
                else:
                    xd = xd + (wb + rb)
            xd = xd[order]
            rt = r[d].T
            rt_zr, rt_h = rt[:, : 2 * hid], rt[:, 2 * hid :]
            h = driver.state(h0, d, batch, hid, x.dtype)
            y = np.zeros((seq, batch, hid), dtype=x.dtype) if spec.want_y else None
            for t in range(steps):
                xt = xd[t]
                if lbr:
                    hr = h @ rt
                    zr = hr[:, : 2 * hid]
                    zr += xt[:, : 2 * hid]
                    clip(zr)
                    zr = f(zr)
                    hh = hr[:, 2 * hid :]
                    if rbh is not None:
                        hh += rbh
                    hh *= zr[:, hid:]
                else:
                    zr = h @ rt_zr
                    zr += xt[:, : 2 * hid]
                    clip(zr)
                    zr = f(zr)
                    hh = (zr[:, hid:] * h) @ rt_h
                hh += xt[:, 2 * hid :]
                clip(hh)
                hh = g(hh)
                z = zr[:, :hid]
                h_new = hh + z * (h - hh)
                if y is not None:
                    y[t] = h_new
                h = h_new if valid is None else np.where(valid[t], h_new, h)
            ys.append(_seq_out(y, order, valid, seq, steps))
            hs.append(_zero_empty(h, lens))
        outs = driver.finish(ys, [hs])
        return (outs + [None] * n_out)[:n_out]

    return run


@kernel("RNN", since=7)
def _rnn(info: NodeInfo) -> Kernel:
    spec = _Spec(info)
    acts = _activations(info, ["tanh"], len(spec.directions))
    clip = _clipper(spec.clip)
    driver = _Run(spec)
    n_out = info.num_outputs

    def run(
        x: np.ndarray, w: np.ndarray, r: np.ndarray, b: Any = None, seq_lens: Any = None, h0: Any = None
    ) -> list[Any]:
        xw, lens, valid, steps, seq, batch = driver.prepare(x, w, seq_lens)
        hid = r.shape[-1]
        ys: list[np.ndarray | None] = []
        hs = []
        for d, reverse in enumerate(spec.directions):
            f = acts[d]
            order = _order(lens, seq, batch, reverse)
            xd = xw[:, :, d]
            if b is not None:
                xd = xd + (b[d, :hid] + b[d, hid:])
            xd = xd[order]
            rt = r[d].T
            h = driver.state(h0, d, batch, hid, x.dtype)
            y = np.zeros((seq, batch, hid), dtype=x.dtype) if spec.want_y else None
            for t in range(steps):
                a = h @ rt
                a += xd[t]
                clip(a)
                h_new = f(a)
                if y is not None:
                    y[t] = h_new
                h = h_new if valid is None else np.where(valid[t], h_new, h)
            ys.append(_seq_out(y, order, valid, seq, steps))
            hs.append(_zero_empty(h, lens))
        outs = driver.finish(ys, [hs])
        return (outs + [None] * n_out)[:n_out]

    return run
