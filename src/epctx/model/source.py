"""Reading a model file: shared by the full loader and the lean reader (imports nothing heavy)."""

from __future__ import annotations

from pathlib import Path

from epctx.errors import Fail, InvalidArgument, NoSuchFile

__all__ = ["read_model_file"]


def read_model_file(path: Path) -> bytes:
    """The bytes of an ONNX file; a missing file is NoSuchFile, a folder InvalidArgument, and a file that
    cannot be read (permissions, I/O) Fail, as onnxruntime: each naming the path."""
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except FileNotFoundError:
        raise NoSuchFile(f"model file not found: {str(path)!r}") from None
    except IsADirectoryError:
        raise InvalidArgument(
            f"model path {str(path)!r} is a folder, expected an ONNX file (or a model package: a folder with a manifest.json)"
        ) from None
    except OSError as exc:
        if path.is_dir():  # Windows reports a folder as PermissionError
            raise InvalidArgument(
                f"model path {str(path)!r} is a folder, expected an ONNX file (or a model package: a folder with a manifest.json)"
            ) from None
        reason = exc.strerror or str(exc)
        raise Fail(f"cannot read the model file {str(path)!r}: {reason}") from exc
