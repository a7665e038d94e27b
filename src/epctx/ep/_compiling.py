"""The values of the EP contract's two compile-side stages, and the compile guard.

- ``get_capability(graph, opset_imports, ctx: CapabilityContext) -> Capability``: what the EP claims (nodes
  the framework groups, or groups the EP made, each one partition), why it declines the nodes it was offered
  and does not take, and the artefacts its checks produced (compiles an EP made to probe its backend) that
  ``compile`` may reuse;
- ``compile(partitions, ctx: CompileContext) -> list[CompiledPartition]``: all partitions of the EP at once,
  with the capability's artefacts, the binary the partitions will be saved into, progress reporting and the
  guard.

The EP keeps nothing between the two: what ``compile`` needs of the capability stage comes back in ``ctx``.

The guard (:class:`CompileGuard`) refuses every compile of a session that must not compile
(``session.disable_model_compile=1``, inside ``epctx.testing.no_compile()``, ``EPCTX_NO_COMPILE=1``) with
ModelRequiresCompilation. The framework checks it before it calls ``compile``; an EP that compiles anything
else (a capability probe) calls ``ctx.guard.check`` before it starts a compiler.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from epctx.errors import ModelRequiresCompilation

if TYPE_CHECKING:
    import onnx_ir as ir

    from epctx.ep._context_io import BinaryLayout, ContextReader
    from epctx.ep._partition import Partition

__all__ = [
    "NO_COMPILE_ENV",
    "Capability",
    "CapabilityContext",
    "CompileContext",
    "CompileGuard",
    "no_compile",
]

NO_COMPILE_ENV = "EPCTX_NO_COMPILE"  # "1": every compile in the process raises (``epctx.testing.no_compile``)
_COMPILE_FORBIDDEN: contextvars.ContextVar[bool] = contextvars.ContextVar("epctx_no_compile", default=False)


@contextlib.contextmanager
def no_compile() -> Iterator[None]:
    """Inside the block every compile, capability probes included, raises ModelRequiresCompilation (loading a
    context model must not compile). The public face is ``epctx.testing.no_compile``."""
    token = _COMPILE_FORBIDDEN.set(True)
    try:
        yield
    finally:
        _COMPILE_FORBIDDEN.reset(token)


@dataclasses.dataclass(frozen=True, slots=True)
class CompileGuard:
    """Whether this session may compile; ``refusal`` says why not (None: it may)."""

    refusal: str | None = None

    @classmethod
    def current(cls, *, disable_model_compile: bool = False) -> CompileGuard:
        """The guard of a session created now: ``session.disable_model_compile`` (its config), then
        ``no_compile()`` around the creation, then ``EPCTX_NO_COMPILE`` in the environment."""
        if disable_model_compile:
            return cls("with session.disable_model_compile=1")
        if _COMPILE_FORBIDDEN.get():
            return cls("inside epctx.testing.no_compile()")
        value = os.environ.get(NO_COMPILE_ENV, "")
        if value not in ("", "0"):
            return cls(f"with {NO_COMPILE_ENV}={value}")
        return cls()

    def check(self, ep_name: str, count: int, purpose: str = "") -> None:
        """Raise ModelRequiresCompilation when compiling is refused: call it before any compiler starts.
        ``purpose``: why the compile, when not to run the partitions (e.g. "for its capability check")."""
        if self.refusal is None:
            return
        why = f" {purpose}" if purpose else ""
        raise ModelRequiresCompilation(
            f"{ep_name} was asked to compile {count} partition(s){why} {self.refusal}: a context model made "
            "for this EP must load without compiling; load one instead"
        )


@dataclasses.dataclass(frozen=True, slots=True)
class CapabilityContext:
    """What ``get_capability`` is given besides the graph:

    - ``guard``: the guard its probe compiles must pass;
    - ``reuse``: when the session refits a context (``epctx.refit_context``), the graphs of that context by EP
      name: an EP whose code does not hold its weights (``ExecutionProvider.refits``) claims the nodes they were
      compiled from and hands their code to ``compile`` as artefacts, compiling nothing;
    - ``assigned``: the nodes of the graph that EPs ahead of this one took (onnxruntime's GraphViewer shows
      them with their EP set): claiming them is harmless (first come first served) but gains nothing, and an
      EP that forms its own ``Capability.groups`` forms them around these nodes;
    - ``assigned_partitions``: the partitions of several nodes that compiling EPs ahead formed (onnxruntime
      shows each as one fused node): the partitioner sees each as one unit, so a group that needs a path out
      through one and back in is split; ``fused_groups(graph, nodes, ctx.assigned_partitions)`` forms groups
      that are not."""

    guard: CompileGuard = CompileGuard()
    reuse: Mapping[str, Sequence[ContextReader]] = dataclasses.field(default_factory=dict)
    assigned: frozenset[ir.Node] = frozenset()
    assigned_partitions: tuple[tuple[ir.Node, ...], ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class Capability:
    """What an EP takes of a graph, first come first served among EPs:

    - ``claimed``: nodes it runs, any order; the framework groups them into cycle-free partitions;
    - ``groups``: node sets it runs, each compiled as one partition (onnxruntime's IndexedSubGraph): the
      partitioner never merges two groups nor a group with ``claimed`` nodes, and splits a group only when it
      must, into its largest cycle-free parts: when EPs ahead of this one took some of its nodes, or when a path
      leaves the group and comes back into it (through nodes of other EPs, or through another of its groups);
      a node in two groups, or in a group and in ``claimed``, or not in the graph is EPFail. A kernel EP's
      groups are claimed nodes (it runs nodes one by one);
    - ``declined``: nodes it was offered and does not run, each with the reason (shown by
      ``InferenceSession.get_fallback_reasons`` and in errors);
    - ``artefacts``: anything its checks produced that ``compile`` may reuse (handed back as
      ``CompileContext.artefacts``)."""

    claimed: tuple[ir.Node, ...] = ()
    declined: Mapping[ir.Node, str] = dataclasses.field(default_factory=dict)
    artefacts: Any = None
    groups: tuple[tuple[ir.Node, ...], ...] = ()

    @property
    def nodes(self) -> tuple[ir.Node, ...]:
        """Every node claimed: the groups' nodes, then ``claimed``."""
        return (*(node for group in self.groups for node in group), *self.claimed)


def _no_target() -> BinaryLayout | None:
    return None


def _no_progress(partition: Partition) -> None:
    return None


@dataclasses.dataclass(frozen=True, slots=True)
class CompileContext:
    """What ``compile`` is given besides the partitions.

    - ``guard``: already checked by the framework for this call; check it again before compiling anything
      else;
    - ``artefacts``: the ``Capability.artefacts`` this EP returned for the same graph;
    - ``progress(partition)``: call it when a partition is done (from any thread): the framework logs it and
      profiles it; the partitions not reported are reported when ``compile`` returns;
    - ``target_binary()``: the binary the partitions will be saved into when this session generates into a
      sharing group (``ep.share_ep_contexts``) whose binary holds entries already, so a payload may refer to
      offsets final in the shared file; None otherwise."""

    guard: CompileGuard = CompileGuard()
    artefacts: Any = None
    progress: Callable[[Partition], None] = _no_progress
    target: Callable[[], BinaryLayout | None] = _no_target

    def target_binary(self) -> BinaryLayout | None:
        return self.target()
