"""SHA-256 of files at hashing speed (the file mapped, hashed in one call that releases the GIL), each file
version hashed once per process; a context binary is hashed by the pass that also verifies its entries (the
loader hands it down as ``hasher``), so the trust check and the container's checks read it once."""

from __future__ import annotations

import hashlib
import mmap
import os
from collections.abc import Callable
from pathlib import Path

from epctx.errors import Untrusted

__all__ = ["Hasher", "file_sha256", "relative_name"]


# (device, inode, size, ctime ns) -> SHA-256, for this process: a binary shared by several context models (a
# weight-sharing group) is hashed once. Any write changes the ctime, so a stale entry is never found.
_HASHED: dict[tuple[int, int, int, int], str] = {}


# ``hasher(mapping, fd, version, path)``: the SHA-256 of a mapped file computed by a caller that does more in the same
# pass (a context binary's entries verified as it is hashed: ``epcontext/shared_hash.py``, handed down by the
# loader), or None to let this module hash it plainly.
Hasher = Callable[[mmap.mmap, int, tuple[int, int, int, int], str], "str | None"]


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
                digest = hasher(mapped, fh.fileno(), key, str(path)) if hasher is not None else None
                if digest is None:
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
