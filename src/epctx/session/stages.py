"""The full path's stage values between loading and planning: what partitioning hands the compile stage
(``Partitioning``), and what the compile stage hands planning and generation (``CompiledUnits``). Frozen: a
stage reads the value the one before returned and makes its own; nothing is filled in afterwards."""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Mapping
from typing import TYPE_CHECKING, TypeVar

from epctx.errors import Fail
from epctx.partition import CompiledModel

if TYPE_CHECKING:
    import onnx_ir as ir

    from epctx.ep._compiling import CompileGuard
    from epctx.ep._contract import CompiledPartition, ExecutionProvider
    from epctx.epcontext.load import ContextLoader
    from epctx.model import LoadedModel
    from epctx.model.view import NodeView
    from epctx.options import SessionConfig
    from epctx.partition import Unit

__all__ = ["CompiledUnits", "Partitioning", "frozen_mapping"]

_EMPTY: Mapping[int, object] = types.MappingProxyType({})
K = TypeVar("K")
V = TypeVar("V")


def frozen_mapping(items: Mapping[K, V]) -> Mapping[K, V]:
    """A read-only copy of ``items`` (a stage value's mappings cannot be changed through it)."""
    return types.MappingProxyType(dict(items))


@dataclasses.dataclass(frozen=True, slots=True)
class Partitioning:
    """Stage 3's value: the loaded model split among the EPs, in execution order."""

    loaded: LoadedModel  # stage 1's value: the model loaded, overridden and optimized
    units: tuple[Unit, ...]  # in execution order: fused partitions and single kernel nodes
    routed: Mapping[NodeView, ExecutionProvider]  # each EPContext node -> the EP that loads it (stage 2)
    # node -> ((EP name, why it declined the node), ...) for nodes EPs declined with a reason
    declined: Mapping[ir.Node, tuple[tuple[str, str], ...]]
    # id(EP) -> its Capability.artefacts, for its compile; the compile stage hands on the value without them
    # (they may hold compiled code)
    artefacts: Mapping[int, object]
    guard: CompileGuard  # the guard of every compile of this session, capability probes included
    bodies: bool  # whether control-flow bodies are partitioned among the EPs too (when the plan is built)
    # The worker that routed the EPContext nodes (and checked their files against the trust policy): the
    # compile stage loads them through it.
    loader: ContextLoader
    # node -> (EP name, why): the nodes refused to an EP that claims them, by the measured rule's hand-back or
    # by the record of a context model (``epctx.partition.measured``); a context model generated records them
    refused: Mapping[ir.Node, tuple[str, str]] = dataclasses.field(default_factory=dict)
    compiling: frozenset[str] = frozenset()  # the names of the session's EPs that compile

    @property
    def to_compile(self) -> tuple[Unit, ...]:
        """The units the compile stage compiles (the others are loaded from a context, or kernel nodes)."""
        return tuple(u for u in self.units if u.partition is not None and not u.from_context)

    def declined_reasons(self) -> dict[str, dict[str, str]]:
        """By node name: {EP name: why} (``InferenceSession.get_fallback_reasons``)."""
        return {node.name or "": dict(reasons) for node, reasons in self.declined.items()}

    def without_artefacts(self) -> Partitioning:
        return dataclasses.replace(self, artefacts=_EMPTY)


@dataclasses.dataclass(frozen=True, slots=True)
class CompiledUnits:
    """Stage 4's value: every fused unit's compiled partition, compiled now or loaded from its context."""

    partitioning: Partitioning  # without its artefacts: the compile consumed them
    partitions: tuple[CompiledPartition | None, ...]  # per unit; None for a kernel EP's node

    def __post_init__(self) -> None:
        if len(self.partitions) != len(self.partitioning.units):
            raise Fail(f"{len(self.partitions)} compiled partitions for {len(self.partitioning.units)} units")

    @property
    def compiled(self) -> Mapping[int, CompiledPartition]:
        """The partitions compiled by this session (not loaded from a context), by unit index."""
        units = self.partitioning.units
        return types.MappingProxyType(
            {
                k: part
                for k, part in enumerate(self.partitions)
                if part is not None and not units[k].from_context
            }
        )

    def result(self, config: SessionConfig) -> CompiledModel:
        """What generation needs (``epctx.epcontext.generate``), as a value."""
        loaded = self.partitioning.loaded
        partitioning = self.partitioning
        return CompiledModel(
            loaded.model,
            loaded.path,
            partitioning.units,
            self.compiled,
            config,
            refused=_recorded(partitioning),
        )


def _recorded(partitioning: Partitioning) -> dict[ir.Node, tuple[str, str]]:
    """What a context model generated from ``partitioning`` records as refused (``epctx.partition.measured``'s
    record): the refusals (hand-backs), and for each node left out of every compiled partition the first
    compiling EP's reason to decline it (its capability, the cost rule, a probe budget). A warm load then asks no
    compiling EP about nodes it declined when the context was made: IREE probed again for 16 s on a warm load
    of ppocr_det's context model, whose every node it had declined. A node is recorded for one EP (the record's
    form): a second compiling EP that declined it is asked again, as before."""
    if not partitioning.compiling:
        return dict(partitioning.refused)
    placed = {node for unit in partitioning.units if unit.partition is not None for node in unit.nodes}
    recorded: dict[ir.Node, tuple[str, str]] = {}
    for node, reasons in partitioning.declined.items():
        if node in placed:
            continue
        first = next(((ep, why) for ep, why in reasons if ep in partitioning.compiling), None)
        if first is not None:
            recorded[node] = first
    return {**recorded, **partitioning.refused}
