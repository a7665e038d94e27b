"""Values IREE cannot take at a partition boundary, with real IREE (issue 21): a Reshape whose shape is known only
at run (IREE 3.x reads its -1 and 0 as sizes: an allocation error or a wrong result at run) is left to the next
EP, with the reason, and the model matches onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import epctx
from tests.oracle import run_ort
from tests.requires import requires

pytestmark = [pytest.mark.slow, requires("iree.runtime", "iree.compiler")]

EP = "IREEExecutionProvider"


def test_a_reshape_to_a_runtime_shape_is_left_to_the_next_ep() -> None:
    value = helper.make_tensor_value_info
    nodes = [
        helper.make_node("Reshape", ["x", "s"], ["y"], name="reshape"),
        helper.make_node("Relu", ["y"], ["z"], name="relu"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [value("x", TensorProto.FLOAT, [2, 6]), value("s", TensorProto.INT64, [2])],
        [value("z", TensorProto.FLOAT, None)],
    )
    data = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    options = epctx.SessionOptions()
    options.add_session_config_entry("epctx.partition.cost_rule", "0")
    sess = epctx.InferenceSession(data, options, providers=[EP])
    assert sess.get_partitions() == [("CPUExecutionProvider", ["reshape"]), (EP, ["relu"])]
    why = sess.get_fallback_reasons()["reshape"][EP]
    assert "value 's', the shape operand of Reshape 'reshape', would enter the partition at run time" in why
    x = np.arange(-6, 6, dtype=np.float32).reshape(2, 6)
    for shape in ([3, -1], [0, -1], [4, 3]):
        feeds = {"x": x, "s": np.array(shape, np.int64)}
        (got,), (expected,) = sess.run(None, feeds), run_ort(data, feeds)
        assert got.shape == expected.shape
        np.testing.assert_array_equal(got, expected)
