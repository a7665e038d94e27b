"""How an ExecutionPlan calls its steps on the hot path (issue 21: session.run's fixed cost): a plan of one step
calls it directly; a longer plan's first runs go through its loop, which takes each step's arguments with a
getter made once, and its later runs through one generated function of straight-line code (``compiled_run``:
slots as locals, no getter, no loop); numpy's error state is set to "ignore" once per outermost run through
numpy's own context variable."""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

__all__ = [
    "ERRORS",
    "IGNORED",
    "Compiled",
    "Direct",
    "ErrstateVar",
    "compiled_run",
    "direct_call",
    "loop_step",
]

# Raw step: (fn, input slots, output slots, slots freed after it).
_Step = tuple[Callable[..., Sequence[Any]], tuple[int, ...], tuple[int, ...], tuple[int, ...]]

_Pick = Callable[[Sequence[Any]], list[Any]]
# A one-step plan's call: (fn, pick of its arguments or None, constants, pick of the plan's outputs).
Direct = tuple[Callable[..., Sequence[Any]], _Pick | None, tuple[Any, ...], _Pick]


def direct_call(
    template: list[Any],
    input_slots: tuple[int, ...],
    output_slots: tuple[int, ...],
    steps: tuple[_Step, ...],
) -> Direct | None:
    """For a plan of one step whose every output is one of the step's results: (fn, pick, constants,
    out_pick), so that ``run`` calls ``fn`` on its inputs straight away. ``pick`` takes the step's arguments from
    ``(*inputs, *constants)`` (None: the step takes the inputs as they come), ``constants`` are the template's
    values of the other slots the step reads (constants, None for an omitted input), ``out_pick`` takes the
    plan's outputs from the step's results (a list).
    None when the plan needs its slots (several steps, or an output that is an input or a constant)."""
    if len(steps) != 1:
        return None
    fn, ins, outs, _ = steps[0]
    if not all(slot in outs for slot in output_slots):
        return None
    position = {slot: k for k, slot in enumerate(input_slots)}
    others = [slot for slot in dict.fromkeys(ins) if slot not in position]
    for k, slot in enumerate(others):
        position[slot] = len(input_slots) + k
    picks = tuple(position[slot] for slot in ins)
    plain = picks == tuple(range(len(input_slots)))
    out_picks = tuple(outs.index(slot) for slot in output_slots)
    return fn, None if plain else _picker(picks), tuple(template[slot] for slot in others), _picker(out_picks)


class Compiled:
    """A plan's steps as one generated Python function (``compiled_run``): ``run(inputs)`` returns the outputs;
    ``step_at(exc)`` the index of the step an exception raised in ``run`` came from (-1: none)."""

    __slots__ = ("code", "lines", "run")

    def __init__(self, run: Callable[[Sequence[Any]], list[Any]], lines: dict[int, int]) -> None:
        self.run = run
        self.code = run.__code__
        self.lines = lines  # line of the generated source -> step index

    def step_at(self, exc: BaseException) -> int:
        tb = exc.__traceback__
        found = -1
        while tb is not None:
            if tb.tb_frame.f_code is self.code:
                found = self.lines.get(tb.tb_lineno, -1)
            tb = tb.tb_next
        return found


def compiled_run(
    template: list[Any],
    input_slots: tuple[int, ...],
    output_slots: tuple[int, ...],
    steps: tuple[_Step, ...],
) -> Compiled:
    """The plan's loop unrolled into one function of straight-line code: each slot a local variable, each
    step's kernel and each constant it reads a default argument (a local too), so a step costs its call and
    no list indexing, argument getter or loop (issue 21: the LLM decode's 94 steps, 171 -> 153 us, measured
    here). Slots are freed where the loop frees them; a slot read before any step writes it holds its template
    value (a constant, or None)."""
    defaults: dict[str, Any] = {}
    written = set(input_slots)
    body = [f"    v{slot} = inputs[{j}]" for j, slot in enumerate(input_slots)]

    def read(slot: int) -> str:
        if slot in written:
            return f"v{slot}"
        defaults[f"c{slot}"] = template[slot]
        return f"c{slot}"

    lines: dict[int, int] = {}
    for k, (fn, ins, outs, frees) in enumerate(steps):
        defaults[f"f{k}"] = fn
        call = f"f{k}({', '.join(read(i) for i in ins)})"
        lines[len(body) + 2] = k  # line 1 is the def
        if len(outs) == 1:
            body.append(f"    v{outs[0]} = {call}[0]")
        else:
            body.append(f"    r = {call}")
            body.extend(f"    v{slot} = r[{j}]" for j, slot in enumerate(outs))
        written.update(outs)
        body.extend(f"    v{slot} = None" for slot in frees)
    body.append(f"    return [{', '.join(read(i) for i in output_slots)}]")
    params = ", ".join(f"{name}=_d[{name!r}]" for name in defaults)
    source = f"def run(inputs{', *, ' + params if params else ''}):\n" + "\n".join(body) + "\n"
    namespace: dict[str, Any] = {"_d": defaults}
    exec(compile(source, "<epctx plan>", "exec"), namespace)  # our own code: slot and step numbers only
    return Compiled(namespace["run"], lines)


def _picker(positions: tuple[int, ...]) -> _Pick:
    """``lambda seq: [seq[i] for i in positions]``, at C speed (``operator.itemgetter``)."""
    if not positions:
        return lambda seq: []
    if len(positions) == 1:
        (i,) = positions
        return lambda seq: [seq[i]]
    get = operator.itemgetter(*positions)
    return lambda seq: list(get(seq))


def loop_step(step: _Step) -> Any:
    """A step as the loop runs it: (fn, get, out, outs, frees); ``get(slots)`` its arguments (C speed: Python
    3.11's list comprehension made a function call a step), ``out`` its one output's slot (-1: several)."""
    fn, ins, outs, frees = step
    get: _Pick | Callable[[Sequence[Any]], tuple[Any, ...]]
    if not ins:
        get = _no_arguments
    elif len(ins) == 1:
        (i,) = ins
        get = _one_argument(i)
    else:
        get = operator.itemgetter(*ins)
    return fn, get, outs[0] if len(outs) == 1 else -1, outs, frees


def _no_arguments(slots: Sequence[Any]) -> tuple[Any, ...]:
    return ()


def _one_argument(i: int) -> Callable[[Sequence[Any]], tuple[Any, ...]]:
    return lambda slots: (slots[i],)


class ErrstateVar:
    """Stands in for numpy's error-state context variable where numpy has none (numpy < 2): each outermost run
    enters ``np.errstate(all="ignore")``."""

    def get(self) -> None:
        return None

    def set(self, _: Any) -> Any:
        state = np.errstate(all="ignore")
        state.__enter__()
        return state

    def reset(self, state: Any) -> None:
        state.__exit__(None, None, None)


def _numpy_errors() -> tuple[Any, Any]:
    """numpy's error-state context variable and its "ignore all" value: setting them is what
    ``np.errstate(all="ignore")`` does on entry (numpy 2), at 0.2 us a run instead of 0.75 us (the object and
    its state made at each entry). The value is made once, here: numpy's buffer size and error callback as they
    are now (an "ignore all" state calls no callback; the buffer size only tunes speed)."""
    try:
        from numpy._core._multiarray_umath import _extobj_contextvar, _make_extobj

        return _extobj_contextvar, _make_extobj(all="ignore")
    except (ImportError, TypeError):
        return ErrstateVar(), object()


ERRORS, IGNORED = _numpy_errors()
