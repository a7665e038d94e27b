"""Weightless contexts, onnxruntime's way (``docs/design/Weightless_Mode.md`` in microsoft/onnxruntime).

The application asks for exactly one mode with the session option ``ep.enable_weightless_mode``: ``0`` NONE
(default), ``1`` EXTERNAL_ONLY (the weights in the source model's external data files are not copied into the
binary; initializers inside the ``.onnx`` still are), ``2`` ALL (no weight is copied: the source ``.onnx`` is
needed at run time too). An EP says what it can do with ``weightless_supported_modes`` (``none``,
``external_only``, ``all``, ``all_or_external_only``): on its class, and as the metadata of its devices. A mode
the EP does not cover is EPFail before anything compiles; any other value is InvalidArgument. The compiled model
records the mode as metadata ``weightless_mode``.

An EP that manages its weights this way (IREE) records, for each weight it leaves out of the binary, a
:class:`WeightRef` (file, offset, length) into a :class:`SourceFile` bound by its size and xxh3-128 digest. At
load the file is found as onnxruntime finds it (``session.model_external_initializers_file_folder_path``, the
folder of ``ep.context_source_model_path``, the context model's folder; for the source ``.onnx`` in ALL mode
``ep.context_source_model_path`` first), mapped read-only, and its digest checked over the mapped bytes: a
changed weights file is InvalidGraph naming it, never a wrong answer. The digest of a file version (device,
inode, size, mtime, ctime of the mapped descriptor) is computed once per process.

A weight whose bytes are not exactly a range of the source (one a backend transformed at compile, e.g. filters
pre-transposed for a layout) cannot be mapped from it: it stays in the binary, and the log says so.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import mmap
import os
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from epctx import options as opt
from epctx.errors import EPFail, InvalidArgument, InvalidGraph, NoSuchFile

__all__ = [
    "MODEL_METADATA_KEY",
    "SUPPORTED_MODES_KEY",
    "WEIGHTLESS_SUPPORT_KEY",
    "NO_WEIGHTLESS",
    "SourceFile",
    "SourcePlanner",
    "WeightRef",
    "WeightlessMode",
    "WeightlessSetting",
    "check_supported",
    "covers",
    "file_digest",
    "open_source_fd",
    "open_sources",
    "parse_mode",
    "setting_for",
    "supported_modes",
]

logger = logging.getLogger("epctx")

SUPPORTED_MODES_KEY = "weightless_supported_modes"  # EP device metadata (onnxruntime >= 1.31)
WEIGHTLESS_SUPPORT_KEY = "weightless_support"  # its earlier form (1.29), read when the other is absent
MODEL_METADATA_KEY = "weightless_mode"  # compiled model metadata: "1" or "2", absent for NONE


class WeightlessMode(enum.IntEnum):
    NONE = 0
    EXTERNAL_ONLY = 1
    ALL = 2


_COVERS: dict[str, frozenset[int]] = {
    "none": frozenset(),
    "external_only": frozenset({1}),
    "all": frozenset({2}),
    "all_or_external_only": frozenset({1, 2}),
}


def parse_mode(value: str | None) -> WeightlessMode:
    """``ep.enable_weightless_mode``: unset / "0" / "1" / "2"; anything else (``3``, "") InvalidArgument, as
    SessionConfig parses it."""
    if value is None:
        return WeightlessMode.NONE
    return WeightlessMode(opt.weightless_mode(opt.EP_ENABLE_WEIGHTLESS_MODE, value))


def supported_modes(metadata: Mapping[str, str]) -> str:
    """What an EP device's metadata says it supports (the newer key, else the older one, else "none")."""
    return metadata.get(SUPPORTED_MODES_KEY) or metadata.get(WEIGHTLESS_SUPPORT_KEY) or "none"


def covers(supported: str, mode: WeightlessMode) -> bool:
    """Whether a supported-modes value includes ``mode`` (unrecognised values include none)."""
    return mode == WeightlessMode.NONE or int(mode) in _COVERS.get(supported, frozenset())


def check_supported(ep_name: str, supported: str, mode: WeightlessMode, where: str = "") -> None:
    if not covers(supported, mode):
        place = f" ({where})" if where else ""
        raise EPFail(
            f"{ep_name}{place} does not support weightless mode {int(mode)} ({mode.name}): it reports "
            f"{SUPPORTED_MODES_KEY}={supported!r}; ask for a mode it lists or leave ep.enable_weightless_mode unset"
        )


@dataclasses.dataclass(frozen=True, slots=True)
class WeightlessSetting:
    """What the framework tells an EP (``ExecutionProvider.weightless``): the mode asked for at compile, and
    where the source's files are at load."""

    mode: WeightlessMode = WeightlessMode.NONE
    source_model: str | None = None  # ep.context_source_model_path
    model_path: str | None = None  # the model file the session was created from (compiling: the source)
    weights_folder: str | None = None  # session.model_external_initializers_file_folder_path
    context_folder: str | None = None  # the folder of the model the session was created from


def setting_for(
    ep_name: str, compiles: bool, supported: str, config: opt.SessionConfig, model_path: str | None
) -> WeightlessSetting:
    """An EP's setting from the parsed session config (``ep_enable_weightless_mode`` checked against
    ``supported`` for an EP that compiles; a kernel EP copies nothing into a binary and is left at NONE)."""
    mode = WeightlessMode(config.ep_enable_weightless_mode)
    if mode and compiles:
        check_supported(ep_name, supported, mode)
    return WeightlessSetting(
        mode=mode if compiles else WeightlessMode.NONE,
        source_model=config.ep_context_source_model_path or None,
        model_path=model_path,
        weights_folder=config.external_initializers_folder or None,
        context_folder=os.path.dirname(os.path.abspath(model_path)) if model_path else None,
    )


NO_WEIGHTLESS = WeightlessSetting()


@dataclasses.dataclass(frozen=True, slots=True)
class SourceFile:
    """A file weights are mapped from: ``location`` relative to the source model's folder (``model``: the source
    ``.onnx`` itself), bound by ``size`` and ``digest`` (xxh3-128, hex)."""

    location: str
    size: int
    digest: str
    model: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"location": self.location, "size": self.size, "xxh3_128": self.digest, "model": self.model}

    @staticmethod
    def from_json(doc: Any, where: str) -> SourceFile:
        ok = (
            isinstance(doc, dict)
            and isinstance(doc.get("location"), str)
            and isinstance(doc.get("size"), int)
        )
        if (
            not ok
            or not isinstance(doc.get("xxh3_128"), str)
            or not isinstance(doc.get("model", False), bool)
        ):
            raise InvalidGraph(f"{where}: a weightless source file record is malformed: {doc!r}")
        return SourceFile(doc["location"], doc["size"], doc["xxh3_128"], doc.get("model", False))


@dataclasses.dataclass(frozen=True, slots=True)
class WeightRef:
    """``length`` bytes at ``offset`` of source file number ``file``."""

    file: int
    offset: int
    length: int


# -- digests: once per file version per process ----------------------------------------------------------
_DIGESTS: dict[tuple[int, ...], str] = {}
_DIGESTS_LOCK = threading.Lock()


def _stamp(fd: int) -> tuple[int, ...]:
    st = os.fstat(fd)
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _open(path: Path, what: str) -> int:
    try:
        return os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise NoSuchFile(f"{what}: cannot open {str(path)!r}: {exc}") from exc


def _map(path: Path, what: str) -> tuple[mmap.mmap, int, str]:
    fd = _open(path, what)
    try:
        return _map_fd(fd)
    finally:
        os.close(fd)


def _map_fd(fd: int) -> tuple[mmap.mmap, int, str]:
    """The file mapped read-only, its size and the digest of the mapped bytes (memoised by the descriptor's
    stamp: device, inode, size, mtime, ctime)."""
    stamp = _stamp(fd)
    mapping = mmap.mmap(fd, 0, access=mmap.ACCESS_READ) if stamp[2] else mmap.mmap(-1, 1)
    with _DIGESTS_LOCK:
        digest = _DIGESTS.get(stamp)
    if digest is None:
        digest = xxhash.xxh3_128_hexdigest(mapping if stamp[2] else b"")
        with _DIGESTS_LOCK:
            _DIGESTS[stamp] = digest
    return mapping, stamp[2], digest


def file_digest(path: str | os.PathLike[str]) -> tuple[int, str]:
    """(size, xxh3-128 hex) of a file, computed once per file version per process."""
    mapping, size, digest = _map(Path(path), str(path))
    mapping.close()
    return size, digest


class SourcePlanner:
    """Compile side: which weights of a partition can be left out of the binary in ``setting.mode``, and where
    they are in the source's files."""

    def __init__(self, setting: WeightlessSetting, where: str) -> None:
        self.setting = setting
        self.where = where
        self.files: list[SourceFile] = []
        self._maps: dict[str, tuple[int, mmap.mmap]] = {}  # real path -> (file number, mapping)

    def _file(self, path: Path, location: str, model: bool) -> tuple[int, mmap.mmap]:
        real = os.path.realpath(path)
        found = self._maps.get(real)
        if found is None:
            mapping, size, digest = _map(Path(real), self.where)
            self.files.append(SourceFile(location, size, digest, model))
            found = self._maps[real] = (len(self.files) - 1, mapping)
        return found

    def ref(self, tensor: Any, array: np.ndarray) -> WeightRef | None:
        """Where ``array`` (the bytes IREE is given for ``tensor``) lies in the source, or None: it stays in
        the binary (an internal initializer in EXTERNAL_ONLY mode, or bytes not found unchanged)."""
        data = memoryview(np.ascontiguousarray(array).reshape(-1).view(np.uint8))  # type: ignore[arg-type]
        if not data.nbytes:
            return None
        location = getattr(tensor, "location", None)
        if isinstance(location, str) and location and hasattr(tensor, "offset"):
            number, mapping = self._file(Path(tensor.path), location, model=False)
            offset = int(tensor.offset or 0)
            if mapping[offset : offset + data.nbytes] == data:
                return WeightRef(number, offset, data.nbytes)
            self._kept(tensor, "its bytes differ from its external data (transformed at compile)")
            return None
        if self.setting.mode != WeightlessMode.ALL:
            return None
        return self._in_model(tensor, data)

    def _in_model(self, tensor: Any, data: memoryview) -> WeightRef | None:
        source = self.setting.source_model or self.setting.model_path
        if source is None:
            raise InvalidArgument(
                f"{self.where}: ep.enable_weightless_mode=2 (ALL) maps the weights inside the source model, "
                "which must then be a file (create the session from a path)"
            )
        number, mapping = self._file(Path(source), os.path.basename(source), model=True)
        offset = mapping.find(data)  # identical bytes anywhere in the file are the same weight
        if offset < 0:
            self._kept(tensor, "its bytes are not stored as such in the source model")
            return None
        return WeightRef(number, offset, data.nbytes)

    def _kept(self, tensor: Any, why: str) -> None:
        logger.info("%s: weight %r kept in the binary: %s", self.where, getattr(tensor, "name", "?"), why)

    def close(self) -> None:
        for _, mapping in self._maps.values():
            mapping.close()
        self._maps.clear()


# -- load side -------------------------------------------------------------------------------------------
def _candidates(source: SourceFile, setting: WeightlessSetting) -> list[tuple[Path, str]]:
    """(folder, location) pairs to try, in onnxruntime's order."""
    found: list[tuple[Path, str]] = []
    if source.model:
        if setting.source_model:
            found.append((Path(setting.source_model).parent, Path(setting.source_model).name))
    elif setting.weights_folder:
        found.append((Path(setting.weights_folder), os.path.basename(source.location)))
    if not source.model and setting.source_model:
        found.append((Path(setting.source_model).parent, source.location))
    if setting.context_folder:
        found.append((Path(setting.context_folder), source.location))
    return found


def _resolve(source: SourceFile, setting: WeightlessSetting, where: str) -> Path:
    from epctx.model.external import allowed_folders, confine_external_file

    tried = []
    for folder, location in _candidates(source, setting):
        joined = folder / location
        tried.append(str(joined))
        if joined.is_file():
            what = f"{where}: weightless source"
            return confine_external_file(
                location, folder, allowed_folders(folder, None), tensor=source.location, what=what
            )
    hint = "ep.context_source_model_path"
    if not source.model:
        hint = f"session.model_external_initializers_file_folder_path or {hint}"
    raise NoSuchFile(
        f"{where}: the weights of this weightless context are in {source.location!r}, not found (tried "
        f"{', '.join(map(repr, tried)) or 'nothing: no folder known'}); set {hint}"
    )


def _changed(path: Path, source: SourceFile, size: int, digest: str, where: str) -> InvalidGraph:
    return InvalidGraph(
        f"{where}: the weights file {str(path)!r} changed since the context was compiled (size {source.size} -> "
        f"{size}, xxh3-128 {source.digest[:16]}... -> {digest[:16]}...): restore it, or compile the context again "
        "for the new weights"
    )


def open_source_fd(source: SourceFile, setting: WeightlessSetting, where: str) -> int:
    """A read-only descriptor of the source file, checked against its size and digest (the caller closes it):
    for a backend that opens the file itself, by ``/proc/self/fd/<n>``, so it reads the very file checked."""
    path = _resolve(source, setting, where)
    fd = _open(path, where)
    try:
        mapping, size, digest = _map_fd(fd)
        mapping.close()
        if (size, digest) != (source.size, source.digest):
            raise _changed(path, source, size, digest, where)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_sources(files: Sequence[SourceFile], setting: WeightlessSetting, where: str) -> list[mmap.mmap]:
    """The source files mapped read-only, each checked against its recorded size and digest."""
    if any(f.model for f in files) and not setting.source_model:
        logger.warning(
            "%s: a context compiled with weightless mode ALL is loaded without ep.context_source_model_path; "
            "the source model is looked for beside the context model",
            where,
        )
    maps = []
    for source in files:
        path = _resolve(source, setting, where)
        mapping, size, digest = _map(path, where)
        if (size, digest) != (source.size, source.digest):
            mapping.close()
            raise _changed(path, source, size, digest, where)
        maps.append(mapping)
    return maps
