"""Weight sharing (``ep.share_ep_contexts``): the generation group of the process, and per-EP binaries opened
once for inference. Thread-safe.

Generation: sessions with ``ep.share_ep_contexts=1`` form one group; the first names each EP's shared binary
after its model (``[model1_name]_[ep].bin``); all compile into the group's writers (identical payloads stored
once) and place their CPU-fallback initializers in the group's external files (identical tensors stored once,
nothing overwritten). A session of the group keeps its context model in the group; the one with
``ep.stop_share_ep_contexts=1`` writes the binaries, the external files and every model of the group in one
transaction (N models -> N+1 files). A session that fails rolls the whole group back: nothing of it is written
and the next sharing session starts a new group.

Inference: the first session opens a shared binary and keeps it; later sessions take it from here without
opening the file again, as long as the path still names the same file (a regenerated binary is opened anew,
never served from the cache). Views keep their mapping alive, so sessions may close in any order.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import xxhash

from epctx.epcontext.container import ContextBinary
from epctx.epcontext.paths import binary_file_name
from epctx.errors import InvalidArgument

if TYPE_CHECKING:
    import onnx

    from epctx.ep import BinaryLayout, ExecutionProvider
    from epctx.epcontext.writer import ContextBinaryWriter  # generation only: not imported by loading
    from epctx.trust.hooks import ReadFunc, WriteFunc

__all__ = [
    "ExternalFile",
    "GenerationGroup",
    "SharedContextWorkspace",
    "generation_group",
    "group_target",
    "workspace",
]

logger = logging.getLogger("epctx")


class ExternalFile:
    """An external-initializer file being built: tensors 64-byte aligned, identical ones stored once."""

    def __init__(self) -> None:
        self.data = bytearray()
        self._index: dict[tuple[int, int], list[int]] = {}

    def add(self, raw: bytes) -> int:
        """The offset of ``raw`` in the file (appended unless the same bytes are there already)."""
        key = (len(raw), xxhash.xxh3_64_intdigest(raw))
        for offset in self._index.get(key, ()):
            if self.data[offset : offset + len(raw)] == raw:
                return offset
        self.data.extend(b"\0" * ((-len(self.data)) % 64))
        offset = len(self.data)
        self.data.extend(raw)
        self._index.setdefault(key, []).append(offset)
        return offset


@dataclasses.dataclass
class PendingModel:
    path: Path
    model: onnx.ModelProto
    overwrite: bool


class GenerationGroup:
    """The models of one sharing group, their shared binaries (one per EP) and external files."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.lock = threading.RLock()
        self.binaries: dict[str, tuple[ContextBinaryWriter, str]] = {}  # EP name -> (writer, preferred name)
        self.files: dict[str, ExternalFile] = {}
        self.models: list[PendingModel] = []
        self.data_write: list[
            WriteFunc | None
        ] = []  # the members' EPContext data write callback (one, or none)

    def use_data_write(self, write: WriteFunc | None) -> None:
        """A member's EPContext data write callback: every model of a group uses the same one (or none), since
        the group's shared binaries are stored once, by the member that writes the group."""
        with self.lock:
            if not self.data_write:
                self.data_write.append(write)
            elif self.data_write[0] != write:
                raise InvalidArgument(
                    "ep.share_ep_contexts: every model of a sharing group must use the same EPContext data write "
                    "function (or none): the group's shared binaries are stored once, for all its models"
                )

    def writer_for(self, ep: ExecutionProvider, model_name: str) -> tuple[ContextBinaryWriter, str]:
        """The group's writer for ``ep`` and its binary's preferred name; the first model of the EP names it."""
        with self.lock:
            found = self.binaries.get(ep.name)
            if found is None:
                from epctx.epcontext.writer import ContextBinaryWriter

                writer = ContextBinaryWriter(
                    ep_name=ep.name, sdk_version=ep.sdk_version(), hardware=ep.hardware()
                )
                found = self.binaries[ep.name] = (writer, binary_file_name(model_name, ep.name))
            return found

    def keep(self, path: Path, model: onnx.ModelProto, *, overwrite: bool) -> None:
        """Hold a member's context model until the group is written."""
        with self.lock:
            if any(p.path == path for p in self.models):
                raise InvalidArgument(
                    f"ep.share_ep_contexts: two models of the sharing group write the context model {str(path)!r}"
                )
            self.models.append(PendingModel(path, model, overwrite))

    def names(self) -> list[str]:
        return [p.path.name for p in self.models]


_GROUP: GenerationGroup | None = None
_GROUP_GUARD = threading.Lock()


def generation_group(folder: Path) -> GenerationGroup:
    """The open sharing group (created by its first session); all its models go to one folder."""
    global _GROUP
    folder = folder.resolve()
    with _GROUP_GUARD:
        if _GROUP is None:
            _GROUP = GenerationGroup(folder)
        elif _GROUP.folder != folder:
            raise InvalidArgument(
                f"ep.share_ep_contexts: this context model goes to {str(folder)!r} but the sharing group "
                f"({', '.join(_GROUP.names()) or 'no model yet'}) writes to {str(_GROUP.folder)!r}; write the "
                "models of a group to one folder"
            )
        return _GROUP


def close_group(group: GenerationGroup, *, failed: BaseException | None = None) -> None:
    """The group is written (or, with ``failed``, rolled back): the next sharing session starts a new one."""
    global _GROUP
    with _GROUP_GUARD:
        if _GROUP is group:
            _GROUP = None
    if failed is not None:
        logger.warning(
            "ep.share_ep_contexts: a session of the sharing group failed (%s); the group (%s) was rolled back "
            "and nothing of it was written",
            failed,
            ", ".join(group.names()) or "no model yet",
        )


def abort_open_group(failed: BaseException) -> None:
    """Roll back the open sharing group, if any (a generating sharing session failed)."""
    with _GROUP_GUARD:
        group = _GROUP
    if group is not None:
        close_group(group, failed=failed)


def group_target(
    group: GenerationGroup | None, model_name: str
) -> Callable[[ExecutionProvider], BinaryLayout] | None:
    """For a session's compile: EP -> the group's writer its partitions will be saved into
    (``CompileContext.target_binary``); None outside a group."""
    if group is None:
        return None
    return lambda ep: group.writer_for(ep, model_name)[0]


class SharedContextWorkspace:
    """Binaries opened for inference by the sessions of a sharing group, per EP."""

    def __init__(self, ep_name: str) -> None:
        self.ep_name = ep_name
        self.lock = threading.RLock()
        self._opened: dict[str, ContextBinary] = {}
        self._read: dict[str, tuple[ReadFunc, ContextBinary]] = {}  # name -> (read callback, its binary)

    def open(self, path: Path, *, copy: bool = False) -> ContextBinary:
        """The binary at ``path``, opened once per group while the path names the same file (``copy``: read
        into memory, see ``ContextBinary.open``; a copy is never reused, the file may have changed)."""
        if copy:
            return ContextBinary.open(path, copy=True)
        key = str(path)
        with self.lock:
            binary = self._opened.get(key)
            if binary is not None:
                fd = binary.open_file()  # None: the path names another file now (regenerated)
                if fd is None:
                    binary = None
                else:
                    os.close(fd)
            if binary is None:
                binary = self._opened[key] = ContextBinary.open(path)
            return binary

    def from_callback(self, read: ReadFunc, name: str) -> ContextBinary:
        """The binary the EPContext data read callback ``read`` returns for ``name``, asked once per group (the
        group's sessions share it, as they share a binary opened from a file); another callback asks anew."""
        from epctx.trust.hooks import read_named_buffer

        with self.lock:
            found = self._read.get(name)
            if found is not None and found[0] == read:
                return found[1]
            binary = ContextBinary.from_bytes(
                read_named_buffer(read, name),
                where=f"context binary {name!r} (from the EPContext data read callback)",
            )
            self._read[name] = (read, binary)
            return binary

    def release_loaded(self) -> None:
        with self.lock:
            self._opened.clear()
            self._read.clear()


_WORKSPACES: dict[str, SharedContextWorkspace] = {}
_GUARD = threading.Lock()


def workspace(ep_name: str) -> SharedContextWorkspace:
    with _GUARD:
        ws = _WORKSPACES.get(ep_name)
        if ws is None:
            ws = _WORKSPACES[ep_name] = SharedContextWorkspace(ep_name)
        return ws
