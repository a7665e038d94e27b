"""A control-flow body reads its enclosing graph's constants (Constant node outputs, initializers that cannot be
fed) as constants: its steps over them fold when the body is built, not at each call (silero-vad's nested LSTM
branches sliced and concatenated their enclosing branch's weights at every chunk). A fed initializer stays fed."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import epctx

ort = pytest.importorskip("onnxruntime")

_W = np.arange(12, dtype=np.float32).reshape(3, 4) / 7.0
_B = np.array([0.5, -1.0, 2.0, 3.0, -0.25, 1.5], dtype=np.float32)


def _branch(name: str, scale: float) -> onnx.GraphProto:
    """A branch that slices and concatenates the outer ``w`` (a Constant node's output) and ``b`` (an
    initializer), then uses the result with the outer input ``x``: three steps over constants, one over x."""
    k = f"{name}_"
    nodes = [
        helper.make_node("Constant", [], [k + "st"], value=numpy_helper.from_array(np.array([0], np.int64))),
        helper.make_node("Constant", [], [k + "en"], value=numpy_helper.from_array(np.array([2], np.int64))),
        helper.make_node("Slice", ["w", k + "st", k + "en"], [k + "top"]),  # (2, 4)
        helper.make_node("Concat", [k + "top", "w"], [k + "ww"], axis=0),  # (5, 4)
        helper.make_node("ReduceSum", [k + "ww"], [k + "col"], keepdims=0),  # (4,)
        helper.make_node("Slice", ["b", k + "st", k + "en"], [k + "b2"]),  # (2,)
        helper.make_node("Mul", ["x", k + "col"], [k + "xm"]),
        helper.make_node("ReduceSum", [k + "b2"], [k + "bs"], keepdims=0),
        helper.make_node("Add", [k + "xm", k + "bs"], [k + "y"]),
        helper.make_node("Mul", [k + "y", k + "s"], [k + "out"]),
        helper.make_node(
            "Constant", [], [k + "s"], value=numpy_helper.from_array(np.array(scale, np.float32))
        ),
    ]
    nodes = nodes[:-2] + [nodes[-1], nodes[-2]]  # the scale's Constant before its use
    out = helper.make_tensor_value_info(k + "out", TensorProto.FLOAT, [2, 4])
    return helper.make_graph(nodes, name, [], [out])


def _model(*, b_is_input: bool) -> onnx.ModelProto:
    nodes = [
        helper.make_node("Constant", [], ["w"], value=numpy_helper.from_array(_W)),
        helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
        helper.make_node("Constant", [], ["zero"], value=numpy_helper.from_array(np.array(0.0, np.float32))),
        helper.make_node("Greater", ["total", "zero"], ["cond"]),
        helper.make_node(
            "If", ["cond"], ["y"], then_branch=_branch("then", 2.0), else_branch=_branch("else", -3.0)
        ),
    ]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])]
    if b_is_input:  # an initializer listed as a graph input: a feed may replace it
        inputs.append(helper.make_tensor_value_info("b", TensorProto.FLOAT, [6]))
    graph = helper.make_graph(
        nodes,
        "outer_constants",
        inputs,
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        initializer=[numpy_helper.from_array(_B, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    return model


def _body_steps(session: epctx.InferenceSession) -> int:
    """Steps of the If's branch plans, as laid out (the If kernel holds its branches' runners)."""
    counts = []
    for step in session._plan.steps:  # what the plan folded is the point of the test
        fn = step[0]
        for cell in getattr(fn, "__closure__", None) or ():
            runner = cell.cell_contents
            if hasattr(runner, "plan") and hasattr(runner, "num_inputs"):
                counts.append(len(runner.plan.steps))
    return sum(counts)


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_a_body_folds_its_outer_constants_and_matches_onnxruntime(sign: float) -> None:
    model = _model(b_is_input=False).SerializeToString()
    session = epctx.InferenceSession(model, providers=["CPUExecutionProvider"])
    oracle = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    for k in range(3):  # call after call
        x = (np.arange(8, dtype=np.float32).reshape(2, 4) + k) * sign
        np.testing.assert_allclose(session.run(None, {"x": x})[0], oracle.run(None, {"x": x})[0], rtol=1e-6)
    steps = _body_steps(session)
    # per branch only the three steps that read x are left: Mul, Add, Mul (the slices, concat and sums folded)
    assert steps == 6, steps


def test_a_fed_initializer_stays_fed_in_a_body() -> None:
    model = _model(b_is_input=True).SerializeToString()
    session = epctx.InferenceSession(model, providers=["CPUExecutionProvider"])
    oracle = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    x = np.ones((2, 4), np.float32)
    for b in (None, np.full(6, 10.0, np.float32)):
        feeds = {"x": x} if b is None else {"x": x, "b": b}
        np.testing.assert_allclose(session.run(None, feeds)[0], oracle.run(None, feeds)[0], rtol=1e-6)
    fed = session.run(None, {"x": x, "b": np.full(6, 10.0, np.float32)})[0]
    assert not np.allclose(fed, session.run(None, {"x": x})[0])
