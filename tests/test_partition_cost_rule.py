"""The partition stage's cost rule: a compiling EP's small partition with no heavy op, between other EPs' nodes,
is left to the next EP, with the reason ('cost rule: ...') in ``get_fallback_reasons``; the whole graph and
partitions with a heavy op are kept; ``epctx.partition.cost_rule=0`` turns it off; with no later EP to take the
nodes the rule steps aside."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import epctx
from tests.fusing_ep import make_fusing_ep, registered
from tests.oracle import run_ort


def _model() -> bytes:
    """x -> MatMul -> Relu -> Softmax (not claimed) -> Relu -> Neg -> y."""
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32), "w")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["a"], name="matmul"),
        helper.make_node("Relu", ["a"], ["b"], name="relu0"),
        helper.make_node("Softmax", ["b"], ["c"], name="softmax"),
        helper.make_node("Relu", ["c"], ["d"], name="relu1"),
        helper.make_node("Neg", ["d"], ["y"], name="neg"),
    ]
    graph = helper.make_graph(
        nodes,
        "cost",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        [w],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


@pytest.fixture
def fusing() -> type:
    cls = make_fusing_ep(lambda node: node.op_type != "Softmax", "CostRuleTestExecutionProvider")
    cls.min_partition_nodes = 4
    return cls


def _session(fusing: type, **config: str) -> epctx.InferenceSession:
    so = epctx.SessionOptions()
    for key, value in config.items():
        so.add_session_config_entry(key, value)
    with registered(fusing):
        return epctx.InferenceSession(_model(), so, providers=[fusing.name, "CPUExecutionProvider"])


def _check_result(sess: epctx.InferenceSession) -> None:
    x = np.random.default_rng(1).standard_normal((2, 4)).astype(np.float32)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], run_ort(_model(), {"x": x})[0], rtol=1e-6)


def test_a_small_light_partition_goes_to_the_next_ep(fusing: type) -> None:
    sess = _session(fusing)
    parts = sess.get_partitions()
    assert parts[0] == (fusing.name, ["matmul", "relu0"])  # a heavy op: kept however small
    assert [ep for ep, _ in parts[1:]] == ["CPUExecutionProvider"] * 3
    reasons = sess.get_fallback_reasons()
    assert set(reasons) == {"relu1", "neg"}
    assert reasons["neg"][fusing.name].startswith("cost rule: a partition of 2 node(s)")
    _check_result(sess)


def test_the_rule_can_be_turned_off(fusing: type) -> None:
    sess = _session(fusing, **{"epctx.partition.cost_rule": "0"})
    assert [ep for ep, _ in sess.get_partitions()] == [fusing.name, "CPUExecutionProvider", fusing.name]
    assert sess.get_fallback_reasons() == {}
    _check_result(sess)


def test_the_whole_graph_is_never_refused(fusing: type) -> None:
    whole = make_fusing_ep(lambda node: True, "CostRuleWholeExecutionProvider")
    whole.min_partition_nodes = 100
    with registered(whole):
        sess = epctx.InferenceSession(_model(), providers=[whole.name, "CPUExecutionProvider"])
    assert sess.get_partitions() == [(whole.name, ["matmul", "relu0", "softmax", "relu1", "neg"])]


def test_a_later_ep_takes_what_the_rule_refused() -> None:
    light = make_fusing_ep(lambda node: node.op_type in ("Relu", "Neg"), "CostRuleLightExecutionProvider")
    light.min_partition_nodes = 4
    whole = make_fusing_ep(lambda node: True, "CostRuleAllExecutionProvider")
    with registered(light, whole):
        sess = epctx.InferenceSession(_model(), providers=[light.name, whole.name])
    assert sess.get_partitions() == [(whole.name, ["matmul", "relu0", "softmax", "relu1", "neg"])]
    assert set(sess.get_fallback_reasons()) == {"relu0", "relu1", "neg"}
    _check_result(sess)


def test_without_a_later_ep_for_the_nodes_the_rule_steps_aside(fusing: type) -> None:
    softmax = make_fusing_ep(lambda node: node.op_type == "Softmax", "CostRuleSoftmaxExecutionProvider")
    so = epctx.SessionOptions()
    so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    with registered(fusing, softmax):
        sess = epctx.InferenceSession(_model(), so, providers=[fusing.name, softmax.name])
    assert [ep for ep, _ in sess.get_partitions()] == [fusing.name, softmax.name, fusing.name]
    assert sess.get_fallback_reasons() == {}
    _check_result(sess)
