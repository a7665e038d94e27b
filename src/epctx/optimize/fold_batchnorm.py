"""Fold an inference BatchNormalization into the Conv that feeds it (as onnxruntime does at level BASIC).

Conv(x, W, b) -> BatchNormalization(scale, B, mean, var, eps) becomes Conv(x, W * f, (b - mean) * f + B)
with f = scale / sqrt(var + eps) per output channel, when W, b and the BN parameters are constants
(initializers or ``Constant`` nodes, see ``conv_params``), the Conv output feeds only the BatchNormalization,
and the BatchNormalization is in inference mode.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from epctx.optimize.conv_params import const_array, conv_before, conv_params, rewrite_conv

__all__ = ["fold_batchnorms"]


def fold_batchnorms(graph: ir.Graph) -> int:
    """Fold every eligible Conv -> BatchNormalization pair of ``graph``; returns how many were folded."""
    folded = 0
    for bn in list(graph):
        if bn.op_type != "BatchNormalization" or bn.domain not in ("", "ai.onnx") or len(bn.outputs) != 1:
            continue
        if bn.attributes.get("training_mode") is not None and bn.attributes["training_mode"].value:
            continue
        conv = conv_before(graph, bn.inputs[0])
        found = conv_params(conv) if conv is not None else None
        params = [const_array(v) for v in bn.inputs[1:5]]
        if conv is None or found is None or len(params) != 4 or any(p is None for p in params):
            continue
        weight, bias = found
        scale, shift, mean, var = (np.asarray(p, dtype=np.float64) for p in params)  # type: ignore[arg-type]
        eps = bn.attributes["epsilon"].value if "epsilon" in bn.attributes else 1e-5
        factor = scale / np.sqrt(var + eps)
        if factor.shape != (weight.shape[0],):
            continue
        new_w = weight.astype(np.float64) * factor.reshape((-1,) + (1,) * (weight.ndim - 1))
        base = np.zeros(weight.shape[0]) if bias is None else bias.astype(np.float64)
        rewrite_conv(graph, conv, bn, new_w, (base - mean) * factor + shift, "bnfold")
        folded += 1
    return folded
