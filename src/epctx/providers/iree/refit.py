"""Refit: an IREE module does not hold its weights (they are parameters), so the module compiled for one model
serves another with the same graph and shapes and other weights (a fine-tune), without compiling.

At compile, each partition records in its ``meta`` (``refit``) what the code depends on:

- ``nodes``: each node's name and a digest of its structure (op, domain, attributes, value names, and the type
  and shape of every value it reads or writes);
- ``weights``: (IREE parameter key, initializer name, element type, shape) of each parameter;
- ``inlined``: the digest of each tensor IREE compiled into the code (under
  ``node_rewrites.PARAMETER_MIN_ELEMENTS`` elements), which a refit cannot change.

A refit (``epctx.refit_context``) claims, in the new model, the nodes of each recorded partition as one group, after checking
each one: a node missing or changed, a parameter of another type or shape, an inlined tensor with other values
is InvalidGraph naming it. The module is handed to ``compile`` as the partition's compile result.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from epctx.errors import InvalidGraph
from epctx.providers.iree.refit_record import RefitRecord, node_digest, tensor_digest

if TYPE_CHECKING:
    import onnx_ir as ir

    from epctx.ep import ContextReader, Partition
    from epctx.providers.iree.compile import CompileResult

__all__ = ["Refits", "claim"]


@dataclasses.dataclass(frozen=True, slots=True)
class Refits:
    """The capability's artefacts in a refit: node set -> (input names, output names, the recorded module)."""

    found: Mapping[frozenset[ir.Node], tuple[tuple[str, ...], tuple[str, ...], CompileResult]]

    def result_for(self, partition: Partition) -> CompileResult:
        from epctx.ep import ir_nodes

        entry = self.found.get(frozenset(ir_nodes(partition.nodes)))
        names = ([v.name for v in partition.inputs], [v.name for v in partition.outputs])
        if entry is None or (list(entry[0]), list(entry[1])) != names:
            raise InvalidGraph(
                f"refit: partition {partition.name!r} of the new model ({len(partition.nodes)} nodes, inputs "
                f"{names[0]}, outputs {names[1]}) matches no graph of the context: the graphs differ"
            )
        return entry[2]


def _tensors_by_name(graph: ir.Graph, nodes: Iterable[ir.Node]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for node in nodes:
        value = node.attributes.get("value")
        if node.op_type == "Constant" and value is not None and len(node.outputs) == 1:
            found[node.outputs[0].name or ""] = value.value
    found.update((name, v.const_value) for name, v in graph.initializers.items() if v.const_value is not None)
    return found


def _check_weights(rec: RefitRecord, tensors: Mapping[str, Any], where: str) -> None:
    for key, name, dtype, shape in rec.weights:
        tensor = tensors.get(name)
        if tensor is None:
            raise InvalidGraph(f"{where}: the new model has no initializer {name!r} (parameter {key!r})")
        found = (str(tensor.dtype), tuple(int(d) for d in tensor.shape))
        if found != (dtype, shape):
            raise InvalidGraph(
                f"{where}: initializer {name!r} is {dtype}{list(shape)} in the context, {found[0]}{list(found[1])} "
                "in the new model: a shape or type change needs a compile"
            )
    for name, digest in rec.inlined:
        tensor = tensors.get(name)
        if tensor is None or tensor_digest(tensor) != digest:
            raise InvalidGraph(
                f"{where}: {name!r} is compiled into the code (IREE inlines small tensors) and differs in the new "
                "model: refit cannot change it, compile the model instead"
            )


def claim(
    graph: ir.Graph, readers: Sequence[ContextReader], ep_name: str
) -> tuple[list[list[ir.Node]], Refits]:
    """The nodes of the new ``graph`` each of the context's graphs was compiled from (one group per graph, each
    node checked), and their code."""
    from epctx.providers.iree.compile import CompileResult
    from epctx.providers.iree.context import read_meta

    by_name = {node.name: node for node in graph if node.name}
    groups: list[list[ir.Node]] = []
    found = {}
    for reader in readers:
        where = f"refit: {ep_name} graph {reader.graph_name!r}"
        meta = read_meta(reader, where)
        if meta.refit is None:
            raise InvalidGraph(f"{where}: the context records no refit information (made by an older epctx)")
        nodes = []
        for name, digest in meta.refit.nodes:
            node = by_name.get(name)
            if node is None:
                raise InvalidGraph(f"{where}: node {name!r} of the compiled graph is not in the new model")
            if node_digest(node) != digest:
                raise InvalidGraph(
                    f"{where}: node {name!r} ({node.op_type}) differs from the compiled one (its attributes, "
                    "inputs, outputs, or their types or shapes)"
                )
            nodes.append(node)
        _check_weights(meta.refit, _tensors_by_name(graph, nodes), where)
        params = tuple((name, key) for key, name, _, _ in meta.refit.weights)
        layouts = {
            name: tuple(meta.transposed[key])
            for key, name, _, _ in meta.refit.weights
            if key in meta.transposed
        }
        result = CompileResult(True, vmfb=reader.read("module"), params=params, transposed=layouts)  # type: ignore[arg-type]
        found[frozenset(nodes)] = (meta.inputs, meta.outputs, result)
        groups.append(nodes)
    return groups, Refits(found)
