"""Merge context models (generated with different ``ep.context_node_name_prefix``) into one model.

Values connect by name: an output of one model that another model reads becomes an internal edge. The
merged model's inputs are the inputs no model produces; its outputs are the outputs no other model reads.
Binaries stay where they are (the merged model must be written in the same folder as its inputs, so the
relative ``ep_cache_context`` paths keep pointing at them).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import onnx

from epctx.ep._context_node import DOMAIN, OP_TYPE
from epctx.epcontext.transaction import Transaction
from epctx.errors import InvalidArgument, InvalidGraph, NoSuchFile
from epctx.model.load import parse_model_proto, read_model_file

__all__ = ["merge_context_models"]


def merge_context_models(
    paths: Sequence[str | os.PathLike[str]], output: str | os.PathLike[str]
) -> onnx.ModelProto:
    """Merge the context models at ``paths`` into one written as ``output`` (in their folder); the merged
    model."""
    if len(paths) < 2:
        raise InvalidArgument("merge needs at least two context models")
    out_path = Path(output)
    models = [_read_input(Path(p), out_path) for p in paths]
    merged = onnx.ModelProto()
    merged.ir_version = max(m.ir_version for _, m in models)
    merged.producer_name = "epctx"
    merged.graph.name = "_".join(m.graph.name or path.stem for path, m in models)
    opsets: dict[str, int] = {}
    metadata: dict[str, str] = {}
    node_names: dict[str, Path] = {}
    init_names: dict[str, tuple[Path, bytes]] = {}
    produced: dict[str, Path] = {}
    for path, model in models:
        _merge_opsets(opsets, path, model)
        for prop in model.metadata_props:
            metadata.setdefault(prop.key, prop.value)
        _merge_nodes(merged.graph, path, model, node_names, produced)
        _merge_initializers(merged.graph, path, model, init_names)
    _add_boundary(merged.graph, models, produced)
    for domain, version in sorted(opsets.items()):
        merged.opset_import.add(domain=domain, version=version)
    for key, value in sorted(metadata.items()):
        merged.metadata_props.add(key=key, value=value)
    if not any(n.op_type == OP_TYPE and n.domain == DOMAIN for n in merged.graph.node):
        raise InvalidGraph("none of the models has an EPContext node; nothing to merge")
    with Transaction(out_path.parent) as tx:
        tx.commit_model(out_path, merged, overwrite=True)
    return merged


def _read_input(path: Path, out_path: Path) -> tuple[Path, onnx.ModelProto]:
    """A model to merge, which must sit in the output's folder (its binaries are named relative to it)."""
    if not path.is_file():
        raise NoSuchFile(f"context model not found: {str(path)!r}")
    if path.resolve().parent != out_path.resolve().parent:
        raise InvalidArgument(
            f"{str(path)!r} is not in the output's folder {str(out_path.resolve().parent)!r}: merged models "
            "refer to their binaries by relative path, so inputs and output must share a folder"
        )
    return path, parse_model_proto(read_model_file(path), f"context model {str(path)!r}")


def _merge_opsets(opsets: dict[str, int], path: Path, model: onnx.ModelProto) -> None:
    """Add ``model``'s opset imports to ``opsets``; models must agree on each domain but the EPContext one."""
    for op in model.opset_import:
        if op.domain in opsets and opsets[op.domain] != op.version and op.domain != DOMAIN:
            raise InvalidGraph(
                f"{str(path)!r} imports opset {op.domain or 'ai.onnx'}:{op.version}, another model "
                f"{opsets[op.domain]}; merged models must agree"
            )
        opsets[op.domain] = max(op.version, opsets.get(op.domain, 0))


def _merge_nodes(
    graph: onnx.GraphProto,
    path: Path,
    model: onnx.ModelProto,
    node_names: dict[str, Path],
    produced: dict[str, Path],
) -> None:
    """Append ``model``'s nodes to ``graph``: node names and produced values must be new."""
    for node in model.graph.node:
        if node.name:
            if node.name in node_names:
                raise InvalidGraph(
                    f"node name {node.name!r} is in {str(node_names[node.name])!r} and {str(path)!r}; "
                    "generate the models with different ep.context_node_name_prefix values"
                )
            node_names[node.name] = path
        for name in node.output:
            if name and name in produced:
                raise InvalidGraph(f"value {name!r} is produced in {str(produced[name])!r} and {str(path)!r}")
            produced[name] = path
        graph.node.append(node)


def _merge_initializers(
    graph: onnx.GraphProto, path: Path, model: onnx.ModelProto, init_names: dict[str, tuple[Path, bytes]]
) -> None:
    """Append ``model``'s initializers to ``graph`` once each; one name, the same bytes."""
    for init in model.graph.initializer:
        data = init.SerializeToString(deterministic=True)
        if init.name in init_names:
            if init_names[init.name][1] != data:
                raise InvalidGraph(
                    f"initializer {init.name!r} differs between {str(init_names[init.name][0])!r} and "
                    f"{str(path)!r}"
                )
            continue
        init_names[init.name] = (path, data)
        graph.initializer.append(init)


def _add_boundary(
    graph: onnx.GraphProto, models: Sequence[tuple[Path, onnx.ModelProto]], produced: dict[str, Path]
) -> None:
    """The merged graph's inputs (read, produced by no model) and outputs (read by no later model)."""
    graph_inputs: dict[str, onnx.ValueInfoProto] = {}
    for _, model in models:
        for vi in model.graph.input:
            if vi.name not in produced and vi.name not in graph_inputs:
                graph_inputs[vi.name] = vi
    graph.input.extend(graph_inputs.values())
    seen: set[str] = set()
    for index, (_, model) in enumerate(models):
        later_reads = {
            name for _, m in models[index + 1 :] for node in m.graph.node for name in node.input if name
        }
        for vi in model.graph.output:
            if vi.name not in later_reads and vi.name not in seen:
                graph.output.append(vi)
                seen.add(vi.name)
