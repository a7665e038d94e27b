"""IREE parameters served from memory that is already there: a ``ParameterIndex`` whose entries point into the
memory-mapped context binary (or, right after a compile, into the model's own initializer arrays). Nothing is
copied into Python and no file is written: ``FileHandle.wrap_memory`` wraps the read-only mapping once and each
parameter is an (offset, length) in it, so every session that loads from one binary reads the same pages."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable
from typing import Any

import numpy as np

from epctx.ep import byte_view, mapped_file
from epctx.providers.iree.runtime_import import iree_runtime

__all__ = ["Parameters"]

SCOPE = "model"
# id(mapping) -> its _Mapping while any session holds one. Keyed by id, not by the mapping: a _Mapping holds a
# view of its mapping, so a weak key would never expire (every session's file and mapping kept to the end of the
# process). An id is unambiguous here: a live _Mapping keeps its mapping, hence the id, alive.
_HANDLES: weakref.WeakValueDictionary[int, _Mapping] = weakref.WeakValueDictionary()
_HANDLES_LOCK = threading.Lock()


def _address(buffer: Any) -> int:
    return int(np.frombuffer(buffer, np.uint8).ctypes.data) if memoryview(buffer).nbytes else 0


class _Mapping:
    """One ``FileHandle`` over a whole read-only mapping, shared by the sessions using the mapping while any
    does."""

    def __init__(self, owner: Any) -> None:
        rt = iree_runtime()

        self.view = memoryview(owner).toreadonly()
        self.base = _address(self.view)
        self.handle = rt.FileHandle.wrap_memory(self.view, readable=True, writable=False)


def _mapping_of(view: memoryview) -> _Mapping | None:
    owner = mapped_file(view)
    if owner is None:
        return None
    with _HANDLES_LOCK:
        found = _HANDLES.get(id(owner))
        if found is None:
            found = _HANDLES[id(owner)] = _Mapping(owner)
        return found


class Parameters:
    """The parameters of one module: IREE parameter key -> bytes (views, never copies)."""

    def __init__(self, entries: Iterable[tuple[str, Any]]) -> None:
        rt = iree_runtime()

        self.index = rt.ParameterIndex()
        self._keep: list[Any] = []
        for key, data in entries:
            view = byte_view(data, f"IREE parameter {key!r}")
            mapping = _mapping_of(view)
            if mapping is not None:
                offset = _address(view) - mapping.base
                self.index.add_from_file_handle(key, mapping.handle, view.nbytes, offset)
                self._keep.append(mapping)
            else:  # an embedded context's bytes, or a compiled model's arrays: wrapped where they are
                handle = rt.FileHandle.wrap_memory(view, readable=True, writable=False)
                self.index.add_from_file_handle(key, handle, view.nbytes, 0)
                self._keep.append((view, handle))

    def provider(self) -> Any:
        return self.index.create_provider(scope=SCOPE)
