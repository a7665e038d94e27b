"""IREE is not offered a recurrence over a sequence (``capability.losing_recurrence``): it runs an LSTM, GRU or RNN
as a loop of per-step dispatches, slower than the CPU EP's kernel (ddddocr's recognizer: 1.73x onnxruntime on
IREE, 1.43x with its LSTM on the CPU EP). A single step is offered; ``EPCTX_IREE_RECURRENCES=1`` offers them
all. The real test runs IREE beside the CPU EP against onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

from epctx.providers.iree.capability import RECURRENCES_ENV, candidate_nodes, losing_recurrence

HIDDEN = 8


def _model(op: str, x_dims: list[int | str], layout: int = 0) -> onnx.ModelProto:
    """x -> op (hidden 8, forward) -> Y -> Relu -> y: the recurrence and a node after it."""
    gates = {"LSTM": 4, "GRU": 3, "RNN": 1}[op]
    rng = np.random.default_rng(5)
    size = x_dims[2]
    w = numpy_helper.from_array(
        (rng.standard_normal((1, gates * HIDDEN, size)) * 0.3).astype(np.float32), "w"
    )
    r = numpy_helper.from_array(
        (rng.standard_normal((1, gates * HIDDEN, HIDDEN)) * 0.3).astype(np.float32), "r"
    )
    b = numpy_helper.from_array((rng.standard_normal((1, 2 * gates * HIDDEN)) * 0.1).astype(np.float32), "b")
    attrs = {"hidden_size": HIDDEN} | ({"layout": 1} if layout else {})
    nodes = [
        helper.make_node(op, ["x", "w", "r", "b"], ["seq"], name="recurrence", **attrs),
        helper.make_node("Relu", ["seq"], ["y"], name="relu"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, x_dims)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    graph = helper.make_graph(nodes, "rnn", [x], [y], [w, r, b])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _graph(model: onnx.ModelProto) -> ir.Graph:
    return ir.serde.deserialize_model(onnx.shape_inference.infer_shapes(model)).graph


def _node(graph: ir.Graph, name: str) -> ir.Node:
    return next(node for node in graph if node.name == name)


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize(
    ("dims", "layout"), [([20, 1, 4], 0), (["steps", 1, 4], 0), ([1, 20, 4], 1), ([20, 20, 4], 1)]
)
def test_a_recurrence_over_a_sequence_is_declined_with_the_measured_reason(
    monkeypatch: pytest.MonkeyPatch, op: str, dims: list[int | str], layout: int
) -> None:
    monkeypatch.delenv(RECURRENCES_ENV, raising=False)
    graph = _graph(_model(op, dims, layout))
    found, declined = candidate_nodes(graph, frozenset())
    assert [node.name for node in found] == ["relu"]
    (why,) = declined.values()
    assert why.startswith("not offered to IREE: a recurrence over a sequence")
    assert "13.5 vs 9.0 ms" in why and "a single step is offered" in why


@pytest.mark.parametrize(("dims", "layout"), [([1, 3, 4], 0), ([3, 1, 4], 1)])
def test_a_single_step_and_other_nodes_are_offered(
    monkeypatch: pytest.MonkeyPatch, dims: list[int], layout: int
) -> None:
    monkeypatch.delenv(RECURRENCES_ENV, raising=False)
    graph = _graph(_model("LSTM", dims, layout))
    assert losing_recurrence(_node(graph, "recurrence")) is None
    assert losing_recurrence(_node(graph, "relu")) is None
    found, declined = candidate_nodes(graph, frozenset())
    assert [node.name for node in found] == ["recurrence", "relu"] and declined == {}


def test_the_environment_offers_them_all(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(RECURRENCES_ENV, "1")
    graph = _graph(_model("LSTM", [20, 1, 4]))
    found, declined = candidate_nodes(graph, frozenset())
    assert [node.name for node in found] == ["recurrence", "relu"] and declined == {}


@pytest.mark.slow  # IREE compiles the Relu
def test_on_iree_the_lstm_runs_on_the_cpu_ep_and_results_match_onnxruntime(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("iree.compiler")
    import epctx
    from tests.oracle import run_ort

    monkeypatch.delenv(RECURRENCES_ENV, raising=False)
    model = _model("LSTM", [20, 1, 4]).SerializeToString()
    so = epctx.SessionOptions()
    so.add_session_config_entry("epctx.partition.measured_rule", "0")
    so.add_session_config_entry("epctx.partition.cost_rule", "0")  # the Relu alone stays on IREE
    session = epctx.InferenceSession(model, so, providers=["IREEExecutionProvider", "CPUExecutionProvider"])
    placed = {p.name: p.provider for p in session.get_node_placement()}
    assert placed == {"recurrence": "CPUExecutionProvider", "relu": "IREEExecutionProvider"}, placed
    reasons = session.get_fallback_reasons()
    assert reasons["recurrence"]["IREEExecutionProvider"].startswith("not offered to IREE: a recurrence")
    feed = {"x": np.random.default_rng(2).standard_normal((20, 1, 4)).astype(np.float32)}
    np.testing.assert_allclose(session.run(None, feed)[0], run_ort(model, feed)[0], rtol=1e-5, atol=1e-5)
