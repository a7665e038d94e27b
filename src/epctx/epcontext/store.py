"""What an EP sees of the context binary: one partition's entries, scoped by its graph name."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from epctx.epcontext.container import ContextBinary, EntryInfo

if TYPE_CHECKING:
    from epctx.epcontext.writer import ContextBinaryWriter  # generation only: not imported by loading

__all__ = ["ContextSource", "ContextStore"]


class ContextStore:
    """Generation side: ``add(key, data)`` stores an entry named ``<graph_name>/<key>`` in the EP's binary."""

    def __init__(self, writer: ContextBinaryWriter, graph_name: str) -> None:
        self._writer = writer
        self.graph_name = graph_name
        self.names: list[str] = []  # entry names added through this store, in order

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
        name = f"{self.graph_name}/{key}"
        self._writer.add(name, data, kind=kind, attrs=attrs, offset=offset)
        self.names.append(name)

    @property
    def writer(self) -> ContextBinaryWriter:
        """The binary these entries go to (shared by the models of a sharing group): an EP that lays payloads
        out at absolute offsets asks it what lies where (``ContextBinaryWriter.requests``)."""
        return self._writer


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
        """The graph's keys in the order written (empty when the binary holds no such graph); O(log n + k)
        over the binary's sorted index, so looking up every graph of a binary stays linear in its entries."""
        prefix = f"{self.graph_name}/"
        return [n[len(prefix) :] for n in self.binary.names(prefix)]

    def read(self, key: str) -> memoryview:
        return self.binary.read(self._name(key))

    def array(self, key: str, dtype: Any, shape: Iterable[int] | None = None) -> np.ndarray:
        return self.binary.array(self._name(key), dtype, shape)

    def attrs(self, key: str) -> Mapping[str, str]:
        return self.binary.entry(self._name(key)).attrs

    def entry(self, key: str) -> EntryInfo:
        """Where the entry lies in the binary (offset, size), its kind and attributes; reads no payload."""
        return self.binary.entry(self._name(key))
