"""Where context files go and how their paths inside a context model are resolved (and attacked)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath

from epctx import options as opt
from epctx.errors import InvalidArgument, InvalidGraph

__all__ = ["binary_file_name", "check_not_inputs", "context_model_path", "resolve_context_file"]

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


def model_name_for(ctx_path: Path) -> str:
    """The ``[model_name]`` of generated file names: the context model's stem without ``_ctx`` (so binaries
    follow ``ep.context_file_path`` / ``-o``: two outputs in one folder never share a binary name)."""
    stem = ctx_path.stem
    return stem[: -len(_CTX_SUFFIX)] if stem.endswith(_CTX_SUFFIX) and len(stem) > len(_CTX_SUFFIX) else stem


def check_not_inputs(sources: Sequence[Path], outputs: Sequence[Path]) -> None:
    """Refuse, before anything is compiled or written, an output that is one of the inputs: a source model, or
    a file one refers to (its external data, or its binaries when it is a context model). Only outputs that
    exist can be inputs, so a model is read only then. Overwriting is no excuse: the source would be lost."""
    existing = [out for out in outputs if os.path.lexists(out)]
    if not existing:
        return
    for source in sources:
        inputs = [(source, f"the input model {str(source)!r}")]
        inputs += [
            (source.parent / ref, f"{ref!r}, which the input model {str(source)!r} reads")
            for ref in _refs(source)
        ]
        for out in existing:
            what = next((what for path, what in inputs if _same_file(out, path)), None)
            if what is not None:
                raise InvalidArgument(
                    f"the output {str(out)!r} is {what}; writing it would destroy an input (overwriting or not): "
                    "write the outputs to another path or folder"
                )


def _refs(model: Path) -> set[str]:
    """The files ``model`` refers to (none when it cannot be read: the compile reports that)."""
    import onnx

    from epctx.epcontext.transaction import model_references

    try:
        return model_references(onnx.load(model, load_external_data=False))
    except Exception:
        return set()


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):
        return os.path.abspath(a) == os.path.abspath(b)


def resolve_context_file(base_dir: Path, relative: str, *, node: str) -> Path:
    """Resolve an ``ep_cache_context`` path against the model folder. Absolute paths, ``..``, symlinks that
    leave the folder, NUL bytes, symlink loops and names the OS refuses are InvalidGraph naming the node and
    the path (onnxruntime: INVALID_GRAPH); subfolders are fine."""
    where = f"EPContext node {node!r}"
    shown = _clip(relative)
    if not relative:
        raise InvalidGraph(f"{where}: ep_cache_context (the binary's path) is empty")
    if "\0" in relative:
        raise InvalidGraph(
            f"{where}: the context binary path {shown} contains a NUL byte; expected a relative file path"
        )
    pure = PurePosixPath(relative.replace("\\", "/"))
    if pure.is_absolute() or Path(relative).is_absolute() or (len(relative) > 1 and relative[1] == ":"):
        raise InvalidGraph(f"{where}: the context binary path {shown} is absolute; it must be relative")
    if ".." in pure.parts:
        raise InvalidGraph(f"{where}: the context binary path {shown} leaves the model folder ('..')")
    try:
        root = base_dir.resolve()
        target = (root / Path(*pure.parts)).resolve()
        inside = target == root or root in target.parents
        is_file = inside and target.is_file()
    except (OSError, RuntimeError, ValueError) as exc:
        # A symlink loop (RuntimeError in Python < 3.13, OSError ELOOP after), a name or path too long
        # (ENAMETOOLONG), a component that is not a folder, an unreadable folder...
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise InvalidGraph(
            f"{where}: the context binary path {shown} cannot be resolved in the model folder "
            f"{str(base_dir)!r}: {reason}"
        ) from exc
    if not inside:
        raise InvalidGraph(
            f"{where}: the context binary path {shown} resolves to {str(target)!r}, outside the model "
            f"folder {str(root)!r} (a symlink?)"
        )
    if not is_file:
        if os.path.lexists(target):
            raise InvalidGraph(
                f"{where}: the context binary path {shown} ({str(target)!r}) does not exist or is not a file"
            )
        raise InvalidGraph(
            f"{where}: the context binary {shown} is missing ({str(target)!r} does not exist): copy "
            f"{pure.name!r} (written beside the context model when it was compiled) into {str(base_dir)!r}, or "
            "compile the source model again"
        )
    return target


def _clip(text: str, limit: int = 200) -> str:
    """``repr(text)``, shortened in the middle when long (a 4,000-character path in a message helps nobody)."""
    if len(text) <= limit:
        return repr(text)
    return f"{text[: limit // 2]!r}...{text[-limit // 2 :]!r} ({len(text)} characters)"
