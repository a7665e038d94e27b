"""ExecutionPlan: built once per session (and per control-flow body); run() calls the steps in order (a flat loop,
then one generated function: plan_calls.py), shape arithmetic memoised per input-shape signature (plan_memo.py)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from epctx.errors import EPCtxError, Fail
from epctx.model.tensors import to_numpy
from epctx.session.plan_calls import ERRORS, IGNORED, Compiled, compiled_run, direct_call, loop_step
from epctx.session.plan_memo import Group, ShapeMemo, shape_groups

if TYPE_CHECKING:
    from epctx.model.view import ValueView

__all__ = ["ExecutionPlan", "PlanStep", "build_plan", "passed_input"]

_WARMUP_RUNS = 2

# Random ops must not be folded into constants: each run draws again.
_NOT_FOLDABLE = frozenset(
    {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial", "Bernoulli"}
)


@dataclasses.dataclass(frozen=True, slots=True)
class PlanStep:
    """A unit to execute: ``fn(*inputs)`` returns one value per entry of ``outputs``."""

    fn: Callable[..., Sequence[Any]]
    inputs: tuple[ValueView | None, ...]
    outputs: tuple[ValueView, ...]
    foldable: bool = False  # may run once at build time when every input is constant
    label: str = ""
    op_type: str = ""  # for profiles: the node's op type, or "EPContext" / the compiled partition's name
    provider: str = ""  # for profiles: the EP that runs it


class ExecutionPlan:
    """Integer value slots, one step per kernel or compiled partition, slots freed after their last use."""

    __slots__ = (
        "_compiled",
        "_direct",
        "_loop",
        "_warmup",
        "info",
        "input_slots",
        "labels",
        "num_slots",
        "output_slots",
        "steps",
        "template",
    )

    def __init__(
        self,
        template: list[Any],
        input_slots: tuple[int, ...],
        output_slots: tuple[int, ...],
        steps: tuple[
            tuple[Callable[..., Sequence[Any]], tuple[int, ...], tuple[int, ...], tuple[int, ...]], ...
        ],
        labels: tuple[str, ...] = (),
        info: tuple[tuple[str, str, str], ...] = (),
    ) -> None:
        self.template = template
        self.labels = labels  # per step, what it runs (for errors): "LayerNormalization node. Name:'ln'"
        self.info = info  # per step, (name, op type, EP) for profiles
        self.num_slots = len(template)
        self.input_slots = input_slots
        self.output_slots = output_slots
        self.steps = steps
        self._direct = direct_call(template, input_slots, output_slots, steps)
        self._loop = tuple(loop_step(step) for step in steps)
        # a plan of several steps runs as one generated function from its third run on (plan_calls.compiled_run:
        # generating it costs 7-13 us a step, which a session run once, or a measurement's few runs, never repays)
        self._compiled: Compiled | None = None
        self._warmup = 0 if self._direct is not None else _WARMUP_RUNS

    def run(self, inputs: Sequence[Any]) -> list[Any]:
        # Log(0), 0/0 and friends give inf/nan as in onnxruntime, without numpy's RuntimeWarnings: numpy's
        # error state is "ignore" for the outermost run (a body's plan runs inside its node's step, under it).
        # The try costs nothing while nothing is raised (CPython 3.11+ zero-cost exceptions).
        token = None if ERRORS.get() is IGNORED else ERRORS.set(IGNORED)
        step: Any = None
        try:
            direct = self._direct
            if direct is not None:  # one step (a whole-model partition): no slot list, no loop
                fn, pick, constants, out_pick = direct
                if pick is None:
                    return out_pick(fn(*inputs))
                return out_pick(fn(*pick((*inputs, *constants) if constants else inputs)))
            compiled = self._compiled
            if compiled is not None and len(inputs) == len(self.input_slots):  # plan_calls.compiled_run
                step = compiled
                return compiled.run(inputs)
            if self._warmup:
                self._warmup -= 1
                if not self._warmup:
                    self._compiled = compiled_run(
                        self.template, self.input_slots, self.output_slots, self.steps
                    )
            return self._looped(inputs)
        except EPCtxError:
            raise
        except Exception as exc:
            if isinstance(step, Compiled):
                k = step.step_at(exc)
                step = self._loop[k] if k >= 0 else None
            raise self._step_failed(self.steps[0] if direct is not None else step, exc) from exc
        finally:
            if token is not None:
                ERRORS.reset(token)

    def _looped(self, inputs: Sequence[Any]) -> list[Any]:
        """The steps run one by one over a slot list (given fewer inputs than the plan has: the others keep their
        template values)."""
        slots = self.template.copy()
        for slot, value in zip(self.input_slots, inputs):
            slots[slot] = value
        for step in self._loop:
            fn, get, out, outs, frees = step
            try:
                results = fn(*get(slots))
            except EPCtxError:
                raise
            except Exception as exc:
                raise self._step_failed(step, exc) from exc
            if out >= 0:
                slots[out] = results[0]
            else:
                for slot, value in zip(outs, results):
                    slots[slot] = value
            for slot in frees:
                slots[slot] = None
        return [slots[i] for i in self.output_slots]

    def run_observed(
        self, inputs: Sequence[Any], before: Callable[[int], None], after: Callable[[int], None]
    ) -> list[Any]:
        """``run`` calling ``before(k)`` / ``after(k)`` around step ``k`` (profiles, RunOptions.terminate): the
        plain ``run`` stays a bare loop."""
        slots = self.template.copy()
        for slot, value in zip(self.input_slots, inputs):
            slots[slot] = value
        token = None if ERRORS.get() is IGNORED else ERRORS.set(IGNORED)
        step: Any = None
        try:
            for k, step in enumerate(self._loop):
                fn, get, out, outs, frees = step
                before(k)
                results = fn(*get(slots))
                after(k)
                if out >= 0:
                    slots[out] = results[0]
                else:
                    for slot, value in zip(outs, results):
                        slots[slot] = value
                for slot in frees:
                    slots[slot] = None
        except EPCtxError:
            raise
        except Exception as exc:
            raise self._step_failed(step, exc) from exc
        finally:
            if token is not None:
                ERRORS.reset(token)
        return [slots[i] for i in self.output_slots]

    def _step_failed(self, step: Any, exc: Exception) -> Fail:
        """A kernel or compiled partition raised: Fail naming it, in onnxruntime's words."""
        index = next((k for k, s in enumerate(self._loop) if s is step), -1)
        if index < 0:
            index = next((k for k, s in enumerate(self.steps) if s is step), -1)
        label = self.labels[index] if 0 <= index < len(self.labels) else f"step {index}"
        return Fail(f"Non-zero status code returned while running {label} Status Message: {_message(exc)}")


def _message(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _describe(step: PlanStep) -> str:
    """onnxruntime's words for what failed: "Relu node. Name:'r'", or the compiled partition's name."""
    node = step.outputs[0].producer() if step.outputs else None
    if node is not None and (node.name or "") == step.label and tuple(node.outputs) == step.outputs:
        return f"{node.op_type} node. Name:{step.label!r}"
    return f"compiled partition {step.label!r}"


class _Slots:
    """The plan's value slots while it is laid out: slot 0 is None (omitted optional inputs); the template
    holds the constants' arrays in theirs. Graph inputs are never constants (an initializer may be fed)."""

    def __init__(self, inputs: Sequence[ValueView]) -> None:
        self.slot_of: dict[ValueView, int] = {}
        self.template: list[Any] = [None]
        self.known_inputs = set(inputs)
        self.constant: dict[ValueView, Any] = {}
        self.cached: set[ValueView] = set()  # values a shape memo keeps between runs (read-only arrays)

    def slot(self, value: ValueView) -> int:
        s = self.slot_of.get(value)
        if s is None:
            s = self.slot_of[value] = len(self.template)
            self.template.append(None)
        return s

    def const_of(self, value: ValueView | None) -> Any:
        if value is None:
            return None
        if value in self.constant:
            return self.constant[value]
        if value.const_value is not None and value not in self.known_inputs:
            array = to_numpy(value.const_value)
            self.constant[value] = array
            return array
        raise KeyError(value)

    def is_const(self, value: ValueView | None) -> bool:
        if value is None or value in self.constant:
            return True
        return value.const_value is not None and value not in self.known_inputs

    def read(self, value: ValueView) -> int:
        """The slot ``value`` is read from; a constant's array is put in the template there."""
        s = self.slot(value)
        if self.is_const(value) and value not in self.known_inputs:
            self.template[s] = self.const_of(value)
        return s


def build_plan(
    inputs: Sequence[ValueView],
    outputs: Sequence[ValueView],
    steps: Sequence[PlanStep],
    *,
    fold_constants: bool = True,
    constants: Mapping[Any, Any] | None = None,  # ValueView -> array (Mapping's key is invariant)
    memoise: bool | None = None,
) -> ExecutionPlan:
    """Lay out slots: slot 0 is always None (omitted optional inputs); then inputs, constants, results.
    ``constants``: arrays of values that are constants though neither initializers nor folded here (a body's
    outer values that are constants in an enclosing graph). ``memoise`` (default: ``fold_constants``): shape
    arithmetic run as memoised groups (``plan_memo``)."""
    slots = _Slots(inputs)
    slots.constant.update(constants or {})
    input_slots = tuple(slots.slot(v) for v in inputs)
    live_steps = [step for step in steps if not (fold_constants and _folded(step, slots))]
    if fold_constants if memoise is None else memoise:
        live_steps = _memoised(live_steps, slots, inputs, outputs)
    live_steps = _aliased(live_steps, slots, inputs, outputs)
    compiled = []
    for step in live_steps:
        ins = tuple(0 if v is None else slots.read(v) for v in step.inputs)
        compiled.append((step.fn, ins, tuple(slots.slot(v) for v in step.outputs)))
    frees_at = _frees(live_steps, slots, keep=set(outputs) | set(inputs))
    output_slots = tuple(slots.read(v) for v in outputs)
    plan_steps = tuple((fn, ins, outs, tuple(frees_at[k])) for k, (fn, ins, outs) in enumerate(compiled))
    labels = tuple(_describe(step) for step in live_steps)
    info = tuple((step.label, step.op_type, step.provider) for step in live_steps)
    return ExecutionPlan(slots.template, input_slots, output_slots, plan_steps, labels, info)


def _folded(step: PlanStep, slots: _Slots) -> bool:
    """Whether ``step`` was folded: foldable, all its inputs constant; its results are constants then."""
    if not (step.foldable and all(slots.is_const(v) for v in step.inputs)):
        return False
    try:
        with np.errstate(all="ignore"):
            results = step.fn(*[slots.const_of(v) for v in step.inputs])
    except EPCtxError:
        raise
    except Exception as exc:
        raise Fail(
            f"Non-zero status code returned while folding {_describe(step)} (its inputs are "
            f"constants) Status Message: {_message(exc)}"
        ) from exc
    for value, result in zip(step.outputs, results):
        slots.constant[value] = result
    return True


def _memoised(
    live_steps: list[PlanStep], slots: _Slots, inputs: Sequence[ValueView], outputs: Sequence[ValueView]
) -> list[PlanStep]:
    """The steps with each group of shape arithmetic (``plan_memo.shape_groups``) run as one memoised step."""
    items = shape_groups(live_steps, slots.is_const, set(inputs) | set(outputs))
    return [_memo_step(item, slots) if isinstance(item, Group) else item for item in items]


def _memo_step(group: Group, slots: _Slots) -> PlanStep:
    """One step for ``group``: its own plan (its errors name its nodes), called when the shapes are new."""
    read = (v for step in group.steps for v in step.inputs if v is not None)
    constants = {v: slots.constant[v] for v in read if v in slots.constant}
    plan = build_plan(group.inputs, group.outputs, group.steps, fold_constants=False, constants=constants)
    slots.cached.update(group.outputs)
    first: PlanStep = group.steps[0]
    label = f"shape arithmetic of {len(group.steps)} nodes from {first.label!r}"
    return PlanStep(
        ShapeMemo(plan.run, len(group.sources)),
        group.inputs,
        group.outputs,
        label=label,
        op_type="ShapeMemo",
        provider=first.provider,
    )


def passed_input(fn: Any) -> int | None:
    """The input a kernel's one output is, when the kernel says so: a kernel may carry ``passes_input``, a
    callable asked once, when the plan is laid out (every kernel of the graph exists by then), that returns the
    index of the input it returns unchanged on every run, or None (e.g. a node fused into the Conv before it,
    which applies the node's work in place and leaves the node passing its value on)."""
    ask = getattr(fn, "passes_input", None)
    return ask() if callable(ask) else None


def _aliased(
    live_steps: list[PlanStep], slots: _Slots, inputs: Sequence[ValueView], outputs: Sequence[ValueView]
) -> list[PlanStep]:
    """The steps left once each pass-through step (``passed_input``) is dropped, its output given its input's
    slot. Kept as steps: a pass-through of a constant or of a graph input, and a graph output that would share
    its array with a graph input, another graph output or a constant (copied then: onnxruntime returns
    distinct arrays there)."""
    root: dict[ValueView, ValueView] = {}  # aliased value -> the value whose slot it shares
    exposed = set(inputs) | set(outputs)  # values whose array the caller sees
    claimed: set[ValueView] = set()  # roots a graph output already shares
    kept = []
    for step in live_steps:
        k = passed_input(step.fn) if len(step.outputs) == 1 else None
        source = step.inputs[k] if k is not None and 0 <= k < len(step.inputs) else None
        if source is None:
            kept.append(step)
            continue
        value, base = step.outputs[0], root.get(source, source)
        kept_array = slots.is_const(base) or base in slots.cached
        if value in exposed and (base in exposed or base in claimed or kept_array):
            kept.append(dataclasses.replace(step, fn=_copying(step.fn)))  # the output its own array
            continue
        if slots.is_const(source) or source in slots.known_inputs:
            kept.append(step)
            continue
        if value in exposed:
            claimed.add(base)
        root[value] = base
        slots.slot_of[value] = slots.slot(base)
    return kept


def _copying(fn: Callable[..., Sequence[Any]]) -> Callable[..., Sequence[Any]]:
    """``fn`` with its one result copied when it is an array: a graph output passed on from a graph input,
    another graph output or a constant is its own array, as onnxruntime returns it."""

    def run(*inputs: Any) -> Sequence[Any]:
        (result,) = fn(*inputs)
        return (result.copy() if isinstance(result, np.ndarray) else result,)

    return run


def _frees(live_steps: Sequence[PlanStep], slots: _Slots, *, keep: set[ValueView]) -> list[list[int]]:
    """The slots each step frees after it runs: a slot at the last use of any value in it (aliased values share
    one), outputs nobody reads right after the step that made them (graph inputs and outputs, and constants,
    are kept)."""
    kept = {slots.slot_of[v] for v in keep if v in slots.slot_of}
    last_use: dict[int, int] = {}
    for k, step in enumerate(live_steps):
        for v in step.inputs:
            if v is not None and not slots.is_const(v):
                last_use[slots.slot_of[v]] = k
    frees_at: list[list[int]] = [[] for _ in live_steps]
    for slot, k in last_use.items():
        if slot not in kept:
            frees_at[k].append(slot)
    for k, step in enumerate(live_steps):
        for v in step.outputs:
            slot = slots.slot_of[v]
            if slot not in kept and slot not in last_use:
                frees_at[k].append(slot)
    return frees_at
