"""External weights files: one file holding a partition's initializers at aligned offsets (what backends that
reference weights by file offset need, e.g. OpenVINO's weightless blobs). Imports neither onnx nor onnx-ir,
so an EP that reads such a file back at load time stays off them."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from epctx.errors import Fail, InvalidArgument

if TYPE_CHECKING:
    import onnx_ir as ir

__all__ = ["ExternalRef", "WeightsFile", "initializer_array", "plan_weights_file"]

_STRING = 8  # ONNX's STRING element type (onnx-ir's DataType.STRING)


@dataclasses.dataclass(frozen=True, slots=True)
class ExternalRef:
    """Where an initializer's bytes are: ``length`` bytes at ``offset`` in ``location`` (ONNX external data)."""

    location: str
    offset: int
    length: int


@dataclasses.dataclass(frozen=True, slots=True)
class WeightsFile:
    """A planned external data file: each initializer at an aligned offset, zeros between them."""

    location: str
    refs: Mapping[str, ExternalRef]  # initializer name -> where it is in the file
    arrays: tuple[tuple[str, int, np.ndarray], ...]  # (name, offset, C-contiguous array), in file order
    size: int

    def chunks(self) -> Iterator[memoryview]:
        """The file's bytes in order (padding included), without copying the arrays."""
        position = 0
        for _, offset, array in self.arrays:
            if offset > position:
                yield memoryview(bytes(offset - position))
            yield memoryview(array.reshape(-1).view(np.uint8))  # type: ignore[arg-type]
            position = offset + array.nbytes
        if self.size > position:
            yield memoryview(bytes(self.size - position))

    def write(self, folder: str | os.PathLike[str]) -> str:
        """Write the file as ``folder/location``; returns its path."""
        path = os.path.join(os.fspath(folder), self.location)
        try:
            with open(path, "wb") as fh:
                for chunk in self.chunks():
                    fh.write(chunk)
        except OSError as exc:
            raise Fail(f"cannot write the weights file {path!r}: {exc}") from exc
        return path


def _align(value: int, alignment: int) -> int:
    return (value + alignment - 1) // alignment * alignment


def initializer_array(tensor: ir.TensorProtocol) -> np.ndarray | None:
    """The tensor's payload as a C-contiguous array, as ONNX stores it (raw little-endian bytes for packed
    sub-byte types), not copied when it already is one; None for string tensors."""
    if tensor.dtype == _STRING:
        return None
    array = np.asarray(tensor.numpy())
    if array.dtype == object:
        return None
    if tensor.dtype.bitwidth < 8:  # packed 4-bit / 2-bit types: numpy holds them unpacked
        return np.frombuffer(tensor.tobytes(), np.uint8)
    return np.ascontiguousarray(array)


def plan_weights_file(
    initializers: Sequence[ir.Value], *, location: str, alignment: int = 64, min_size: int = 0
) -> WeightsFile:
    """Lay the initializers (at least ``min_size`` bytes, not strings) out in one external data file."""
    if alignment < 1 or alignment & (alignment - 1):
        raise InvalidArgument(f"alignment must be a power of two, got {alignment}")
    if not location or os.path.basename(location) != location:
        raise InvalidArgument(f"location must be a plain file name, got {location!r}")
    refs: dict[str, ExternalRef] = {}
    arrays: list[tuple[str, int, np.ndarray]] = []
    cursor = 0
    for value in initializers:
        tensor = value.const_value
        if tensor is None or not value.name or value.name in refs:
            continue
        array = initializer_array(tensor)
        if array is None or array.nbytes < min_size or array.nbytes == 0:
            continue
        offset = _align(cursor, alignment)
        refs[value.name] = ExternalRef(location, offset, array.nbytes)
        arrays.append((value.name, offset, array))
        cursor = offset + array.nbytes
    return WeightsFile(location, refs, tuple(arrays), cursor)
