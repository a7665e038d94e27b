"""Payload checksums of context binaries: one-shot digests, streamed digests (same results), and memory-mapped
payloads hashed chunk by chunk.

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

import os
import zlib
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any

import xxhash

from epctx.ep._memory import mapped_file, release_pages

__all__ = [
    "CHECKSUM_ALGORITHMS",
    "CHUNK",
    "DEFAULT_CHECKSUM",
    "SHARED_MIN",
    "STREAMS",
    "FileVersion",
    "digest",
    "file_version",
    "remember_verified",
    "verified_before",
]

DEFAULT_CHECKSUM = "xxh3_64"
CHUNK = 8 << 20  # bytes handled at a time (hashing, writing, comparing)


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
STREAMS: Mapping[str, Callable[[], Any]] = MappingProxyType(
    {"crc32": _Crc32Stream, "xxh3_64": xxhash.xxh3_64}
)


def digest(algorithm: str, data: memoryview) -> str:
    """``CHECKSUM_ALGORITHMS[algorithm](data)``; a memory-mapped payload is hashed chunk by chunk, each chunk's
    pages released after it (see ``release_pages``)."""
    if data.nbytes <= CHUNK or mapped_file(data) is None:
        return CHECKSUM_ALGORITHMS[algorithm](data)
    stream = STREAMS[algorithm]()
    for start in range(0, data.nbytes, CHUNK):
        chunk = data[start : start + CHUNK]
        stream.update(chunk)
        release_pages(chunk)
    return str(stream.hexdigest())


# Entries verified in this process, by file version (device, inode, size, ctime in ns): a payload whose file is
# unchanged since it was verified (by a session's first read, or by the trust policy's hashing pass, which
# verifies every entry of a binary as it hashes it: ``epcontext/shared_hash.py``) is not hashed again for it.
# Any write changes a file's ctime (a replacement its inode), and no user can set a ctime back, so a version
# found here holds the bytes that were verified.
FileVersion = tuple[int, int, int, int]
_VERIFIED: dict[FileVersion, set[tuple[int, int, str]]] = {}
_VERSIONS_KEPT = 4096  # file versions remembered (then forgotten all at once: the next read verifies again)
SHARED_MIN = 64 << 10  # payloads this large use the table; below, hashing costs about what a stat does


def file_version(path: str | os.PathLike[str] | None) -> FileVersion | None:
    if path is None:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_ctime_ns)


def verified_before(version: FileVersion | None, offset: int, size: int, checksum: str) -> bool:
    """Whether the payload at ``offset`` (``size`` bytes, ``checksum``) of the file ``version`` was verified in
    this process (the caller checks that its file is still that version)."""
    known = _VERIFIED.get(version) if version is not None else None
    return known is not None and (offset, size, checksum) in known


def remember_verified(version: FileVersion, entries: Iterable[tuple[int, int, str]]) -> None:
    """Record payloads (offset, size, checksum) of the file ``version`` as verified: call it only once the file is
    known to be that version still (a stat after the bytes were read)."""
    if len(_VERIFIED) >= _VERSIONS_KEPT and version not in _VERIFIED:
        _VERIFIED.clear()
    _VERIFIED.setdefault(version, set()).update(entries)
