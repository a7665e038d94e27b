"""Shape arithmetic memoised per input-shape signature (issue 21: the LLM pair's per-node cost).

Exported transformers compute reshape targets, masks and expand shapes at every run from the shapes of their
tensors: ``Shape -> Gather -> Unsqueeze -> Concat -> Reshape``, ``ConstantOfShape``, ``Equal`` / ``Where`` on
shape values (the decode step of the corpus' LLM: 44 of its 182 steps). Those steps read nothing but the
*shapes* of some tensors (``Shape`` and ``Size`` nodes, the *sources*) and constants, so their values are a
function of those shapes. The plan runs each such group of steps as one step that looks their values up by
the sources' shapes (a small dict, bounded in entries and bytes) and runs the group's own little plan only
when a signature is new: a decode loop whose past length grows gives a new entry per step, an unchanged
signature (a prompt length seen before, a fixed-size model) none. onnxruntime folds these at load when the
shapes are static; with dynamic dims it runs them as kernels each time.

A step belongs to a group when it is foldable (pure; no subgraph, no outer value), is no graph output, and is
a ``Shape`` / ``Size`` node or reads only constants and values of the group's kind. Steps are grouped by the
set of sources they depend on; a group of one step stays a plain step. Each group (or plain step) is moved
to just after the last step that makes one of its sources (its other inputs come from groups placed before
it), which is where it first can run. The cached values are made read-only: a kernel that wrote into its
input would otherwise change every later run's value.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Sequence
from typing import Any, Protocol

import numpy as np

__all__ = ["MEMO_BYTES", "MEMO_ENTRIES", "Group", "ShapeMemo", "shape_groups"]

# Per group: at most this many signatures, and this many bytes of cached values (oldest dropped first). A server
# generating for one prompt after another meets the same past lengths again: 256 lengths of an LLM decode's
# shape values are ~0.5 MB; a prefill's masks grow with the square of the prompt, which the byte bound holds.
MEMO_ENTRIES = 256
MEMO_BYTES = 1 << 24

_SHAPE_OPS = frozenset({"Shape", "Size"})


class _Step(Protocol):
    @property
    def inputs(self) -> tuple[Any, ...]: ...
    @property
    def outputs(self) -> tuple[Any, ...]: ...
    @property
    def foldable(self) -> bool: ...


class Group:
    """Steps that depend on the shapes of ``sources`` only: ``inputs`` are the sources then the values of
    other groups (or moved plain steps) that they read; ``outputs`` the values read outside the group."""

    __slots__ = ("inputs", "outputs", "sources", "steps")

    def __init__(self, sources: tuple[Any, ...], steps: list[Any]) -> None:
        self.sources = sources
        self.steps = steps
        self.inputs: tuple[Any, ...] = ()
        self.outputs: tuple[Any, ...] = ()


def _shape_node(step: _Step) -> bool:
    """A Shape / Size node's step (of the default domain) with its one input present."""
    node = step.outputs[0].producer() if len(step.outputs) == 1 else None
    if node is None or node.op_type not in _SHAPE_OPS or node.domain not in ("", "ai.onnx"):
        return False
    return tuple(node.outputs) == step.outputs and len(step.inputs) >= 1 and step.inputs[0] is not None


def _sources_of(
    steps: Sequence[_Step], is_const: Callable[[Any], bool], exposed: set[Any]
) -> dict[int, frozenset[Any]]:
    """Per step index of a memoisable step, the source tensors whose shapes its values depend on."""
    depends: dict[Any, frozenset[Any]] = {}  # shape-derived value -> its sources
    found: dict[int, frozenset[Any]] = {}
    for k, step in enumerate(steps):
        if not step.foldable or not step.outputs or any(v in exposed for v in step.outputs):
            continue
        if _shape_node(step):
            x = step.inputs[0]
            sources = depends.get(x, frozenset((x,)))
        else:
            read = [v for v in step.inputs if v is not None and not is_const(v)]
            if not read or any(v not in depends for v in read):
                continue
            sources = frozenset().union(*(depends[v] for v in read))
        found[k] = sources
        for v in step.outputs:
            depends[v] = sources
    return found


def shape_groups(steps: Sequence[_Step], is_const: Callable[[Any], bool], exposed: set[Any]) -> list[Any]:
    """``steps`` with the memoisable ones gathered: each item a step or a :class:`Group` (two steps or more),
    in an order where every value is made before it is read. ``exposed``: values the caller sees (graph inputs
    and outputs), never memoised."""
    found = _sources_of(steps, is_const, exposed)
    if not found:
        return list(steps)
    by_sources: dict[frozenset[Any], list[int]] = {}
    for k, sources in found.items():
        by_sources.setdefault(sources, []).append(k)
    maker = {v: k for k, step in enumerate(steps) for v in step.outputs}
    # a group can run once its last source exists: right after that source's step (-1: a graph input)
    ready_at: dict[int, list[frozenset[Any]]] = {}
    for sources in by_sources:
        last = max(maker.get(v, -1) for v in sources)  # a source is never a memoised value itself
        ready_at.setdefault(last, []).append(sources)
    order: dict[Any, int] = {}  # a source -> where it is first read (a stable order for the keys)
    for step in steps:
        for v in step.inputs:
            order.setdefault(v, len(order))
    ordered: list[Any] = []
    for sources in ready_at.get(-1, []):
        ordered.append(_item(sources, by_sources[sources], steps, order))
    for k, step in enumerate(steps):
        if k in found:
            continue
        ordered.append(step)
        for sources in ready_at.get(k, []):
            ordered.append(_item(sources, by_sources[sources], steps, order))
    return _finish(_dependency_order(ordered), is_const)


def _item(sources: frozenset[Any], members: list[int], steps: Sequence[_Step], order: dict[Any, int]) -> Any:
    """A group of the ``members`` (one member: the step itself). Its key is every source its values depend on,
    whether its members read that source's shape themselves or through another group's values."""
    if len(members) == 1:
        return steps[members[0]]
    return Group(tuple(sorted(sources, key=order.__getitem__)), [steps[k] for k in members])


def _made(item: Any) -> list[Any]:
    steps = item.steps if isinstance(item, Group) else [item]
    return [v for s in steps for v in s.outputs]


def _read(item: Any) -> list[Any]:
    steps = item.steps if isinstance(item, Group) else [item]
    return [v for s in steps for v in s.inputs if v is not None]


def _dependency_order(items: list[Any]) -> list[Any]:
    """``items`` reordered where a group (or moved step) placed at one point reads another placed at the same
    point after it: each item after those that make what it reads (a stable topological sort)."""
    maker = {v: k for k, item in enumerate(items) for v in _made(item)}
    done: set[int] = set()
    out: list[Any] = []

    def visit(k: int) -> None:
        stack = [(k, False)]
        while stack:
            j, expanded = stack.pop()
            if j in done:
                continue
            if expanded:
                done.add(j)
                out.append(items[j])
                continue
            stack.append((j, True))
            stack.extend(
                (maker[v], False) for v in _read(items[j]) if maker.get(v, j) != j and maker[v] not in done
            )

    for k in range(len(items)):
        visit(k)
    return out


def _finish(items: list[Any], is_const: Callable[[Any], bool]) -> list[Any]:
    """Each group's inputs (all its sources, then the values of others it reads; constants are the group's
    own) and outputs (what others read)."""
    read_by: dict[Any, set[int]] = {}
    for k, item in enumerate(items):
        for v in _read(item):
            read_by.setdefault(v, set()).add(k)
    for k, item in enumerate(items):
        if not isinstance(item, Group):
            continue
        made = set(_made(item))
        outside = [v for v in dict.fromkeys(_read(item)) if v not in made and not is_const(v)]
        item.inputs = (*item.sources, *(v for v in outside if v not in item.sources))
        item.outputs = tuple(v for v in _made(item) if read_by.get(v, set()) - {k})
    return items


class ShapeMemo:
    """A group's step: its values looked up by the shapes of its first ``sources`` arguments; ``run`` (the
    group's plan, called with all the arguments) when the signature is new."""

    __slots__ = ("bytes", "cache", "lock", "run", "sizes", "sources")

    def __init__(self, run: Callable[[Sequence[Any]], list[Any]], sources: int) -> None:
        self.run = run
        self.sources = sources
        self.cache: dict[Hashable, tuple[Any, ...]] = {}
        self.sizes: dict[Hashable, int] = {}  # each entry's bytes
        self.bytes = 0
        # stores and evictions take it (runs of one session on several threads); hits take none
        self.lock = threading.Lock()

    def __call__(self, *args: Any) -> tuple[Any, ...]:
        key = args[0].shape if self.sources == 1 else tuple(a.shape for a in args[: self.sources])
        hit = self.cache.get(key)
        if hit is not None:
            return hit
        results = tuple(self.run(args))
        self._store(key, results)
        return results

    def _store(self, key: Hashable, results: tuple[Any, ...]) -> None:
        arrays = [r for r in results if type(r) is np.ndarray]
        size = sum(a.nbytes for a in arrays)
        if size > MEMO_BYTES:
            return
        for a in arrays:
            a.setflags(write=False)
        cache, sizes = self.cache, self.sizes
        with self.lock:
            if key in cache:
                return
            while cache and (len(cache) >= MEMO_ENTRIES or self.bytes + size > MEMO_BYTES):
                oldest = next(iter(cache))
                del cache[oldest]
                self.bytes -= sizes.pop(oldest)
            cache[key] = results
            sizes[key] = size
            self.bytes += size
