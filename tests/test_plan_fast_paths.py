"""run()'s fast paths in the plan (issue 21: session.run's fixed cost): a plan of one step calls it straight away
(no slot list, no loop), and numpy's error state is set to "ignore" once, by the outermost plan run (a
control-flow body's plan runs under its node's step). Each is checked against the general path: same results,
same errors naming the node, RuntimeWarnings still suppressed inside bodies, the caller's numpy state restored."""

from __future__ import annotations

import threading
import warnings
from typing import Any

import numpy as np
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper

import epctx
from epctx.errors import Fail
from epctx.session import plan_calls
from epctx.session.plan import ExecutionPlan, PlanStep, build_plan


def _values(*names: str) -> list[ir.Value]:
    return [ir.Value(name=n) for n in names]


def _general(plan: ExecutionPlan) -> ExecutionPlan:
    """The same plan without its direct call: the slot list and the loop."""
    twin = ExecutionPlan(
        plan.template, plan.input_slots, plan.output_slots, plan.steps, plan.labels, plan.info
    )
    twin._direct = None
    return twin


def test_a_one_step_plan_calls_its_step_directly_with_inputs_and_outputs_reordered() -> None:
    a, b, c, y1, y2 = _values("a", "b", "c", "y1", "y2")
    seen: list[tuple[Any, ...]] = []

    def step(*args: Any) -> tuple[Any, ...]:
        seen.append(args)
        return (args[0] - args[1], args[0] + args[2])

    # reads c, a, b; the graph outputs are the step's results the other way round
    plan = build_plan([a, b, c], [y2, y1], [PlanStep(step, (c, a, b), (y1, y2))], fold_constants=False)
    assert plan._direct is not None
    feed = [np.float32(1), np.float32(10), np.float32(100)]
    got = plan.run(feed)
    want = _general(plan).run(feed)
    assert seen[0] == seen[1] == (100, 1, 10)
    assert got == want == [110, 99]


def test_a_one_step_plan_reads_constants_and_omitted_inputs_from_its_template() -> None:
    x, w, y = _values("x", "w", "y")
    w.const_value = ir.tensor(np.array([2.0, 3.0], np.float32))

    def step(xs: Any, omitted: Any, weight: Any, xs_again: Any) -> tuple[Any, ...]:
        assert omitted is None
        return (xs * weight + xs_again,)

    plan = build_plan([x], [y], [PlanStep(step, (x, None, w, x), (y,))], fold_constants=False)
    assert plan._direct is not None
    x_in = np.array([1.0, 1.0], np.float32)
    np.testing.assert_array_equal(plan.run([x_in])[0], [3.0, 4.0])
    np.testing.assert_array_equal(_general(plan).run([x_in])[0], [3.0, 4.0])


def test_plans_that_need_their_slots_take_the_loop() -> None:
    x, y, z = _values("x", "y", "z")
    double = PlanStep(lambda v: (v * 2,), (x,), (y,))
    two = build_plan([x], [z], [double, PlanStep(lambda v: (v + 1,), (y,), (z,))])
    passed = build_plan([x], [y, x], [double])  # an output that is the graph input
    none = build_plan([x], [x], [])
    assert two._direct is None and passed._direct is None and none._direct is None
    assert two.run([np.int64(3)]) == [7]
    assert passed.run([np.int64(3)]) == [6, 3]
    assert none.run([np.int64(3)]) == [3]


def _failing(*args: Any) -> tuple[Any, ...]:
    raise ValueError("bad shapes")


def test_a_one_step_plan_that_fails_names_its_step_as_the_loop_does() -> None:
    x, y = _values("x", "y")
    plan = build_plan([x], [y], [PlanStep(_failing, (x,), (y,), label="part0")])
    assert plan._direct is not None
    messages = []
    for p in (plan, _general(plan)):
        with pytest.raises(Fail) as info:
            p.run([np.zeros(2)])
        messages.append(str(info.value))
    assert messages[0] == messages[1]
    assert messages[0].endswith(
        "Non-zero status code returned while running compiled partition 'part0' Status Message: "
        "ValueError: bad shapes"
    )


def _one_node(node: Any, inputs: list[Any], outputs: list[Any]) -> bytes:
    graph = helper.make_graph([node], "g", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def test_a_one_node_session_that_fails_at_run_names_the_node_as_onnxruntime() -> None:
    model = _one_node(
        helper.make_node("Reshape", ["x", "shape"], ["y"], name="reshape_me"),
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
            helper.make_tensor_value_info("shape", TensorProto.INT64, [2]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    sess = epctx.InferenceSession(model, providers=["CPUExecutionProvider"])
    assert sess._plan._direct is not None
    feed = {"x": np.zeros((2, 3), np.float32), "shape": np.array([4, 4], np.int64)}
    with pytest.raises(Fail, match=r"^.*Non-zero status code returned while running Reshape node\. "
                       r"Name:'reshape_me' Status Message: "):  # fmt: skip
        sess.run(None, feed)
    ort = pytest.importorskip("onnxruntime")
    with pytest.raises(Exception, match=r"Non-zero status code returned while running Reshape node\. "
                       r"Name:'reshape_me'"):  # fmt: skip
        ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feed)


def _if_log_model() -> bytes:
    """y = If(c, then: Log(x) / x, else: x / 0): inf / nan from a body's kernels."""
    x_info = helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])
    zero = helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0])
    then_graph = helper.make_graph(
        [helper.make_node("Log", ["x"], ["l"]), helper.make_node("Div", ["l", "x"], ["t"])],
        "then",
        [],
        [helper.make_tensor_value_info("t", TensorProto.FLOAT, [3])],
    )
    else_graph = helper.make_graph(
        [helper.make_node("Div", ["x", "zero"], ["e"])],
        "else",
        [],
        [helper.make_tensor_value_info("e", TensorProto.FLOAT, [3])],
    )
    graph = helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], then_branch=then_graph, else_branch=else_graph)],
        "g",
        [helper.make_tensor_value_info("c", TensorProto.BOOL, []), x_info],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
        initializer=[zero],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def test_warnings_stay_suppressed_inside_bodies_and_the_callers_state_comes_back() -> None:
    sess = epctx.InferenceSession(_if_log_model(), providers=["CPUExecutionProvider"])
    x = np.array([0.0, -1.0, 1.0], np.float32)
    before = np.geterr()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a RuntimeWarning would raise
        (then_y,) = sess.run(None, {"c": np.array(True), "x": x})
        (else_y,) = sess.run(None, {"c": np.array(False), "x": x})
    assert np.geterr() == before
    assert then_y[0] == -np.inf and np.isnan(then_y[1]) and then_y[2] == 0.0
    assert np.isnan(else_y[0]) and else_y[1] == -np.inf and else_y[2] == np.inf
    ort = pytest.importorskip("onnxruntime")
    want = ort.InferenceSession(_if_log_model(), providers=["CPUExecutionProvider"]).run(
        None, {"c": np.array(True), "x": x}
    )
    np.testing.assert_array_equal(then_y, want[0])


def test_errors_are_ignored_in_every_step_and_nested_plan_and_restored_after_a_failure() -> None:
    x, y, z = _values("x", "y", "z")
    states: list[dict[str, str]] = []

    def record(v: Any) -> tuple[Any, ...]:
        states.append(np.geterr())
        return (v,)

    inner = build_plan([x], [y], [PlanStep(record, (x,), (y,))])

    def outer_step(v: Any) -> tuple[Any, ...]:
        states.append(np.geterr())
        return (inner.run([v])[0],)

    outer = build_plan([x], [z], [PlanStep(outer_step, (x,), (z,))])
    before = np.geterr()
    assert before["divide"] != "ignore"
    outer.run([np.zeros(1)])
    inner.run([np.zeros(1)])  # a body plan run on its own sets the state itself
    ignored = dict.fromkeys(("divide", "over", "under", "invalid"), "ignore")
    assert states == [ignored] * 3
    assert np.geterr() == before
    failing = build_plan([x], [y], [PlanStep(_failing, (x,), (y,), label="p")])
    with pytest.raises(Fail):
        failing.run([np.zeros(1)])
    assert np.geterr() == before


def test_each_thread_ignores_errors_in_its_own_runs() -> None:
    x, y = _values("x", "y")
    states: dict[str, dict[str, str]] = {}

    def record(v: Any) -> tuple[Any, ...]:
        states[threading.current_thread().name] = np.geterr()
        return (np.log(v),)

    plan = build_plan([x], [y], [PlanStep(record, (x,), (y,))])
    results: list[Any] = []
    errors: list[BaseException] = []

    def work() -> None:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                results.append(plan.run([np.zeros(1)])[0])
            assert np.geterr()["divide"] != "ignore"
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=work, name=f"t{k}") for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(states) == 4 and all(s["divide"] == "ignore" for s in states.values())
    assert all(r[0] == -np.inf for r in results)


def test_numpy_2_sets_its_error_state_through_its_context_variable() -> None:
    """The cheap guard is in use where numpy has it (numpy >= 2): a numpy that drops it falls back to
    np.errstate, and this test says so."""
    if int(np.__version__.split(".")[0]) < 2:
        pytest.skip("numpy < 2 has no error-state context variable")
    assert not isinstance(plan_calls.ERRORS, plan_calls.ErrstateVar)
    token = plan_calls.ERRORS.set(plan_calls.IGNORED)
    try:
        assert set(np.geterr().values()) == {"ignore"}
    finally:
        plan_calls.ERRORS.reset(token)


def test_the_fallback_guard_enters_numpys_errstate() -> None:
    var = plan_calls.ErrstateVar()
    before = np.geterr()
    state = var.set(object())
    assert var.get() is None and set(np.geterr().values()) == {"ignore"}
    var.reset(state)
    assert np.geterr() == before


def test_the_loop_takes_steps_of_no_one_or_several_inputs_and_outputs_and_names_a_failing_one() -> None:
    x, c, s, d, m, y = _values("x", "c", "s", "d", "m", "y")
    steps = [
        PlanStep(lambda: (np.float64(10),), (), (c,)),  # no input
        PlanStep(lambda a, b: (a + b, a - b), (x, c), (s, d)),  # two in, two out
        PlanStep(lambda a: (a * 2,), (s,), (m,)),  # one in, one out
        PlanStep(lambda a, b, omitted: (a + b + (0 if omitted is None else 1),), (m, d, None), (y,)),
    ]
    plan = build_plan([x], [y, s], steps, fold_constants=False)
    assert plan._direct is None
    assert plan.run([np.float64(1)]) == [(1 + 10) * 2 + (1 - 10), 11]
    failing = [*steps[:2], PlanStep(_failing, (s,), (m,), label="third"), steps[3]]
    with pytest.raises(
        Fail, match=r"running compiled partition 'third' Status Message: ValueError: bad shapes$"
    ):
        build_plan([x], [y], failing, fold_constants=False).run([np.float64(1)])
