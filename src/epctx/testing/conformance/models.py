"""The conformance suite's models, made with ``onnx.helper``: small, float32, ops every compiling EP should take
(MatMul, Add, Relu, Sigmoid), plus LayerNormalization where a CPU-fallback node is wanted."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import onnx

__all__ = ["IN", "chain", "feeds", "partial", "second_stage", "shared_variant"]

IN = 32  # input features: W1 is 32 x 64 float32 = 8 KiB, enough for an EP to store it as its own payload
HIDDEN = 64
OUT = 8
_OPSET = 17


def _model(nodes: list[onnx.NodeProto], inits: dict[str, np.ndarray], name: str, x: str, y: str, width: int,
           out: int) -> onnx.ModelProto:  # fmt: skip
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["N", width])],
        [helper.make_tensor_value_info(y, TensorProto.FLOAT, ["N", out])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", _OPSET)], producer_name="conformance"
    )
    model.ir_version = 8
    return model


def _weights(seed: int, *shapes: tuple[int, ...]) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(s) / np.sqrt(s[0])).astype(np.float32) for s in shapes]


def chain(seed: int = 0) -> onnx.ModelProto:
    """x -> MatMul -> Add -> Relu -> MatMul -> Sigmoid -> y: one partition when the EP takes every node."""
    from onnx import helper

    w1, b1, w2 = _weights(seed, (IN, HIDDEN), (HIDDEN,), (HIDDEN, OUT))
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h"], name="mm1"),
        helper.make_node("Add", ["h", "B1"], ["hb"], name="add1"),
        helper.make_node("Relu", ["hb"], ["r"], name="relu"),
        helper.make_node("MatMul", ["r", "W2"], ["logits"], name="mm2"),
        helper.make_node("Sigmoid", ["logits"], ["y"], name="sig"),
    ]
    return _model(nodes, {"W1": w1, "B1": b1, "W2": w2}, "chain", "x", "y", IN, OUT)


def shared_variant(seed: int) -> onnx.ModelProto:
    """``chain(seed)`` with the W1 and B1 of ``chain(0)``: the models of a weight-sharing group share them (W2
    differs)."""
    model = chain(seed)
    base = {i.name: i for i in chain(0).graph.initializer}
    for init in model.graph.initializer:
        if init.name in ("W1", "B1"):
            init.CopyFrom(base[init.name])
    return model


def partial(seed: int = 0) -> onnx.ModelProto:
    """MatMul -> Relu | LayerNormalization (left to the CPU EP) | MatMul -> Add -> Sigmoid: two EP partitions
    with a CPU node between them."""
    from onnx import helper

    w1, w2, b2 = _weights(seed, (IN, HIDDEN), (HIDDEN, OUT), (OUT,))
    scale = np.linspace(0.5, 1.5, HIDDEN, dtype=np.float32)
    bias = np.linspace(-0.1, 0.1, HIDDEN, dtype=np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["a"], name="mm1"),
        helper.make_node("Relu", ["a"], ["b"], name="relu"),
        helper.make_node("LayerNormalization", ["b", "ln_scale", "ln_bias"], ["c"], axis=-1, name="ln"),
        helper.make_node("MatMul", ["c", "W2"], ["d"], name="mm2"),
        helper.make_node("Add", ["d", "B2"], ["e"], name="add"),
        helper.make_node("Sigmoid", ["e"], ["y"], name="sig"),
    ]
    inits = {"W1": w1, "W2": w2, "B2": b2, "ln_scale": scale, "ln_bias": bias}
    return _model(nodes, inits, "partial", "x", "y", IN, OUT)


def second_stage(seed: int = 5) -> onnx.ModelProto:
    """Reads ``y`` (the output of ``chain``): y -> MatMul -> Add -> Relu -> z. Merged after ``chain``."""
    from onnx import helper

    v, c = _weights(seed, (OUT, 6), (6,))
    nodes = [
        helper.make_node("MatMul", ["y", "V"], ["p"], name="s2_mm"),
        helper.make_node("Add", ["p", "C"], ["q"], name="s2_add"),
        helper.make_node("Relu", ["q"], ["z"], name="s2_relu"),
    ]
    return _model(nodes, {"V": v, "C": c}, "second_stage", "y", "z", OUT, 6)


def feeds(seed: int = 1, n: int = 3) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).standard_normal((n, IN)).astype(np.float32)}
