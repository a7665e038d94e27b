"""What an EP sees of the context binary: one partition's entries, scoped by its graph name."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from epctx.epcontext.container import ContextBinary, ContextBinaryWriter, EntryInfo

__all__ = ["ContextSource", "ContextStore"]


class ContextStore:
    """Generation side: ``add(key, data)`` stores an entry named ``<graph_name>/<key>`` in the EP's binary."""

    def __init__(self, writer: ContextBinaryWriter, graph_name: str) -> None:
        self._writer = writer
        self.graph_name = graph_name

    def add(
        self,
        key: str,
        data: Any,
        *,
        kind: str = "graph",
        attrs: Mapping[str, str] | None = None,
        offset: int | None = None,
    ) -> None:
        """``offset``: the absolute offset asked for in the binary's file (``ContextBinaryWriter.add``)."""
        self._writer.add(f"{self.graph_name}/{key}", data, kind=kind, attrs=attrs, offset=offset)


class ContextSource:
    """Load side: the entries of one graph in an opened binary (verified on first read, never copied).
    ``binary.path`` / ``binary.open_file()`` give the file a file-backed binary was mapped from."""

    def __init__(self, binary: ContextBinary, graph_name: str) -> None:
        self.binary = binary
        self.graph_name = graph_name

    def _name(self, key: str) -> str:
        return f"{self.graph_name}/{key}"

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self._name(key) in self.binary

    def keys(self) -> Iterable[str]:
        prefix = f"{self.graph_name}/"
        return [n[len(prefix) :] for n in self.binary.names() if n.startswith(prefix)]

    def read(self, key: str) -> memoryview:
        return self.binary.read(self._name(key))

    def array(self, key: str, dtype: Any, shape: Iterable[int] | None = None) -> np.ndarray:
        return self.binary.array(self._name(key), dtype, shape)

    def attrs(self, key: str) -> Mapping[str, str]:
        return self.binary.entry(self._name(key)).attrs

    def entry(self, key: str) -> EntryInfo:
        """Where the entry lies in the binary (offset, size), its kind and attributes; reads no payload."""
        return self.binary.entry(self._name(key))
