"""The transparent cache's folder: one entry per key, generations written aside and switched atomically.

    <cache>/<key>/key.json             what the key covers (written once)
    <cache>/<key>/CURRENT              the name of the generation to serve (replaced atomically)
    <cache>/<key>/g<ns>-<pid>/         a generation: model_ctx.onnx and its binaries

A generation is compiled into a folder of its own and becomes visible only when ``CURRENT`` names it (a
rename): a process killed while compiling or writing leaves a folder nothing names (removed by the next
writer or ``prune``) and the previous generation, if any, still served. Writers of a key hold an exclusive
``flock`` on its folder: of many processes starting at once one compiles, the others wait and then load what
it wrote. Readers take no lock (``CURRENT`` only ever names a complete generation). A load refreshes the
mtime of ``CURRENT``: ``prune`` removes the least recently used entries beyond a size.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import shutil
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from epctx.epcontext.files import write_file_atomic
from epctx.errors import InvalidArgument

__all__ = ["CURRENT", "CONTEXT_NAME", "CacheEntry", "ContextCache", "EntryInfo"]

logger = logging.getLogger("epctx")

CURRENT = "CURRENT"
KEY_FILE = "key.json"
CONTEXT_NAME = "model_ctx.onnx"


@dataclasses.dataclass(frozen=True, slots=True)
class EntryInfo:
    key: str
    size: int  # bytes, every generation
    last_used: float  # mtime of CURRENT (0: no generation yet)
    current: str | None
    generations: tuple[str, ...]
    model: str  # what key.json says the source was


def _folder_size(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total


class CacheEntry:
    """One key's folder."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.key = folder.name

    def current(self) -> Path | None:
        """The context model of the generation ``CURRENT`` names, or None."""
        try:
            name = (self.folder / CURRENT).read_text(encoding="utf-8").strip()
        except OSError:
            return None
        ctx = self.folder / name / CONTEXT_NAME
        return ctx if name and "/" not in name and ctx.is_file() else None

    def touch(self) -> None:
        with contextlib.suppress(OSError):
            os.utime(self.folder / CURRENT)

    @contextlib.contextmanager
    def locked(self, *, wait: bool = True) -> Iterator[bool]:
        """The key's writer lock (waits while another process compiles it). Yields whether it is held:
        always with ``wait``, else only when no other process held it."""
        self.folder.mkdir(parents=True, exist_ok=True)
        try:
            import fcntl
        except ImportError:  # no flock: writers may compile twice, each generation still atomic
            yield wait
            return
        fd = os.open(self.folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if not wait:
                    yield False
                    return
                logger.info("epctx.context_cache: another process compiles %s; waiting for it", self.folder)
                fcntl.flock(fd, fcntl.LOCK_EX)
            yield True
        finally:
            os.close(fd)

    def tidy(self, current: str | None) -> None:
        """Remove generations a killed writer left (one killed after switching ``CURRENT`` but before removing
        the others leaves them to the next reader), unless another process holds the lock right now.
        ``current``: the generation just read from ``CURRENT``."""
        try:
            stale = any(
                p.name != current and p.name.startswith("g") for p in self.folder.iterdir() if p.is_dir()
            )
        except OSError:
            return
        if stale:
            with self.locked(wait=False) as held:
                if held:
                    removed = self.remove_stale()
                    logger.info("epctx.context_cache: removed generations nothing serves: %s", removed)

    def new_generation(self) -> Path:
        """A fresh generation folder (call under :meth:`locked`)."""
        path = self.folder / f"g{time.time_ns()}-{os.getpid()}"
        path.mkdir()
        return path

    def commit(self, generation: Path, parts: Mapping[str, Any]) -> None:
        """Serve ``generation`` from now on (atomically), then remove the others (call under :meth:`locked`)."""
        if not (self.folder / KEY_FILE).exists():
            text = json.dumps(parts, indent=1, sort_keys=True)
            write_file_atomic(self.folder / KEY_FILE, lambda write: write(text.encode()), what="cache key")
        name = generation.name.encode()
        write_file_atomic(self.folder / CURRENT, lambda write: write(name), what="cache pointer")
        self.remove_stale(keep=generation.name)

    def remove_stale(self, keep: str | None = None) -> list[str]:
        """Remove generations ``CURRENT`` does not name (killed writers', replaced ones); call under the lock."""
        keep = keep or self._current_name()
        removed = []
        for item in self.folder.iterdir():
            if item.is_dir() and item.name.startswith("g") and item.name != keep:
                shutil.rmtree(item, ignore_errors=True)
                removed.append(item.name)
        return removed

    def _current_name(self) -> str | None:
        current = self.current()
        return current.parent.name if current is not None else None

    def info(self) -> EntryInfo:
        try:
            last_used = (self.folder / CURRENT).stat().st_mtime
        except OSError:
            last_used = 0.0
        model = ""
        with contextlib.suppress(OSError, ValueError, AttributeError):
            parts = json.loads((self.folder / KEY_FILE).read_text(encoding="utf-8"))
            model = parts["source"]["model"][:12] + " " + ",".join(p["name"] for p in parts["providers"])
        generations = tuple(
            sorted(p.name for p in self.folder.iterdir() if p.is_dir() and p.name.startswith("g"))
        )
        return EntryInfo(
            self.key, _folder_size(self.folder), last_used, self._current_name(), generations, model
        )


class ContextCache:
    """A cache folder (``epctx.context_cache``)."""

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.folder = Path(folder)
        if self.folder.exists() and not self.folder.is_dir():
            raise InvalidArgument(f"epctx.context_cache {str(self.folder)!r} is not a folder")

    def entry(self, key: str) -> CacheEntry:
        return CacheEntry(self.folder / key)

    def entries(self) -> list[CacheEntry]:
        if not self.folder.is_dir():
            return []
        return [CacheEntry(p) for p in sorted(self.folder.iterdir()) if p.is_dir()]  # committed or not

    def prune(self, max_bytes: int | None = None) -> list[str]:
        """Remove stale generations, then whole entries, least recently used first, until the cache holds at
        most ``max_bytes``. Returns what was removed (``<key>/<generation>`` or ``<key>``)."""
        removed = []
        infos = []
        for entry in self.entries():
            with entry.locked():
                removed += [f"{entry.key}/{g}" for g in entry.remove_stale()]
            infos.append(entry.info())
        if max_bytes is None:
            return removed
        total = sum(i.size for i in infos)
        for info in sorted(infos, key=lambda i: i.last_used):
            if total <= max_bytes:
                break
            entry = self.entry(info.key)
            with entry.locked():
                shutil.rmtree(entry.folder, ignore_errors=True)
            total -= info.size
            removed.append(info.key)
        return removed

    def clear(self) -> list[str]:
        removed = []
        for entry in self.entries():
            with entry.locked():
                shutil.rmtree(entry.folder, ignore_errors=True)
            removed.append(entry.key)
        return removed
