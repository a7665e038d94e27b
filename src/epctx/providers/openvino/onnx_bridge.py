"""How a partition reaches OpenVINO's ONNX reader, without copying its weights.

In memory: OpenVINO's ONNX frontend copies every constant it reads from memory (the external-data location
``*/_ORT_MEM_ADDR_/*`` with the address of the bytes as the offset, the convention ONNX Runtime's OpenVINO EP
uses), which doubled the weights in memory at every compile and capability query. So the large floating-point
initializers (``shared_weights``) reach the frontend as graph inputs instead, and each of those ``Parameter``
operations is then replaced by an ``ov.op.Constant`` that shares the initializer's array
(:func:`bind_weights`): OpenVINO reads the weights in place, as it reads an external data file it maps
itself; only the compiler's own repacked copy is added. The other initializers (small ones, integer and
quantized tensors, whose values the frontend may need while translating) still go through
``_ORT_MEM_ADDR_``. The arrays must stay alive while OpenVINO may read them: callers keep the returned list.

Weightless: OpenVINO's weightless blobs record, for each constant, its offset in the external data file the
model was read from; on import they read the constants from a weights file at those offsets. So the model is
written to a temporary folder with every initializer at its planned offset (``weights.WeightsLayout``: the
offset it will have in the context binary) of a sparse weights file, and read from there.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import tempfile
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

from epctx.ep import ExternalRef, Partition, WeightsFile, initializer_array, ir_nodes, partition_model
from epctx.providers.openvino.weights import write_sparse

__all__ = ["MEMORY_LOCATION", "bind_weights", "in_memory_model", "read_partition", "weightless_model_folder"]

MEMORY_LOCATION = "*/_ORT_MEM_ADDR_/*"
# Initializers OpenVINO reads in place (as graph inputs, bound to shared constants): floating-point tensors
# of at least this many bytes. Smaller ones, and integer or quantized tensors (shapes, indices, packed
# weights the frontend may need to see as constants while translating), are copied by the frontend.
_SHARED_DTYPES = frozenset({ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.DOUBLE})
_SHARED_MIN_BYTES = 1 << 16


def in_memory_model(partition: Partition) -> tuple[bytes, list[np.ndarray], dict[str, np.ndarray]]:
    """The partition as ONNX bytes: the large floating-point initializers are graph inputs (returned by name,
    for :func:`bind_weights`), the others point at their arrays in memory. Returns the bytes, the arrays to
    keep alive and the shared weights."""
    refs: dict[str, ExternalRef] = {}
    keep: list[np.ndarray] = []
    shared: dict[str, np.ndarray] = {}
    inputs = {v.name for v in partition.inputs}
    for value in partition.initializers:
        tensor = value.const_value
        if tensor is None or not value.name:
            continue
        array = initializer_array(tensor)
        if array is None or array.nbytes == 0:
            continue
        keep.append(array)
        refs[value.name] = ExternalRef(MEMORY_LOCATION, int(array.ctypes.data), int(array.nbytes))
        if (
            tensor.dtype in _SHARED_DTYPES
            and array.nbytes >= _SHARED_MIN_BYTES
            and value.name not in inputs
            and value.name not in shared
        ):
            shared[value.name] = array
    model = partition_model(partition, weights=refs)
    _constant_inputs(model, partition)
    if shared:
        _as_inputs(model, shared)
    return model.SerializeToString(), keep, shared


def _constant_inputs(model: onnx.ModelProto, partition: Partition) -> None:
    """Partition inputs made by a ``Constant`` node outside the partition (in another partition, or run by
    another EP) become that ``Constant`` again in the extracted model: OpenVINO then knows their values (axes,
    shapes) instead of reading a Parameter of unknown content, which leaves ranks dynamic and makes its CPU
    plugin refuse the partition (e.g. an Unsqueeze whose axes come from a Constant grouped elsewhere). The
    compiled model does not read them: ``CompiledOpenVINO`` feeds only the inputs it has."""
    constants = {}
    for value in partition.inputs:
        producer = value.producer()
        if producer is not None and producer.op_type == "Constant" and producer.domain in ("", "ai.onnx"):
            constants[value.name] = producer
    if not constants:
        return
    graph = model.graph
    kept = [v for v in graph.input if v.name not in constants]
    del graph.input[:]
    graph.input.extend(kept)
    nodes = [ir.serde.serialize_node(node) for node in ir_nodes(list(constants.values()))] + list(graph.node)
    del graph.node[:]
    graph.node.extend(nodes)


def _as_inputs(model: onnx.ModelProto, shared: Mapping[str, np.ndarray]) -> None:
    """Turn the initializers named in ``shared`` into graph inputs of the same type and shape."""
    graph = model.graph
    kept = [t for t in graph.initializer if t.name not in shared]
    moved = [t for t in graph.initializer if t.name in shared]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    for tensor in moved:
        graph.input.append(
            onnx.helper.make_tensor_value_info(tensor.name, tensor.data_type, list(tensor.dims))
        )


def _writable_view(array: np.ndarray) -> np.ndarray:
    """``array``'s memory as a writable array (OpenVINO only shares writable numpy arrays; it never writes
    into a constant): re-wrapped by address, so the original (read-only, memory-mapped) array must stay alive."""
    if array.flags.writeable:
        return array
    raw = np.ctypeslib.as_array((ctypes.c_uint8 * array.nbytes).from_address(array.ctypes.data))
    return raw.view(array.dtype).reshape(array.shape)


def bind_weights(ov_model: Any, shared: Mapping[str, np.ndarray]) -> Any:
    """Replace each ``Parameter`` of ``ov_model`` named in ``shared`` by a constant sharing the array's memory
    (no copy); returns the model. Parameters the frontend dropped (unused initializers) are skipped."""
    if not shared:
        return ov_model
    import openvino as ov

    for parameter in list(ov_model.get_parameters()):
        output = parameter.output(0)
        names = output.get_names() | {parameter.get_friendly_name()}
        name = next((n for n in names if n in shared), None)
        if name is None:
            continue
        constant = ov.op.Constant(ov.Tensor(_writable_view(shared[name]), shared_memory=True))
        constant.set_friendly_name(parameter.get_friendly_name())
        constant.output(0).set_names(output.get_names())
        output.replace(constant.output(0))
        ov_model.remove_parameter(parameter)  # same type and shape: nothing downstream changes
    return ov_model


def read_partition(core: Any, partition: Partition) -> tuple[Any, list[np.ndarray]]:
    """``Core.read_model`` of the partition, its weights read in place; returns the model and the arrays to keep
    alive while OpenVINO may read them."""
    data, keep, shared = in_memory_model(partition)
    return bind_weights(core.read_model(data), shared), keep


@contextlib.contextmanager
def weightless_model_folder(partition: Partition, plan: WeightsFile) -> Iterator[str]:
    """A temporary folder holding ``model.onnx`` and its weights file laid out as ``plan``; yields the model's
    path. The folder is removed on exit (OpenVINO keeps its own mapping of what it read)."""
    model = partition_model(partition, weights=plan.refs)
    _constant_inputs(model, partition)
    with tempfile.TemporaryDirectory(prefix="epctx-ov-", ignore_cleanup_errors=True) as folder:
        write_sparse(plan, folder)
        path = os.path.join(folder, "model.onnx")
        with open(path, "wb") as fh:
            fh.write(model.SerializeToString())
        yield path
