"""Strided stems as stride-1 convolutions over the space-to-depth of their input
(``epctx.providers.iree.space_to_depth``, in IREE jobs whose convolutions are data-tiled): the rewritten graph
computes what the convolution did (kernels 1x1 to 7x7, padding on every side, bias, odd sizes, a dynamic batch,
rows past the last one read cropped), checked with onnxruntime on both graphs; convolutions it does not handle
are left as they are. IREE running it on a real net is tests/providers/test_iree_data_tiling.py's; speed
(ResNet-18's stem 9.1 -> 3.3 ms) is benchmarks/bench_iree_flags.py's."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from epctx.providers.iree.space_to_depth import strided_stems_to_depth
from tests.oracle import run_ort

CASES = {
    "7x7 pad 3 bias (ResNet)": dict(kernel=7, pads=[3, 3, 3, 3], bias=True, size=(32, 32)),
    "3x3 pad 1 on odd sizes (YOLO)": dict(kernel=3, pads=[1, 1, 1, 1], size=(15, 17)),
    "3x3 no padding": dict(kernel=3, pads=[0, 0, 0, 0], size=(16, 16)),
    "4x4 no padding, the last row cropped": dict(kernel=4, pads=[0, 0, 0, 0], size=(17, 17)),
    "asymmetric pads, one channel": dict(kernel=3, pads=[0, 1, 2, 0], size=(14, 13), channels=1),
    "1x1, four channels": dict(kernel=1, pads=[0, 0, 0, 0], size=(9, 10), channels=4),
    "dynamic batch": dict(kernel=3, pads=[1, 1, 1, 1], size=(16, 16), batch="n"),
}


def _model(kernel: int, pads: list[int], size: tuple[int, int], bias: bool = False, channels: int = 3,
           batch: int | str = 2, strides: tuple[int, int] = (2, 2), group: int = 1,
           dilations: tuple[int, int] = (1, 1), auto_pad: str | None = None) -> onnx.ModelProto:  # fmt: skip
    rng = np.random.default_rng(0)
    out = 8
    w = (0.3 * rng.standard_normal((out, channels // group, kernel, kernel))).astype(np.float32)
    inits = [numpy_helper.from_array(w, "w")]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(out).astype(np.float32), "b"))
    attrs: dict[str, object] = {"strides": list(strides), "group": group, "dilations": list(dilations)}
    attrs.update({"auto_pad": auto_pad} if auto_pad else {"pads": pads})
    nodes = [
        helper.make_node("Conv", ["x", "w", *(["b"] if bias else [])], ["c"], name="stem", **attrs),
        helper.make_node("Relu", ["c"], ["y"]),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, channels, *size])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, out, "h", "w"])
    graph = helper.make_graph(nodes, "stem", [x], [y], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("case", CASES.values(), ids=list(CASES))
def test_the_rewritten_stem_computes_what_the_convolution_did(case: dict) -> None:
    model = _model(**case)
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(model)
    assert strided_stems_to_depth(rewritten) == 1
    onnx.checker.check_model(rewritten)
    convs = [n for n in rewritten.graph.node if n.op_type == "Conv"]
    assert (
        len(convs) == 1
        and helper.get_attribute_value(convs[0].attribute[0]) == [(case["kernel"] + 1) // 2] * 2
    )
    assert not any(a.name == "strides" for a in convs[0].attribute)  # stride 1
    channels = case.get("channels", 3)
    x = np.random.default_rng(1).standard_normal((2, channels, *case["size"])).astype(np.float32)
    (expected,) = run_ort(model, {"x": x})
    (got,) = run_ort(rewritten, {"x": x})
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


NOT_STEMS = {
    "stride 1": dict(strides=(1, 1)),
    "eight channels": dict(channels=8),
    "grouped": dict(group=3),
    "dilated": dict(dilations=(2, 2)),
    "auto_pad": dict(auto_pad="SAME_UPPER"),
    "unknown height": dict(size=("h", 16)),
}


@pytest.mark.parametrize("case", NOT_STEMS.values(), ids=list(NOT_STEMS))
def test_other_convolutions_are_left_as_they_are(case: dict) -> None:
    model = _model(**{"kernel": 3, "pads": [1, 1, 1, 1], "size": (16, 16), **case})
    before = model.SerializeToString()
    assert strided_stems_to_depth(model) == 0
    assert model.SerializeToString() == before
