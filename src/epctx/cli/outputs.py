"""Checks on the files a verb will write, made before any work (no compile is wasted on an output that cannot be
written): the folder must exist (never a silent ``mkdir``) and be writable, and an existing file is replaced only
with ``--force``."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from epctx.errors import Fail, InvalidArgument

__all__ = ["check_folder", "check_outputs", "file_sizes", "written_files"]


def check_folder(folder: Path, *, flag: str) -> None:
    """``folder`` (where ``flag`` writes) exists, is a folder and is writable."""
    shown = str(folder) or "."
    if not folder.exists():
        raise InvalidArgument(
            f"{flag}: the folder {shown!r} does not exist; create it first (mkdir -p {shown})"
        )
    if not folder.is_dir():
        raise InvalidArgument(f"{flag}: {shown!r} is not a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise InvalidArgument(f"{flag}: the folder {shown!r} is not writable")


def check_outputs(paths: Iterable[Path], *, force: bool, flag: str = "-o") -> None:
    """Every path can be written: its folder exists and is writable, it is not a folder, and it does not exist
    unless ``force``."""
    for path in paths:
        check_folder(path.parent, flag=flag)
        if path.is_dir():
            raise InvalidArgument(f"{flag}: {str(path)!r} is a folder; name the output file")
        if path.exists() and not force:
            raise Fail(f"{str(path)!r} exists already; use --force to overwrite it")


def file_sizes(paths: Iterable[Path]) -> dict[str, int]:
    """``{path: bytes}`` of files just written (the report of compile, share and merge)."""
    return {str(p): p.stat().st_size for p in paths}


def written_files(model_path: Path) -> list[Path]:
    """A context model and the files it refers to (binaries of embed_mode=0 EPContext nodes, external
    initializers)."""
    import onnx

    from epctx.epcontext.transaction import model_references

    model = onnx.load(model_path, load_external_data=False)
    return [model_path, *sorted(model_path.parent / name for name in model_references(model))]
