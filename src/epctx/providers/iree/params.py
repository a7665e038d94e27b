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
_HANDLES: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
_HANDLES_LOCK = threading.Lock()


def _address(buffer: Any) -> int:
    return int(np.frombuffer(buffer, np.uint8).ctypes.data) if memoryview(buffer).nbytes else 0


class _Mapping:
    """One ``FileHandle`` over a whole read-only mapping (weakly cached per mapping)."""

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
        found = _HANDLES.get(owner)
        if found is None:
            try:
                found = _HANDLES[owner] = _Mapping(owner)
            except TypeError:  # an object without weak references: not cached
                return _Mapping(owner)
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
