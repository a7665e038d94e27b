"""Pass-through steps aliased by the plan (session/plan.py): a kernel that says its output is its input k
(``passes_input``) gets no step; its output shares the input's slot. Checked on plans of hand-made steps (slot
lifetimes, graph outputs) and on sessions: Conv epilogues and PP-OCR's classifier against onnxruntime."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx_ir as ir
import pytest

import epctx
from epctx.session.plan import PlanStep, build_plan, passed_input
from tests.cpu.test_conv_epilogue import CASES, X, _model
from tests.oracle import run_ort


def _passing(k: int | None) -> Callable[..., Any]:
    def fn(*inputs: Any) -> tuple[Any, ...]:
        return (inputs[k if k is not None else 0] + 0,)  # a fresh array: only a kept step makes one

    fn.passes_input = lambda: k  # type: ignore[attr-defined]
    return fn


def _double(a: Any) -> tuple[Any, ...]:
    return (a * 2,)


def _values(*names: str) -> list[ir.Value]:
    return [ir.Value(name=n) for n in names]


def test_kernels_without_passes_input_pass_nothing() -> None:
    assert passed_input(_double) is None
    assert passed_input(_passing(1)) == 1 and passed_input(_passing(None)) is None


def test_a_pass_through_step_is_dropped_and_its_slot_outlives_the_base() -> None:
    """y's last read is the pass-through to z, z is read two steps later: the shared slot must stay."""
    x, y, z, u, w = _values("x", "y", "z", "u", "w")
    steps = [
        PlanStep(_double, (x,), (y,)),
        PlanStep(_passing(0), (y,), (z,)),
        PlanStep(_double, (x,), (u,)),
        PlanStep(lambda a, b: (a + b,), (z, u), (w,)),
    ]
    plan = build_plan([x], [w], steps)
    assert len(plan.steps) == 3
    (out,) = plan.run([np.arange(4.0)])
    np.testing.assert_array_equal(out, np.arange(4.0) * 4)


def test_a_graph_output_that_is_an_alias_is_its_base_array() -> None:
    x, y, z = _values("x", "y", "z")
    plan = build_plan([x], [z], [PlanStep(_double, (x,), (y,)), PlanStep(_passing(0), (y,), (z,))])
    assert len(plan.steps) == 1
    np.testing.assert_array_equal(plan.run([np.ones(3)])[0], np.full(3, 2.0))


def test_graph_outputs_never_share_an_array_through_an_alias() -> None:
    """Two outputs passing one value, an output passing another output or a graph input: those steps stay (as
    onnxruntime, each output its own array)."""
    x, y, z1, z2, z3, z4 = _values("x", "y", "z1", "z2", "z3", "z4")
    steps = [
        PlanStep(_double, (x,), (y,)),
        PlanStep(_passing(0), (y,), (z1,)),
        PlanStep(_passing(0), (y,), (z2,)),
        PlanStep(_passing(0), (z1,), (z3,)),
        PlanStep(_passing(0), (x,), (z4,)),
    ]
    plan = build_plan([x], [z1, z2, z3, z4], steps)
    assert len(plan.steps) == 4  # only z1 aliased
    feed = np.ones(3)
    outs = plan.run([feed])
    assert len({id(o) for o in [*outs, feed]}) == 5
    for o, expected in zip(outs, [2.0, 2.0, 2.0, 1.0]):
        np.testing.assert_array_equal(o, np.full(3, expected))


def test_a_constant_is_not_aliased() -> None:
    x, z = _values("x", "z")
    c = ir.Value(name="c", const_value=ir.tensor(np.ones(2, np.float32)))
    steps = [
        PlanStep(_passing(0), (c,), (z,)),
        PlanStep(lambda a, b: (a + b,), (z, x), (ir.Value(name="w"),)),
    ]
    plan = build_plan([x], [steps[1].outputs[0]], steps, fold_constants=False)
    assert len(plan.steps) == 2


@pytest.mark.parametrize("case", ["relu", "silu", "paddle_hard_swish", "paddle_hard_swish_swapped"])
def test_conv_epilogue_readers_leave_the_plan(case: str) -> None:
    tail, inits, opset = CASES[case]
    data = _model(tail, ["z"], inits, opset)
    sess = epctx.InferenceSession(data)
    assert len(sess._plan.steps) == 1  # the Conv; the readers pass through
    ours = sess.run(None, {"x": X})[0]
    np.testing.assert_allclose(ours, run_ort(data, {"x": X})[0], atol=1e-5, rtol=1e-5)
    assert sess.run(None, {"x": X})[0] is not ours  # each run its own output


def test_a_reader_on_another_ep_keeps_its_step() -> None:
    data = _model(CASES["relu"][0], ["z"], [])
    sess = epctx.InferenceSession(data, providers=["ExampleExecutionProvider", "CPUExecutionProvider"])
    assert len(sess._plan.steps) == 2
    np.testing.assert_allclose(sess.run(None, {"x": X})[0], run_ort(data, {"x": X})[0], atol=1e-5, rtol=1e-5)


def test_ppocr_cls_runs_fewer_steps_with_the_same_outputs(tmp_path: Path) -> None:
    from benchmarks.corpus import Unavailable, feeds, materialise

    try:
        path = materialise("ppocr_cls", tmp_path)
    except Unavailable as exc:
        pytest.skip(str(exc))
    sess = epctx.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert len(sess._plan.steps) < len(list(sess.model.graph)) - 90  # 96 pass-throughs of its HardSwishes
    feed = feeds("ppocr_cls")
    for ours, theirs in zip(sess.run(None, feed), run_ort(path.read_bytes(), feed)):
        np.testing.assert_allclose(ours, theirs, atol=1e-3, rtol=0)


def test_identity_leaves_the_plan_unless_it_copies_a_graph_input_out() -> None:
    import onnx
    from onnx import helper

    graph = helper.make_graph(
        [
            helper.make_node("Neg", ["x"], ["n"]),
            helper.make_node("Identity", ["n"], ["i"]),
            helper.make_node("Identity", ["i"], ["j"]),
            helper.make_node("Abs", ["j"], ["a"]),
            helper.make_node("Identity", ["x"], ["xi"]),
        ],
        "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info(o, onnx.TensorProto.FLOAT, None) for o in ("a", "j", "xi")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    sess = epctx.InferenceSession(model.SerializeToString())
    assert len(sess._plan.steps) == 3  # Neg, Abs and the Identity of the graph input
    x = np.array([1.0, -2.0, 3.0], np.float32)
    ours = sess.run(None, {"x": x})
    for a, b in zip(ours, run_ort(model.SerializeToString(), {"x": x}), strict=True):
        np.testing.assert_array_equal(a, b)
    assert ours[2] is not x
