"""How a partition reaches OpenVINO's ONNX reader, without copying its weights.

In memory: the extracted model references each initializer with the external-data location
``*/_ORT_MEM_ADDR_/*`` and the address of its bytes as the offset (the convention ONNX Runtime's OpenVINO EP
uses; OpenVINO's ONNX frontend reads the tensor straight from that memory). The arrays must stay alive while
OpenVINO may read them: callers keep the returned list.

Weightless: OpenVINO's weightless blobs record, for each constant, its offset in the external data file the
model was read from; on import they read the constants from a weights file at those offsets. So the model is
written to a temporary folder with every initializer at its planned offset (``weights.WeightsLayout``: the
offset it will have in the context binary) of a sparse weights file, and read from there.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator

import numpy as np

from epctx.partition.extract import ExternalRef, WeightsFile, initializer_array, partition_model
from epctx.providers.base import Partition
from epctx.providers.openvino.weights import write_sparse

__all__ = ["MEMORY_LOCATION", "in_memory_model", "weightless_model_folder"]

MEMORY_LOCATION = "*/_ORT_MEM_ADDR_/*"


def in_memory_model(partition: Partition) -> tuple[bytes, list[np.ndarray]]:
    """The partition as ONNX bytes whose initializers point at their arrays in memory; returns the bytes and
    the arrays to keep alive."""
    refs: dict[str, ExternalRef] = {}
    keep: list[np.ndarray] = []
    for value in partition.initializers:
        tensor = value.const_value
        if tensor is None or not value.name:
            continue
        array = initializer_array(tensor)
        if array is None or array.nbytes == 0:
            continue
        keep.append(array)
        refs[value.name] = ExternalRef(MEMORY_LOCATION, int(array.ctypes.data), int(array.nbytes))
    model = partition_model(partition, weights=refs)
    return model.SerializeToString(), keep


@contextlib.contextmanager
def weightless_model_folder(partition: Partition, plan: WeightsFile) -> Iterator[str]:
    """A temporary folder holding ``model.onnx`` and its weights file laid out as ``plan``; yields the model's
    path. The folder is removed on exit (OpenVINO keeps its own mapping of what it read)."""
    model = partition_model(partition, weights=plan.refs)
    with tempfile.TemporaryDirectory(prefix="epctx-ov-", ignore_cleanup_errors=True) as folder:
        write_sparse(plan, folder)
        path = os.path.join(folder, "model.onnx")
        with open(path, "wb") as fh:
            fh.write(model.SerializeToString())
        yield path
