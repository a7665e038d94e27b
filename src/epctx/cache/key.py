"""The transparent cache's key: everything that changes a compiled binary, hashed.

- the source model's bytes and every external data file its initializers name (content, not names or dates);
- the providers in order, each with its options and, for compiling EPs, its SDK version, hardware and
  compatibility string (target triple and CPU features for IREE, device and precision for OpenVINO);
- the session options that reach compile: every config entry but the cache's and the context-generation ones,
  the optimization level, free dimension overrides and the values given to ``add_initializer``;
- this machine (architecture, CPU model and flags) and epctx's version.

Two sessions with the same key compile byte-identical contexts (generation is deterministic), so a context
cached under a key is the one this session would compile; any change above gives another key, never a stale
binary. The parts are kept beside the context (``key.json``) so that ``epctx cache list`` says what a key is.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from epctx import options as opt
from epctx._version import __version__

if TYPE_CHECKING:
    from epctx.ep._contract import ExecutionProvider

__all__ = ["CACHE_CONFIG_KEYS", "Digests", "cache_key", "external_data_files"]

# Config entries that do not change the binary: the cache's own, and how (not what) the context is written.
CACHE_CONFIG_KEYS = frozenset({opt.CONTEXT_CACHE, opt.CONTEXT_CACHE_MAX_MB, opt.CONTEXT_REUSE})
_NOT_IN_KEY = CACHE_CONFIG_KEYS | {
    opt.EP_CONTEXT_ENABLE,
    opt.EP_CONTEXT_FILE_PATH,
    opt.EP_CONTEXT_EMBED_MODE,
    opt.DISABLE_MODEL_COMPILE,
    opt.FAIL_ON_SUBOPTIMAL_COMPILED_MODEL,
}


class Digests:
    """SHA-256 of files, remembered in the cache folder (``digests.json``) by what identifies a file's content
    without reading it: device, inode, size, mtime and ctime in ns (any write changes ctime, which no tool sets
    back). A file unchanged since it was last hashed is not read again."""

    def __init__(self, folder: Path | None) -> None:
        self.path = folder / "digests.json" if folder is not None else None
        self.known: dict[str, list[Any]] = {}
        self.changed = False
        if self.path is not None:
            try:
                loaded = json.loads(self.path.read_text(encoding="utf-8"))
                self.known = loaded if isinstance(loaded, dict) else {}
            except (OSError, ValueError):
                self.known = {}

    def digest(self, path: Path, extra: Callable[[bytes], Any] | None = None) -> tuple[str, Any]:
        """(the file's SHA-256, ``extra(content)`` computed when the file was hashed)."""
        stat = os.stat(path)
        stamp = [stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns]
        name = str(path.resolve())
        known = self.known.get(name)
        if isinstance(known, list) and len(known) == 7 and known[:5] == stamp:
            return str(known[5]), known[6]
        data = path.read_bytes()
        found = (hashlib.sha256(data).hexdigest(), extra(data) if extra is not None else None)
        self.known[name] = [*stamp, *found]
        self.changed = True
        return found

    def save(self) -> None:
        if self.path is None or not self.changed:
            return
        from epctx.epcontext.files import write_file_atomic

        text = json.dumps(self.known, sort_keys=True).encode()
        with contextlib.suppress(OSError):  # a cache of digests: losing it costs a hash, nothing else
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_file_atomic(self.path, lambda write: write(text), what="cache digests")


def external_data_files(data: memoryview) -> list[str]:
    """The ``location`` of every external initializer of the model's main graph, in order, once each."""
    from epctx.model.wire import fields, text

    found: dict[str, None] = {}
    for number, _, graph in fields(data):
        if number != 7 or not isinstance(graph, memoryview):
            continue
        for field, _, tensor in fields(graph):
            if field != 5 or not isinstance(tensor, memoryview):
                continue
            for item, _, entry in fields(tensor):
                if item == 13 and isinstance(entry, memoryview):
                    pair = {n: text(v) for n, _, v in fields(entry) if n in (1, 2)}
                    if pair.get(1) == "location" and pair.get(2):
                        found[pair[2]] = None
    return list(found)


def _source_parts(
    source: str | os.PathLike[str] | bytes, external_folder: Path | None, digests: Digests
) -> dict[str, Any]:
    if isinstance(source, (bytes, bytearray, memoryview)):
        data = bytes(source)
        model, locations = hashlib.sha256(data).hexdigest(), external_data_files(memoryview(data))
        folder = external_folder
    else:
        path = Path(source)
        model, locations = digests.digest(path, lambda data: external_data_files(memoryview(data)))
        folder = external_folder or path.resolve().parent
    external = {}
    for location in locations:
        file = (folder or Path.cwd()) / location
        external[location] = digests.digest(file)[0] if file.is_file() else "missing"
    return {"model": model, "external_data": external}


def _provider_parts(ep: ExecutionProvider) -> dict[str, Any]:
    part: dict[str, Any] = {"name": ep.name, "options": dict(sorted(ep.provider_options().items()))}
    if ep.compiles:
        part.update(sdk=ep.sdk_version(), hardware=ep.hardware(), compatibility=ep.compatibility_info())
    return part


def _session_parts(options: opt.SessionOptions) -> dict[str, Any]:
    import numpy as np

    initializers = {}
    for name, value in sorted(options.initializers.items()):
        array = np.ascontiguousarray(value.numpy() if callable(getattr(value, "numpy", None)) else value)
        initializers[name] = [
            str(array.dtype),
            list(array.shape),
            hashlib.sha256(array.tobytes()).hexdigest(),
        ]
    by_name, by_denotation = options.free_dimension_overrides
    return {
        "config": {k: v for k, v in sorted(options.config.items()) if k not in _NOT_IN_KEY},
        "graph_optimization_level": int(options.graph_optimization_level),
        "free_dimensions": [sorted(by_name.items()), sorted(by_denotation.items())],
        "initializers": initializers,
    }


def _machine_parts() -> dict[str, Any]:
    from epctx.ep._hardware import cpu_device

    flags = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            flags = next(
                (ln.split(":", 1)[1].strip() for ln in fh if ln.lower().startswith(("flags", "features"))), ""
            )
    except OSError:
        pass
    cpu = cpu_device()
    return {
        "machine": platform.machine(),
        "system": platform.system(),
        "cpu": cpu.metadata.get("model_name", ""),
        "cpu_flags": hashlib.sha256(" ".join(sorted(flags.split())).encode()).hexdigest(),
    }


def cache_key(
    source: str | os.PathLike[str] | bytes,
    providers: Sequence[ExecutionProvider],
    options: opt.SessionOptions,
    digests: Digests,
    config: opt.SessionConfig | None = None,
) -> tuple[str, Mapping[str, Any]]:
    """(the key, its parts) of a session over ``source`` (a path: external data beside it; bytes: in
    ``session.model_external_initializers_file_folder_path``); ``config``: ``options``' parsed config."""
    config = opt.SessionConfig.of(options) if config is None else config
    external_folder = config.external_initializers_folder
    parts = {
        "epctx": __version__,
        "source": _source_parts(source, Path(external_folder) if external_folder else None, digests),
        "providers": [_provider_parts(ep) for ep in providers],
        "session": _session_parts(options),
        "this_machine": _machine_parts(),
    }
    digests.save()
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32], parts
