"""Strided 1x1 convolutions as 2-D matmuls over channels-last data (``epctx.providers.iree.pointwise``, in IREE jobs
whose convolutions are data-tiled): the rewritten graph computes what the convolution did (bias or none, even and
odd sizes), checked with onnxruntime on both graphs, its filter stored as (C, F, 1, 1) and reported so; the
convolutions it does not handle are left as they are. The rule (which jobs rewrite) and IREE running it on ResNet-18
are tests/providers/test_iree_data_tiling.py's; speed is in the module's docstring."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from epctx.providers.iree.pointwise import TO_CF, strided_pointwise_as_matmuls
from tests.oracle import run_ort


def _model(size: tuple[int, int], bias: bool = True, batch: int | str = 1, kernel: int = 1,
           shared: bool = False, **attributes: object) -> onnx.ModelProto:  # fmt: skip
    """x -> Relu -> Conv (16 -> 24 channels, stride 2 unless given) -> Relu; ``shared``: a second Conv reads w."""
    rng = np.random.default_rng(0)
    w = (0.3 * rng.standard_normal((24, 16, kernel, kernel))).astype(np.float32)
    inits = [numpy_helper.from_array(w, "w")]
    inputs = ["r", "w"]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(24).astype(np.float32), "b"))
        inputs.append("b")
    attributes = {"strides": [2, 2], **attributes}
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("Conv", inputs, ["c"], name="down", **attributes),
        helper.make_node("Relu", ["c"], ["y"]),
    ]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", "c", "h", "w"])]
    if shared:
        nodes.append(helper.make_node("Conv", ["r", "w"], ["z"], name="again", **attributes))
        outputs.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, ["n", "c", "h", "w"]))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 16, *size])
    graph = helper.make_graph(nodes, "down", [x], outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("size", [(8, 8), (7, 9), (1, 1)])
@pytest.mark.parametrize("bias", [True, False])
def test_the_rewritten_convolution_computes_what_it_did(size: tuple[int, int], bias: bool) -> None:
    model = _model(size, bias)
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(model)
    source = numpy_helper.to_array(model.graph.initializer[0])
    assert strided_pointwise_as_matmuls(rewritten) == {"w": TO_CF}
    onnx.checker.check_model(rewritten, full_check=True)
    ops = [n.op_type for n in rewritten.graph.node]
    assert "Conv" not in ops and ops.count("MatMul") == 1 and ops.count("Transpose") == 2
    stored = numpy_helper.to_array(next(t for t in rewritten.graph.initializer if t.name == "w"))
    np.testing.assert_array_equal(stored, source.transpose(TO_CF))  # the layout the EP records for the weight
    x = np.random.default_rng(1).standard_normal((1, 16, *size)).astype(np.float32)
    (expected,) = run_ort(model, {"x": x})
    (got,) = run_ort(rewritten, {"x": x})
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "model",
    [
        _model((8, 8), strides=[1, 1]),
        _model((8, 8), kernel=3, pads=[1, 1, 1, 1]),
        _model((8, 8), pads=[1, 1, 1, 1]),
        _model((8, 8), strides=[2, 1]),
        _model((8, 8), dilations=[2, 2]),
        _model((8, 8), batch="n"),
        _model((8, 8), batch=2),
        _model((8, 8), shared=True),
    ],
    ids=[
        "stride 1",
        "3x3",
        "padded",
        "uneven strides",
        "dilated",
        "dynamic batch",
        "batch 2",
        "shared filter",
    ],
)
def test_convolutions_it_does_not_handle_are_left_alone(model: onnx.ModelProto) -> None:
    before = model.SerializeToString()
    assert strided_pointwise_as_matmuls(model) == {}
    assert model.SerializeToString() == before
