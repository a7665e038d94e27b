"""The Conv folds of level BASIC, as onnxruntime's ConvBNFusion, ConvMulFusion and ConvAddFusion do them.

A Conv whose only reader scales or shifts each output channel by constants takes that into its weight and
bias: BatchNormalization (``fold_batchnorm.py``), ``Mul`` by a constant (W * f, b * f) and ``Add`` of a
constant (b + a), the constant being a scalar or one value per output channel ((M, 1, 1) or (1, M, 1, 1) for a
2-D conv). PP-OCRv4's det and rec models follow most Convs by a ``Mul`` and an ``Add`` of scalars (their
"learnable affine" blocks), PP-OCR cls its squeeze-excitation Convs by an ``Add`` of the bias.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from epctx.optimize.conv_params import const_array, conv_before, conv_params, rewrite_conv
from epctx.optimize.fold_batchnorm import fold_batchnorms

__all__ = ["fold_conv_affine", "fold_conv_batchnorm", "fold_scales_and_shifts"]


def fold_conv_affine(graph: ir.Graph) -> int:
    """Every Conv fold of ``graph`` (BatchNormalization, then Mul and Add); returns how many readers were
    folded into their Conv."""
    return fold_batchnorms(graph) + fold_scales_and_shifts(graph)


def fold_conv_batchnorm(graph: ir.Graph) -> int:
    """The name ``session/pipeline.py`` calls the level-BASIC Conv folds by: :func:`fold_conv_affine`."""
    return fold_conv_affine(graph)


def fold_scales_and_shifts(graph: ir.Graph) -> int:
    """Fold every Conv -> Mul(constant) and Conv -> Add(constant) of ``graph`` (in order, so that a Mul then an
    Add both fold); returns how many were folded."""
    folded = 0
    for node in list(graph):
        if node.op_type not in ("Mul", "Add") or node.domain not in ("", "ai.onnx") or len(node.inputs) != 2:
            continue
        for side in (0, 1):
            conv = conv_before(graph, node.inputs[side])
            found = conv_params(conv) if conv is not None else None
            other = const_array(node.inputs[1 - side])
            if conv is None or found is None or other is None:
                continue
            weight, bias = found
            per_channel = _per_channel(other, weight)
            if per_channel is None:
                continue
            base = np.zeros(weight.shape[0]) if bias is None else bias.astype(np.float64)
            if node.op_type == "Mul":
                scale = per_channel.reshape((-1,) + (1,) * (weight.ndim - 1))
                rewrite_conv(
                    graph, conv, node, weight.astype(np.float64) * scale, base * per_channel, "mulfold"
                )
            else:
                rewrite_conv(graph, conv, node, weight.astype(np.float64), base + per_channel, "addfold")
            folded += 1
            break
    return folded


def _per_channel(const: np.ndarray, weight: np.ndarray) -> np.ndarray | None:
    """``const`` as one float64 value per output channel when, broadcast against the Conv's output
    (N, M, *spatial), it varies along M at most and does not widen the output; else None."""
    rank, channels = weight.ndim, weight.shape[0]
    if const.dtype != weight.dtype or const.ndim > rank:
        return None
    shape = (1,) * (rank - const.ndim) + const.shape
    if shape[0] != 1 or shape[1] not in (1, channels) or any(d != 1 for d in shape[2:]):
        return None
    return np.broadcast_to(const.reshape(-1).astype(np.float64), (channels,)).copy()
