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

Checksum choice (``benchmarks/bench_container.py --candidates``, 2-core AMD EPYC dev VM, shared and noisy):
ms added to a warm load = mmap of a file in the page cache + np.frombuffer + one pass (0.4-0.7 / 2.3 / 9 ms
at 10 / 50 / 200 MB), medians of interleaved rounds, range of two runs:

    algorithm       10 MB                 50 MB                  200 MB
    xxh3_64         +0.1 ms (18-27 %)     +1.6-1.8 ms (68-76 %)  +7.7-8.1 ms (84-91 %)
    zlib.crc32      +2.0 ms (320-490 %)   +9-19 ms (380-820 %)   +39-51 ms (430-575 %)
    zlib.adler32    +3.1 ms (470-760 %)   +14-26 ms              +62-65 ms (700 %)
    sha256 / sha1   +6-10 ms              +27-46 ms              +110-125 ms (1250-1370 %)
    md5 / blake2b   +11-22 ms             +42-106 ms             +178-284 ms (1950-3190 %)
    numpy u64 sum   +0.5 ms (80-115 %)    +1.9-5.7 ms            +8 ms (86-95 %)   (no checksum: the floor)

The < 5 % budget is out of reach for any check that reads every byte: a warm load is itself one pass over the
bytes and verification is a second one, bound by memory bandwidth (see the bare sum). xxh3_64 sits at that
floor, 4-6x cheaper than crc32 (the fastest stdlib candidate), so it is the default for the small ``xxhash``
dependency; ``checksum="crc32"`` stays supported and the header names the algorithm, so readers verify either.
"""

from __future__ import annotations

import bisect
import contextlib
import errno
import functools
import itertools
import json
import math
import mmap
import os
import re
import secrets
import struct
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np
import xxhash

from epctx.ep.alignment import align
from epctx.ep.memory import mapped_file, release_pages
from epctx.epcontext.layout import EntryInfo, Slot, check_layout, deduplicate, place
from epctx.errors import EPCtxError, Fail, InvalidArgument, InvalidGraph, NoSuchFile

__all__ = [
    "CHECKSUM_ALGORITHMS",
    "DEFAULT_CHECKSUM",
    "FORMAT_VERSION",
    "MAGIC",
    "MAX_HEADER_BYTES",
    "TEMP_PATTERN",
    "ContextBinary",
    "ContextBinaryWriter",
    "EntryInfo",
    "is_stale_temp",
    "write_file_atomic",
    "release_pages",
    "temp_writer_pid",
]

MAGIC = b"EPCTXBIN"
FORMAT_VERSION = 1
DEFAULT_CHECKSUM = "xxh3_64"
_PREAMBLE = struct.Struct("<8sIIQQ")  # magic, version, header crc32, header length, file size
_SIZES = struct.Struct("<QQ")  # the preamble fields the header crc32 covers
_CHUNK = 8 << 20  # bytes handed to a sink at a time
_MAX_ALIGNMENT = 1 << 16
_NAMES_SHOWN = 8
MAX_HEADER_BYTES = 16 << 20  # the longest header written or read (~120,000 entries): json.loads stays cheap
_SPARSE_MIN = 8 << 20  # padding or payloads this long are read hole-aware in a binary mapped from a file
_ZERO_CHUNK = 1 << 20  # zeros hashed at a time for a hole (small enough to stay in cache)
_HOLES_KNOWN = hasattr(os, "SEEK_DATA") and hasattr(os, "SEEK_HOLE") and hasattr(os, "pread")
# ``.<binary name>.<writer pid>.<random hex>.tmp``: what ContextBinaryWriter.write writes before renaming.
TEMP_PATTERN = re.compile(
    r"\.(?P<name>.+)\.(?P<pid>[1-9][0-9]{0,9})\.(?P<token>[0-9a-f]{12})\.tmp", re.DOTALL
)


def _crc32(data: memoryview) -> str:
    return f"{zlib.crc32(data):08x}"


def _xxh3_64(data: memoryview) -> str:
    return f"{xxhash.xxh3_64_intdigest(data):016x}"


CHECKSUM_ALGORITHMS: Mapping[str, Callable[[memoryview], str]] = MappingProxyType(
    {"crc32": _crc32, "xxh3_64": _xxh3_64}
)


class _Crc32Stream:
    """crc32 fed piece by piece; ``hexdigest`` as ``_crc32`` of the concatenation."""

    __slots__ = ("_crc",)

    def __init__(self) -> None:
        self._crc = 0

    def update(self, data: memoryview | bytes) -> None:
        self._crc = zlib.crc32(data, self._crc)

    def hexdigest(self) -> str:
        return f"{self._crc:08x}"


# The same digests fed piece by piece (a payload with holes: the holes are hashed from a buffer of zeros).
_STREAMS: Mapping[str, Callable[[], Any]] = MappingProxyType(
    {"crc32": _Crc32Stream, "xxh3_64": xxhash.xxh3_64}
)


def _digest(algorithm: str, data: memoryview) -> str:
    """``CHECKSUM_ALGORITHMS[algorithm](data)``; a memory-mapped payload is hashed chunk by chunk, each chunk's
    pages released after it (see ``release_pages``)."""
    if data.nbytes <= _CHUNK or mapped_file(data) is None:
        return CHECKSUM_ALGORITHMS[algorithm](data)
    stream = _STREAMS[algorithm]()
    for start in range(0, data.nbytes, _CHUNK):
        chunk = data[start : start + _CHUNK]
        stream.update(chunk)
        release_pages(chunk)
    return str(stream.hexdigest())


def _str_map(value: object) -> dict[str, str] | None:
    out = dict(value) if isinstance(value, Mapping) else None
    valid = out is not None and all(isinstance(k, str) and isinstance(v, str) for k, v in out.items())
    return out if valid else None


def _byte_view(data: object, what: str) -> memoryview:
    """A flat unsigned-byte view of ``data`` without copying it; ``what`` names it in errors."""
    if isinstance(data, np.ndarray):
        if data.dtype.hasobject:
            raise InvalidArgument(f"{what}: arrays of Python objects cannot be stored")
        if not data.flags.c_contiguous:
            raise InvalidArgument(f"{what}: the array is not C-contiguous (pass np.ascontiguousarray(data))")
        return memoryview(data.reshape(-1).view(np.uint8))  # type: ignore[arg-type]
    try:
        view = memoryview(data)  # type: ignore[arg-type]
    except TypeError:
        raise InvalidArgument(
            f"{what}: expected bytes-like data or a numpy array, not {type(data).__name__}"
        ) from None
    if not view.c_contiguous:
        raise InvalidArgument(f"{what}: the buffer is not C-contiguous")
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


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
        meta = _str_map({} if metadata is None else metadata)
        if meta is None:
            raise InvalidArgument("metadata must map str to str")
        if not _valid_alignment(alignment):
            raise InvalidArgument(
                f"alignment must be a power of two up to {_MAX_ALIGNMENT}, got {alignment!r}"
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
        attr_map = _str_map({} if attrs is None else attrs)
        if attr_map is None:
            raise InvalidArgument(f"entry {name!r}: attrs must map str to str")
        if offset is not None and (type(offset) is not int or offset < 0):
            raise InvalidArgument(f"entry {name!r}: offset must be a non-negative int, got {offset!r}")
        view = _byte_view(data, f"entry {name!r}")
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
                p.checksum = _digest(self._checksum, p.data)
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
            [(p.data, p.checksum or _digest(self._checksum, p.data), p.offset) for p in self._entries]
        )
        # Offsets are absolute, so they depend on the header length: iterate to the (monotone) fixed point.
        data_start = align(_PREAMBLE.size, self._alignment)
        while True:
            offsets, file_size = place(slots, data_start, self._alignment)
            header = self._header(offsets, slot_of, slots)
            needed = align(_PREAMBLE.size + len(header), self._alignment)
            if needed <= data_start:
                break
            data_start = needed
        if len(header) > MAX_HEADER_BYTES:
            raise InvalidArgument(
                f"the context binary header would take {len(header)} bytes, more than the {MAX_HEADER_BYTES} a "
                f"reader accepts ({len(self._entries)} entries): use fewer entries or shorter names and attributes"
            )
        header_crc = zlib.crc32(header, zlib.crc32(_SIZES.pack(len(header), file_size)))
        head = _PREAMBLE.pack(MAGIC, FORMAT_VERSION, header_crc, len(header), file_size) + header
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
            for start in range(position, offset, _CHUNK):  # padding (large before a requested offset)
                yield bytes(min(_CHUNK, offset - start))
            for start in range(0, data.nbytes, _CHUNK):
                chunk = data[start : start + _CHUNK]
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


def write_file_atomic(
    path: str | os.PathLike[str], fill: Callable[[Callable[[Any], object]], object], *, what: str = "file"
) -> None:
    """Write ``path`` through a temporary file in its folder (``.<name>.<pid>.<hex>.tmp``, see ``TEMP_PATTERN``
    and ``is_stale_temp``; mode 0o666 less the umask) that ``fill(write)`` fills, fsync'ed, then renamed over
    ``path``: never a half file under ``path``, and a killed writer's temporary file can be told apart."""
    target = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(target))
    tmp = os.path.join(folder, f".{os.path.basename(target)}.{os.getpid()}.{secrets.token_hex(6)}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    except FileNotFoundError:
        raise NoSuchFile(f"cannot write {what} {target!r}: folder {folder!r} does not exist") from None
    except OSError as exc:
        raise Fail(f"cannot write {what} {target!r}: {exc}") from exc
    try:
        with open(fd, "wb") as fh:
            fill(fh.write)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise Fail(f"writing {what} {target!r} failed: {exc}") from exc
        raise
    _fsync_folder(folder)


def _fsync_folder(folder: str) -> None:
    """Make the rename durable where the platform allows it (best effort)."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def temp_writer_pid(path: str | os.PathLike[str]) -> int | None:
    """The process id of the writer whose temporary file ``path`` is (a name ``ContextBinaryWriter.write``
    gives: ``.<binary name>.<pid>.<12 hex digits>.tmp``), else None."""
    match = TEMP_PATTERN.fullmatch(os.path.basename(os.fspath(path)))
    return int(match["pid"]) if match else None


def is_stale_temp(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a context binary writer's temporary file whose writer process no longer runs on this
    machine (killed mid-write; a finished or failed write leaves none). False for any other name, and where
    it cannot be told (Windows; a writer that runs as another user counts as running). A reused process id
    reads as running: never stale by mistake, at worst kept until that process ends. Only the name and the
    process table are looked at: the caller decides what to remove, and when."""
    pid = temp_writer_pid(path)
    if pid is None or os.name != "posix":
        return False
    try:
        os.kill(pid, 0)  # signal 0: existence check only
    except ProcessLookupError:
        return True
    except (PermissionError, OverflowError):
        return False
    except OSError as exc:
        return exc.errno == errno.ESRCH
    return False


def _first(item: tuple[int, memoryview]) -> int:
    return item[0]


def _valid_alignment(alignment: object) -> bool:
    return type(alignment) is int and 1 <= alignment <= _MAX_ALIGNMENT and not alignment & (alignment - 1)


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
        header = _read_header(buf, where)
        self.alignment: int = _field(header, "alignment", int, where)
        if not _valid_alignment(self.alignment):
            raise InvalidGraph(f"{where}: alignment {self.alignment} is not a power of two up to 65536")
        self.checksum_algorithm: str = _field(header, "checksum", str, where)
        if self.checksum_algorithm not in CHECKSUM_ALGORITHMS:
            known = ", ".join(sorted(CHECKSUM_ALGORITHMS))
            raise InvalidGraph(
                f"{where}: unknown checksum {self.checksum_algorithm!r} (this epctx knows {known})"
            )
        self._digest = CHECKSUM_ALGORITHMS[self.checksum_algorithm]
        self.ep_name: str = _field(header, "ep_name", str, where)
        self.sdk_version: str = _field(header, "sdk_version", str, where)
        self.hardware: str = _field(header, "hardware", str, where)
        metadata = _str_map(header.get("metadata"))
        if metadata is None:
            raise InvalidGraph(f"{where}: header field 'metadata' must map str to str")
        self.metadata: Mapping[str, str] = MappingProxyType(metadata)
        header_end = _PREAMBLE.size + _PREAMBLE.unpack_from(buf)[3]
        self._entries = _parse_entries(header.get("entries"), where, header_end, buf.nbytes, self.alignment)
        self._gap_before = check_layout(self._entries, buf, where, header_end, self.alignment)
        self._names = tuple(self._entries)
        self._sorted: tuple[list[str], list[int]] | None = None  # names sorted, and their places in _names

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> ContextBinary:
        """Map a context binary file read-only. Entries are verified when first read."""
        target = os.fspath(path)
        where = f"context binary {target!r}"
        try:
            with open(target, "rb") as fh:
                stat = os.fstat(fh.fileno())
                size = stat.st_size
                if size < _PREAMBLE.size:
                    raise InvalidGraph(f"{where}: truncated: {size} bytes, a context binary has at least 32")
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
        return binary

    @classmethod
    def from_bytes(cls, buf: object, *, where: str = "embedded context") -> ContextBinary:
        """Read a context binary held in memory (bytes, bytearray, memoryview, mmap, numpy uint8 array)
        without copying it; views it returns share ``buf``'s memory and are read-only."""
        return cls(_byte_view(buf, where).toreadonly(), where=where)

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
            self._verify(info, view)
            self._verified.add(key)
        return view

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
            return not any(padding[i : i + _CHUNK].any() for i in range(0, padding.size, _CHUNK))
        for first, last in _data_ranges(fd, start, end):
            for position in range(first, last, _CHUNK):
                chunk = os.pread(fd, min(_CHUNK, last - position), position)
                if len(chunk) != min(_CHUNK, last - position):
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
        stream = _STREAMS[self.checksum_algorithm]()
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


def _read_header(buf: memoryview, where: str) -> dict[str, Any]:
    size = buf.nbytes
    if size < _PREAMBLE.size:
        raise InvalidGraph(
            f"{where}: truncated: {size} bytes, a context binary has at least {_PREAMBLE.size}"
        )
    magic, version, header_crc, header_len, file_size = _PREAMBLE.unpack_from(buf)
    if magic != MAGIC:
        raise InvalidGraph(f"{where}: not an epctx context binary (magic {magic!r}, expected {MAGIC!r})")
    if version != FORMAT_VERSION:
        raise InvalidGraph(
            f"{where}: unsupported context binary format version {version} (this epctx reads {FORMAT_VERSION})"
        )
    if file_size != size:
        raise InvalidGraph(
            f"{where}: size mismatch: the preamble records {file_size} bytes, found {size} (truncated file?)"
        )
    if header_len > size - _PREAMBLE.size:
        raise InvalidGraph(f"{where}: header length {header_len} runs past the end ({size} bytes)")
    if header_len > MAX_HEADER_BYTES:
        raise InvalidGraph(
            f"{where}: header length {header_len} is over the {MAX_HEADER_BYTES} bytes a context binary header "
            "may take (corrupt binary)"
        )
    raw = buf[_PREAMBLE.size : _PREAMBLE.size + header_len]
    found = zlib.crc32(raw, zlib.crc32(_SIZES.pack(header_len, file_size)))
    if found != header_crc:
        raise InvalidGraph(
            f"{where}: header checksum mismatch: expected crc32 {header_crc:08x}, found {found:08x} (corrupt binary)"
        )
    try:
        header = json.loads(bytes(raw).decode("utf-8"))
    except (ValueError, RecursionError) as exc:
        raise InvalidGraph(f"{where}: header is not valid UTF-8 JSON: {exc}") from exc
    if not isinstance(header, dict):
        raise InvalidGraph(f"{where}: header must be a JSON object, found {type(header).__name__}")
    return header


def _field(obj: Mapping[str, Any], key: str, kind: type, where: str) -> Any:
    """``obj[key]`` if it is a str (kind str) or a non-negative int (kind int), else InvalidGraph."""
    value = obj.get(key)
    if kind is int and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise InvalidGraph(f"{where}: header field {key!r} must be a non-negative integer, found {value!r}")
    if kind is str and not isinstance(value, str):
        raise InvalidGraph(f"{where}: header field {key!r} must be a string, found {value!r}")
    return value


def _parse_entries(
    raw: object, where: str, header_end: int, size: int, alignment: int
) -> dict[str, EntryInfo]:
    if not isinstance(raw, list):
        raise InvalidGraph(f"{where}: header field 'entries' must be a list")
    entries: dict[str, EntryInfo] = {}
    for i, item in enumerate(raw):
        if not isinstance(item, dict):
            raise InvalidGraph(f"{where}: entry #{i} must be an object")
        name = _field(item, "name", str, f"{where}: entry #{i}")
        here = f"{where}: entry {name!r}"
        kind = _field(item, "kind", str, here)
        offset = _field(item, "offset", int, here)
        length = _field(item, "size", int, here)
        checksum = _field(item, "checksum", str, here)
        attrs = _str_map(item.get("attrs"))
        if attrs is None:
            raise InvalidGraph(f"{here}: 'attrs' must map str to str")
        if name in entries:
            raise InvalidGraph(f"{here} appears twice")
        if offset < header_end:
            raise InvalidGraph(f"{here}: offset {offset} points into the header (which ends at {header_end})")
        if offset + length > size:
            raise InvalidGraph(f"{here}: offset {offset} + size {length} runs past the end ({size} bytes)")
        if length and offset % alignment:
            raise InvalidGraph(f"{here}: offset {offset} is not a multiple of the alignment {alignment}")
        entries[name] = EntryInfo(name, kind, offset, length, checksum, MappingProxyType(attrs))
    return entries
