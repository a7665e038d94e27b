"""A plan of several steps runs as one generated function (session/plan_calls.py ``compiled_run``, issue 21):
each slot a local, each kernel and constant a default argument. Checked against the slot-list loop it replaces:
the same values (multi-output steps, omitted inputs, constants, freed slots, outputs that are inputs or
constants), the same step named when a kernel fails, the loop kept for a call given fewer inputs and for a
plan's first runs (generating the function costs more than a session run once saves)."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx_ir as ir
import pytest

from epctx.errors import Fail
from epctx.session.plan import ExecutionPlan, PlanStep, build_plan
from epctx.session.plan_calls import compiled_run


def _values(*names: str) -> list[ir.Value]:
    return [ir.Value(name=n) for n in names]


def _looped(plan: ExecutionPlan) -> ExecutionPlan:
    twin = ExecutionPlan(
        plan.template, plan.input_slots, plan.output_slots, plan.steps, plan.labels, plan.info
    )
    twin._direct = twin._compiled = None
    twin._warmup = 0
    return twin


def _warm(plan: ExecutionPlan, inputs: list[Any]) -> ExecutionPlan:
    """``plan`` after the runs that precede its generated function (the loop runs them)."""
    assert plan._compiled is None
    while plan._warmup:
        plan.run(inputs)
    assert plan._compiled is not None
    return plan


def _split(v: Any) -> tuple[Any, ...]:
    return (v[:1], v[1:], v * 0)  # three results, the graph reads two


def _plan() -> tuple[ExecutionPlan, list[Any]]:
    x, w, a, b, c, d, e, y = _values("x", "w", "a", "b", "c", "d", "e", "y")
    w.const_value = ir.tensor(np.array([10.0, 20.0, 30.0], np.float32))
    seen: list[Any] = []

    def weighted(v: Any, omitted: Any, weight: Any) -> tuple[Any]:
        seen.append(omitted)
        return (v * weight,)

    steps = [
        PlanStep(weighted, (x, None, w), (a,), label="weighted"),
        PlanStep(_split, (a,), (b, c, d), label="split"),
        PlanStep(lambda p, q: (np.concatenate([q, p]),), (b, c), (e,), label="swap"),
        PlanStep(lambda p, q: (p + q,), (e, x), (y,), label="add"),
    ]
    return build_plan([x], [y, x, w, b], steps, fold_constants=False), seen


def test_the_generated_function_gives_what_the_loop_gives() -> None:
    plan, seen = _plan()
    feed = [np.array([1.0, 2.0, 3.0], np.float32)]
    _warm(plan, feed)
    seen.clear()
    got, want = plan.run(feed), _looped(plan).run(feed)
    assert seen == [None, None]
    assert len(got) == len(want) == 4
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    np.testing.assert_array_equal(got[0], [41.0, 92.0, 13.0])
    assert got[1] is feed[0]


def test_a_failing_step_is_named_as_the_loop_names_it() -> None:
    x, y, z, u = _values("x", "y", "z", "u")

    def bad(v: Any) -> tuple[Any]:
        raise ValueError("bad shapes")

    steps = [
        PlanStep(lambda v: (v * 2,), (x,), (y,), label="first"),
        PlanStep(bad, (y,), (z,), label="second"),
        PlanStep(lambda v: (v + 1,), (z,), (u,), label="third"),
    ]
    plan = build_plan([x], [u], steps, fold_constants=False)
    plan._warmup = 0
    plan._compiled = compiled_run(plan.template, plan.input_slots, plan.output_slots, plan.steps)
    messages = []
    for p in (plan, _looped(plan)):
        with pytest.raises(Fail) as info:
            p.run([np.zeros(2)])
        messages.append(str(info.value))
    assert messages[0] == messages[1]
    assert "running compiled partition 'second' Status Message: ValueError: bad shapes" in messages[0]


def test_the_first_runs_take_the_loop_then_the_function() -> None:
    plan, _ = _plan()
    feed = [np.array([1.0, 2.0, 3.0], np.float32)]
    results = []
    for _ in range(4):
        results.append(plan.run(feed)[0])
        if len(results) < 2:
            assert plan._compiled is None
    assert plan._compiled is not None and plan._warmup == 0
    for r in results[1:]:
        np.testing.assert_array_equal(r, results[0])


def test_a_call_with_fewer_inputs_keeps_the_loop() -> None:
    """The loop zips the inputs it is given with the plan's: the rest keep their template values."""
    x, k, y = _values("x", "k", "y")
    plan = build_plan(
        [x, k],
        [y],
        [
            PlanStep(lambda a, b: (a if b is None else a + b,), (x, k), (x,)),
            PlanStep(lambda a: (a,), (x,), (y,)),
        ],
    )
    _warm(plan, [np.int64(3), np.int64(4)])
    assert plan.run([np.int64(3)]) == [3]
    assert plan.run([np.int64(3), np.int64(4)]) == [7]
