"""OpenVINO in onnxruntime's weightless mode EXTERNAL_ONLY (``ep.enable_weightless_mode=1``): the blob references
the source model's own external data file, at the weights' original offsets, and imports map that file in place.

OpenVINO (2026.4) records, for each constant of a blob compiled with ``CACHE_MODE=OPTIMIZE_SIZE``, its offset in
the external data file the model was read from, and embeds the constants that came from inside the ``.onnx``
(measured here: an initializer inside the model is in the blob, one outside is not). So the partition is exported
with its external initializers pointing at the source's data file at their offsets (a temporary model file
beside it: OpenVINO refuses external data outside the model's folder, links included), its internal ones embedded: exactly EXTERNAL_ONLY. One file per partition (``WEIGHTS_PATH`` names one):
a partition whose external weights lie in several files is EPFail. ALL is not offered: the initializers inside
the ``.onnx`` are not at offsets OpenVINO can reference.

At load the file is found and checked (size, xxh3-128) by ``epctx.ep.open_source_fd`` and named to OpenVINO by
``/proc/self/fd/<n>`` of the checked descriptor.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

from epctx.ep import ExternalRef, Partition, SourceFile, file_digest, partition_model
from epctx.errors import EPFail

__all__ = ["source_model_folder", "source_refs"]


def source_refs(partition: Partition, where: str) -> tuple[SourceFile, Path, dict[str, ExternalRef]] | None:
    """The partition's initializers stored in the source's external data, where they lie there; None when it
    has none (its blob then holds every weight, as EXTERNAL_ONLY asks)."""
    files: dict[Path, str] = {}
    refs: dict[str, ExternalRef] = {}
    for value in partition.initializers:
        tensor = value.const_value
        location = getattr(tensor, "location", None)
        if tensor is None or not value.name or not isinstance(location, str) or not location:
            continue
        files.setdefault(Path(tensor.path).resolve(), location)  # type: ignore[attr-defined]
        length = getattr(tensor, "length", None) or tensor.nbytes
        refs[value.name] = ExternalRef(location, int(getattr(tensor, "offset", 0) or 0), int(length))
    if not refs:
        return None
    if len(files) > 1:
        raise EPFail(
            f"{where}: weightless mode EXTERNAL_ONLY on OpenVINO maps one external data file per partition; this "
            f"one's weights are in {sorted(files.values())}"
        )
    path, location = next(iter(files.items()))
    size, digest = file_digest(path)
    return SourceFile(location, size, digest), path, refs


@contextlib.contextmanager
def source_model_folder(partition: Partition, refs: Mapping[str, ExternalRef], data: Path) -> Iterator[str]:
    """The partition as an ONNX file whose external weights are ``data``, for ``read_model``: written beside
    ``data`` (a hidden temporary file, removed after), as OpenVINO refuses external data outside the model's
    folder, links included. Where that folder cannot be written, a hard link to ``data`` in a temporary folder
    (same file system only); else EPFail."""
    model = partition_model(
        partition, weights={k: ExternalRef(data.name, r.offset, r.length) for k, r in refs.items()}
    )
    payload = model.SerializeToString()
    try:
        fd, path = tempfile.mkstemp(prefix=".epctx-ov-", suffix=".onnx", dir=data.parent)
    except OSError:
        with _linked(data) as folder:
            path = os.path.join(folder, "model.onnx")
            with open(path, "wb") as fh:
                fh.write(payload)
            yield path
        return
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(payload)
        yield path
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)


@contextlib.contextmanager
def _linked(data: Path) -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="epctx-ov-", ignore_cleanup_errors=True) as folder:
        try:
            os.link(data, os.path.join(folder, data.name))
        except OSError as exc:
            raise EPFail(
                f"weightless mode EXTERNAL_ONLY on OpenVINO compiles beside the source's data file {str(data)!r}: "
                f"its folder cannot be written and a link to it cannot be made ({exc})"
            ) from exc
        yield folder
