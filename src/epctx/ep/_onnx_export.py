"""A partition as a standalone ONNX model: what compiling EPs hand to a backend's ONNX importer.

``partition_model`` turns a :class:`~epctx.ep._contract.Partition` into an ``onnx.ModelProto`` whose graph
inputs are the partition's inputs, whose outputs are its outputs, whose initializers are its constants and
whose nodes are its nodes (serialized with ``onnx_ir.serde``; subgraphs keep their references to outer values
by name, and every outer value a subgraph reads is an input, an initializer or a node output of the
partition, so they resolve). Values keep the types and shapes the loaded model declares or that shape
inference gave them.

Initializers are embedded by default. ``weights`` places some of them as external data instead, at offsets
the caller chose: :func:`plan_weights_file` lays them out in one file (aligned, in partition order) and
writes it, which is what backends that reference weights by file offset need (OpenVINO's weightless blobs).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx
import onnx_ir as ir

from epctx.ep._contract import Partition
from epctx.ep._partition import ir_nodes, ir_values
from epctx.ep._weights_file import ExternalRef
from epctx.errors import InvalidArgument

__all__ = ["partition_model"]

_PRODUCER = "epctx"


def _initializer_proto(value: ir.Value, ref: ExternalRef | None) -> onnx.TensorProto:
    tensor = value.const_value
    if tensor is None:
        raise InvalidArgument(f"initializer {value.name!r} has no value")
    name = value.name or ""
    if ref is None and not isinstance(tensor, ir.ExternalTensor):
        proto = ir.serde.serialize_tensor(tensor)
        proto.name = name
        return proto
    proto = onnx.TensorProto(
        name=name, data_type=int(tensor.dtype), dims=[int(d) for d in tensor.shape.numpy()]
    )
    if ref is None:  # external in the source model: embed its bytes (the extracted model stands alone)
        if tensor.dtype == ir.DataType.STRING:
            proto = ir.serde.serialize_tensor(ir.Tensor(np.asarray(tensor.numpy()), dtype=tensor.dtype))
            proto.name = name
            return proto
        proto.raw_data = tensor.tobytes()
        return proto
    proto.data_location = onnx.TensorProto.EXTERNAL
    for key, item in (("location", ref.location), ("offset", str(ref.offset)), ("length", str(ref.length))):
        proto.external_data.add(key=key, value=item)
    return proto


def _value_info(value: ir.Value, what: str) -> onnx.ValueInfoProto:
    if not value.name:
        raise InvalidArgument(f"partition {what} has no name: every boundary value must be named")
    return ir.serde.serialize_value(value)


def partition_model(
    partition: Partition,
    *,
    opset_imports: Mapping[str, int] | None = None,
    ir_version: int | None = None,
    weights: Mapping[str, ExternalRef] | None = None,
    graph_name: str | None = None,
) -> onnx.ModelProto:
    """The partition as a standalone ONNX model.

    ``opset_imports`` defaults to the partition's; ``ir_version`` to the lowest the opsets allow (at least 7).
    Initializers named in ``weights`` become external data at the given location and offset (the caller
    writes that file, e.g. with :meth:`WeightsFile.write`); the others are embedded, including those that
    were external in the source model. The partition is not modified."""
    opsets = dict(partition.opset_imports if opset_imports is None else opset_imports)
    opsets.setdefault("", 1)
    refs = weights or {}
    graph = onnx.GraphProto(name=graph_name or partition.name or "partition")
    for value in ir_values(partition.inputs):
        graph.input.append(_value_info(value, f"input {value.name!r}"))
    for value in ir_values(partition.outputs):
        graph.output.append(_value_info(value, f"output {value.name!r}"))
    for value in ir_values(partition.initializers):
        graph.initializer.append(_initializer_proto(value, refs.get(value.name or "")))
    for node in ir_nodes(partition.nodes):
        graph.node.append(ir.serde.serialize_node(node))
    opset_list = [onnx.helper.make_opsetid(domain, version) for domain, version in sorted(opsets.items())]
    if ir_version is None:
        ir_version = max(7, onnx.helper.find_min_ir_version_for(opset_list, True))
    model = onnx.helper.make_model(graph, opset_imports=opset_list, producer_name=_PRODUCER)
    model.ir_version = ir_version
    return model
