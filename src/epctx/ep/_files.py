"""Files epctx writes atomically, and the user's cache folder, where EPs keep what they learned between processes.

- ``write_file_atomic``: through a temporary file in the target's folder whose name says which process writes
  it (``.<name>.<pid>.<hex>.tmp``, ``epctx.epcontext.files.TEMP_PATTERN``), fsync'ed, renamed over the target;
- ``user_cache_dir(*parts)``: ``$EPCTX_CACHE_DIR``, else ``$XDG_CACHE_HOME/epctx``, else ``~/.cache/epctx``;
- ``RecordCache``: small JSON records by key in one cache folder. Writers replace a record atomically (two
  processes writing the same key leave one whole record), readers take no lock; a record that does not parse,
  or is another key's, reads as missing and the next ``put`` rewrites it. A cache never fails its caller: a
  folder that cannot be written is logged once and the records are not kept.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import secrets
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from epctx.errors import Fail, NoSuchFile

__all__ = ["CACHE_DIR_ENV", "RecordCache", "fsync_folder", "user_cache_dir", "write_file_atomic"]

logger = logging.getLogger("epctx")

CACHE_DIR_ENV = "EPCTX_CACHE_DIR"
_KEY = re.compile(r"[0-9a-f]{16,128}")


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
    fsync_folder(folder)


def fsync_folder(folder: str) -> None:
    """Make the rename durable where the platform allows it (best effort)."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def user_cache_dir(*parts: str) -> Path:
    """epctx's folder in the user's cache (not created): ``$EPCTX_CACHE_DIR``, else ``$XDG_CACHE_HOME/epctx``,
    else ``~/.cache/epctx``; then ``parts``."""
    given = os.environ.get(CACHE_DIR_ENV)
    if given:
        return Path(given, *parts)
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache, "epctx", *parts)


class RecordCache:
    """JSON records by key (hex digits: a digest of what decides the record) in ``folder``, one file each,
    ``<key[:2]>/<key>.json``; each record holds its key, so a file copied or renamed reads as missing."""

    def __init__(self, folder: str | os.PathLike[str], *, what: str = "cache record") -> None:
        self.folder = Path(folder)
        self.what = what
        self._unwritable = False

    def path(self, key: str) -> Path:
        if not _KEY.fullmatch(key):
            raise ValueError(f"a record key is 16 to 128 lowercase hex digits, got {key!r}")
        return self.folder / key[:2] / f"{key}.json"

    def get(self, key: str) -> dict[str, Any] | None:
        """The record of ``key``, or None: none kept, or one that cannot be read or parsed, or is another's."""
        path = self.path(key)
        try:
            doc = json.loads(path.read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            logger.info("%s %s ignored (it is written again): %s", self.what, path, exc)
            return None
        if not isinstance(doc, dict) or doc.get("key") != key or not isinstance(doc.get("record"), dict):
            logger.info("%s %s ignored (it is written again): not a record of this key", self.what, path)
            return None
        return dict(doc["record"])

    def put(self, key: str, record: Mapping[str, Any]) -> bool:
        """Keep ``record`` under ``key`` (atomically replacing any); False when the folder cannot be written."""
        path = self.path(key)
        text = json.dumps({"key": key, "record": dict(record)}, sort_keys=True).encode()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_file_atomic(path, lambda write: write(text), what=self.what)
        except (OSError, Fail) as exc:
            if not self._unwritable:
                logger.warning(
                    "%s: %s cannot be written, nothing is kept there: %s", self.what, self.folder, exc
                )
            self._unwritable = True
            return False
        return True
