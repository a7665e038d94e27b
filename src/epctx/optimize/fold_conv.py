"""The Conv folds of level BASIC, as onnxruntime's ConvBNFusion, ConvMulFusion and ConvAddFusion do them.

A Conv whose output is read by one node that scales or shifts each output channel by constants takes that node
into its weight and bias, and so on along the chain (Conv -> BatchNormalization -> Mul -> Add folds whole, with
one new weight and bias):

* ``BatchNormalization`` in inference mode: W * f, (b - mean) * f + B with f = scale / sqrt(var + eps);
* ``Mul`` by a constant: W * c, b * c;
* ``Add`` of a constant: b + c;

the constants being initializers, ``Constant`` nodes or Reshapes of those (``conv_params.const_array``: Paddle
exports feed every weight and BatchNormalization parameter from Constant nodes), ``Mul`` / ``Add`` constants a
scalar or one value per output channel ((M, 1, 1) or (1, M, 1, 1) for a 2-D conv). PP-OCRv4's det and rec models
follow most Convs by a ``Mul`` and an ``Add`` of scalars (their "learnable affine" blocks), PP-OCR cls its
squeeze-excitation Convs by an ``Add`` of the bias reshaped.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from epctx.optimize.conv_params import const_array, conv_params, rewrite_conv, sole_reader

__all__ = ["fold_conv_affine"]

Affine = tuple[np.ndarray, np.ndarray]  # per output channel: scale, shift (float64)


def fold_conv_affine(graph: ir.Graph) -> int:
    """Every Conv fold of ``graph``; returns how many readers were folded into their Conv."""
    folded = 0
    for conv in list(graph):
        if conv.op_type != "Conv" or conv.domain not in ("", "ai.onnx") or len(conv.outputs) != 1:
            continue
        found = conv_params(conv)
        if found is None:
            continue
        weight, bias = found
        readers: list[ir.Node] = []
        scale = np.ones(weight.shape[0])
        shift = np.zeros(weight.shape[0]) if bias is None else bias.astype(np.float64)
        x = conv.outputs[0]
        while (reader := sole_reader(graph, x)) is not None and (
            step := _affine(reader, x, weight)
        ) is not None:
            scale, shift = scale * step[0], shift * step[0] + step[1]
            readers.append(reader)
            x = reader.outputs[0]
        if readers:
            new_w = weight.astype(np.float64) * scale.reshape((-1,) + (1,) * (weight.ndim - 1))
            rewrite_conv(graph, conv, readers, new_w.astype(weight.dtype), shift.astype(weight.dtype))
            folded += len(readers)
    return folded


def _affine(node: ir.Node, x: ir.Value, weight: np.ndarray) -> Affine | None:
    """What ``node`` (reading ``x``, the Conv's output so far) does to each output channel, if it folds."""
    if len(node.outputs) != 1:
        return None
    if node.op_type == "BatchNormalization":
        return _batchnorm(node, x, weight.shape[0])
    if node.op_type not in ("Mul", "Add") or len(node.inputs) != 2 or list(node.inputs).count(x) != 1:
        return None
    other = const_array(node.inputs[1 - list(node.inputs).index(x)])
    per_channel = None if other is None else _per_channel(other, weight)
    if per_channel is None:
        return None
    if node.op_type == "Mul":
        return per_channel, np.zeros_like(per_channel)
    return np.ones_like(per_channel), per_channel


def _batchnorm(bn: ir.Node, x: ir.Value, channels: int) -> Affine | None:
    attr = bn.attributes.get("training_mode")
    if bn.inputs[0] is not x or len(bn.inputs) != 5 or (attr is not None and attr.value):
        return None
    params = [const_array(v) for v in bn.inputs[1:5]]
    if any(p is None for p in params):
        return None
    scale, b, mean, var = (np.asarray(p, dtype=np.float64) for p in params)  # type: ignore[arg-type]
    eps = bn.attributes["epsilon"].value if "epsilon" in bn.attributes else 1e-5
    factor = scale / np.sqrt(var + eps)
    if factor.shape != (channels,) or b.shape != (channels,) or mean.shape != (channels,):
        return None
    return factor, b - mean * factor


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
