"""Chains of small nodes run by their first node's kernel (providers/cpu/chains.py, issue 21): RMSNorm as
PyTorch exports it, SiLU after a MatMul, rotary embeddings' rotate-half. Each: matched (the plan drops the other
nodes' steps), the same bits as the nodes run one by one and close to onnxruntime; not matched when a value in
between escapes (a graph output, another reader), when a constant differs, or when another EP runs one node."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import epctx
from tests.oracle import run_ort

RNG = np.random.default_rng(7)
X = RNG.standard_normal((1, 5, 16), dtype=np.float32)
W = RNG.standard_normal((16, 16), dtype=np.float32)
GAMMA = RNG.standard_normal(16, dtype=np.float32)


def _c(name: str, values: Any, dtype: Any = np.float32) -> onnx.NodeProto:
    return helper.make_node(
        "Constant", [], [name], value=numpy_helper.from_array(np.asarray(values, dtype), name)
    )


def _model(nodes: list[onnx.NodeProto], outputs: list[str], opset: int = 17) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", 16])],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
        [numpy_helper.from_array(W, "w"), numpy_helper.from_array(GAMMA, "gamma")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _rms(
    *, weight: bool = True, axes: int = -1, one: float = 1.0, escape: str = "", tied: bool = False
) -> onnx.ModelProto:
    """y = MatMul(RMSNorm(x), w) as torch exports ``x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)``."""
    nodes = [
        _c("two", 2.0),
        _c("eps", 1e-5),
        _c("one", one),
        helper.make_node("Pow", ["x", "two"], ["p"]),
        helper.make_node("ReduceMean", ["p"], ["m"], axes=[axes], keepdims=1),
        helper.make_node("Add", ["m", "eps"], ["a"]),
        helper.make_node("Sqrt", ["a"], ["s"]),
        helper.make_node("Div", ["one", "s"], ["d"]),
        helper.make_node("Mul", ["x", "d"], ["n"]),
    ]
    last = "n"
    if tied:  # the weight an Identity of an initializer, as torch exports tied weights
        nodes.append(helper.make_node("Identity", ["gamma"], ["gamma_tied"]))
    if weight:
        nodes.append(helper.make_node("Mul", ["n", "gamma_tied" if tied else "gamma"], ["nw"]))
        last = "nw"
    nodes.append(helper.make_node("MatMul", [last, "w"], ["y"]))
    return _model(nodes, ["y", *([escape] if escape else [])])


def _silu(*, other: bool = False) -> onnx.ModelProto:
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["g"]),
        helper.make_node("Sigmoid", ["g"], ["sg"]),
        helper.make_node("Mul", ["x" if other else "g", "sg"], ["y"]),
    ]
    return _model(nodes, ["y"])


def _rotary(*, half: int = 8, axis: int = 2, concat_axis: int = -1, low_of: str = "x") -> onnx.ModelProto:
    """y = x * cos + rotate_half(x) * sin, rotate_half(x) = Concat(-x[..., h:], x[..., :h]); the slices'
    axis given as a positive index (as torch exports it), the Concat's as -1, x = Tanh(input) (a plan drops no
    step that passes a graph input on); ``low_of``: what the second Slice reads ("x", or "r": Relu(input))."""
    nodes = [
        _c("h", [half], np.int64),
        _c("zero", [0], np.int64),
        _c("end", [2**63 - 1], np.int64),
        _c("ax", [axis], np.int64),
        _c("step", [1], np.int64),
        _c("cos", np.cos(np.arange(16, dtype=np.float32))),
        _c("sin", np.sin(np.arange(16, dtype=np.float32))),
        helper.make_node("Tanh", ["x"], ["q"]),
        helper.make_node("Slice", ["q", "h", "end", "ax", "step"], ["hi"]),
        helper.make_node("Neg", ["hi"], ["neg"]),
        *([helper.make_node("Relu", ["x"], ["r"])] if low_of == "r" else []),
        helper.make_node("Slice", ["q" if low_of == "x" else low_of, "zero", "h", "ax", "step"], ["lo"]),
        helper.make_node("Concat", ["neg", "lo"], ["rot"], axis=concat_axis),
        helper.make_node("Mul", ["q", "cos"], ["xc"]),
        helper.make_node("Mul", ["rot", "sin"], ["rs"]),
        helper.make_node("Add", ["xc", "rs"], ["y"]),
    ]
    return _model(nodes, ["y"])


def _ops(sess: epctx.InferenceSession) -> list[str]:
    return [info[1] for info in sess._plan.info]


def _session(model: onnx.ModelProto, **kwargs: Any) -> epctx.InferenceSession:
    return epctx.InferenceSession(model.SerializeToString(), **kwargs)


def _unfused(model: onnx.ModelProto, value: str) -> onnx.ModelProto:
    """The same model with ``value`` (a value in between) also a graph output: nothing fused."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    copy.graph.output.append(helper.make_tensor_value_info(value, TensorProto.FLOAT, None))
    return copy


def _same_bits_and_close_to_ort(
    model: onnx.ModelProto, escape: str, x: np.ndarray = X
) -> epctx.InferenceSession:
    sess = _session(model)
    (ours,) = sess.run(None, {"x": x})
    plain = _session(_unfused(model, escape)).run(None, {"x": x})[0]
    np.testing.assert_array_equal(ours, plain)
    np.testing.assert_allclose(ours, run_ort(model, {"x": x})[0], rtol=1e-5, atol=1e-5)
    return sess


def test_rms_norm_with_its_weight_is_one_step() -> None:
    sess = _same_bits_and_close_to_ort(_rms(), "d")
    assert _ops(sess) == ["Pow", "MatMul"]
    assert _ops(_session(_unfused(_rms(), "d"))) == [
        "Pow",
        "ReduceMean",
        "Add",
        "Sqrt",
        "Div",
        "Mul",
        "Mul",
        "MatMul",
    ]


def test_rms_norm_over_one_row_is_close_to_the_nodes_and_onnxruntime() -> None:
    """One row (a decode step's): numpy scalars after a BLAS dot, the sum in another order than add.reduce."""
    model = _rms()
    x = X[:, :1]
    (ours,) = _session(model).run(None, {"x": x})
    plain = _session(_unfused(model, "d")).run(None, {"x": x})[0]
    np.testing.assert_allclose(ours, plain, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(ours, run_ort(model, {"x": x})[0], rtol=1e-5, atol=1e-5)
    assert ours.dtype == np.float32 and ours.shape == (1, 1, 16)


def test_rms_norm_with_a_weight_through_an_identity_takes_it() -> None:
    sess = _same_bits_and_close_to_ort(_rms(tied=True), "d")
    assert _ops(sess) == ["Pow", "MatMul"]


def test_rms_norm_without_a_weight_ends_at_the_mul_by_x() -> None:
    sess = _same_bits_and_close_to_ort(_rms(weight=False), "s")
    assert _ops(sess) == ["Pow", "MatMul"]


def test_rms_norm_not_matched_on_another_axis_or_another_constant() -> None:
    for model in (_rms(axes=1), _rms(one=2.0)):
        sess = _session(model)
        assert "ReduceMean" in _ops(sess)
        np.testing.assert_allclose(
            sess.run(None, {"x": X})[0], run_ort(model, {"x": X})[0], rtol=1e-5, atol=1e-5
        )


@pytest.mark.parametrize("escape", ["p", "m", "a", "s", "d"])
def test_rms_norm_not_matched_when_a_value_in_between_escapes(escape: str) -> None:
    model = _rms(escape=escape)
    sess = _session(model)
    assert "ReduceMean" in _ops(sess)
    for ours, theirs in zip(sess.run(None, {"x": X}), run_ort(model, {"x": X})):
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)


def test_rms_norm_whose_result_before_the_weight_is_a_graph_output_ends_there() -> None:
    model = _rms(escape="n")
    sess = _session(model)
    assert _ops(sess) == ["Pow", "Mul", "MatMul"]
    for ours, theirs in zip(sess.run(None, {"x": X}), run_ort(model, {"x": X})):
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)


def test_rms_norm_with_its_div_on_another_ep_runs_node_by_node() -> None:
    model = _rms()
    providers = [("ExampleExecutionProvider", {"ops": "Div"}), "CPUExecutionProvider"]
    sess = _session(model, providers=providers)
    assert "ExampleExecutionProvider" in {ep for ep, _ in sess.get_partitions()}
    assert "ReduceMean" in _ops(sess)
    np.testing.assert_allclose(sess.run(None, {"x": X})[0], run_ort(model, {"x": X})[0], rtol=1e-5, atol=1e-5)


def test_silu_after_a_matmul_is_one_step() -> None:
    sess = _same_bits_and_close_to_ort(_silu(), "sg")
    assert _ops(sess) == ["MatMul", "Sigmoid"]


def test_a_mul_by_something_else_is_no_silu() -> None:
    model = _silu(other=True)
    sess = _session(model)
    assert _ops(sess) == ["MatMul", "Sigmoid", "Mul"]
    np.testing.assert_allclose(sess.run(None, {"x": X})[0], run_ort(model, {"x": X})[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("half", [8, 5])
def test_rotate_half_is_one_step(half: int) -> None:
    """Slices of the last axis given as 2 and a Concat on -1; a split that is not the middle too (the chain is
    what the nodes compute, whatever the split)."""
    sess = _same_bits_and_close_to_ort(_rotary(half=half), "neg")
    assert _ops(sess) == ["Tanh", "Slice", "Mul", "Mul", "Add"]
    x = RNG.standard_normal((2, 3, 16), dtype=np.float32)  # other batch and sequence sizes
    _same_bits_and_close_to_ort(_rotary(half=half), "neg", x)


def test_rotate_half_along_another_axis() -> None:
    model = _rotary(half=3, axis=1, concat_axis=1)
    x = RNG.standard_normal((2, 7, 16), dtype=np.float32)
    sess = _same_bits_and_close_to_ort(model, "neg", x)
    assert _ops(sess) == ["Tanh", "Slice", "Mul", "Mul", "Add"]


def test_rotate_half_not_matched_when_its_slices_read_different_values() -> None:
    model = _rotary(low_of="r")
    sess = _session(model)
    assert _ops(sess) == ["Tanh", "Slice", "Neg", "Relu", "Slice", "Concat", "Mul", "Mul", "Add"]
    np.testing.assert_allclose(sess.run(None, {"x": X})[0], run_ort(model, {"x": X})[0], rtol=1e-5, atol=1e-5)
