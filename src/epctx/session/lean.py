"""The lean load path: a session over a context model read by the lean reader (``epctx.model.lean``).

Every node is an EPContext node, so there is nothing to partition, optimise or compile: each node is routed
to its EP, its binary loaded and checked by the same ContextLoader as the full path, and the plan is one step
per node. Neither onnx nor onnx-ir, the CPU kernels nor anything of generation is imported here."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from epctx.ep.context_node import EPContextNode
from epctx.ep.contract import CompiledPartition, ExecutionProvider, Partition
from epctx.epcontext.load import ContextLoader
from epctx.model.lean import LeanModel, LeanNode, LeanValue, read_context_model
from epctx.model.source import read_model_file
from epctx.session.feeds import InputSpec
from epctx.session.node_arg import ModelMetadata, NodeArg, lean_node_arg
from epctx.session.plan import ExecutionPlan, PlanStep, build_plan

__all__ = ["LeanSession", "open_lean"]

# phase(kind, name, EP name) -> a context around one partition's load (StepBuilder.phase's signature).
Phase = Callable[[str, str, str], contextlib.AbstractContextManager[Any]]


def _no_phase(kind: str, name: str, ep: str) -> contextlib.AbstractContextManager[Any]:
    return contextlib.nullcontext()


class LeanSession(NamedTuple):
    """What InferenceSession keeps of a session made on the lean path."""

    plan: ExecutionPlan
    inputs: list[NodeArg]
    outputs: list[NodeArg]
    specs: list[InputSpec]
    partitions: list[tuple[str, list[str]]]
    metadata: ModelMetadata


def open_lean(
    source: str | os.PathLike[str] | bytes,
    providers: Sequence[ExecutionProvider],
    config: Mapping[str, str],
    *,
    phase: Phase | None = None,
) -> LeanSession | bytes | None:
    """The session when ``source`` is a context model the lean reader takes; otherwise the file's bytes (read
    once, for the full loader) or None (bytes given, or nothing read). ``phase(kind, name, EP name)`` wraps
    each context load (profiles, as ``StepBuilder.phase``)."""
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
    return _build(model, path, providers, config, phase or _no_phase)


def _build(
    model: LeanModel,
    path: Path | None,
    providers: Sequence[ExecutionProvider],
    config: Mapping[str, str],
    phase: Phase,
) -> LeanSession:
    loader = ContextLoader(model_path=path, config=config, metadata=model.metadata_props)
    views = [(node, _view(node)) for node in model.nodes]
    routed = loader.route_views(views, providers)
    values: dict[str, LeanValue] = {v.name: v for v in model.inputs}
    for value in model.outputs:
        values.setdefault(value.name, value)
    read_later = _readers(model)
    steps: list[PlanStep] = []
    partitions: list[tuple[str, list[str]]] = []
    for k, (node, _) in enumerate(views):
        ep = routed[node]
        partition = _partition(node, ep, model, values, read_later[k])
        with phase("context_load", node.name, ep.name):
            compiled: CompiledPartition = loader.load(ep, node, partition)
        steps.append(
            PlanStep(
                compiled,
                partition.inputs,  # type: ignore[arg-type]
                partition.outputs,  # type: ignore[arg-type]
                label=partition.name,
                op_type="EPContext",
                provider=ep.name,
            )
        )
        partitions.append((ep.name, [node.name]))
    loader.finish()
    inputs = [values[v.name] for v in model.inputs]
    outputs = [values[v.name] for v in model.outputs]
    plan = build_plan(inputs, outputs, steps, fold_constants=False)  # type: ignore[arg-type]
    return LeanSession(
        plan=plan,
        inputs=[lean_node_arg(v) for v in model.inputs],
        outputs=[lean_node_arg(v) for v in model.outputs],
        specs=[InputSpec.from_lean(v) for v in model.inputs],
        partitions=partitions,
        metadata=ModelMetadata(
            producer_name=model.producer_name,
            graph_name=model.graph_name,
            domain=model.domain,
            description=model.doc_string,
            graph_description=model.graph_doc_string,
            version=model.model_version,
            custom_metadata_map=dict(model.metadata_props),
        ),
    )


def _view(node: LeanNode) -> EPContextNode:
    attributes = {name: (attr.type, attr.value) for name, attr in node.attributes.items()}
    return EPContextNode.from_parts(node.name, node.inputs, node.outputs, attributes)


def _readers(model: LeanModel) -> list[set[str]]:
    """Per node, the names read after it: by a later node or as a graph output."""
    later = {v.name for v in model.outputs}
    found: list[set[str]] = []
    for node in reversed(model.nodes):
        found.append(set(later))
        later.update(node.inputs)
    return found[::-1]


def _partition(
    node: LeanNode, ep: ExecutionProvider, model: LeanModel, values: dict[str, LeanValue], read: set[str]
) -> Partition:
    """As ``epctx.ep.make_partition`` describes a one-node group: its inputs, and the outputs read later."""
    for name in node.outputs:
        values.setdefault(name, LeanValue(name, 0, None))
    inputs = tuple(dict.fromkeys(values[name] for name in node.inputs))
    outputs = tuple(values[name] for name in node.outputs if name in read)
    return Partition(
        name=node.name,
        ep_name=ep.name,
        nodes=(node,),  # type: ignore[arg-type]
        inputs=inputs,  # type: ignore[arg-type]
        outputs=outputs,  # type: ignore[arg-type]
        initializers=(),
        opset_imports=dict(model.opset_imports),
    )
