"""External data confined to the model folder, as onnxruntime (1.32) confines it.

onnxruntime resolves a tensor's ``location`` against the folder of the model path as given, follows every
symlink, and accepts the file only when it resolves inside that folder or inside the folder of the model
file itself once resolved (so a Hugging Face cache, where ``model.onnx`` and its data are both links into
``blobs/``, loads). An absolute location is refused; ``..`` is fine while the result stays inside. A file
outside is ``Fail`` with onnxruntime's words ("External data path escapes model directory"), a missing one
NoSuchFile: both name the initializer and the paths. This covers every model the full loader reads: plain
models, context models with CPU-fallback initializers, and the sources that weightless contexts map.

Imports neither onnx nor onnx-ir (the caller points the tensors at ``lookup_dir``)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path, PurePosixPath

from epctx.errors import Fail, InvalidGraph, NoSuchFile

__all__ = ["allowed_folders", "confine_external_file"]


def allowed_folders(lookup_dir: Path, model_path: Path | None) -> tuple[Path, ...]:
    """The folders external data may resolve into: ``lookup_dir`` resolved, and the resolved model file's
    folder (they differ when the model file is a symlink)."""
    roots = [Path(os.path.realpath(lookup_dir))]
    if model_path is not None:
        real_parent = Path(os.path.realpath(model_path)).parent
        if real_parent not in roots:
            roots.append(real_parent)
    return tuple(roots)


def confine_external_file(
    location: str, lookup_dir: Path, roots: Iterable[Path], *, tensor: str, what: str
) -> Path:
    """The resolved file ``location`` names, checked to lie in one of ``roots`` and to exist."""
    prefix = f"{what}: external data path validation failed for initializer {tensor!r}"
    pure = PurePosixPath(location.replace("\\", "/"))
    if not location or "\0" in location:
        raise InvalidGraph(f"{prefix}: the location {location!r} is not a file path")
    if pure.is_absolute() or Path(location).is_absolute() or (len(location) > 1 and location[1] == ":"):
        raise Fail(f"{prefix}: absolute path not allowed for external data location: {location!r}")
    joined = lookup_dir / Path(*pure.parts)
    try:
        resolved = Path(os.path.realpath(joined, strict=False))
    except (OSError, ValueError) as exc:  # a symlink loop, a name too long
        raise Fail(f"{prefix}: the external data path {location!r} cannot be resolved: {exc}") from exc
    roots = tuple(roots)
    if not any(resolved == root or root in resolved.parents for root in roots):
        allowed = " or ".join(repr(str(r)) for r in roots)
        raise Fail(
            f"{prefix}: External data path escapes model directory. External data path: {location!r} "
            f"resolved path: {str(resolved)!r} allowed directory: {allowed}"
        )
    if not resolved.is_file():
        raise NoSuchFile(
            f"{prefix}: the external data file {str(joined)!r} does not exist or is not a file "
            f"(resolved: {str(resolved)!r})"
        )
    return resolved
