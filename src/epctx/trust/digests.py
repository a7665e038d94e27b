"""SHA-256 of files at hashing speed (the file mapped, hashed in one call that releases the GIL), each file
version hashed once per process."""

from __future__ import annotations

import hashlib
import mmap
import os
from pathlib import Path

from epctx.errors import Untrusted

__all__ = ["file_sha256", "relative_name"]


# (device, inode, size, ctime ns) -> SHA-256, for this process: a binary shared by several context models (a
# weight-sharing group) is hashed once. Any write changes the ctime, so a stale entry is never found.
_HASHED: dict[tuple[int, int, int, int], str] = {}


def file_sha256(path: Path) -> str:
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
                digest = hashlib.sha256(mapped).hexdigest()
            after = os.fstat(fh.fileno())
            if (after.st_size, after.st_ctime_ns) == (st.st_size, st.st_ctime_ns):
                _HASHED[key] = digest
            return digest
    except OSError as exc:
        raise Untrusted(f"cannot read {str(path)!r} to check its signature: {exc.strerror or exc}") from exc


def relative_name(path: Path, folder: Path) -> str | None:
    """``path``'s name in a manifest of ``folder`` (posix, relative), None when it lies outside."""
    try:
        return Path(os.path.realpath(path)).relative_to(os.path.realpath(folder)).as_posix()
    except ValueError:
        return None
