"""Conv + BatchNormalization folding: same outputs as onnxruntime, fewer nodes, nothing folded when unsafe."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

import epctx
from epctx.optimize import fold_conv_affine
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
    assert fold_conv_affine(graph) == 1
    assert [n.op_type for n in graph] == ["Conv"]
    assert sorted(graph.initializers) == ["conv_fold_B", "conv_fold_W"]
    x = np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32)
    assert_matches_ort(model, {"x": x}, atol=1e-5)


def test_not_folded_when_the_conv_output_has_other_readers():
    model = _model(with_bias=True, conv_output_also_used=True)
    graph = ir.serde.deserialize_model(model).graph
    assert fold_conv_affine(graph) == 0
    x = np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32)
    assert_matches_ort(model, {"x": x}, atol=1e-5)


def test_disable_all_keeps_the_graph():
    so = epctx.SessionOptions()
    so.graph_optimization_level = epctx.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = epctx.InferenceSession(_model(with_bias=True).SerializeToString(), so)
    assert [n.op_type for n in sess.model.graph] == ["Conv", "BatchNormalization"]


def _constant_fed_model(*, shared_mean: bool = False) -> object:
    """Conv + BatchNormalization whose weight and BN parameters come from Constant nodes (as Paddle exports)."""
    rng = np.random.default_rng(2)
    arrays = {
        "W": rng.standard_normal((4, 3, 3, 3)).astype(np.float32),
        "scale": rng.standard_normal(4).astype(np.float32),
        "B": rng.standard_normal(4).astype(np.float32),
        "mean": rng.standard_normal(4).astype(np.float32),
        "var": rng.random(4).astype(np.float32) + 0.5,
    }
    nodes = [
        helper.make_node(
            "Constant", [], [name], value=numpy_helper.from_array(a, name + "_t"), name=f"c_{name}"
        )
        for name, a in arrays.items()
    ]
    nodes += [
        helper.make_node("Conv", ["x", "W"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("BatchNormalization", ["c", "scale", "B", "mean", "var"], ["y"], name="bn"),
    ]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if shared_mean:  # another reader keeps the mean's Constant node alive
        axes = numpy_helper.from_array(np.array([0, 2, 3]), "axes_t")
        nodes.append(helper.make_node("Constant", [], ["axes"], value=axes))
        nodes.append(helper.make_node("Unsqueeze", ["mean", "axes"], ["mean_4d"]))
        nodes.append(helper.make_node("Add", ["y", "mean_4d"], ["z"]))
        outputs = [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])], outputs
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])


def test_constant_fed_parameters_are_folded_and_their_constant_nodes_removed():
    model = _constant_fed_model()
    graph = ir.serde.deserialize_model(model).graph
    assert fold_conv_affine(graph) == 1
    assert [n.op_type for n in graph] == ["Conv"]
    assert sorted(graph.initializers) == ["conv_fold_B", "conv_fold_W"]
    x = np.random.default_rng(3).standard_normal((1, 3, 8, 8)).astype(np.float32)
    assert_matches_ort(model, {"x": x}, atol=1e-5)
    sess = epctx.InferenceSession(model.SerializeToString())
    assert [n.op_type for n in sess.model.graph] == ["Conv"]


def test_a_constant_node_another_node_reads_is_kept():
    model = _constant_fed_model(shared_mean=True)
    graph = ir.serde.deserialize_model(model).graph
    assert fold_conv_affine(graph) == 1
    ops = [n.op_type for n in graph]
    assert "BatchNormalization" not in ops and ops.count("Constant") == 2  # the mean's and the axes'
    x = np.random.default_rng(3).standard_normal((1, 3, 8, 8)).astype(np.float32)
    assert_matches_ort(model, {"x": x}, atol=1e-5)


@pytest.mark.parametrize(
    ("filename", "folds", "bn_folds"),
    [
        ("ch_ppocr_mobile_v2.0_cls_infer.onnx", 53, 35),  # and 18 bias Adds
        ("ch_PP-OCRv4_rec_infer.onnx", 62, 6),  # and 28 Mul + Add pairs
        ("ch_PP-OCRv4_det_infer.onnx", 58, 2),  # and 28 Mul + Add pairs
    ],
)
def test_paddle_models_constant_fed_batchnorms_fold_and_match_onnxruntime(filename, folds, bn_folds):
    """PP-OCR's models (rapidocr-onnxruntime's wheel) feed their BatchNormalizations from Constant nodes."""
    import importlib.util
    from pathlib import Path

    import onnxruntime as ort

    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("rapidocr_onnxruntime is not installed")
    path = Path(spec.submodule_search_locations[0]) / "models" / filename
    graph = ir.load(str(path)).graph
    before = sum(n.op_type == "BatchNormalization" for n in graph)
    assert fold_conv_affine(graph) == folds
    assert sum(n.op_type == "BatchNormalization" for n in graph) == before - bn_folds
    sess = epctx.InferenceSession(str(path))
    assert sum(n.op_type == "BatchNormalization" for n in sess.model.graph) == before - bn_folds
    shape = [d if isinstance(d, int) and d > 0 else 1 for d in sess.get_inputs()[0].shape]
    shape[2:] = [48, 192] if "cls" in filename or "rec" in filename else [96, 128]
    x = np.random.default_rng(4).random(shape).astype(np.float32)
    feed = {sess.get_inputs()[0].name: x}
    ours = sess.run(None, feed)
    theirs = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feed)
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a, b, atol=1e-3, rtol=1e-3)
