"""Reading a model file: shared by the full loader and the lean reader (imports nothing heavy)."""

from __future__ import annotations

from pathlib import Path

from epctx.errors import InvalidArgument, NoSuchFile

__all__ = ["read_model_file"]


def read_model_file(path: Path) -> bytes:
    """The bytes of an ONNX file; a missing file is NoSuchFile and a folder InvalidArgument, both naming it."""
    if not path.is_file():
        if path.is_dir():
            raise InvalidArgument(f"model path {str(path)!r} is a folder, expected an ONNX file")
        raise NoSuchFile(f"model file not found: {str(path)!r}")
    return path.read_bytes()
