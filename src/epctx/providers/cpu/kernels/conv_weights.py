"""A Conv's constant weights as its kernels read them: prepared once per layout (``prepare_weight``), and
scaled once when the activation after the Conv runs in fewer passes on a scaled input (``Weights``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from epctx.providers.cpu import fusion
from epctx.providers.cpu.kernels.conv_activations import activation_of, prescaled_activation

__all__ = ["Weights", "prepare_weight"]


class Weights:
    """A Conv's prepared constant weights and bias, and the activation of its epilogue, settled at the first
    call (once the epilogue knows whether it is active): an activation that runs in fewer passes on a scaled
    input (``conv_activations.prescaled_activation``: HardSwish, SiLU) gets weights and bias scaled once."""

    __slots__ = ("_settled", "b", "epilogue", "group", "scalable", "w")

    def __init__(
        self,
        w: np.ndarray | None,
        b: np.ndarray | None,
        group: int,
        epilogue: fusion.Epilogue | None,
        *,
        bias_input: bool,
    ) -> None:
        self.w, self.b, self.group, self.epilogue = w, b, group, epilogue
        # a bias computed at run time is not scaled
        self.scalable = w is not None and w.dtype == np.float32 and not (bias_input and b is None)
        self._settled: tuple[dict[str, Any], np.ndarray | None, fusion.Activation | None] | None = None

    def settled(self) -> tuple[dict[str, Any], np.ndarray | None, fusion.Activation | None]:
        """(prepared weights, bias as a column, the activation to apply or None)."""
        found = self._settled
        if found is None:
            found = self._settled = self._settle()
        return found

    def _settle(self) -> tuple[dict[str, Any], np.ndarray | None, fusion.Activation | None]:
        epilogue = self.epilogue
        if epilogue is None or not epilogue.active():
            return self._make(1.0, None)
        scaled = prescaled_activation(epilogue) if self.scalable else None
        return self._make(*scaled) if scaled is not None else self._make(1.0, activation_of(epilogue))

    def _make(
        self, scale: float, activation: fusion.Activation | None
    ) -> tuple[dict[str, Any], np.ndarray | None, fusion.Activation | None]:
        w, b = self.w, self.b
        if scale != 1.0:
            w = None if w is None else (w * w.dtype.type(scale))
            b = None if b is None else (b * b.dtype.type(scale))
        prepared = {} if w is None else prepare_weight(w, self.group)
        return prepared, None if b is None else b.reshape(-1, 1), activation


def prepare_weight(w: np.ndarray, group: int) -> dict[str, Any]:
    m, cg = w.shape[0], w.shape[1]
    k = int(np.prod(w.shape[2:], dtype=np.int64))
    prep: dict[str, Any] = {}
    if group == 1:
        prep["w2"] = np.ascontiguousarray(w.reshape(m, cg * k))
    else:
        prep["w3"] = np.ascontiguousarray(w.reshape(group, m // group, cg * k))
    if cg == 1 and group > 1:
        # depthwise: (C, multiplier, K) per kernel offset
        prep["wd"] = np.ascontiguousarray(w.reshape(group, m // group, k).transpose(2, 0, 1))
        # channels-last: (*K, C, multiplier)
        nd = w.ndim - 2
        wl = w.reshape(group, m // group, *w.shape[2:]).transpose(*range(2, 2 + nd), 0, 1)
        prep["wl"] = np.ascontiguousarray(wl)
    return prep
