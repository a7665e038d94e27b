"""Conv + BatchNormalization folding: same outputs as onnxruntime, fewer nodes, nothing folded when unsafe."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

import epctx
from epctx.optimize import fold_conv_batchnorm
from tests.oracle import assert_matches_ort


def _model(*, with_bias: bool, conv_output_also_used: bool = False, momentum: bool = False) -> object:
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "W"),
        numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "scale"),
        numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "B"),
        numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "mean"),
        numpy_helper.from_array(rng.random(4).astype(np.float32) + 0.5, "var"),
    ]
    conv_inputs = ["x", "W"]
    if with_bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b"))
        conv_inputs.append("b")
    bn_attrs = {"epsilon": 1e-3, **({"momentum": 0.9} if momentum else {})}
    nodes = [
        helper.make_node("Conv", conv_inputs, ["c"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node(
            "BatchNormalization", ["c", "scale", "B", "mean", "var"], ["y"], name="bn", **bn_attrs
        ),
    ]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if conv_output_also_used:
        nodes.append(helper.make_node("Relu", ["c"], ["r"]))
        outputs.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, None))
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])], outputs, inits
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13 if momentum else 15)])


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("momentum", [False, True])
def test_folded_session_matches_onnxruntime(with_bias, momentum):
    model = _model(with_bias=with_bias, momentum=momentum)
    graph = ir.serde.deserialize_model(model).graph
    assert fold_conv_batchnorm(graph) == 1
    assert [n.op_type for n in graph] == ["Conv"]
    assert sorted(graph.initializers) == ["conv_bnfold_B", "conv_bnfold_W"]
    x = np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32)
    assert_matches_ort(model, {"x": x}, atol=1e-5)


def test_not_folded_when_the_conv_output_has_other_readers():
    model = _model(with_bias=True, conv_output_also_used=True)
    graph = ir.serde.deserialize_model(model).graph
    assert fold_conv_batchnorm(graph) == 0
    x = np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32)
    assert_matches_ort(model, {"x": x}, atol=1e-5)


def test_disable_all_keeps_the_graph():
    so = epctx.SessionOptions()
    so.graph_optimization_level = epctx.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = epctx.InferenceSession(_model(with_bias=True).SerializeToString(), so)
    assert [n.op_type for n in sess.model.graph] == ["Conv", "BatchNormalization"]
