"""A run with something to do around the plan's steps: RunOptions (its log severity, the terminate flag checked
between steps), the profiler's per-step events, EPs' run scopes. The common run (none of these) goes straight to
the plan's loop in InferenceSession and never comes here."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from epctx.errors import Fail
from epctx.session.logs import severity_scope

if TYPE_CHECKING:
    from epctx import options as opt
    from epctx.ep import ExecutionProvider
    from epctx.session.plan import ExecutionPlan
    from epctx.session.profiling import Profiler

__all__ = ["run_observed"]


def run_observed(
    plan: ExecutionPlan,
    inputs: list[Any],
    run_options: opt.RunOptions | None,
    profiler: Profiler | None,
    scoped: Sequence[ExecutionProvider],
) -> list[Any]:
    with contextlib.ExitStack() as stack:
        for ep in scoped:
            scope = ep.run_scope()
            if scope is not None:
                stack.enter_context(scope)
        hooks: tuple[Callable[[int], None], ...] = (_nothing, _nothing)
        if run_options is not None:
            stack.enter_context(severity_scope(run_options.log_severity_level))
            hooks = (_terminate_check(run_options, hooks[0]), hooks[1])
            _terminate_check(run_options, _nothing)(-1)
        if profiler is not None:
            tag = run_options.logid if run_options is not None else ""
            stack.enter_context(profiler.span("Session", "model_run", {"run_tag": tag}))
            before, after = profiler.step_hooks(plan.info)
            hooks = (_chain(hooks[0], before), after)
        if hooks[0] is _nothing:
            return plan.run(inputs)
        return plan.run_observed(inputs, hooks[0], hooks[1])


def _nothing(k: int) -> None:
    return None


def _chain(first: Callable[[int], None], second: Callable[[int], None]) -> Callable[[int], None]:
    if first is _nothing:
        return second

    def both(k: int) -> None:
        first(k)
        second(k)

    return both


def _terminate_check(run_options: opt.RunOptions, then: Callable[[int], None]) -> Callable[[int], None]:
    def check(k: int) -> None:
        if run_options.terminate:
            raise Fail("Exiting due to terminate flag being set to true.")
        then(k)

    return check
