"""What an OpenVINO partition stores in the context binary, and how it is imported back without compiling.

Entries of one graph (``<graph name>/<key>``):

- ``meta`` (JSON, sorted keys): format and version, the device, the runtime properties the model was compiled
  with (precision, streams, threads: given again to ``import_model``), the partition's input and output names
  in order, and in weightless mode the weights layout;
- ``blob``: ``CompiledModel.export_model()``, OpenVINO's own format (its header names the OpenVINO version
  and the CPU ISA, which OpenVINO checks on import);
- weightless mode only: ``weights/<j>``, one entry per distinct tensor, asking the writer for the absolute
  offset the blob references (``weights``); ``meta`` gives each one's offset and size.

Import reads the blob in place: the entry's memory (the memory-mapped ``.bin``, or the ``ep_cache_context``
bytes of an embedded context) is wrapped in an ``ov.Tensor`` without a copy, and OpenVINO's CPU plugin keeps
the constants of a full blob as views of it. OpenVINO only takes writable numpy arrays for shared tensors, so
the read-only view is re-wrapped by address: OpenVINO never writes into an imported blob.

Weightless import: see ``weights``; OpenVINO maps the weights from the binary's own file when they sit at the
offsets the blob references.
"""

from __future__ import annotations

import ctypes
import io
import mmap
import os
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any, BinaryIO

import numpy as np

from epctx.ep import ContextWriter, SourceFile, WeightsFile, dump_document, load_document
from epctx.errors import InvalidGraph

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "CONFIG_ALLOWED",
    "BlobMeta",
    "read_meta",
    "exported_blob",
    "shared_tensor",
    "write_entries",
]

FORMAT = "epctx.openvino"
FORMAT_VERSION = 1
SOURCE_VERSION = 2  # meta with 'source' (weights in the source's data file; older epctx refuses it)


class BlobMeta:
    """The parsed ``meta`` entry."""

    __slots__ = ("config", "device", "inputs", "outputs", "source", "weights", "weights_size")

    def __init__(
        self,
        *,
        device: str,
        config: Mapping[str, Any],
        inputs: Sequence[str],
        outputs: Sequence[str],
        weights: Sequence[tuple[str, int, int]] = (),
        weights_size: int = 0,
        source: SourceFile | None = None,
    ) -> None:
        self.source = source  # EXTERNAL_ONLY: the source's data file the blob references (source_weights.py)
        self.device = device
        self.config = dict(config)
        self.inputs = tuple(inputs)
        self.outputs = tuple(outputs)
        self.weights = tuple(weights)  # (entry key, offset in the weights file, size)
        self.weights_size = weights_size

    def to_json(self) -> bytes:
        doc = {
            "device": self.device,
            "config": self.config,
            "inputs": list(self.inputs),
            "outputs": list(self.outputs),
            "weights": [{"key": k, "offset": o, "size": s} for k, o, s in self.weights],
            "weights_size": self.weights_size,
        }
        if self.source is None:
            return dump_document(doc, format=FORMAT, version=FORMAT_VERSION)
        doc["source"] = self.source.to_json()
        return dump_document(doc, format=FORMAT, version=SOURCE_VERSION)


def _strs(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise TypeError(f"expected a list of strings, found {value!r}")
    return tuple(value)


def _count(value: Any) -> int:
    if type(value) is not int or value < 0:
        raise TypeError(f"expected a non-negative integer, found {value!r}")
    return value


# The OpenVINO properties a binary may carry to ``import_model``: exactly those ``OpenVINOOptions.runtime_config``
# records (what the blob computes with), each with the values epctx writes. Anything else is refused, not
# ignored: OpenVINO acts on what it is given (``CACHE_DIR`` creates folders and writes blobs there,
# ``WEIGHTS_PATH`` / ``CACHE_MODE`` pick the file weights are mapped from, ``ENABLE_MMAP``, hints, device
# properties...), none of it is metadata, and epctx never writes another key, so a binary that has one was
# not made by epctx as it stands (crafted, or written by a release with other semantics): InvalidGraph naming
# the key. Properties epctx sets at import itself (``CACHE_MODE`` and ``WEIGHTS_PATH`` for weightless blobs)
# come from the meta's weights layout, never from its config.
_PRECISIONS = ("f32", "f16", "bf16")


def _positive(value: Any) -> bool:
    return type(value) is int and value > 0


CONFIG_ALLOWED: Mapping[str, Any] = {
    "INFERENCE_PRECISION_HINT": lambda value: value in _PRECISIONS,
    "NUM_STREAMS": _positive,
    "INFERENCE_NUM_THREADS": _positive,
}


def _check_config(config: Any, where: str) -> dict[str, Any]:
    if not isinstance(config, dict):
        raise InvalidGraph(f"{where}: malformed 'meta': config must be an object, found {config!r}")
    for key, value in config.items():
        check = CONFIG_ALLOWED.get(key)
        if check is None:
            raise InvalidGraph(
                f"{where}: 'meta' config has OpenVINO property {key!r}, which a context binary may not set "
                f"(allowed: {sorted(CONFIG_ALLOWED)})"
            )
        if not check(value):
            raise InvalidGraph(f"{where}: 'meta' config: {key!r} = {value!r} is not a value epctx writes")
    return dict(config)


def read_meta(data: memoryview, where: str) -> BlobMeta:
    """Parse and check ``meta``; anything malformed, or an OpenVINO property outside ``CONFIG_ALLOWED``, is
    InvalidGraph naming ``where``."""
    version = SOURCE_VERSION if b'"source"' in bytes(data) else FORMAT_VERSION
    doc = load_document(data, format=FORMAT, version=version, where=f"{where}: 'meta'")
    source = SourceFile.from_json(doc["source"], where) if "source" in doc else None
    config = _check_config(doc.get("config"), where)
    try:
        weights = []
        for item in doc["weights"]:
            key = item["key"]
            if not isinstance(key, str) or not key.startswith("weights/"):
                raise TypeError(f"weights key {key!r} is not a weights entry")
            weights.append((key, _count(item["offset"]), _count(item["size"])))
        size = _count(doc["weights_size"])
        if any(offset + length > size for _, offset, length in weights):
            raise TypeError(f"a weight lies past the end of the {size}-byte weights file")
        device = doc["device"]
        if not isinstance(device, str):
            raise TypeError(f"device must be a string, found {device!r}")
        return BlobMeta(
            device=device,
            config=config,
            inputs=_strs(doc["inputs"]),
            outputs=_strs(doc["outputs"]),
            weights=weights,
            weights_size=size,
            source=source,
        )
    except (KeyError, TypeError) as exc:
        raise InvalidGraph(f"{where}: malformed 'meta': {exc!r}") from exc


def write_entries(
    store: ContextWriter,
    *,
    blob: bytes | memoryview,
    device: str,
    config: Mapping[str, Any],
    inputs: Sequence[str],
    outputs: Sequence[str],
    weights: WeightsFile | None,
    source: SourceFile | None = None,
) -> None:
    entries: list[tuple[str, int, int]] = []
    if weights is not None:
        for j, (_, offset, array) in enumerate(weights.arrays):
            key = f"weights/{j}"
            data = array.reshape(-1).view(np.uint8)
            store.add(key, data, kind="weights", attrs={"offset": str(offset)}, offset=offset)
            entries.append((key, offset, array.nbytes))
    meta = BlobMeta(
        device=device,
        config=config,
        inputs=inputs,
        outputs=outputs,
        weights=entries,
        weights_size=weights.size if weights is not None else 0,
        source=source,
    )
    store.add("meta", meta.to_json(), kind="metadata")
    store.add("blob", blob, kind="graph")


class _FileSink(io.BytesIO):
    """What ``CompiledModel.export_model(stream)`` writes into (it takes only ``io.BytesIO``, and calls its
    ``write`` piece by piece): the pieces go straight to a file, so the blob is never whole in memory."""

    def __init__(self, fh: BinaryIO) -> None:
        super().__init__()
        self._fh = fh

    def write(self, data: Any) -> int:
        return self._fh.write(data)

    def flush(self) -> None:
        self._fh.flush()

    def seek(self, offset: int, whence: int = 0) -> int:  # the serializer patches sizes it wrote earlier
        return self._fh.seek(offset, whence)

    def tell(self) -> int:
        return self._fh.tell()


def exported_blob(compiled_model: Any) -> memoryview:
    """``compiled_model.export_model()`` as a read-only view of a memory-mapped anonymous temporary file.

    ``export_model()`` returns the blob in memory (as large as the weights in ``weightless=0`` mode, on top of
    the source weights and the compiled model); written through :class:`_FileSink` it streams to the file as
    OpenVINO's own cache does, and the context binary writer reads the mapping in chunks, dropping each from
    memory once written (``container.release_pages``). The mapping lives as long as the view."""
    with tempfile.TemporaryFile(prefix="epctx-ov-blob-") as fh:
        compiled_model.export_model(_FileSink(fh))
        fh.flush()
        size = os.fstat(fh.fileno()).st_size
        if size == 0:
            raise InvalidGraph("OpenVINO exported an empty blob")
        return memoryview(mmap.mmap(fh.fileno(), size, access=mmap.ACCESS_READ))


def shared_tensor(view: memoryview) -> tuple[Any, np.ndarray]:
    """An ``ov.Tensor`` (u8) over ``view``'s memory, not copied; returns it and the array it wraps."""
    import openvino as ov

    if view.nbytes == 0:
        raise InvalidGraph("the OpenVINO blob is empty")
    address = np.frombuffer(view, np.uint8).ctypes.data
    array = np.ctypeslib.as_array((ctypes.c_uint8 * view.nbytes).from_address(address))
    return ov.Tensor(array, shared_memory=True), array
