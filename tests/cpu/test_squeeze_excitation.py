"""Squeeze-excitation blocks as one kernel (providers/cpu/squeeze.py): GlobalAveragePool -> 1x1 Conv -> act ->
1x1 Conv -> act -> Mul(x, scale) computed by the pool's kernel, the other nodes passing the scale on and leaving
the plan; outputs as onnxruntime's, and nothing fused where the pattern does not hold exactly."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import epctx
from epctx.providers.cpu import squeeze
from tests.oracle import run_ort

RNG = np.random.default_rng(5)
C, R = 24, 8


def _init(name: str, *shape: int) -> onnx.TensorProto:
    return numpy_helper.from_array((RNG.standard_normal(shape) * 0.3).astype(np.float32), name)


def _block(act1: str = "Relu", act2: str = "HardSigmoid", identities: bool = False) -> list[onnx.NodeProto]:
    ident = [helper.make_node("Identity", ["c1"], ["c1i"])] if identities else []
    return [
        helper.make_node("GlobalAveragePool", ["x"], ["g"], name="gap"),
        helper.make_node("Conv", ["g", "w1", "b1"], ["c1"], name="fc1"),
        *ident,
        helper.make_node(act1, ["c1i" if identities else "c1"], ["a1"]),
        helper.make_node("Conv", ["a1", "w2", "b2"], ["c2"], name="fc2"),
        helper.make_node(
            act2, ["c2"], ["s"], **({"alpha": 1 / 6, "beta": 0.5} if act2 == "HardSigmoid" else {})
        ),
        helper.make_node("Mul", ["x", "s"], ["y"]),
    ]


def _model(
    nodes: list[onnx.NodeProto], outputs: list[str], n: int = 1, inputs: tuple[str, ...] = ()
) -> bytes:
    inits = [_init("w1", R, C, 1, 1), _init("b1", R), _init("w2", C, R, 1, 1), _init("b2", C)]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, C, 7, 9])]
        + [
            helper.make_tensor_value_info(i.name, TensorProto.FLOAT, list(i.dims))
            for i in inits
            if i.name in inputs
        ],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
        [i for i in inits if i.name not in inputs],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def _run(
    model: bytes, n: int = 1, extra: dict[str, np.ndarray] | None = None
) -> tuple[Any, list[squeeze.Block]]:
    sess = epctx.InferenceSession(model, providers=["CPUExecutionProvider"])
    feed = {"x": RNG.standard_normal((n, C, 7, 9)).astype(np.float32), **(extra or {})}
    for _ in range(2):
        ours = sess.run(None, feed)
    for a, b in zip(ours, run_ort(model, feed), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)
    blocks = list(
        {id(b): b for n_ in sess.model.graph if (b := squeeze._MEMBERS.get(n_)) is not None}.values()
    )
    return sess, blocks


@pytest.mark.parametrize(
    ("act1", "act2", "identities"),
    [("Relu", "HardSigmoid", False), ("Relu", "HardSigmoid", True), ("HardSwish", "HardSigmoid", False)],
)
@pytest.mark.parametrize("n", [1, 2])
def test_block_runs_as_one_kernel_and_matches_onnxruntime(
    act1: str, act2: str, identities: bool, n: int
) -> None:
    model = _model(_block(act1, act2, identities), ["y"], n)
    sess, blocks = _run(model, n)
    assert len(blocks) == 1 and blocks[0].active()
    assert len(sess._plan.steps) == 2  # the pool (the whole block) and the Mul


def test_not_fused_when_a_value_of_the_block_is_read_elsewhere_or_a_graph_output() -> None:
    for outputs in (["y", "a1"], ["y", "g"]):
        sess, blocks = _run(_model(_block(), outputs), 1)
        assert not blocks and len(sess._plan.steps) > 2
    extra = [helper.make_node("Neg", ["c2"], ["other"])]  # a second reader of the second conv
    sess, blocks = _run(_model(_block() + extra, ["y", "other"]), 1)
    assert not blocks


def test_not_fused_with_weights_fed_at_run_time_or_a_mul_of_something_else() -> None:
    w1 = (RNG.standard_normal((R, C, 1, 1)) * 0.3).astype(np.float32)
    _, blocks = _run(_model(_block(), ["y"], inputs=("w1",)), 1, {"w1": w1})
    assert not blocks
    b2 = RNG.standard_normal(C).astype(np.float32)
    _, blocks = _run(_model(_block(), ["y"], inputs=("b2",)), 1, {"b2": b2})
    assert not blocks
    nodes = _block()[:-1] + [helper.make_node("Mul", ["s", "s"], ["y"])]
    _, blocks = _run(_model(nodes, ["y"]), 1)
    assert not blocks
