"""The lean load path: a session over a context model read by the lean reader (``epctx.model.lean``).

Every node is an EPContext node, so there is nothing to partition, optimise or compile: each node is routed
to its EP, its binary loaded and checked by the same ContextLoader as the full path, and the plan is one step
per node. Neither onnx nor onnx-ir, the CPU kernels nor anything of generation is imported here."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

from epctx import options as opt
from epctx.ep._contract import CompiledPartition, ExecutionProvider, Partition
from epctx.epcontext.load import ContextLoader
from epctx.model.lean import LeanGraph, LeanModel, LeanNode, LeanValue, read_context_model
from epctx.model.source import read_model_file
from epctx.session.plan import PlanStep, build_plan
from epctx.session.prepared import PreparedSession, prepare
from epctx.session.profiling import Phase, no_phase

__all__ = ["open_lean"]


def open_lean(
    source: str | os.PathLike[str] | bytes,
    providers: Sequence[ExecutionProvider],
    config: opt.SessionConfig,
    *,
    phase: Phase | None = None,
    read_func: Callable[[str], object] | None = None,
) -> PreparedSession | bytes | None:
    """The prepared session when ``source`` is a context model the lean reader takes; otherwise the file's bytes (read
    once, for the full loader) or None (bytes given, or nothing read). ``phase(kind, name, EP name)`` wraps
    each context load (profiles, as ``StepBuilder.phase``); ``read_func``: the EPContext data read callback."""
    path: Path | None = None
    if isinstance(source, (bytes, bytearray, memoryview)):
        data = bytes(source)
    elif isinstance(source, (str, os.PathLike)):
        path = Path(source)
        data = read_model_file(path)
    else:
        return None
    model = read_context_model(data)
    if model is None:
        return data if path is not None else None
    return _build(model, path, providers, config, phase or no_phase, read_func)


def _build(
    model: LeanModel,
    path: Path | None,
    providers: Sequence[ExecutionProvider],
    config: opt.SessionConfig,
    phase: Phase,
    read_func: Callable[[str], object] | None = None,
) -> PreparedSession:
    graph = model.graph
    loader = ContextLoader(model_path=path, config=config, metadata=model.metadata_props, read_func=read_func)
    routed = loader.route(graph, providers)
    read_later = _readers(graph)
    steps: list[PlanStep] = []
    partitions: list[tuple[str, tuple[str]]] = []
    for k, node in enumerate(graph.nodes):
        ep = routed[node]
        partition = _partition(node, ep, model, read_later[k])
        with phase("context_load", node.name, ep.name):
            compiled: CompiledPartition = loader.load(ep, node, partition)
        steps.append(
            PlanStep(
                compiled,
                partition.inputs,
                partition.outputs,
                label=partition.name,
                op_type="EPContext",
                provider=ep.name,
            )
        )
        partitions.append((ep.name, (node.name,)))
    loader.finish()
    return prepare(model, build_plan(graph.inputs, graph.outputs, steps, fold_constants=False), partitions)


def _readers(graph: LeanGraph) -> list[set[LeanValue]]:
    """Per node, the values read after it: by a later node or as a graph output."""
    later = set(graph.outputs)
    found: list[set[LeanValue]] = []
    for node in reversed(graph.nodes):
        found.append(set(later))
        later.update(node.inputs)
    return found[::-1]


def _partition(node: LeanNode, ep: ExecutionProvider, model: LeanModel, read: set[LeanValue]) -> Partition:
    """As ``epctx.ep.make_partition`` describes a one-node group: its inputs, and the outputs read later."""
    return Partition(
        name=node.name,
        ep_name=ep.name,
        nodes=(node,),
        inputs=tuple(dict.fromkeys(node.inputs)),
        outputs=tuple(v for v in node.outputs if v in read),
        initializers=(),
        opset_imports=dict(model.opset_imports),
    )
