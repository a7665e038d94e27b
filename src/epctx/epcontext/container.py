"""The context binary container: what ``<stem>_<ep>.bin`` holds and what embed mode 1 puts in an attribute.

Layout (integers little-endian): a 32-byte preamble (magic b"EPCTXBIN", format version u32, header crc32 u32,
header length u64, file size u64); the header, JSON in UTF-8 with sorted keys and no whitespace (alignment,
checksum algorithm, ep_name, sdk_version, hardware, metadata {str: str}, entries [{name, kind, offset, size,
checksum, attrs {str: str}}] in the order added); then the payloads, each non-empty one at an absolute offset
that is a multiple of ``alignment`` (64 by default; 4096 for pages), zeros in between, the file ending with
the last payload. Identical payloads are stored once (same size and checksum, then compared byte for byte).
Payloads go in the order added, except those given the absolute offset they asked for (``layout``).

The header crc32 covers the header length, file size and header: a flipped byte in the preamble or header
is an InvalidGraph at open. Payload checksums (and the zero padding before each payload) are verified the
first time an entry is read, so a binary shared by many models costs only what a session uses.

A bad file costs no more than its header claims: before anything past the preamble is read, the header length
is checked against the file and ``MAX_HEADER_BYTES`` (which bounds the entry count too); entries must lie in
the file, aligned, apart (or be one deduplicated payload: same offset, size and checksum), and the file must
end with the last payload, so padding to any size is refused at open without reading it. Padding before a
requested offset may be long: it is checked on first read, and in a file, long padding and payloads are read
hole-aware (SEEK_DATA / SEEK_HOLE): a hole reads as zeros by definition, so it is never mapped, and the
padding's data is read in chunks into a buffer. Opening costs one pass over the header and one sort of the
entries; ``names(prefix)`` finds one graph's entries in O(log n + k). Nothing in
the file is pickle or code. Returned memoryviews and arrays keep the read-only mapping alive after close();
the writer replaces files atomically and never modifies one in place (truncating a mapped file would fault).

The writer is ``writer.ContextBinaryWriter``; the header format ``header.py``; checksums ``checksums.py``.
"""

from __future__ import annotations

import bisect
import contextlib
import errno
import functools
import itertools
import math
import mmap
import os
from collections.abc import Iterable, Iterator, Mapping
from types import MappingProxyType
from typing import Any

import numpy as np

from epctx.ep._memory import byte_view
from epctx.epcontext.checksums import (
    CHECKSUM_ALGORITHMS,
    CHUNK,
    SHARED_MIN,
    STREAMS,
    FileVersion,
    file_version,
    remember_verified,
    verified_before,
)
from epctx.epcontext.header import (
    PREAMBLE,
    header_field,
    parse_entries,
    read_header,
    str_map,
    valid_alignment,
)
from epctx.epcontext.layout import EntryInfo, check_layout
from epctx.errors import Fail, InvalidArgument, InvalidGraph, NoSuchFile

__all__ = ["ContextBinary", "EntryInfo"]

_NAMES_SHOWN = 8
_SPARSE_MIN = 8 << 20  # padding or payloads this long are read hole-aware in a binary mapped from a file
_ZERO_CHUNK = 1 << 20  # zeros hashed at a time for a hole (small enough to stay in cache)
_HOLES_KNOWN = hasattr(os, "SEEK_DATA") and hasattr(os, "SEEK_HOLE") and hasattr(os, "pread")


class ContextBinary:
    """A read-only view of a context binary in a file (memory-mapped) or in a buffer (not copied).

    Header fields are plain attributes: ``ep_name``, ``sdk_version``, ``hardware``, ``metadata`` (read-only
    mapping), ``alignment``, ``checksum_algorithm``; ``where`` is how error messages name the binary;
    ``path`` is the absolute path of the file it was opened from (None for a binary in memory)."""

    def __init__(self, buf: memoryview, *, where: str, mapping: mmap.mmap | None = None) -> None:
        """Use :meth:`open` or :meth:`from_bytes`."""
        self._buf = buf
        self._mapping = mapping
        self._closed = False
        self._verified: set[tuple[int, int]] = set()
        self.where = where
        self.path: str | None = None
        self._file_id: tuple[int, int, int] | None = None  # device, inode, size of the mapped file
        self._version: FileVersion | None = None  # the mapped file's version at open (shared verification)
        header = read_header(buf, where)
        self.alignment: int = header_field(header, "alignment", int, where)
        if not valid_alignment(self.alignment):
            raise InvalidGraph(f"{where}: alignment {self.alignment} is not a power of two up to 65536")
        self.checksum_algorithm: str = header_field(header, "checksum", str, where)
        if self.checksum_algorithm not in CHECKSUM_ALGORITHMS:
            known = ", ".join(sorted(CHECKSUM_ALGORITHMS))
            raise InvalidGraph(
                f"{where}: unknown checksum {self.checksum_algorithm!r} (this epctx knows {known})"
            )
        self._digest = CHECKSUM_ALGORITHMS[self.checksum_algorithm]
        self.ep_name: str = header_field(header, "ep_name", str, where)
        self.sdk_version: str = header_field(header, "sdk_version", str, where)
        self.hardware: str = header_field(header, "hardware", str, where)
        metadata = str_map(header.get("metadata"))
        if metadata is None:
            raise InvalidGraph(f"{where}: header field 'metadata' must map str to str")
        self.metadata: Mapping[str, str] = MappingProxyType(metadata)
        header_end = PREAMBLE.size + PREAMBLE.unpack_from(buf)[3]
        self._entries = parse_entries(header.get("entries"), where, header_end, buf.nbytes, self.alignment)
        self._gap_before = check_layout(self._entries, buf, where, header_end, self.alignment)
        self._names = tuple(self._entries)
        self._sorted: tuple[list[str], list[int]] | None = None  # names sorted, and their places in _names

    @classmethod
    def open(cls, path: str | os.PathLike[str], *, copy: bool = False) -> ContextBinary:
        """Map a context binary file read-only. Entries are verified when first read. ``copy``: read the
        file into private memory instead (``epctx.context_binary_copy``): the session then never sees a later
        change to the file, at the cost of the file's size in memory and one read."""
        target = os.fspath(path)
        where = f"context binary {target!r}"
        try:
            with open(target, "rb") as fh:
                stat = os.fstat(fh.fileno())
                size = stat.st_size
                if size < PREAMBLE.size:
                    raise InvalidGraph(f"{where}: truncated: {size} bytes, a context binary has at least 32")
                if copy:
                    return cls._copied(fh, size, where, target)
                mapping = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        except FileNotFoundError:
            raise NoSuchFile(f"{where} not found") from None
        except IsADirectoryError:
            raise InvalidArgument(f"{where} is a folder") from None
        except OSError as exc:
            raise Fail(f"cannot read {where}: {exc}") from exc
        try:
            binary = cls(memoryview(mapping), where=where, mapping=mapping)
        except BaseException:
            with contextlib.suppress(BufferError):  # a traceback may still hold a header view
                mapping.close()
            raise
        binary.path = os.path.abspath(target)
        binary._file_id = (stat.st_dev, stat.st_ino, stat.st_size)
        binary._version = (stat.st_dev, stat.st_ino, stat.st_size, stat.st_ctime_ns)
        return binary

    @classmethod
    def _copied(cls, fh: Any, size: int, where: str, target: str) -> ContextBinary:
        data = bytearray(size)
        view, done = memoryview(data), 0
        while done < size:
            got = fh.readinto(view[done:])
            if not got:
                break
            done += got
        if done != size or fh.read(1):
            raise Fail(f"{where} changed size while it was read")
        binary = cls(memoryview(data).toreadonly(), where=where)
        binary.path = os.path.abspath(target)  # no file id: open_file() gives None, libraries get memory
        return binary

    @classmethod
    def from_bytes(cls, buf: object, *, where: str = "embedded context") -> ContextBinary:
        """Read a context binary held in memory (bytes, bytearray, memoryview, mmap, numpy uint8 array)
        without copying it; views it returns share ``buf``'s memory and are read-only."""
        return cls(byte_view(buf, where).toreadonly(), where=where)

    def __enter__(self) -> ContextBinary:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ContextBinary({self.where}, ep_name={self.ep_name!r}, entries={len(self._entries)})"

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def close(self) -> None:
        """Release the binary. Views already returned stay valid (the mapping goes when the last one does)."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(BufferError):
            self._buf.release()
        if self._mapping is not None:
            with contextlib.suppress(BufferError):  # views are alive: unmapped when the last one goes
                self._mapping.close()
            self._mapping = None

    def open_file(self) -> int | None:
        """A read-only descriptor of the file this binary was mapped from (the caller closes it), for a library
        that reads a file rather than memory: entries read (verified) here have the same bytes there. None
        for a binary in memory, or when ``path`` names another file now (replaced since it was opened)."""
        if self.path is None or self._file_id is None:
            return None
        flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
        try:
            fd = os.open(self.path, flags)
        except OSError:
            return None
        stat = os.fstat(fd)
        if (stat.st_dev, stat.st_ino, stat.st_size) != self._file_id:
            os.close(fd)
            return None
        return fd

    def names(self, prefix: str = "") -> tuple[str, ...]:
        """Entry names in the order they were written; with ``prefix``, only those that start with it (found
        in an index sorted once per binary: O(log n + k), so a lookup per graph stays cheap with many)."""
        if not prefix:
            return self._names
        if self._sorted is None:
            order = sorted(range(len(self._names)), key=self._names.__getitem__)
            self._sorted = ([self._names[i] for i in order], order)
        names, order = self._sorted
        start = stop = bisect.bisect_left(names, prefix)
        while stop < len(names) and names[stop].startswith(prefix):
            stop += 1
        return tuple(self._names[i] for i in sorted(order[start:stop]))

    def entry(self, name: str) -> EntryInfo:
        info = self._entries.get(name)
        if info is None:
            present = list(self._entries)
            shown = ", ".join(repr(n) for n in present[:_NAMES_SHOWN])
            more = f" and {len(present) - _NAMES_SHOWN} more" if len(present) > _NAMES_SHOWN else ""
            raise InvalidGraph(f"{self.where}: no entry {name!r} (entries: {shown or 'none'}{more})")
        return info

    def read(self, name: str) -> memoryview:
        """The entry's bytes, read-only and not copied; verified against its checksum on first read."""
        info = self.entry(name)
        if self._closed:
            raise InvalidArgument(f"{self.where} is closed")
        view = self._buf[info.offset : info.offset + info.size]
        key = (info.offset, info.size)
        if key not in self._verified:
            if not self._verified_in_process(info):
                self._verify(info, view)
                self._remember(info)
            self._verified.add(key)
        return view

    def _verified_in_process(self, info: EntryInfo) -> bool:
        """A large payload of a mapped file verified before in this process (by another session, or by the trust
        policy's hashing pass), its file unchanged since: the same bytes, not hashed again."""
        if self._version is None or info.size < SHARED_MIN:
            return False
        if not verified_before(self._version, info.offset, info.size, info.checksum):
            return False
        return file_version(self.path) == self._version  # no write since this binary was mapped

    def _remember(self, info: EntryInfo) -> None:
        if self._version is not None and info.size >= SHARED_MIN and file_version(self.path) == self._version:
            remember_verified(self._version, [(info.offset, info.size, info.checksum)])

    def array(self, name: str, dtype: Any, shape: Iterable[int] | None = None) -> np.ndarray:
        """The entry as a read-only numpy array over the binary's memory (1-D when ``shape`` is None)."""
        dt = np.dtype(dtype)
        if dt.hasobject or dt.itemsize == 0:
            raise InvalidArgument(f"entry {name!r}: cannot view bytes as dtype {dt}")
        view = self.read(name)
        dims = (view.nbytes // dt.itemsize,) if shape is None else tuple(int(d) for d in shape)
        expected = math.prod(dims) * dt.itemsize
        if expected != view.nbytes or min(dims, default=0) < 0:
            raise InvalidGraph(
                f"{self.where}: entry {name!r} has {view.nbytes} bytes, "
                f"expected {expected} for dtype {dt} and shape {list(dims)}"
            )
        return np.frombuffer(view, dtype=dt).reshape(dims)

    def verify(self, names: Iterable[str] | None = None) -> None:
        """Verify entries now (all by default) instead of on first read."""
        for name in self.names() if names is None else names:
            self.read(name)

    def _verify(self, info: EntryInfo, view: memoryview) -> None:
        """Check the padding before the payload is zero and the payload's checksum, reading each byte once and
        copying none. In a file-backed binary, long runs are read hole-aware: a hole reads as zeros by
        definition, so it is hashed from a buffer of zeros and never mapped (a sparse 8 GiB file costs its
        hashing time, not 8 GiB of memory)."""
        gap_start = self._gap_before.get(info.offset, info.offset) if info.size else info.offset
        fd = None
        if (
            self._mapping is not None
            and _HOLES_KNOWN
            and max(info.offset - gap_start, info.size) >= _SPARSE_MIN
        ):
            fd = self.open_file()  # None when the path names another file now: read the mapping
        try:
            if not self._zeros(gap_start, info.offset, fd):
                raise InvalidGraph(
                    f"{self.where}: entry {info.name!r}: padding bytes {gap_start}..{info.offset} "
                    "before its payload are not zero (corrupt binary)"
                )
            found = self._checksum(view, info.offset, fd)
        finally:
            if fd is not None:
                os.close(fd)
        if found != info.checksum:
            raise InvalidGraph(
                f"{self.where}: entry {info.name!r}: checksum mismatch: expected {self.checksum_algorithm} "
                f"{info.checksum}, found {found} (corrupt binary)"
            )

    def _zeros(self, start: int, end: int, fd: int | None) -> bool:
        """Whether bytes start..end of the binary are all zero; with ``fd``, only the file's data is read, in
        chunks into a buffer (padding is no payload: it need not stay mapped)."""
        if start == end:
            return True
        if fd is None or end - start < _SPARSE_MIN:
            padding = np.frombuffer(self._buf[start:end], np.uint8)
            return not any(padding[i : i + CHUNK].any() for i in range(0, padding.size, CHUNK))
        for first, last in _data_ranges(fd, start, end):
            for position in range(first, last, CHUNK):
                chunk = os.pread(fd, min(CHUNK, last - position), position)
                if len(chunk) != min(CHUNK, last - position):
                    raise InvalidGraph(f"{self.where}: the file shrank while it was open")
                if np.frombuffer(chunk, np.uint8).any():
                    return False
        return True

    def _checksum(self, view: memoryview, offset: int, fd: int | None) -> str:
        """The payload's digest in one pass over the mapping, holes (with ``fd``) hashed from zeros."""
        end = offset + view.nbytes
        ranges = _data_ranges(fd, offset, end) if fd is not None and view.nbytes >= _SPARSE_MIN else None
        first = next(ranges, None) if ranges is not None else (offset, end)
        if first == (offset, end):  # no hole: the whole payload at once
            return self._digest(view)
        stream = STREAMS[self.checksum_algorithm]()
        zeros = _zero_chunk()
        position = offset
        for start, stop in itertools.chain([] if first is None else [first], ranges or (), [(end, end)]):
            for hole in range(position, start, _ZERO_CHUNK):
                stream.update(zeros[: min(_ZERO_CHUNK, start - hole)])
            stream.update(view[start - offset : stop - offset])
            position = stop
        digest: str = stream.hexdigest()
        return digest


def _data_ranges(fd: int, start: int, end: int) -> Iterator[tuple[int, int]]:
    """The runs of start..end of the file that hold data, in order; holes (which read as zeros) are left out.
    All of it where the file system cannot tell."""
    position = start
    while position < end:
        try:
            data = os.lseek(fd, position, os.SEEK_DATA)
            hole = os.lseek(fd, data, os.SEEK_HOLE) if data < end else end
        except OSError as exc:
            if exc.errno != errno.ENXIO:  # ENXIO: no data from here to the end of the file
                yield position, end
            return
        if data >= end:
            return
        if hole <= data:  # a file system that says nothing sensible: read the rest
            yield data, end
            return
        yield data, min(hole, end)
        position = hole


@functools.cache
def _zero_chunk() -> memoryview:
    return memoryview(bytes(_ZERO_CHUNK))
