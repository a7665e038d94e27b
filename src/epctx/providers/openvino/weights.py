"""Weightless mode: where each weight lies, from compile time on, and the file OpenVINO maps it from at import.

OpenVINO (2026.4) records, for each constant of a weightless blob, its offset in the external data file the
model was read from, and on import maps the weights from a file path (``WEIGHTS_PATH``) at those offsets,
from offset 0: it takes no base offset and no memory (``hint::model`` / ``MODEL_PTR`` are not read by the CPU
plugin). So the offsets are chosen to be the weights' final absolute offsets in the context binary:

- compile (:class:`WeightsLayout`, one per EP instance, i.e. per session): each distinct tensor (identical
  bytes once, across all the partitions the EP compiles) gets the next 64-byte aligned offset past a header
  budget, and the partition is read from a sparse external data file holding its tensors at those offsets;
- save: each tensor is an entry of the binary that asks the writer for that offset;
- load (:func:`weights_file`): when every weights entry sits at the offset its blob references and the
  binary is a file, the entries are verified (checksums) and OpenVINO maps the binary's own file: no copy.
  It is named by ``/proc/self/fd/<n>`` of a descriptor checked to be the very file the container mapped
  and verified (not one renamed over it since); where ``/proc`` is missing, by its path once checked.
  Otherwise (an embedded context, an offset the writer could not give because the header outgrew its
  budget or another model of a shared binary took it, a binary rewritten by merging) the weights are
  written once into an anonymous in-memory file (``memfd``; a temporary file elsewhere) laid out as at
  compile time, and OpenVINO maps that.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import threading
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np
import xxhash

from epctx.ep import (
    ExternalRef,
    Partition,
    WeightsFile,
    align,
    initializer_array,
    release_pages,
    same_bytes,
)
from epctx.errors import InvalidGraph

if TYPE_CHECKING:
    from epctx.ep import BinaryLayout, ContextReader
    from epctx.providers.openvino.context import BlobMeta

__all__ = ["WEIGHTS_FILE", "WeightsLayout", "header_budget", "layout_for", "weights_file"]

WEIGHTS_FILE = "weights.bin"
ALIGNMENT = 64  # the context binary writer's default alignment
_ENTRY_BUDGET = 512  # header bytes allowed per binary entry: its JSON fields and a name of ~400 bytes
_PAGE = 4096
_WRITE_CHUNK = 8 << 20

logger = logging.getLogger("epctx")


_GROUP_ROOM = 4  # header room for this many times the first model's entries: later models of a sharing group


def header_budget(entries: int) -> int:
    """Where the weights start: room for a context binary header of ``_GROUP_ROOM`` times ``entries`` entries,
    page-aligned. The first model of a sharing group cannot know how many follow, and the header holds every
    model's entries: if it outgrows this room, the writer cannot honor the requested offsets and the group's
    weights are copied at load (correct, slower; logged). The room costs zeros in the binary, partly filled by
    the small entries (blobs, meta)."""
    return align(2 * _PAGE + _ENTRY_BUDGET * _GROUP_ROOM * max(entries, 0), _PAGE)


def _bytes(array: np.ndarray) -> memoryview:
    return memoryview(array.reshape(-1).view(np.uint8))  # type: ignore[arg-type]


class WeightsLayout:
    """Absolute offsets of the weights of every partition an EP compiles weightless, in the binary the blobs
    will be saved in. Identical tensors share one offset; offsets only grow, from ``base``.

    One layout per context binary writer (:func:`layout_for`): the writer of a sharing group is shared by the
    group's models, so a later model's identical tensors take the offset an earlier model's entry asked for,
    and its new ones go past every requested one: each blob references offsets that are the final ones in
    the one binary, and every model of the group maps its weights in place."""

    def __init__(self, base: int) -> None:
        self.base = base
        self._end = base
        self._known: dict[tuple[int, int], list[tuple[memoryview, int]]] = {}
        self._offsets: set[int] = set()
        self._synced = 0  # writer entries already looked at

    def _key(self, data: memoryview) -> tuple[int, int]:
        return (data.nbytes, xxhash.xxh3_64_intdigest(data))

    def sync(self, writer: BinaryLayout) -> WeightsLayout:
        """Take in the offsets the writer's entries asked for since the last sync (another model's weights)."""
        count = writer.entry_count()
        for offset, data in writer.requests(self._synced):
            if offset in self._offsets or not data.nbytes:
                continue
            self._known.setdefault(self._key(data), []).append((data, offset))
            self._offsets.add(offset)
            self._end = max(self._end, offset + data.nbytes)
        self._synced = count
        return self

    def offset_of(self, array: np.ndarray) -> int:
        data = _bytes(array)
        key = self._key(data)
        release_pages(data)  # a memory-mapped source tensor is read again only when written
        for other, offset in self._known.get(key, ()):
            if same_bytes(other, data):
                return offset
        offset = align(self._end, ALIGNMENT)
        self._end = offset + data.nbytes
        self._known.setdefault(key, []).append((data, offset))
        self._offsets.add(offset)
        return offset

    def replan(self, plan: WeightsFile) -> WeightsFile:
        """``plan``'s tensors (the arrays it holds: nothing is read from the model again) at their offsets in
        this layout, in the order they were placed."""
        moved = {offset: self.offset_of(array) for _, offset, array in plan.arrays}
        refs = {n: ExternalRef(r.location, moved[r.offset], r.length) for n, r in plan.refs.items()}
        arrays = sorted(
            ((name, moved[offset], array) for name, offset, array in plan.arrays), key=lambda a: a[1]
        )
        size = max((offset + array.nbytes for _, offset, array in arrays), default=0)
        return WeightsFile(plan.location, refs, tuple(arrays), size)

    def plan(self, partition: Partition) -> WeightsFile:
        """The partition's external data file: its tensors (not strings, not empty) at their offsets."""
        refs: dict[str, ExternalRef] = {}
        arrays: dict[int, tuple[str, int, np.ndarray]] = {}
        for value in partition.initializers:
            tensor = value.const_value
            if tensor is None or not value.name or value.name in refs:
                continue
            array = initializer_array(tensor)
            if array is None or array.nbytes == 0:
                continue
            offset = self.offset_of(array)
            refs[value.name] = ExternalRef(WEIGHTS_FILE, offset, array.nbytes)
            arrays.setdefault(offset, (value.name, offset, array))
        ordered = tuple(arrays[offset] for offset in sorted(arrays))
        size = max((offset + array.nbytes for _, offset, array in ordered), default=0)
        return WeightsFile(WEIGHTS_FILE, refs, ordered, size)


_LAYOUTS: weakref.WeakKeyDictionary[BinaryLayout, WeightsLayout] = weakref.WeakKeyDictionary()
_LAYOUTS_LOCK = threading.Lock()


def layout_for(writer: BinaryLayout, base: int) -> WeightsLayout:
    """The layout of the binary ``writer`` writes (created with ``base`` by its first model), up to date with
    the entries added to it."""
    with _LAYOUTS_LOCK:
        layout = _LAYOUTS.get(writer)
        if layout is None:
            layout = _LAYOUTS[writer] = WeightsLayout(base)
        return layout.sync(writer)


def write_sparse(plan: WeightsFile, folder: str) -> str:
    """Write ``plan`` as ``folder/<location>``: the tensors at their offsets, holes in between."""
    path = os.path.join(folder, plan.location)
    with open(path, "wb") as fh:
        for _, offset, array in plan.arrays:
            fh.seek(offset)
            data = _bytes(array)
            for start in range(0, data.nbytes, _WRITE_CHUNK):
                chunk = data[start : start + _WRITE_CHUNK]
                fh.write(chunk)
                release_pages(chunk)  # a memory-mapped source holds one chunk at a time
        fh.truncate(plan.size)
    return path


# -- load -------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def weights_file(source: ContextReader, meta: BlobMeta) -> Iterator[str]:
    """A path to a file holding the weights of a weightless blob at the offsets it references, for
    ``WEIGHTS_PATH``; valid until exit (OpenVINO keeps its own mapping)."""
    fd = _binary_file(source, meta)
    if fd is not None:
        try:
            yield f"/proc/self/fd/{fd}" if os.path.isdir("/proc/self/fd") else str(source.binary.path)
        finally:
            os.close(fd)
        return
    if source.binary.path is not None:
        logger.info(
            "%s: graph %r: its weights are not at the offsets its blob references; copying %d bytes",
            source.binary.where, source.graph_name, sum(size for _, _, size in meta.weights),
        )  # fmt: skip
    with _copied_weights(source, meta) as path:
        yield path


def _binary_file(source: ContextReader, meta: BlobMeta) -> int | None:
    """A descriptor of the binary's file when OpenVINO can map the weights from it in place, else None.
    Every weights entry is verified first: OpenVINO reads nothing of the file but these entries."""
    if source.binary.path is None:
        return None
    for key, offset, size in meta.weights:
        info = source.entry(key)
        if (info.offset, info.size) != (offset, size):
            return None
    for key, _, _ in meta.weights:
        source.read(key)
    return source.binary.open_file()


@contextlib.contextmanager
def _copied_weights(source: ContextReader, meta: BlobMeta) -> Iterator[str]:
    memfd = getattr(os, "memfd_create", None)
    if memfd is not None and os.path.isdir("/proc/self/fd"):
        fd = memfd("epctx-openvino-weights", getattr(os, "MFD_CLOEXEC", 0))
        try:
            _fill(fd, source, meta)
            yield f"/proc/self/fd/{fd}"
        finally:
            os.close(fd)
        return
    handle, path = tempfile.mkstemp(prefix="epctx-openvino-", suffix=".weights")
    try:
        _fill(handle, source, meta)
        os.close(handle)
        handle = -1
        yield path
    finally:
        if handle >= 0:
            os.close(handle)
        with contextlib.suppress(OSError):
            os.unlink(path)


def _fill(fd: int, source: ContextReader, meta: BlobMeta) -> None:
    os.ftruncate(fd, meta.weights_size)  # sparse: the holes before and between the weights cost nothing
    for key, offset, size in meta.weights:
        _write_at(fd, source.read(key), offset, size, source)


def _write_at(fd: int, data: memoryview, offset: int, size: int, source: ContextReader) -> None:
    if data.nbytes != size:
        raise InvalidGraph(
            f"{source.binary.where}: graph {source.graph_name!r}: a weights entry has {data.nbytes} bytes, "
            f"'meta' says {size}"
        )
    pwrite = getattr(os, "pwrite", None)
    if pwrite is None:  # Windows: no pwrite
        os.lseek(fd, offset, os.SEEK_SET)
    written = 0
    while written < size:
        chunk = data[written:]
        written += pwrite(fd, chunk, offset + written) if pwrite is not None else os.write(fd, chunk)
