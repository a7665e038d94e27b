"""Benchmark models built with onnx.helper: an MLP, a ResNet-18-like CNN, a BERT-like encoder, Identity.

Every builder takes its sizes as keyword arguments (tests build tiny versions), draws float32 weights from a
numpy generator with a fixed seed (the same arguments give the same model bytes) and returns an opset-17
``onnx.ModelProto``. ``MODELS`` maps a name to its builder; ``example_inputs`` makes a matching feed.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["MODELS", "example_inputs", "identity", "mlp", "resnet18", "save", "transformer"]

OPSET = 17
IR_VERSION = 8  # opset 17 needs IR >= 8; keeps the models loadable by older onnxruntime releases too


class _GraphBuilder:
    """Collects nodes and initializers; names come from per-builder counters (deterministic)."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._counts: dict[str, int] = {}

    def fresh(self, prefix: str) -> str:
        n = self._counts.get(prefix, 0)
        self._counts[prefix] = n + 1
        return f"{prefix}_{n}"

    def const(self, prefix: str, array: np.ndarray) -> str:
        name = self.fresh(prefix)
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def normal(self, prefix: str, shape: Sequence[int], std: float) -> str:
        return self.const(prefix, (self.rng.standard_normal(shape) * std).astype(np.float32))

    def op(self, op_type: str, inputs: Sequence[str], num_outputs: int = 1, **attrs: Any) -> Any:
        """Add a node; returns its output name (or a list of names when ``num_outputs`` > 1)."""
        base = self.fresh(op_type.lower())
        outputs = [base] if num_outputs == 1 else [f"{base}_out{i}" for i in range(num_outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outputs, name=base, **attrs))
        return outputs[0] if num_outputs == 1 else outputs

    def model(
        self,
        name: str,
        inputs: Sequence[onnx.ValueInfoProto],
        outputs: Sequence[onnx.ValueInfoProto],
    ) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, name, list(inputs), list(outputs), self.initializers)
        model = helper.make_model(
            graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="epctx-benchmarks"
        )
        model.ir_version = IR_VERSION
        return model


def _float_input(name: str, shape: Sequence[int]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape))


def _float_output(name: str, shape: Sequence[int] | None = None) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, None if shape is None else list(shape))


def _rename_last_output(b: _GraphBuilder, name: str) -> None:
    b.nodes[-1].output[0] = name


# -- MLP ---------------------------------------------------------------------------------------------------
def mlp(
    *, batch: int = 32, sizes: Sequence[int] = (784, 1024, 1024, 1024, 10), seed: int = 0
) -> onnx.ModelProto:
    """Dense layers ``sizes[0] -> ... -> sizes[-1]`` with Relu between them.

    Hidden layers are Gemm(transB=1) + Relu as torch exports them; the last layer is MatMul + Add, so both
    forms are timed.
    """
    if len(sizes) < 2:
        raise ValueError(f"mlp needs at least two sizes, got {list(sizes)}")
    b = _GraphBuilder(seed)
    x = "input"
    layers = len(sizes) - 1
    for k in range(layers):
        fan_in, fan_out = sizes[k], sizes[k + 1]
        std = math.sqrt(2.0 / fan_in)
        bias = b.const("bias", (b.rng.standard_normal(fan_out) * 0.01).astype(np.float32))
        if k < layers - 1:
            w = b.normal("weight", (fan_out, fan_in), std)  # [out, in] with transB=1
            x = b.op("Gemm", [x, w, bias], transB=1)
            x = b.op("Relu", [x])
        else:
            w = b.normal("weight", (fan_in, fan_out), std)
            x = b.op("MatMul", [x, w])
            x = b.op("Add", [x, bias])
    _rename_last_output(b, "output")
    return b.model(
        "mlp", [_float_input("input", (batch, sizes[0]))], [_float_output("output", (batch, sizes[-1]))]
    )


# -- ResNet-18 ---------------------------------------------------------------------------------------------
def _conv_bn(
    b: _GraphBuilder,
    x: str,
    c_in: int,
    c_out: int,
    kernel: int,
    stride: int,
    *,
    relu: bool,
    gamma: float = 1.0,
) -> str:
    """Conv (no bias, as torchvision) + BatchNormalization (not folded) + optional Relu."""
    std = math.sqrt(2.0 / (c_in * kernel * kernel))
    w = b.normal("conv_w", (c_out, c_in, kernel, kernel), std)
    pad = kernel // 2
    y = b.op("Conv", [x, w], kernel_shape=[kernel, kernel], strides=[stride, stride], pads=[pad] * 4)
    scale = b.const("bn_scale", (gamma * b.rng.uniform(0.8, 1.2, c_out)).astype(np.float32))
    bias = b.const("bn_bias", (b.rng.standard_normal(c_out) * 0.05).astype(np.float32))
    mean = b.const("bn_mean", (b.rng.standard_normal(c_out) * 0.05).astype(np.float32))
    var = b.const("bn_var", b.rng.uniform(0.5, 1.5, c_out).astype(np.float32))
    y = b.op("BatchNormalization", [y, scale, bias, mean, var], epsilon=1e-5)
    return b.op("Relu", [y]) if relu else y


def resnet18(
    *,
    batch: int = 1,
    image: int = 224,
    widths: Sequence[int] = (64, 128, 256, 512),
    blocks: Sequence[int] = (2, 2, 2, 2),
    num_classes: int = 1000,
    seed: int = 0,
) -> onnx.ModelProto:
    """ResNet-18 layout: conv7x7/2 + BN + Relu + MaxPool3x3/2, basic blocks with skips, GAP, Gemm."""
    if len(widths) != len(blocks):
        raise ValueError(f"widths {list(widths)} and blocks {list(blocks)} differ in length")
    b = _GraphBuilder(seed)
    x = _conv_bn(b, "input", 3, widths[0], 7, 2, relu=True)
    x = b.op("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    c_in = widths[0]
    for stage, (width, count) in enumerate(zip(widths, blocks)):
        for block in range(count):
            stride = 2 if stage > 0 and block == 0 else 1
            y = _conv_bn(b, x, c_in, width, 3, stride, relu=True)
            # A small last-BN scale keeps the residual stream from growing block after block.
            y = _conv_bn(b, y, width, width, 3, 1, relu=False, gamma=0.3)
            skip = x
            if stride != 1 or c_in != width:
                skip = _conv_bn(b, x, c_in, width, 1, stride, relu=False)
            x = b.op("Relu", [b.op("Add", [y, skip])])
            c_in = width
    x = b.op("GlobalAveragePool", [x])
    x = b.op("Flatten", [x], axis=1)
    w = b.normal("fc_w", (num_classes, c_in), math.sqrt(1.0 / c_in))
    bias = b.const("fc_b", np.zeros(num_classes, np.float32))
    b.op("Gemm", [x, w, bias], transB=1)
    _rename_last_output(b, "output")
    return b.model(
        "resnet18",
        [_float_input("input", (batch, 3, image, image))],
        [_float_output("output", (batch, num_classes))],
    )


# -- Transformer encoder -----------------------------------------------------------------------------------
def _linear(b: _GraphBuilder, x: str, d_in: int, d_out: int) -> str:
    w = b.normal("w", (d_in, d_out), 0.02)
    bias = b.const("b", (b.rng.standard_normal(d_out) * 0.02).astype(np.float32))
    return b.op("Add", [b.op("MatMul", [x, w]), bias])


def _layer_norm(b: _GraphBuilder, x: str, hidden: int) -> str:
    scale = b.const("ln_scale", b.rng.uniform(0.9, 1.1, hidden).astype(np.float32))
    bias = b.const("ln_bias", (b.rng.standard_normal(hidden) * 0.02).astype(np.float32))
    return b.op("LayerNormalization", [x, scale, bias], axis=-1, epsilon=1e-12)


def _gelu_erf(b: _GraphBuilder, x: str, consts: dict[str, str]) -> str:
    """0.5 * x * (1 + erf(x / sqrt(2))), node for node as BERT exports it."""
    e = b.op("Erf", [b.op("Div", [x, consts["sqrt2"]])])
    return b.op("Mul", [b.op("Mul", [x, b.op("Add", [e, consts["one"]])]), consts["half"]])


def transformer(
    *,
    layers: int = 6,
    hidden: int = 512,
    heads: int = 8,
    ffn: int = 2048,
    seq: int = 128,
    batch: int = 1,
    seed: int = 0,
) -> onnx.ModelProto:
    """A BERT-style post-LN encoder over ``[batch, seq, hidden]`` embeddings (no attention mask)."""
    if hidden % heads:
        raise ValueError(f"hidden {hidden} is not a multiple of heads {heads}")
    head_dim = hidden // heads
    b = _GraphBuilder(seed)
    consts = {
        "sqrt2": b.const("sqrt2", np.array(math.sqrt(2.0), np.float32)),
        "one": b.const("one", np.array(1.0, np.float32)),
        "half": b.const("half", np.array(0.5, np.float32)),
        "scale": b.const("attn_scale", np.array(math.sqrt(head_dim), np.float32)),
        # 0 copies the input's dimension, so the shapes stay valid for any batch and sequence length.
        "to_heads": b.const("shape_heads", np.array([0, 0, heads, head_dim], np.int64)),
        "to_hidden": b.const("shape_hidden", np.array([0, 0, hidden], np.int64)),
    }
    x = "input"
    for _ in range(layers):
        q, k, v = (b.op("Reshape", [_linear(b, x, hidden, hidden), consts["to_heads"]]) for _ in range(3))
        q = b.op("Transpose", [q], perm=[0, 2, 1, 3])  # [B, H, S, D]
        k = b.op("Transpose", [k], perm=[0, 2, 3, 1])  # [B, H, D, S]
        v = b.op("Transpose", [v], perm=[0, 2, 1, 3])
        scores = b.op("Div", [b.op("MatMul", [q, k]), consts["scale"]])
        probs = b.op("Softmax", [scores], axis=-1)
        ctx = b.op("Transpose", [b.op("MatMul", [probs, v])], perm=[0, 2, 1, 3])
        ctx = b.op("Reshape", [ctx, consts["to_hidden"]])
        attn = _linear(b, ctx, hidden, hidden)
        x = _layer_norm(b, b.op("Add", [attn, x]), hidden)
        h = _gelu_erf(b, _linear(b, x, hidden, ffn), consts)
        x = _layer_norm(b, b.op("Add", [_linear(b, h, ffn, hidden), x]), hidden)
    _rename_last_output(b, "output")
    return b.model(
        "transformer",
        [_float_input("input", (batch, seq, hidden))],
        [_float_output("output", (batch, seq, hidden))],
    )


# -- Identity ----------------------------------------------------------------------------------------------
def identity(*, size: int = 16) -> onnx.ModelProto:
    """One Identity node over float32 ``[1, size]``: measures the per-run() overhead."""
    b = _GraphBuilder(0)
    b.nodes.append(helper.make_node("Identity", ["input"], ["output"], name="identity"))
    return b.model("identity", [_float_input("input", (1, size))], [_float_output("output", (1, size))])


MODELS: dict[str, Callable[..., onnx.ModelProto]] = {
    "mlp": mlp,
    "resnet18": resnet18,
    "transformer": transformer,
    "identity": identity,
}


# -- feeds and files ---------------------------------------------------------------------------------------
def example_inputs(name: str, model: onnx.ModelProto, *, seed: int = 1) -> dict[str, np.ndarray]:
    """A feed for every graph input of ``model`` (built by ``MODELS[name]``), drawn with a fixed seed.

    Dimensions given as parameters are set to 1. Image-like inputs (``resnet18``) are drawn from [0, 1);
    everything else from a standard normal.
    """
    if name not in MODELS:
        raise KeyError(f"unknown model {name!r}; known: {sorted(MODELS)}")
    rng = np.random.default_rng(seed)
    initializers = {t.name for t in model.graph.initializer}
    feeds: dict[str, np.ndarray] = {}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        tensor_type = value.type.tensor_type
        dtype = helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)
        shape = [d.dim_value if d.HasField("dim_value") else 1 for d in tensor_type.shape.dim]
        data: np.ndarray
        if np.issubdtype(dtype, np.floating):
            data = rng.random(shape) if name == "resnet18" else rng.standard_normal(shape)
        else:
            data = rng.integers(0, 10, shape)
        feeds[value.name] = np.asarray(data, dtype=dtype)
    return feeds


def save(model: onnx.ModelProto, path: str | os.PathLike[str], *, external_data: bool = False) -> None:
    """Write ``model`` to ``path``; with ``external_data`` the weights go to ``<file name>.data`` beside it.

    The caller's ``model`` is not modified (onnx's external-data conversion works on a copy).
    """
    path = os.fspath(path)
    if not external_data:
        onnx.save_model(model, path)
        return
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    onnx.save_model(
        copy,
        path,
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=os.path.basename(path) + ".data",
        size_threshold=1024,
    )
