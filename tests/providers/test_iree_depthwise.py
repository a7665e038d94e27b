"""Depthwise convolutions as shifted products (``epctx.providers.iree.depthwise``, with ``fast_codegen``): the
rewritten graph computes what the convolution did (strides, dilations, padding, bias, 3x3 and 5x5 kernels,
Paddle's Constant-node filters), its filter stored as ``(kh, kw, 1, C)``, and IREE runs it matching
onnxruntime. Speed (IREE's depthwise code 33 ms, the rewrite 0.83 ms for three 3x3 convolutions over
1x64x64x64) is benchmarks/bench_iree_flags.py's."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import epctx
from epctx.providers.iree.depthwise import TO_HWCF, constants_as_initializers, decompose_depthwise
from tests.oracle import run_ort
from tests.requires import requires

EP = "IREEExecutionProvider"
CASES = {
    "3x3 pad 1": dict(kernel=3, pads=[1, 1, 1, 1]),
    "3x3 stride 2 bias": dict(kernel=3, pads=[1, 1, 1, 1], strides=[2, 2], bias=True),
    "5x5 pad 2 stride 2 on odd sizes": dict(kernel=5, pads=[2, 2, 2, 2], strides=[2, 2], size=(15, 17)),
    "3x3 dilation 2 asymmetric pads": dict(kernel=3, pads=[2, 1, 2, 3], dilations=[2, 2]),
    "3x3 no padding": dict(kernel=3),
    "stride (2, 1)": dict(kernel=3, pads=[1, 1, 1, 1], strides=[2, 1]),
}


def _model(kernel: int, pads: list[int] | None = None, strides: list[int] | None = None,
           dilations: list[int] | None = None, bias: bool = False, size: tuple[int, int] = (16, 16),
           constant: bool = False) -> onnx.ModelProto:  # fmt: skip
    rng = np.random.default_rng(0)
    channels = 12
    w = (0.3 * rng.standard_normal((channels, 1, kernel, kernel))).astype(np.float32)
    attrs: dict[str, object] = {"group": channels}
    for name, value in (("pads", pads), ("strides", strides), ("dilations", dilations)):
        if value is not None:
            attrs[name] = value
    inputs = ["x", "w", *(["b"] if bias else [])]
    nodes = [helper.make_node("Conv", inputs, ["c"], **attrs), helper.make_node("Relu", ["c"], ["y"])]
    inits = [numpy_helper.from_array(w, "w")]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(channels).astype(np.float32), "b"))
    if constant:  # as Paddle exports weights
        nodes = [helper.make_node("Constant", [], [t.name], value=t) for t in inits] + nodes
        inits = []
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, *size])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, channels, "h", "w"])
    graph = helper.make_graph(nodes, "depthwise", [x], [y], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _feed(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    return {"x": np.random.default_rng(1).standard_normal(shape).astype(np.float32)}


@pytest.mark.parametrize("nhwc", [False, True])
@pytest.mark.parametrize("case", list(CASES))
def test_the_rewrite_computes_the_convolution(case: str, nhwc: bool) -> None:
    model = _model(**CASES[case])  # type: ignore[arg-type]
    source = numpy_helper.to_array(model.graph.initializer[0])
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(model)
    assert decompose_depthwise(rewritten.graph, nhwc=nhwc) == {"w": TO_HWCF}
    assert "Conv" not in {n.op_type for n in rewritten.graph.node}
    stored = {t.name: numpy_helper.to_array(t) for t in rewritten.graph.initializer}
    np.testing.assert_array_equal(stored["w"], source.transpose(TO_HWCF))
    onnx.checker.check_model(rewritten)
    feed = _feed(model)
    np.testing.assert_allclose(run_ort(rewritten, feed)[0], run_ort(model, feed)[0], rtol=1e-5, atol=1e-5)


def test_constant_node_filters_become_initializers_first() -> None:
    model = _model(3, pads=[1, 1, 1, 1], bias=True, constant=True)
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(model)
    constants_as_initializers(rewritten.graph)
    assert decompose_depthwise(rewritten.graph) == {"w": TO_HWCF}
    feed = _feed(model)
    np.testing.assert_allclose(run_ort(rewritten, feed)[0], run_ort(model, feed)[0], rtol=1e-5, atol=1e-5)


def test_grouped_shared_and_large_kernels_stay_convolutions() -> None:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((8, 2, 3, 3)).astype(np.float32), "w")  # 2 per group
    big = numpy_helper.from_array(rng.standard_normal((8, 1, 9, 9)).astype(np.float32), "big")  # 81 taps
    nodes = [helper.make_node("Conv", ["x", "w"], ["a"], group=4, pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["a", "big"], ["y"], group=8, pads=[4, 4, 4, 4])]  # fmt: skip
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 9, 9])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w, big])  # fmt: skip
    assert decompose_depthwise(graph) == {}
    assert [n.op_type for n in graph.node] == ["Conv", "Conv"]


@pytest.mark.slow  # compiles with IREE
@requires("iree.runtime", "iree.compiler")
@pytest.mark.parametrize("case", ["3x3 stride 2 bias", "5x5 pad 2 stride 2 on odd sizes", "paddle constants"])
def test_iree_runs_the_rewrite_matching_onnxruntime(case: str) -> None:
    if case == "paddle constants":
        model = _model(3, pads=[1, 1, 1, 1], bias=True, constant=True)
    else:
        model = _model(**CASES[case])  # type: ignore[arg-type]
    sess = epctx.InferenceSession(model.SerializeToString(), providers=[EP])
    assert [ep for ep, _ in sess.get_partitions()] == [EP], sess.get_partitions()
    feed = _feed(model)
    (got,) = sess.run(None, feed)
    assert float(np.max(np.abs(got - run_ort(model, feed)[0]))) <= 1e-3
