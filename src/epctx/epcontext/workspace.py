"""SharedContextWorkspace: ``ep.share_ep_contexts`` — one per EP per process, thread-safe.

Generation: sessions of a group compile into one shared binary writer, named after the first model
(``[model1_name]_[ep].bin``); each writes its own context model pointing at it; the session with
``ep.stop_share_ep_contexts=1`` writes the binary and clears the workspace (N models -> N+1 files; the
container stores identical weights once). Inference: the first session opens the binary and leaves it in
the workspace; later sessions take it from there without opening the file again. Opened binaries are
memory-mapped and every view keeps its mapping alive, so sessions may close in any order.
"""

from __future__ import annotations

import threading
from pathlib import Path

from epctx.epcontext.container import ContextBinary, ContextBinaryWriter
from epctx.epcontext.paths import binary_file_name
from epctx.errors import InvalidArgument
from epctx.providers.base import ExecutionProvider

__all__ = ["SharedContextWorkspace", "workspace"]


class SharedContextWorkspace:
    def __init__(self, ep_name: str) -> None:
        self.ep_name = ep_name
        self.lock = threading.RLock()
        self._writer: ContextBinaryWriter | None = None
        self._file_name = ""
        self._folder: Path | None = None
        self._opened: dict[str, ContextBinary] = {}

    # -- generation ----------------------------------------------------------------------------------
    def generation_target(
        self, ep: ExecutionProvider, model_name: str, folder: Path
    ) -> tuple[ContextBinaryWriter, str]:
        """The group's writer and binary file name; the first session of a group creates them."""
        with self.lock:
            folder = folder.resolve()
            if self._writer is None:
                self._writer = ContextBinaryWriter(
                    ep_name=ep.name, sdk_version=ep.sdk_version(), hardware=ep.hardware()
                )
                self._file_name = binary_file_name(model_name, ep.name)
                self._folder = folder
            elif folder != self._folder:
                raise InvalidArgument(
                    f"ep.share_ep_contexts: this context model goes to {str(folder)!r} but the shared binary "
                    f"{self._file_name!r} of the group goes to {str(self._folder)!r}; write them to one folder"
                )
            return self._writer, self._file_name

    def finish_generation(self) -> None:
        with self.lock:
            self._writer = None
            self._file_name = ""
            self._folder = None

    # -- inference -----------------------------------------------------------------------------------
    def open(self, path: Path) -> ContextBinary:
        """The binary at ``path``, opened once per group."""
        key = str(path)
        with self.lock:
            binary = self._opened.get(key)
            if binary is None:
                binary = self._opened[key] = ContextBinary.open(path)
            return binary

    def release_loaded(self) -> None:
        with self.lock:
            self._opened.clear()


_WORKSPACES: dict[str, SharedContextWorkspace] = {}
_GUARD = threading.Lock()


def workspace(ep_name: str) -> SharedContextWorkspace:
    with _GUARD:
        ws = _WORKSPACES.get(ep_name)
        if ws is None:
            ws = _WORKSPACES[ep_name] = SharedContextWorkspace(ep_name)
        return ws
