"""Small models for the context-cache tests: partly claimed by the example EP, so CPU nodes remain."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

EXAMPLE = "ExampleExecutionProvider"


def two_partition_model(seed: int = 0) -> onnx.ModelProto:
    """MatMul -> Relu | LayerNormalization (CPU) | MatMul -> Add -> Sigmoid: two example-EP partitions."""
    rng = np.random.default_rng(seed)
    inits = [
        numpy_helper.from_array(rng.standard_normal((8, 16)).astype(np.float32), "W1"),
        numpy_helper.from_array(rng.standard_normal((16, 4)).astype(np.float32), "W2"),
        numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "B2"),
        numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "ln_scale"),
        numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "ln_bias"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["a"], name="mm1"),
        helper.make_node("Relu", ["a"], ["b"], name="relu"),
        helper.make_node("LayerNormalization", ["b", "ln_scale", "ln_bias"], ["c"], axis=-1, name="ln"),
        helper.make_node("MatMul", ["c", "W2"], ["d"], name="mm2"),
        helper.make_node("Add", ["d", "B2"], ["e"], name="add"),
        helper.make_node("Sigmoid", ["e"], ["y"], name="sig"),
    ]
    graph = helper.make_graph(
        nodes,
        "two_partitions",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="tests")
    helper.set_model_props(model, {"origin": "tests"})
    return model


def whole_model(seed: int = 0) -> onnx.ModelProto:
    """``two_partition_model`` without its CPU node: the example EP takes every node, so the context model
    is EPContext nodes only (what the lean load path reads)."""
    model = two_partition_model(seed)
    graph = model.graph
    ln = next(n for n in graph.node if n.op_type == "LayerNormalization")
    graph.node.remove(ln)
    for node in graph.node:
        node.input[:] = ["b" if name == "c" else name for name in node.input]
    kept = [t for t in graph.initializer if not t.name.startswith("ln_")]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    graph.name = "whole"
    return model


def feed(seed: int = 1, n: int = 3) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).standard_normal((n, 8)).astype(np.float32)}
