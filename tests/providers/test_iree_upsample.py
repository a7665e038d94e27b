"""Nearest upsampling by whole factors as a broadcast (``epctx.providers.iree.upsample``, in every IREE job with a
``Resize``): the rewritten graph computes what the Resize did for the coordinate and rounding modes it takes
(factors 2 and 3, one axis only, a dynamic batch), checked with onnxruntime on both graphs; the modes where an
output pixel does not read ``floor(i / s)``, linear modes, fractional factors and ``sizes`` are left alone. IREE
running it on a real detector is tests/providers/test_iree_data_tiling.py's (nudenet); speed (the YOLO's two
Resize 0.53 ms of 13) is in the module's docstring."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from epctx.providers.iree.upsample import nearest_upsamples_as_broadcasts
from tests.oracle import run_ort


def _model(scales: list[float], batch: int | str = 2, size: tuple[int | str, int] = (5, 7),
           sizes: bool = False, **attrs: str) -> onnx.ModelProto:  # fmt: skip
    inits = [numpy_helper.from_array(np.array(scales, np.float32), "scales")]
    inputs = ["x", "", "scales"]
    if sizes:
        inits.append(numpy_helper.from_array(np.array([2, 3, 10, 14], np.int64), "sizes"))
        inputs = ["x", "", "", "sizes"]
    nodes = [
        helper.make_node("Resize", inputs, ["r"], name="up", **attrs),
        helper.make_node("Relu", ["r"], ["y"]),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, *size])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 3, "h", "w"])
    graph = helper.make_graph(nodes, "up", [x], [y], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


CASES = {
    "x2 asymmetric (PyTorch's nn.Upsample)": ([1, 1, 2, 2], dict(coordinate_transformation_mode="asymmetric",
                                                                 nearest_mode="floor")),
    "x2 asymmetric, ONNX's default rounding": ([1, 1, 2, 2], dict(coordinate_transformation_mode="asymmetric")),
    "x3 half_pixel (ONNX's default)": ([1, 1, 3, 3], {}),
    "x2 pytorch_half_pixel, round_prefer_ceil": ([1, 1, 2, 2], dict(coordinate_transformation_mode=
                                                                    "pytorch_half_pixel",
                                                                    nearest_mode="round_prefer_ceil")),
    "x2 along the height only": ([1, 1, 2, 1], dict(coordinate_transformation_mode="asymmetric")),
}  # fmt: skip


@pytest.mark.parametrize(("scales", "attrs"), CASES.values(), ids=list(CASES))
@pytest.mark.parametrize("batch", [2, "n"])
def test_the_rewritten_resize_computes_what_the_resize_did(
    scales: list[float], attrs: dict[str, str], batch: int | str
) -> None:
    model = _model(scales, batch, **attrs)
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(model)
    assert nearest_upsamples_as_broadcasts(rewritten) == 1
    onnx.checker.check_model(rewritten)
    assert [n.op_type for n in rewritten.graph.node] == ["Unsqueeze", "Expand", "Reshape", "Relu"]
    x = np.random.default_rng(0).standard_normal((2, 3, 5, 7)).astype(np.float32)
    (expected,) = run_ort(model, {"x": x})
    (got,) = run_ort(rewritten, {"x": x})
    assert got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)


LEFT = {
    "align_corners": dict(scales=[1, 1, 2, 2], coordinate_transformation_mode="align_corners"),
    "tf_half_pixel_for_nn": dict(scales=[1, 1, 2, 2], coordinate_transformation_mode="tf_half_pixel_for_nn"),
    "asymmetric, ceil": dict(scales=[1, 1, 2, 2], coordinate_transformation_mode="asymmetric", nearest_mode="ceil"),
    "half_pixel, floor": dict(scales=[1, 1, 2, 2], nearest_mode="floor"),
    "linear": dict(scales=[1, 1, 2, 2], mode="linear"),
    "x1.5": dict(scales=[1, 1, 1.5, 1.5]),
    "channels scaled": dict(scales=[1, 2, 2, 2]),
    "sizes": dict(scales=[], sizes=True),
    "unknown height": dict(scales=[1, 1, 2, 2], size=("h", 7)),
}  # fmt: skip


@pytest.mark.parametrize("case", LEFT.values(), ids=list(LEFT))
def test_other_resizes_are_left_alone(case: dict) -> None:
    model = _model(**case)
    before = model.SerializeToString()
    assert nearest_upsamples_as_broadcasts(model) == 0
    assert model.SerializeToString() == before
