"""Rank-0 values (scalars) into, out of and between the partitions of a compiling EP (IREE, OpenVINO), against
onnxruntime: a scalar graph input, a scalar made by one partition, consumed by a node the EP is not given
(``disabled_ops``: the CPU EP) and then by a second partition, and scalar graph outputs of both. Fresh compile and
a context model loaded back."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import epctx
from epctx.testing import no_compile
from tests.oracle import run_ort

OPTIONS = {"disabled_ops": "Neg"}  # Neg runs on the CPU EP, between two partitions of the EP
_MODULES = {
    "IREEExecutionProvider": ("iree.runtime", "iree.compiler"),
    "OpenVINOExecutionProvider": ("openvino",),
}


def _scalar_model() -> onnx.ModelProto:
    f = TensorProto.FLOAT
    nodes = [
        helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),  # every axis: a rank-0 result
        helper.make_node("Add", ["s", "k"], ["t"]),  # k: a rank-0 graph input
        helper.make_node("Neg", ["t"], ["u"]),  # the CPU EP: u crosses two partition boundaries
        helper.make_node("Mul", ["x", "u"], ["y"]),
        helper.make_node("Mul", ["u", "u"], ["z"]),
    ]
    graph = helper.make_graph(
        nodes,
        "scalars",
        [helper.make_tensor_value_info("x", f, [2, 4]), helper.make_tensor_value_info("k", f, [])],
        [
            helper.make_tensor_value_info("y", f, [2, 4]),
            helper.make_tensor_value_info("z", f, []),
            helper.make_tensor_value_info("t", f, []),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _check(sess: epctx.InferenceSession, model: onnx.ModelProto) -> None:
    rng = np.random.default_rng(3)
    for _ in range(3):
        feeds = {
            "x": rng.standard_normal((2, 4)).astype(np.float32),
            "k": np.array(rng.standard_normal(), np.float32),
        }
        got = sess.run(None, feeds)
        expected = run_ort(model, feeds)
        assert [g.shape for g in got] == [e.shape for e in expected] == [(2, 4), (), ()]
        for g, e in zip(got, expected):
            np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("ep", sorted(_MODULES))
@pytest.mark.slow  # compiles with IREE and OpenVINO
def test_scalars_cross_partition_boundaries(ep: str, tmp_path: Path) -> None:
    for module in _MODULES[ep]:
        pytest.importorskip(module)
    model = _scalar_model()
    source = tmp_path / "scalars.onnx"
    onnx.save(model, source)
    so = epctx.SessionOptions()
    so.add_session_config_entry("ep.context_enable", "1")
    so.add_session_config_entry("epctx.partition.cost_rule", "0")  # small partitions, kept for this test
    sess = epctx.InferenceSession(str(source), so, providers=[(ep, OPTIONS)])
    assert [e for e, _ in sess.get_partitions()] == [ep, "CPUExecutionProvider", ep], sess.get_partitions()
    _check(sess, model)
    with no_compile():
        loaded = epctx.InferenceSession(str(tmp_path / "scalars_ctx.onnx"), providers=[(ep, OPTIONS)])
    _check(loaded, model)
