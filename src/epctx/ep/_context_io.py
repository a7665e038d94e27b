"""What an EP sees of the context binary: the writer it saves a partition into and the reader it loads from.

The framework implements both (``epctx.epcontext.store``) over the context binary container; EPs depend only
on these protocols. Entries are named ``<graph_name>/<key>``: each partition has its own keys.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

__all__ = ["BinaryFile", "BinaryLayout", "ContextReader", "ContextWriter", "EntryLocation"]


class EntryLocation(Protocol):
    """Where an entry lies in the binary, its kind and attributes (no payload is read)."""

    @property
    def offset(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def kind(self) -> str: ...
    @property
    def attrs(self) -> Mapping[str, str]: ...


class BinaryLayout(Protocol):
    """The binary being written (shared by the models of a sharing group): what lies at which offset."""

    def requests(self, start: int = 0) -> list[tuple[int, memoryview]]:
        """(requested absolute offset, payload) of the entries added with ``offset=``, in the order added."""
        ...

    def entry_count(self) -> int: ...


class BinaryFile(Protocol):
    """The binary an EP loads from: ``path`` of its file (None in memory), ``where`` names it in errors."""

    @property
    def path(self) -> str | None: ...
    @property
    def where(self) -> str: ...
    def open_file(self) -> int | None:
        """A read-only descriptor of the mapped file (the caller closes it), or None."""
        ...


class ContextWriter(Protocol):
    """Generation side (``ExecutionProvider.save_partition``)."""

    @property
    def graph_name(self) -> str: ...
    @property
    def writer(self) -> BinaryLayout: ...
    def add(
        self,
        key: str,
        data: Any,
        *,
        kind: str = "graph",
        attrs: Mapping[str, str] | None = None,
        offset: int | None = None,
    ) -> None:
        """Store ``data`` (bytes-like or a C-contiguous array, referenced until written) under ``key``;
        ``offset`` asks for an absolute offset in the binary's file."""
        ...


class ContextReader(Protocol):
    """Load side (``ExecutionProvider.load_partition``): one graph's entries, verified on first read, never
    copied."""

    @property
    def graph_name(self) -> str: ...
    @property
    def binary(self) -> BinaryFile: ...
    def __contains__(self, key: object) -> bool: ...
    def keys(self) -> Iterable[str]: ...
    def read(self, key: str) -> memoryview: ...
    def array(self, key: str, dtype: Any, shape: Iterable[int] | None = None) -> Any: ...
    def attrs(self, key: str) -> Mapping[str, str]: ...
    def entry(self, key: str) -> EntryLocation: ...
