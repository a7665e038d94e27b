"""SHA-256 of files at hashing speed (the file mapped, hashed in one call that releases the GIL), each file
version hashed once per process; a context binary is hashed by the pass that also verifies its entries (the
loader hands it down as ``hasher``), so the trust check and the container's checks read it once."""

from __future__ import annotations

import hashlib
import mmap
import os
from pathlib import Path
from typing import Any, Protocol

from epctx.errors import Untrusted

__all__ = ["Hasher", "file_sha256", "notes_of", "relative_name"]


# (device, inode, size, ctime ns) -> SHA-256, for this process: a binary shared by several context models (a
# weight-sharing group) is hashed once. Any write changes the ctime, so a stale entry is never found.
_HASHED: dict[tuple[int, int, int, int], str] = {}
_NOTES: dict[
    tuple[int, int, int, int], object
] = {}  # what the hasher found besides the digest, by file version


class Hasher(Protocol):
    """Hashing done by a caller that does more in the same pass (a context binary's entries verified as it is
    hashed: ``epcontext/shared_hash.py``, handed down by the loader; trust stays below it).

    ``sha256(mapping, fd, version, path)``: the file's SHA-256 and notes on what else was verified (JSON-able,
    opaque here: kept in the verification record), or None to let this module hash it plainly.
    ``remember(version, notes)``: a record's notes for a file version that is unchanged since it was verified
    (a warm session: nothing is hashed, the notes stand for the pass)."""

    def sha256(self, mapping: mmap.mmap, fd: int, version: tuple[int, int, int, int], path: str) -> Any: ...

    def remember(self, version: tuple[int, int, int, int], notes: object) -> None: ...


def file_sha256(path: Path, hasher: Hasher | None = None) -> str:
    try:
        with open(path, "rb") as fh:
            st = os.fstat(fh.fileno())
            key = (st.st_dev, st.st_ino, st.st_size, st.st_ctime_ns)
            known = _HASHED.get(key)
            if known is not None:
                return known
            if st.st_size == 0:
                return hashlib.sha256().hexdigest()
            with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
                done = hasher.sha256(mapped, fh.fileno(), key, str(path)) if hasher is not None else None
                digest = hashlib.sha256(mapped).hexdigest() if done is None else done[0]
                if done is not None and done[1]:
                    _NOTES[key] = done[1]
            after = os.fstat(fh.fileno())
            if (after.st_size, after.st_ctime_ns) == (st.st_size, st.st_ctime_ns):
                _HASHED[key] = digest
            return digest
    except OSError as exc:
        raise Untrusted(f"cannot read {str(path)!r} to check its signature: {exc.strerror or exc}") from exc


def notes_of(version: list[int] | None) -> object:
    """What the hasher noted when it hashed this file version in this process (None: nothing)."""
    return _NOTES.get(tuple(version)) if version is not None and len(version) == 4 else None  # type: ignore[arg-type]


def relative_name(path: Path, folder: Path) -> str | None:
    """``path``'s name in a manifest of ``folder`` (posix, relative), None when it lies outside."""
    try:
        return Path(os.path.realpath(path)).relative_to(os.path.realpath(folder)).as_posix()
    except ValueError:
        return None
