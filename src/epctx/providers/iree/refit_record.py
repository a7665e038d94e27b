"""What an IREE partition's code depends on, recorded at compile in its ``meta`` (``refit``) so that a refit
(``refit.py``) can tell whether another model's graph is the same: each node's structure digest, each
parameter's type and shape, the digest of each tensor compiled into the code."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import xxhash

from epctx.errors import InvalidGraph

if TYPE_CHECKING:
    import onnx_ir as ir

    from epctx.ep import Partition
    from epctx.providers.iree.compile import CompileResult

__all__ = ["RefitRecord", "node_digest", "record", "tensor_digest"]


@dataclasses.dataclass(frozen=True, slots=True)
class RefitRecord:
    nodes: tuple[tuple[str, str], ...]
    weights: tuple[tuple[str, str, str, tuple[int, ...]], ...]
    inlined: tuple[tuple[str, str], ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "nodes": [list(n) for n in self.nodes],
            "weights": [[k, n, t, list(s)] for k, n, t, s in self.weights],
            "inlined": [list(i) for i in self.inlined],
        }

    @staticmethod
    def from_json(doc: Any, where: str) -> RefitRecord:
        try:
            return RefitRecord(
                nodes=tuple((str(a), str(b)) for a, b in doc["nodes"]),
                weights=tuple(
                    (str(k), str(n), str(t), tuple(int(d) for d in s)) for k, n, t, s in doc["weights"]
                ),
                inlined=tuple((str(a), str(b)) for a, b in doc["inlined"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidGraph(f"{where}: 'meta' field 'refit' is malformed: {exc}") from exc


def _value(value: Any) -> str:
    if value is None:
        return "-"
    shape = value.shape
    dims = "?" if shape is None else ",".join(str(d) for d in shape)
    return f"{value.name}:{value.dtype}[{dims}]"


def _attribute(attr: Any) -> str:
    value = attr.value
    if hasattr(value, "tobytes") and hasattr(value, "dtype"):  # a tensor attribute: its bytes
        return f"{attr.name}=T{value.dtype}{list(value.shape)}:{xxhash.xxh3_64_hexdigest(value.tobytes())}"
    return f"{attr.name}={attr.type}:{value!r}"


def node_digest(node: ir.Node) -> str:
    parts = [node.domain or "", node.op_type]
    parts += sorted(_attribute(a) for a in node.attributes.values())
    parts += ["in"] + [_value(v) for v in node.inputs] + ["out"] + [_value(v) for v in node.outputs]
    return xxhash.xxh3_64_hexdigest("\0".join(parts).encode("utf-8", "surrogatepass"))


def tensor_digest(tensor: Any) -> str:
    return xxhash.xxh3_64_hexdigest(tensor.tobytes())


def record(partition: Partition, result: CompileResult, tensors: Mapping[str, Any]) -> RefitRecord:
    """What the partition's code depends on (``tensors``: the tensors IREE may make parameters of, by name)."""
    params = dict(result.params)  # initializer name -> parameter key
    weights = []
    for name, key in result.params:
        tensor = tensors[name]
        weights.append((key, name, str(tensor.dtype), tuple(int(d) for d in tensor.shape)))
    inlined = [(name, tensor_digest(t)) for name, t in sorted(tensors.items()) if name not in params]
    from epctx.ep import ir_nodes

    nodes = tuple((node.name or "", node_digest(node)) for node in ir_nodes(partition.nodes))
    return RefitRecord(nodes, tuple(weights), tuple(inlined))
