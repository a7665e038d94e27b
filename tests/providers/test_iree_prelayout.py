"""Conv filters stored channels-last at compile (``worker.prelayout_filters``): IREE's channels-last conversion
then reads each filter parameter as stored, so loading transposes nothing (ResNet-sized weights: no copy per
session) and each weight transposed is flagged in the binary (it cannot be mapped from the source model)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import epctx
from epctx.providers.iree.worker import TO_HWCF, prelayout_filters
from epctx.testing import no_compile
from tests.oracle import run_ort
from tests.requires import requires

EP = "IREEExecutionProvider"


def _model() -> onnx.ModelProto:
    """conv0 (ungrouped), conv1 (depthwise), conv2 and conv3 sharing one filter."""
    rng = np.random.default_rng(0)

    def weight(name: str, shape: tuple[int, ...]) -> onnx.TensorProto:
        return numpy_helper.from_array((0.1 * rng.standard_normal(shape)).astype(np.float32), name)

    inits = [weight("w0", (16, 3, 3, 3)), weight("w1", (16, 1, 3, 3)), weight("ws", (16, 16, 1, 1))]
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["a"], pads=[1, 1, 1, 1], name="conv0"),
        helper.make_node("Conv", ["a", "w1"], ["b"], group=16, pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("Conv", ["b", "ws"], ["c"], name="conv2"),
        helper.make_node("Conv", ["c", "ws"], ["y"], name="conv3"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 12, 12])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 12, 12])
    graph = helper.make_graph(nodes, "prelayout", [x], [y], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_only_ungrouped_filters_read_once_are_stored_transposed() -> None:
    model = _model()
    source = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    changed = prelayout_filters(model.graph)
    assert changed == {"w0": TO_HWCF}
    stored = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    np.testing.assert_array_equal(stored["w0"], source["w0"].transpose(TO_HWCF))
    np.testing.assert_array_equal(stored["w1"], source["w1"])  # grouped: IREE lays it out otherwise
    np.testing.assert_array_equal(stored["ws"], source["ws"])  # read by two nodes
    onnx.checker.check_model(model)
    x = np.random.default_rng(1).standard_normal((1, 3, 12, 12)).astype(np.float32)
    np.testing.assert_allclose(
        run_ort(model, {"x": x})[0], run_ort(_model(), {"x": x})[0], rtol=1e-5, atol=1e-6
    )


@pytest.mark.slow
@requires("iree.runtime", "iree.compiler")
def test_context_stores_the_filter_as_iree_reads_it_and_flags_it(tmp_path: Path) -> None:
    model = _model()
    source = tmp_path / "m.onnx"
    onnx.save(model, source)
    so = epctx.SessionOptions()
    so.add_session_config_entry("ep.context_enable", "1")
    epctx.InferenceSession(str(source), so, providers=[EP])
    data = (tmp_path / f"m_{EP}.bin").read_bytes()
    w0 = numpy_helper.to_array(model.graph.initializer[0])
    assert np.ascontiguousarray(w0.transpose(TO_HWCF)).tobytes() in data
    assert w0.tobytes() not in data  # the source layout is not stored (a second copy)
    meta = re.search(rb'"transposed":(\{[^}]*\})', data)
    # the depthwise filter too, in the layout of its rewrite as shifted products (``depthwise``)
    assert meta is not None and json.loads(meta.group(1)) == {"w0": TO_HWCF, "w1": TO_HWCF}
    w1 = numpy_helper.to_array(model.graph.initializer[1])
    assert np.ascontiguousarray(w1.transpose(TO_HWCF)).tobytes() in data
    assert w1.tobytes() not in data
    with no_compile():
        sess = epctx.InferenceSession(str(tmp_path / "m_ctx.onnx"), providers=[EP])
    x = np.random.default_rng(1).standard_normal((1, 3, 12, 12)).astype(np.float32)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], run_ort(model, {"x": x})[0], rtol=1e-4, atol=1e-5)
