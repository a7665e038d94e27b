"""Generation as one transaction: a kill at any moment leaves the previous complete state or the new one.

A generation writes into one folder, holding an exclusive lock on the folder itself (``flock`` on its
descriptor, so no lock file is left behind): concurrent epctx writers of a folder are serialised. Under the
lock it
1. removes temporary files of epctx writers that died (``.<name>.<pid>.<hex>.tmp`` whose process is gone);
2. writes binaries and external-initializer files first, each under its preferred name when that name is
   free or already holds the same bytes, else under a name derived from its content
   (``model_EP.bin`` -> ``model_EP.<digest>.bin``), so a file the previous context model reads is never
   overwritten with other bytes;
3. renames each context model into place last (each an atomic rename);
4. removes the files the replaced context models referred to that the new ones do not, unless another
   model in the folder still names them.

Identity binding (``identity.py``) makes any other combination unloadable; this module makes sure none is
left behind.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import re
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import xxhash

from epctx.epcontext.files import is_stale_temp, write_file_atomic
from epctx.epcontext.header import MAGIC, MAX_HEADER_BYTES
from epctx.errors import Fail, InvalidArgument

if TYPE_CHECKING:
    import onnx

    from epctx.epcontext.writer import ContextBinaryWriter

__all__ = ["Transaction", "model_references", "rename_references"]

logger = logging.getLogger("epctx")


def remove_stale_temps(folder: Path) -> list[str]:
    """Remove temporary files of epctx writers whose process is gone; returns their names."""
    removed = []
    with contextlib.suppress(OSError), os.scandir(folder) as items:
        for item in items:
            if is_stale_temp(item.path) and item.is_file(follow_symlinks=False):
                with contextlib.suppress(OSError):
                    os.unlink(item.path)
                    removed.append(item.name)
    if removed:
        logger.info("removed %d temporary file(s) of killed generations in %s", len(removed), folder)
    return removed


def model_references(model: onnx.ModelProto) -> set[str]:
    """The files (relative to the model's folder) a context model refers to: binaries of embed_mode=0
    EPContext nodes and external-data locations of its initializers."""
    refs: set[str] = set()
    for node in model.graph.node:
        if node.op_type != "EPContext":
            continue
        attrs = {a.name: a for a in node.attribute}
        embed = attrs["embed_mode"].i if "embed_mode" in attrs else 1
        if embed == 0 and "ep_cache_context" in attrs:
            with contextlib.suppress(UnicodeDecodeError):
                refs.add(attrs["ep_cache_context"].s.decode("utf-8"))
    for tensor in model.graph.initializer:
        for item in tensor.external_data:
            if item.key == "location":
                refs.add(item.value)
    return refs


def rename_references(model: onnx.ModelProto, names: dict[str, str]) -> None:
    """Point the model's references at the final file names (``names``: preferred -> final)."""
    if all(old == new for old, new in names.items()):
        return
    for node in model.graph.node:
        if node.op_type != "EPContext":
            continue
        attrs = {a.name: a for a in node.attribute}
        embed = attrs["embed_mode"].i if "embed_mode" in attrs else 1
        cache = attrs.get("ep_cache_context")
        if embed == 0 and cache is not None:
            final = names.get(cache.s.decode("utf-8", "replace"))
            if final is not None:
                cache.s = final.encode("utf-8")
    for tensor in model.graph.initializer:
        for item in tensor.external_data:
            if item.key == "location" and item.value in names:
                item.value = names[item.value]


def _read_refs(path: Path) -> set[str]:
    """The references of the context model at ``path`` now (none if it is missing or unreadable)."""
    import onnx

    try:
        data = path.read_bytes()
        model = onnx.ModelProto()
        model.ParseFromString(data)
    except Exception:  # a damaged previous model: keep every file it may have named
        return set()
    return model_references(model)


def _digest_name(preferred: str, digest: str) -> str:
    stem, dot, suffix = preferred.rpartition(".")
    return f"{stem}.{digest[:12]}.{suffix}" if dot and stem else f"{preferred}.{digest[:12]}"


def _same_prefix(path: Path, head: bytes, size: int) -> bool:
    """Whether the file at ``path`` has ``size`` bytes and starts with ``head``."""
    try:
        with open(path, "rb") as fh:
            if os.fstat(fh.fileno()).st_size != size:
                return False
            return fh.read(len(head)) == head
    except OSError:
        return False


def _same_bytes(path: Path, data: bytes) -> bool:
    try:
        with open(path, "rb") as fh:
            if os.fstat(fh.fileno()).st_size != len(data):
                return False
            return fh.read() == data
    except OSError:
        return False


class Transaction:
    """``with Transaction(folder) as tx:`` place binaries and files, commit models; see the module doc."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._fd: int | None = None
        self._replaced: set[str] = set()  # what the replaced context models referred to
        self._written: set[str] = set()  # what the new ones refer to
        self._models: set[str] = set()  # names of the context models committed
        self._created: set[str] = set()  # files this transaction wrote where none was
        self._committed_refs: set[str] = set()  # what the committed models refer to

    def __enter__(self) -> Transaction:
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise Fail(f"cannot create the output folder {str(self.folder)!r}: {exc}") from exc
        self._fd = _lock_folder(self.folder)
        remove_stale_temps(self.folder)
        _remove_orphans(self.folder)
        return self

    def __exit__(self, kind: object, exc: object, tb: object) -> None:
        try:
            if kind is None:
                _fsync_folder(self._fd)
                self._remove_previous()
            else:  # files this transaction created for models it did not commit
                for name in self._created - self._committed_refs:
                    with contextlib.suppress(OSError):
                        os.unlink(self.folder / name)
        finally:
            if self._fd is not None:
                os.close(self._fd)  # releases the lock
                self._fd = None

    # -- files before the model -------------------------------------------------------------------------
    def place_binary(self, preferred: str, writer: ContextBinaryWriter) -> str:
        """Write ``writer``'s binary under ``preferred`` or a content-derived name; returns the name used."""
        head = writer.header_bytes()
        size = writer.planned_size()
        name = self._free_name(preferred, _binary_digest(head), lambda p: _same_prefix(p, head, size))
        if not _same_prefix(self.folder / name, head, size):
            self._note_created(name)
            writer.write(self.folder / name)
        self._written.add(name)
        return name

    def place_file(self, preferred: str, data: bytes) -> str:
        """Write ``data`` under ``preferred`` or a content-derived name; returns the name used."""
        name = self._free_name(preferred, xxhash.xxh3_64_hexdigest(data), lambda p: _same_bytes(p, data))
        if not _same_bytes(self.folder / name, data):
            self._note_created(name)
            write_file_atomic(self.folder / name, lambda write: write(data))
        self._written.add(name)
        return name

    def _note_created(self, name: str) -> None:
        if not os.path.lexists(self.folder / name):
            self._created.add(name)

    def _free_name(self, preferred: str, digest: str, same: Callable[[Path], bool]) -> str:
        """``preferred`` when it is free, holds the same bytes, or is a file no model of the folder names (as
        onnxruntime, epctx then overwrites it); else the content-derived name (free or the same bytes)."""
        path = self.folder / preferred
        if not os.path.lexists(path):
            return preferred
        regular = path.is_file() and not path.is_symlink()
        if regular and (same(path) or not _named_elsewhere(self.folder, {preferred}, skip=())):
            return preferred
        derived = _digest_name(preferred, digest)
        path = self.folder / derived
        if not os.path.lexists(path) or (path.is_file() and not path.is_symlink() and same(path)):
            return derived
        raise Fail(
            f"cannot place {preferred!r} in {str(self.folder)!r}: it is in use and {derived!r} exists with "
            "other content"
        )

    # -- the model last ---------------------------------------------------------------------------------
    def check_model_path(self, path: Path, *, overwrite: bool) -> None:
        """Fail before anything is written if the model cannot go to ``path``."""
        if path.is_dir():
            raise InvalidArgument(f"the context model path {str(path)!r} is a folder")
        if not overwrite and os.path.lexists(path):
            raise Fail(f"the context model {str(path)!r} exists already; remove it or write to another path")

    def commit_model(self, path: Path, model: onnx.ModelProto, *, overwrite: bool) -> None:
        """Rename the context model into place; with ``overwrite`` False an existing file is an error."""
        self.check_model_path(path, overwrite=overwrite)
        if path.exists():
            self._replaced |= _read_refs(path)
        data = model.SerializeToString(deterministic=True)
        write_file_atomic(path, lambda write: write(data))
        refs = model_references(model)
        self._written |= refs
        self._committed_refs |= refs
        self._models.add(path.name)

    def _remove_previous(self) -> None:
        stale = {name for name in self._replaced - self._written if _plain_name(name)}
        if not stale:
            return
        named = _named_elsewhere(self.folder, stale, skip=self._models)
        for name in sorted(stale - named):
            with contextlib.suppress(OSError):
                os.unlink(self.folder / name)
                logger.info("removed %s (the previous generation's file)", self.folder / name)


# Content-derived names (``_digest_name``): ``<stem>.<12 hex digits>.<suffix>``; the digits are the content's
# digest (``_binary_digest`` for context binaries), which is how a file is known to be epctx's own.
_DIGEST_NAME = re.compile(r"^(?P<stem>.+)\.(?P<digest>[0-9a-f]{12})(?P<suffix>\.[^.]+)?$")
_PREAMBLE_SIZE = 32  # magic, format version, header crc32, header length (u64 at 16), file size


def _binary_digest(head: bytes) -> str:
    """The digest of a context binary in its content-derived name: over its preamble and header."""
    header_len = int.from_bytes(head[16:24], "little")
    return xxhash.xxh3_64_hexdigest(head[: _PREAMBLE_SIZE + header_len])


def _is_ours(path: Path, digest: str) -> bool:
    """Whether the file's content has the digest its name carries (a context binary or a file epctx wrote)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(_PREAMBLE_SIZE)
            if head[:8] == MAGIC and len(head) == _PREAMBLE_SIZE:
                header_len = int.from_bytes(head[16:24], "little")
                if header_len > MAX_HEADER_BYTES:
                    return False
                return _binary_digest(head + fh.read(header_len)).startswith(digest)
            stream = xxhash.xxh3_64(head)
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                stream.update(chunk)
            return str(stream.hexdigest()).startswith(digest)
    except OSError:
        return False


def _remove_orphans(folder: Path) -> None:
    """Remove epctx's files under content-derived names that no model of the folder names (a generation was
    killed between writing them and renaming its model into place). Files of other programs are never touched:
    a file counts as epctx's only when its content has the digest its name carries."""
    candidates: set[str] = set()
    with contextlib.suppress(OSError), os.scandir(folder) as items:
        for item in items:
            match = _DIGEST_NAME.match(item.name)
            if match is None or item.name.startswith(".") or item.name.endswith(".onnx"):
                continue
            if item.is_file(follow_symlinks=False) and _is_ours(Path(item.path), match["digest"]):
                candidates.add(item.name)
    if not candidates:
        return
    for name in sorted(candidates - _named_elsewhere(folder, candidates, skip=())):
        with contextlib.suppress(OSError):
            os.unlink(folder / name)
            logger.info("removed %s (written by a generation that did not finish)", folder / name)


def _plain_name(name: str) -> bool:
    return bool(name) and "/" not in name and "\\" not in name and name not in (".", "..")


def _named_elsewhere(folder: Path, names: set[str], *, skip: Iterable[str]) -> set[str]:
    """Which of ``names`` another ``.onnx`` file of the folder mentions (byte search: conservative)."""
    found: set[str] = set()
    for other in _onnx_files(folder, skip):
        with contextlib.suppress(OSError, ValueError), open(other, "rb") as fh:
            if os.fstat(fh.fileno()).st_size == 0:
                continue
            with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
                found.update(n for n in names - found if data.find(n.encode("utf-8")) >= 0)
        if found == names:
            break
    return found


def _onnx_files(folder: Path, skip: Iterable[str]) -> Iterator[Path]:
    skipped = set(skip)
    with contextlib.suppress(OSError), os.scandir(folder) as items:
        for item in items:
            if item.name.endswith(".onnx") and item.name not in skipped and item.is_file():
                yield Path(item.path)


def _lock_folder(folder: Path) -> int | None:
    """An exclusive lock on the folder (serialises epctx writers); None where the platform has no flock."""
    try:
        import fcntl
    except ImportError:  # Windows: no folder locks; writes stay atomic one by one
        return None
    fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            logger.info("waiting for another epctx writer of %s", folder)
            fcntl.flock(fd, fcntl.LOCK_EX)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _fsync_folder(fd: int | None) -> None:
    if fd is not None:
        with contextlib.suppress(OSError):
            os.fsync(fd)
