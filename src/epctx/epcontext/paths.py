"""Where context files go and how their paths inside a context model are resolved (and attacked)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path, PurePosixPath

from epctx import options as opt
from epctx.errors import InvalidArgument, InvalidGraph

__all__ = ["binary_file_name", "context_model_path", "resolve_context_file"]

_CTX_SUFFIX = "_ctx"


def context_model_path(source_path: Path | None, config: Mapping[str, str]) -> Path:
    """``ep.context_file_path``, or ``<stem>_ctx.onnx`` beside the source model. A folder is rejected."""
    given = config.get(opt.EP_CONTEXT_FILE_PATH, "")
    if given:
        path = Path(given)
        if path.is_dir() or given.endswith(("/", os.sep)):
            raise InvalidArgument(f"{opt.EP_CONTEXT_FILE_PATH} must name a file, got the folder {given!r}")
        return path
    if source_path is None:
        raise InvalidArgument(
            f"the model comes from bytes: set {opt.EP_CONTEXT_FILE_PATH} to say where the context model goes"
        )
    return source_path.with_name(f"{source_path.stem}{_CTX_SUFFIX}.onnx")


def binary_file_name(model_name: str, ep_name: str) -> str:
    """``[model_name]_[ep].bin``."""
    return f"{model_name}_{ep_name}.bin"


def model_name_for(source_path: Path | None, ctx_path: Path) -> str:
    """The ``[model_name]`` of generated file names: the source model's stem, else the context model's."""
    if source_path is not None:
        return source_path.stem
    stem = ctx_path.stem
    return stem[: -len(_CTX_SUFFIX)] if stem.endswith(_CTX_SUFFIX) and len(stem) > len(_CTX_SUFFIX) else stem


def resolve_context_file(base_dir: Path, relative: str, *, node: str) -> Path:
    """Resolve an ``ep_cache_context`` path against the model folder. Absolute paths, ``..`` and symlinks
    that leave the folder are InvalidGraph; subfolders are fine."""
    where = f"EPContext node {node!r}"
    if not relative:
        raise InvalidGraph(f"{where}: ep_cache_context (the binary's path) is empty")
    pure = PurePosixPath(relative.replace("\\", "/"))
    if pure.is_absolute() or Path(relative).is_absolute() or (len(relative) > 1 and relative[1] == ":"):
        raise InvalidGraph(f"{where}: the context binary path {relative!r} is absolute; it must be relative")
    if ".." in pure.parts:
        raise InvalidGraph(f"{where}: the context binary path {relative!r} leaves the model folder ('..')")
    root = base_dir.resolve()
    target = (root / Path(*pure.parts)).resolve()
    if target != root and root not in target.parents:
        raise InvalidGraph(
            f"{where}: the context binary path {relative!r} resolves to {str(target)!r}, outside the model "
            f"folder {str(root)!r} (a symlink?)"
        )
    if not target.is_file():
        raise InvalidGraph(f"{where}: the context binary {str(target)!r} does not exist or is not a file")
    return target
