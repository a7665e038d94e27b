"""SHA-256 of files at hashing speed (the file mapped, hashed in one call that releases the GIL)."""

from __future__ import annotations

import hashlib
import mmap
import os
from pathlib import Path

from epctx.errors import Untrusted

__all__ = ["file_sha256", "relative_name"]


def file_sha256(path: Path) -> str:
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size == 0:
                return hashlib.sha256().hexdigest()
            with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
                return hashlib.sha256(mapped).hexdigest()
    except OSError as exc:
        raise Untrusted(f"cannot read {str(path)!r} to check its signature: {exc.strerror or exc}") from exc


def relative_name(path: Path, folder: Path) -> str | None:
    """``path``'s name in a manifest of ``folder`` (posix, relative), None when it lies outside."""
    try:
        return Path(os.path.realpath(path)).relative_to(os.path.realpath(folder)).as_posix()
    except ValueError:
        return None
