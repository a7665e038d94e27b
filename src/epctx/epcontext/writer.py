"""``ContextBinaryWriter``: collects named entries and writes one context binary (deterministic,
deduplicated, atomic); the layout is in ``container.py``."""

from __future__ import annotations

import json
import os
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from epctx.ep._alignment import align
from epctx.ep._memory import byte_view, release_pages
from epctx.epcontext.checksums import CHECKSUM_ALGORITHMS, CHUNK, DEFAULT_CHECKSUM, digest
from epctx.epcontext.files import write_file_atomic
from epctx.epcontext.header import (
    FORMAT_VERSION,
    HEADER_SIZES,
    MAGIC,
    MAX_ALIGNMENT,
    MAX_HEADER_BYTES,
    PREAMBLE,
    str_map,
    valid_alignment,
)
from epctx.epcontext.layout import Slot, deduplicate, place
from epctx.errors import EPCtxError, Fail, InvalidArgument

if TYPE_CHECKING:
    from epctx.epcontext.container import ContextBinary

__all__ = ["ContextBinaryWriter"]


@dataclass(slots=True)
class _Pending:
    name: str
    kind: str
    data: memoryview
    attrs: dict[str, str]
    checksum: str | None  # already known (copied from a verified binary with the same algorithm)
    offset: int | None  # requested absolute offset


class ContextBinaryWriter:
    """Collects named entries and writes them as one context binary (deterministic, deduplicated)."""

    def __init__(
        self,
        *,
        ep_name: str,
        sdk_version: str = "",
        hardware: str = "",
        metadata: Mapping[str, str] | None = None,
        alignment: int = 64,
        checksum: str = DEFAULT_CHECKSUM,
    ) -> None:
        for field, value in (("ep_name", ep_name), ("sdk_version", sdk_version), ("hardware", hardware)):
            if not isinstance(value, str):
                raise InvalidArgument(f"{field} must be a str, got {type(value).__name__}")
        if not ep_name:
            raise InvalidArgument("ep_name must not be empty")
        meta = str_map({} if metadata is None else metadata)
        if meta is None:
            raise InvalidArgument("metadata must map str to str")
        if not valid_alignment(alignment):
            raise InvalidArgument(
                f"alignment must be a power of two up to {MAX_ALIGNMENT}, got {alignment!r}"
            )
        if checksum not in CHECKSUM_ALGORITHMS:
            raise InvalidArgument(f"unknown checksum {checksum!r}; known: {sorted(CHECKSUM_ALGORITHMS)}")
        self._alignment = alignment
        self._checksum = checksum
        self._fields: dict[str, object] = dict(
            alignment=alignment, checksum=checksum, ep_name=ep_name, sdk_version=sdk_version,
            hardware=hardware, metadata=meta,
        )  # fmt: skip
        self._entries: list[_Pending] = []
        self._names: dict[str, _Pending] = {}

    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self._entries)

    def requests(self, start: int = 0) -> list[tuple[int, memoryview]]:
        """(requested offset, payload) of the entries added with ``offset=``, from the ``start``-th entry on, in
        the order added: where a backend that lays data out before the binary exists finds what is (or will
        be) at which offset. Payloads are the views ``add`` keeps, not copies."""
        return [(p.offset, p.data) for p in self._entries[start:] if p.offset is not None]

    def entry_count(self) -> int:
        return len(self._entries)

    def add(
        self,
        name: str,
        data: object,
        *,
        kind: str = "graph",
        attrs: Mapping[str, str] | None = None,
        offset: int | None = None,
    ) -> None:
        """Add an entry. ``data`` (bytes-like or a C-contiguous numpy array) is referenced, not copied: keep it
        unchanged until the binary is written. Duplicate names raise InvalidArgument. ``offset`` asks for the
        payload's absolute offset in the file, given when the layout allows it (see ``layout``); where the
        entry went is its ``EntryInfo.offset`` in the written binary."""
        self._check_name(name)
        if not isinstance(kind, str) or not kind:
            raise InvalidArgument(f"entry {name!r}: kind must be a non-empty str, got {kind!r}")
        attr_map = str_map({} if attrs is None else attrs)
        if attr_map is None:
            raise InvalidArgument(f"entry {name!r}: attrs must map str to str")
        if offset is not None and (type(offset) is not int or offset < 0):
            raise InvalidArgument(f"entry {name!r}: offset must be a non-negative int, got {offset!r}")
        view = byte_view(data, f"entry {name!r}")
        self._entries.append(_Pending(name, kind, view, attr_map, None, offset))
        self._names[name] = self._entries[-1]

    def add_from(self, binary: ContextBinary, names: Iterable[str] | None = None) -> None:
        """Copy entries (all, or ``names``) from an opened binary, verifying them. All or nothing."""
        if isinstance(names, str):
            raise InvalidArgument(f"add_from: names must be a list of entry names, not the str {names!r}")
        chosen = list(binary.names() if names is None else names)
        if len(set(chosen)) != len(chosen):
            raise InvalidArgument("add_from: names repeat")
        for name in chosen:
            self._check_name(name)
        infos = [binary.entry(name) for name in chosen]
        views = [binary.read(name) for name in chosen]
        same_algorithm = binary.checksum_algorithm == self._checksum
        for info, view in zip(infos, views):
            known = info.checksum if same_algorithm else None
            self._entries.append(_Pending(info.name, info.kind, view, dict(info.attrs), known, None))
            self._names[info.name] = self._entries[-1]

    @property
    def checksum_algorithm(self) -> str:
        return self._checksum

    def entry_rows(
        self, names: Iterable[str] | None = None
    ) -> list[tuple[str, str, int, str, dict[str, str]]]:
        """(name, kind, size, checksum, attrs) of the entries ``names`` (all by default), as the written header
        will list them. Payload checksums are computed once and kept for writing."""
        chosen = self._entries if names is None else [self._names[n] for n in names]
        rows = []
        for p in chosen:
            if p.checksum is None:
                p.checksum = digest(self._checksum, p.data)
            rows.append((p.name, p.kind, p.data.nbytes, p.checksum, p.attrs))
        return rows

    def header_bytes(self) -> bytes:
        """The preamble, header and padding this writer writes first: they name every payload's offset, size
        and checksum, so two writers with equal header bytes write equal files."""
        self.entry_rows()
        return self._layout()[0]

    def planned_size(self) -> int:
        """The size in bytes of the binary this writer writes, computed without assembling it."""
        self.entry_rows()
        head, payloads = self._layout()
        return max([len(head)] + [offset + data.nbytes for offset, data in payloads])

    def _check_name(self, name: object) -> None:
        if not isinstance(name, str) or not name:
            raise InvalidArgument(f"entry name must be a non-empty str, got {name!r}")
        if name in self._names:
            raise InvalidArgument(f"entry {name!r} is already in the context binary")

    def _layout(self) -> tuple[bytes, list[tuple[int, memoryview]]]:
        """The preamble + header + padding, and the unique payloads with their offsets, in file order."""
        slots, slot_of = deduplicate(
            [(p.data, p.checksum or digest(self._checksum, p.data), p.offset) for p in self._entries]
        )
        # Offsets are absolute, so they depend on the header length: iterate to the (monotone) fixed point.
        data_start = align(PREAMBLE.size, self._alignment)
        while True:
            offsets, file_size = place(slots, data_start, self._alignment)
            header = self._header(offsets, slot_of, slots)
            needed = align(PREAMBLE.size + len(header), self._alignment)
            if needed <= data_start:
                break
            data_start = needed
        if len(header) > MAX_HEADER_BYTES:
            raise InvalidArgument(
                f"the context binary header would take {len(header)} bytes, more than the {MAX_HEADER_BYTES} a "
                f"reader accepts ({len(self._entries)} entries): use fewer entries or shorter names and attributes"
            )
        header_crc = zlib.crc32(header, zlib.crc32(HEADER_SIZES.pack(len(header), file_size)))
        head = PREAMBLE.pack(MAGIC, FORMAT_VERSION, header_crc, len(header), file_size) + header
        head += bytes(data_start - len(head))
        return head, sorted(((offsets[i], s.data) for i, s in enumerate(slots) if s.data.nbytes), key=_first)

    def _header(self, offsets: list[int], slot_of: list[int], slots: list[Slot]) -> bytes:
        keys = ("name", "kind", "offset", "size", "checksum", "attrs")
        entries = [
            dict(zip(keys, (p.name, p.kind, offsets[i], slots[i].data.nbytes, slots[i].checksum, p.attrs)))
            for p, i in zip(self._entries, slot_of)
        ]
        text = json.dumps(
            dict(self._fields, entries=entries), sort_keys=True, separators=(",", ":"), ensure_ascii=False
        )
        try:
            return text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidArgument(
                f"context binary header: a name, kind or attribute is not valid text: {exc}"
            ) from exc

    def _chunks(self) -> Iterator[bytes | memoryview]:
        head, payloads = self._layout()
        yield head
        position = len(head)
        for offset, data in payloads:
            for start in range(position, offset, CHUNK):  # padding (large before a requested offset)
                yield bytes(min(CHUNK, offset - start))
            for start in range(0, data.nbytes, CHUNK):
                chunk = data[start : start + CHUNK]
                yield chunk
                release_pages(chunk)  # consumed: a memory-mapped payload holds one chunk at a time
            position = offset + data.nbytes

    def to_bytes(self) -> bytes:
        """The whole binary in memory (for embed mode 1)."""
        return b"".join(self._chunks())

    def write_to(self, stream_write: Callable[[bytes], object]) -> int:
        """Stream the binary to ``stream_write`` in bytes chunks of at most 8 MiB; returns the size written.
        An exception from ``stream_write`` surfaces as Fail carrying its message."""
        total = 0
        for chunk in self._chunks():
            try:
                stream_write(bytes(chunk))
            except EPCtxError:
                raise
            except Exception as exc:
                raise Fail(f"writing the context binary to a stream failed: {exc}") from exc
            total += len(chunk)
        return total

    def write(self, path: str | os.PathLike[str]) -> None:
        """Write atomically (``write_file_atomic``): a temporary file in the same folder, fsync'ed, renamed over
        ``path``."""
        target = os.fspath(path)
        if os.path.isdir(target):
            raise InvalidArgument(f"context binary path {target!r} is a folder")
        write_file_atomic(
            target, lambda write: [write(chunk) for chunk in self._chunks()], what="context binary"
        )


def _first(item: tuple[int, memoryview]) -> int:
    return item[0]
