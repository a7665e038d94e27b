"""A Pow whose exponent enters an IREE partition at run time is not given to IREE (issue 21): IREE computes a power
whose exponent it does not know when compiling as exp(y * log(x)), NaN for every negative base, where ONNX's Pow
squares it (the tiny LLM's RMS norm, x ** 2, cut into pieces: NaN logits). With the exponent inside the partition
(a Constant node, an initializer) IREE folds it and takes the Pow."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import epctx
from tests.oracle import run_ort
from tests.requires import requires

pytestmark = [pytest.mark.slow, requires("iree.runtime", "iree.compiler")]

EP = "IREEExecutionProvider"


def _model() -> bytes:
    """x -> Add(x, b) -> Pow(., two from a Constant node) -> Mul(., c) -> y, and a few element-wise nodes more
    (IREE leaves partitions of fewer than 8 nodes to the next EP)."""
    two = helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])
    b = numpy_helper.from_array(np.full((1, 64), -0.5, np.float32), "b")
    c = numpy_helper.from_array(np.full((1, 64), 1.5, np.float32), "c")
    nodes = [
        helper.make_node("Constant", [], ["e"], value=two, name="exponent"),
        helper.make_node("Add", ["x", "b"], ["a"], name="add"),
        helper.make_node("Pow", ["a", "e"], ["p"], name="pow"),
    ]
    last = "p"
    for k in range(8):
        op = "Mul" if k % 2 == 0 else "Add"
        nodes.append(helper.make_node(op, [last, "c"], [f"t{k}"], name=f"tail{k}"))
        last = f"t{k}"
    nodes.append(helper.make_node("Identity", [last], ["y"], name="out"))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])
    graph = helper.make_graph(nodes, "pow_exponent", [x], [y], [b, c])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


@pytest.mark.parametrize("exponent_on_cpu", [True, False])
def test_a_pow_whose_exponent_comes_from_outside_is_left_to_the_next_ep(exponent_on_cpu: bool) -> None:
    data = _model()
    options = {"disabled_ops": "Constant"} if exponent_on_cpu else {}
    sess = epctx.InferenceSession(data, providers=[(EP, options)])
    placement = {node: ep for ep, nodes in sess.get_partitions() for node in nodes}
    x = np.linspace(-2.0, 2.0, 64, dtype=np.float32).reshape(1, 64)  # negative bases once b is added
    (got,) = sess.run(None, {"x": x})
    (expected,) = run_ort(data, {"x": x})
    assert not np.isnan(got).any()
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    if exponent_on_cpu:
        assert placement["pow"] == "CPUExecutionProvider"
        reasons = sess.get_fallback_reasons()
        assert "exponent of Pow 'pow'" in str(reasons)
    else:
        assert placement["pow"] == EP
