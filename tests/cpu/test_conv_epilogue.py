"""Conv epilogues (providers/cpu/fusion.py): the activation after a Conv applied in place by the Conv kernel,
checked against onnxruntime, with the cases where it must not happen (another reader, a graph output, a reader
that another EP runs)."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import epctx
from epctx.providers.cpu import fusion
from tests.oracle import run_ort

RNG = np.random.default_rng(3)
X = RNG.standard_normal((1, 8, 9, 9)).astype(np.float32) * 3
W = RNG.standard_normal((16, 8, 3, 3)).astype(np.float32) * 0.3
B = RNG.standard_normal(16).astype(np.float32)


def _model(
    tail: list[onnx.NodeProto], outputs: list[str], inits: list[onnx.TensorProto], opset: int = 17
) -> bytes:
    conv = helper.make_node("Conv", ["x", "w", "b"], ["y"], name="conv", pads=[1, 1, 1, 1])
    graph = helper.make_graph(
        [conv, *tail],
        "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, X.shape)],
        [helper.make_tensor_value_info(o, onnx.TensorProto.FLOAT, None) for o in outputs],
        [numpy_helper.from_array(W, "w"), numpy_helper.from_array(B, "b"), *inits],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model.SerializeToString()


def _scalar(name: str, value: float) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(value, np.float32), name)


CASES: dict[str, tuple[list[onnx.NodeProto], list[onnx.TensorProto], int]] = {
    "relu": ([helper.make_node("Relu", ["y"], ["z"])], [], 17),
    "clip": (
        [helper.make_node("Clip", ["y", "lo", "hi"], ["z"])],
        [_scalar("lo", 0.0), _scalar("hi", 6.0)],
        17,
    ),
    "clip_max_only": ([helper.make_node("Clip", ["y", "", "hi"], ["z"])], [_scalar("hi", 1.0)], 17),
    "clip_opset6": ([helper.make_node("Clip", ["y"], ["z"], min=-1.0, max=2.0)], [], 10),
    "hard_sigmoid": ([helper.make_node("HardSigmoid", ["y"], ["z"], alpha=0.3, beta=0.4)], [], 17),
    "hard_swish": ([helper.make_node("HardSwish", ["y"], ["z"])], [], 17),
    "silu": ([helper.make_node("Sigmoid", ["y"], ["s"]), helper.make_node("Mul", ["y", "s"], ["z"])], [], 17),
    "silu_swapped": (
        [helper.make_node("Sigmoid", ["y"], ["s"]), helper.make_node("Mul", ["s", "y"], ["z"])],
        [],
        17,
    ),
    # HardSwish as Paddle exports it: x * Clip(x + 3, 0, 6) / 6 (or * (1/6)), operands in either order
    "paddle_hard_swish": (
        [
            helper.make_node("Add", ["y", "three"], ["t"]),
            helper.make_node("Clip", ["t", "zero", "six"], ["c"]),
            helper.make_node("Mul", ["y", "c"], ["m"]),
            helper.make_node("Div", ["m", "six"], ["z"]),
        ],
        [_scalar("three", 3.0), _scalar("zero", 0.0), _scalar("six", 6.0)],
        17,
    ),
    "paddle_hard_swish_swapped": (
        [
            helper.make_node("Add", ["three", "y"], ["t"]),
            helper.make_node("Clip", ["t", "zero", "six"], ["c"]),
            helper.make_node("Mul", ["c", "y"], ["m"]),
            helper.make_node("Mul", ["m", "sixth"], ["z"]),
        ],
        [_scalar("three", 3.0), _scalar("zero", 0.0), _scalar("six", 6.0), _scalar("sixth", 1.0 / 6.0)],
        17,
    ),
}


def _paddle_hard_swish(three: float = 3.0, *, outputs: tuple[str, ...] = ("z",)) -> bytes:
    tail, inits, opset = CASES["paddle_hard_swish"]
    return _model(tail, list(outputs), [_scalar("three", three), *inits[1:]], opset)


@pytest.mark.parametrize(
    "data",
    [_paddle_hard_swish(2.0), _paddle_hard_swish(outputs=("z", "t")), _paddle_hard_swish(outputs=("z", "m"))],
    ids=["not_three", "sum_is_an_output", "product_is_an_output"],
)
def test_paddle_hard_swish_not_fused_unless_exactly_that(data: bytes) -> None:
    ours, sess = _run(data)
    for a, b in zip(ours, run_ort(data, {"x": X})):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)
    assert _epilogues(sess) == []


def _run(data: bytes, **kwargs: Any) -> tuple[list[Any], Any]:
    sess = epctx.InferenceSession(data, **kwargs)
    return sess.run(None, {"x": X}), sess


def _epilogues(sess: Any) -> list[fusion.Epilogue]:
    return list({id(e): e for n in sess.model.graph if (e := fusion._READERS.get(n)) is not None}.values())


@pytest.mark.parametrize("case", list(CASES))
def test_conv_activation_is_fused_and_matches_onnxruntime(case: str) -> None:
    tail, inits, opset = CASES[case]
    data = _model(tail, ["z"], inits, opset)
    ours, sess = _run(data)
    np.testing.assert_allclose(ours[0], run_ort(data, {"x": X})[0], atol=1e-5, rtol=1e-5)
    (epilogue,) = _epilogues(sess)
    assert epilogue.active()


def test_not_fused_when_the_conv_output_has_another_reader_or_is_an_output() -> None:
    tail = [helper.make_node("Relu", ["y"], ["z"]), helper.make_node("Neg", ["y"], ["n"])]
    data = _model(tail, ["z", "n"], [])
    ours, sess = _run(data)
    for a, b in zip(ours, run_ort(data, {"x": X})):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)
    assert _epilogues(sess) == []
    data = _model([helper.make_node("Relu", ["y"], ["z"])], ["z", "y"], [])
    ours, sess = _run(data)
    for a, b in zip(ours, run_ort(data, {"x": X})):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)
    assert _epilogues(sess) == []


def test_not_fused_when_clip_bounds_are_runtime_inputs() -> None:
    conv = helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1])
    graph = helper.make_graph(
        [conv, helper.make_node("Clip", ["y", "lo"], ["z"])],
        "g",
        [
            helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, X.shape),
            helper.make_tensor_value_info("lo", onnx.TensorProto.FLOAT, []),
        ],
        [helper.make_tensor_value_info("z", onnx.TensorProto.FLOAT, None)],
        [numpy_helper.from_array(W, "w"), numpy_helper.from_array(B, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    sess = epctx.InferenceSession(model.SerializeToString())
    lo = np.array(0.5, np.float32)
    ours = sess.run(None, {"x": X, "lo": lo})[0]
    np.testing.assert_allclose(ours, run_ort(model, {"x": X, "lo": lo})[0], atol=1e-5, rtol=1e-5)
    assert _epilogues(sess) == []


@pytest.mark.parametrize("case", ["relu", "silu"])
def test_a_reader_on_another_ep_keeps_its_own_activation(case: str) -> None:
    """The Relu, or the Mul of SiLU, on the Example EP (its own interpreter): the Conv on the CPU EP must leave
    its output alone."""
    data = _model(CASES[case][0], ["z"], [])
    ours, sess = _run(data, providers=["ExampleExecutionProvider", "CPUExecutionProvider"])
    placed = {node: ep for ep, nodes in sess.get_partitions() for node in nodes}
    assert "ExampleExecutionProvider" in placed.values() and placed["conv"] == "CPUExecutionProvider"
    np.testing.assert_allclose(ours[0], run_ort(data, {"x": X})[0], atol=1e-5, rtol=1e-5)
    assert not any(e.active() for e in _epilogues(sess))


def test_weights_and_clip_bounds_from_constant_nodes() -> None:
    """As Paddle exports them: the Conv's weight and the Clip's bounds are Constant nodes, not initializers."""
    consts = [
        helper.make_node("Constant", [], [name], value=numpy_helper.from_array(array, name))
        for name, array in (
            ("w", W),
            ("b", B),
            ("lo", np.array(0.0, np.float32)),
            ("hi", np.array(6.0, np.float32)),
        )
    ]
    conv = helper.make_node("Conv", ["x", "w", "b"], ["y"], name="conv", pads=[1, 1, 1, 1])
    graph = helper.make_graph(
        [*consts, conv, helper.make_node("Clip", ["y", "lo", "hi"], ["z"])],
        "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, X.shape)],
        [helper.make_tensor_value_info("z", onnx.TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    ours, sess = _run(model.SerializeToString())
    np.testing.assert_allclose(ours[0], run_ort(model, {"x": X})[0], atol=1e-5, rtol=1e-5)
    (epilogue,) = _epilogues(sess)
    assert epilogue.active()


@pytest.mark.parametrize("case", ["clip", "clip_max_only", "hard_sigmoid", "hard_swish", "paddle_hard_swish"])
def test_outputs_larger_than_a_chunk(case: str) -> None:
    """Multi-pass activations run over the output in chunks of fusion._CHUNK values: 4 x 16 x 66 x 66 is 4.3
    chunks, the last one short."""
    tail, inits, opset = CASES[case]
    x = RNG.standard_normal((4, 8, 66, 66)).astype(np.float32) * 3
    conv = helper.make_node("Conv", ["x", "w", "b"], ["y"], name="conv", pads=[1, 1, 1, 1])
    graph = helper.make_graph(
        [conv, *tail],
        "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, x.shape)],
        [helper.make_tensor_value_info("z", onnx.TensorProto.FLOAT, None)],
        [numpy_helper.from_array(W, "w"), numpy_helper.from_array(B, "b"), *inits],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    sess = epctx.InferenceSession(model.SerializeToString())
    ours = sess.run(None, {"x": x})[0]
    assert ours.size > 4 * fusion._CHUNK
    np.testing.assert_allclose(ours, run_ort(model, {"x": x})[0], atol=1e-5, rtol=1e-5)
    (epilogue,) = _epilogues(sess)
    assert epilogue.active()


def test_clip_without_bounds_is_fused_as_nothing() -> None:
    data = _model([helper.make_node("Clip", ["y"], ["z"])], ["z"], [])
    ours, sess = _run(data)
    np.testing.assert_allclose(ours[0], run_ort(data, {"x": X})[0], atol=1e-5, rtol=1e-5)
    (epilogue,) = _epilogues(sess)
    assert epilogue.active()


def _weights(sess: Any) -> list[Any]:
    from epctx.providers.cpu.kernels.conv_weights import Weights

    found: list[Any] = []
    for fn, *_ in sess._plan.steps:
        cells = _cells(fn, set())
        found += [c for c in cells if isinstance(c, Weights) and not any(c is f for f in found)]
    return found


def _cells(fn: Any, seen: set[int]) -> list[Any]:
    """What the closures of ``fn`` and of the functions in them hold (the kernels are plain functions)."""
    if id(fn) in seen:
        return []
    seen.add(id(fn))
    cells = [c.cell_contents for c in (getattr(fn, "__closure__", None) or ())]
    return cells + [x for c in cells if callable(c) for x in _cells(c, seen)]


@pytest.mark.parametrize("case", ["hard_swish", "paddle_hard_swish", "paddle_hard_swish_swapped"])
def test_hard_swish_runs_on_prescaled_weights(case: str) -> None:
    """The Conv's weights and bias scaled by 1/sqrt(6) once, HardSwish in three passes."""
    tail, inits, opset = CASES[case]
    data = _model(tail, ["z"], inits, opset)
    ours, sess = _run(data)
    np.testing.assert_allclose(ours[0], run_ort(data, {"x": X})[0], atol=1e-5, rtol=1e-5)
    (weights,) = _weights(sess)
    assert weights.settled()[2] is fusion._hard_swish_scaled


def test_hard_swish_with_a_bias_computed_at_run_time_is_not_prescaled() -> None:
    conv = helper.make_node("Conv", ["x", "w", "bb"], ["y"], pads=[1, 1, 1, 1])
    graph = helper.make_graph(
        [helper.make_node("Neg", ["b"], ["bb"]), conv, helper.make_node("HardSwish", ["y"], ["z"])],
        "g",
        [
            helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, X.shape),
            helper.make_tensor_value_info("b", onnx.TensorProto.FLOAT, [16]),
        ],
        [helper.make_tensor_value_info("z", onnx.TensorProto.FLOAT, None)],
        [numpy_helper.from_array(W, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    sess = epctx.InferenceSession(model.SerializeToString())
    ours = sess.run(None, {"x": X, "b": B})[0]
    np.testing.assert_allclose(ours, run_ort(model, {"x": X, "b": B})[0], atol=1e-5, rtol=1e-5)
    (weights,) = _weights(sess)
    assert weights.settled()[2] is fusion._hard_swish
