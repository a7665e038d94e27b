"""Conv + Mul / Add by constants folded into the Conv (onnxruntime's ConvMulFusion / ConvAddFusion): same outputs
as onnxruntime, nothing folded where the constant is not per channel or the Conv's output has other readers."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

import epctx
from epctx.optimize import fold_conv_affine
from tests.oracle import assert_matches_ort

_RNG = np.random.default_rng(0)


def _model(
    readers: list[tuple[str, np.ndarray | None]],
    *,
    bias: bool = True,
    constant_nodes: bool = False,
    extra_reader: bool = False,
) -> object:
    """x -> Conv(W[, b]) -> reader 0 -> reader 1 ...; each reader is (op, constant) or (op, None) for a second
    graph input as its other operand."""
    inits = [numpy_helper.from_array(_RNG.standard_normal((4, 3, 3, 3)).astype(np.float32), "W")]
    conv_inputs = ["x", "W"]
    if bias:
        inits.append(numpy_helper.from_array(_RNG.standard_normal(4).astype(np.float32), "b"))
        conv_inputs.append("b")
    nodes = [helper.make_node("Conv", conv_inputs, ["c0"], pads=[1, 1, 1, 1], name="conv")]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])]
    for k, (op, const) in enumerate(readers):
        name = f"k{k}"
        if const is None:
            inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, 4, 1, 1]))
        elif constant_nodes:
            nodes.append(
                helper.make_node("Constant", [], [name], value=numpy_helper.from_array(const, name + "_t"))
            )
        else:
            inits.append(numpy_helper.from_array(const, name))
        nodes.append(helper.make_node(op, [f"c{k}", name], [f"c{k + 1}"], name=f"{op.lower()}{k}"))
    outputs = [helper.make_tensor_value_info(f"c{len(readers)}", TensorProto.FLOAT, None)]
    if extra_reader:
        nodes.append(helper.make_node("Relu", ["c0"], ["r"]))
        outputs.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, None))
    graph = helper.make_graph(nodes, "g", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _feeds(model: object) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    shapes = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in model.graph.input}  # type: ignore[attr-defined]
    return {name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}


_SCALAR = np.array([1.7], dtype=np.float32)
_PER_CHANNEL_4D = _RNG.standard_normal((1, 4, 1, 1)).astype(np.float32)
_PER_CHANNEL_3D = _RNG.standard_normal((4, 1, 1)).astype(np.float32)


@pytest.mark.parametrize("constant_nodes", [False, True], ids=["initializers", "constant_nodes"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize(
    "readers",
    [
        [("Mul", _SCALAR), ("Add", np.array([-0.3], dtype=np.float32))],  # PP-OCRv4's learnable affine block
        [("Mul", _PER_CHANNEL_4D)],
        [("Add", _PER_CHANNEL_3D)],
        [("Add", np.float32(2.5).reshape(())), ("Mul", _PER_CHANNEL_3D), ("Add", _PER_CHANNEL_4D)],
    ],
    ids=["mul_add_scalars", "mul_per_channel", "add_per_channel", "add_mul_add"],
)
def test_folded_into_the_conv_and_matches_onnxruntime(readers, bias, constant_nodes):
    model = _model(readers, bias=bias, constant_nodes=constant_nodes)
    graph = ir.serde.deserialize_model(model).graph
    assert fold_conv_affine(graph) == len(readers)
    assert [n.op_type for n in graph] == ["Conv"]
    assert sorted(graph.initializers) == ["conv_fold_B", "conv_fold_W"]  # the chain folded in one rewrite
    assert graph.outputs[0].name == f"c{len(readers)}"
    assert_matches_ort(model, _feeds(model), atol=1e-5)
    sess = epctx.InferenceSession(model.SerializeToString())  # type: ignore[attr-defined]
    assert [n.op_type for n in sess.model.graph] == ["Conv"]


@pytest.mark.parametrize(
    ("readers", "extra_reader"),
    [
        ([("Mul", _RNG.standard_normal((1, 1, 8, 8)).astype(np.float32))], False),  # varies over space
        ([("Add", _RNG.standard_normal((2, 4, 1, 1)).astype(np.float32))], False),  # widens the batch
        ([("Add", np.ones((1, 1, 4, 1, 1), dtype=np.float32))], False),  # widens the rank
        ([("Mul", None)], False),  # a graph input, not a constant
        ([("Mul", _SCALAR)], True),  # the Conv's output has another reader
    ],
    ids=["spatial", "batch", "rank", "graph_input", "shared_output"],
)
def test_not_folded_unless_per_channel_constant_on_an_unshared_output(readers, extra_reader):
    model = _model(readers, extra_reader=extra_reader)
    graph = ir.serde.deserialize_model(model).graph
    assert fold_conv_affine(graph) == 0
    assert_matches_ort(model, _feeds(model), atol=1e-5)


@pytest.mark.parametrize(
    ("filename", "least"), [("ch_PP-OCRv4_det_infer.onnx", 48), ("ch_PP-OCRv4_rec_infer.onnx", 56)]
)
def test_paddle_learnable_affine_blocks_fold(filename, least):
    """PP-OCRv4's det and rec models (rapidocr-onnxruntime's wheel): a Mul and an Add of scalars after most Convs."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("rapidocr_onnxruntime is not installed")
    graph = ir.load(str(Path(spec.submodule_search_locations[0]) / "models" / filename)).graph
    nodes = len(list(graph))
    folded = fold_conv_affine(graph)
    assert folded >= least
    assert len(list(graph)) <= nodes - folded  # each fold removes its reader (and Constant nodes left unread)


@pytest.mark.parametrize("shape", [[1, 4, 1, 1], [0, 4, 1, 1], [4, 1, 1]])
def test_a_bias_added_through_a_reshape_of_constants_folds(shape):
    """PP-OCR cls's squeeze-excitation Convs: Add(Conv, Reshape(Constant, Constant)); the Reshape and its
    Constant nodes go with the Add (a 0 in the shape copies the data's size there, as onnxruntime's does)."""
    bias = _RNG.standard_normal(4).astype(np.float32)
    if shape[0] == 0:  # the 0 copies the data's first size: 1
        bias = bias.reshape(1, 4)
    nodes = [
        helper.make_node(
            "Constant",
            [],
            ["w"],
            value=numpy_helper.from_array(_RNG.standard_normal((4, 3, 1, 1)).astype(np.float32), "w_t"),
        ),
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
        helper.make_node("Constant", [], ["data"], value=numpy_helper.from_array(bias, "data_t")),
        helper.make_node(
            "Constant",
            [],
            ["shape"],
            value=numpy_helper.from_array(np.array(shape, dtype=np.int64), "shape_t"),
        ),
        helper.make_node("Reshape", ["data", "shape"], ["b"]),
        helper.make_node("Add", ["c", "b"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 5, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    g = ir.serde.deserialize_model(model).graph
    assert fold_conv_affine(g) == 1
    assert [n.op_type for n in g] == ["Conv"]
    assert_matches_ort(model, _feeds(model), atol=1e-5)


def test_batchnorm_then_mul_then_add_fold_whole():
    rng = np.random.default_rng(7)
    arrays = {
        "W": rng.standard_normal((4, 3, 3, 3)),
        "scale": rng.standard_normal(4),
        "B": rng.standard_normal(4),
        "mean": rng.standard_normal(4),
        "var": rng.random(4) + 0.5,
        "k": np.array([0.7]),
        "a": rng.standard_normal((4, 1, 1)),
    }
    inits = [numpy_helper.from_array(v.astype(np.float32), k) for k, v in arrays.items()]
    nodes = [
        helper.make_node("Conv", ["x", "W"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("BatchNormalization", ["c", "scale", "B", "mean", "var"], ["n"], epsilon=1e-3),
        helper.make_node("Mul", ["k", "n"], ["m"]),
        helper.make_node("Add", ["m", "a"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 6, 7])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])
    g = ir.serde.deserialize_model(model).graph
    assert fold_conv_affine(g) == 3
    assert [n.op_type for n in g] == ["Conv"] and sorted(g.initializers) == ["conv_fold_B", "conv_fold_W"]
    assert g.outputs[0].name == "y"
    assert_matches_ort(model, _feeds(model), atol=1e-5)
