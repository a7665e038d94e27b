"""Context payload formats, told apart by their bytes, not by the node's ``source`` (used by ``epctx inspect``).

- ``epctx-container``: magic ``b"EPCTXBIN"``; the header is read with :class:`ContextBinary` (every epctx EP's
  binaries are containers).
- Formats an EP recognises as its own come first: each EP folder declares its detectors (``EP_PAYLOADS``, e.g.
  ``providers/openvino/payloads.py`` for what ONNX Runtime's OpenVINO EP writes) and a plugin factory may carry
  ``payload_detectors``; they reach this layer through ``epctx._hooks``.
- Formats of EPs epctx does not have (``_FOREIGN``), written by onnxruntime's EPs:
  - ``qnn-context-binary``: what ``QnnContext_getBinary`` returns (ORT's QNN EP stores it as is). Not a
    documented format: recognised by the layout seen in binaries of QNN SDK 2.51 (onnxruntime-qnn 2.7.0):
    big-endian u32 major and minor header versions, then at 0x10 three little-endian u64 (metadata size,
    header section size, body size) where header section + body = the payload size.
  - ``tensorrt-engine``: a serialized TensorRT engine (``ptrt`` / ``ftrt`` signature, possibly after a
    length-prefixed JSON preamble), as ORT's TensorRT EP embeds it or names it in ``ep_cache_context``.
- ``unknown``: anything else.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from epctx._hooks import payload_detectors
from epctx.epcontext.container import MAGIC, ContextBinary
from epctx.errors import EPCtxError, InvalidGraph

__all__ = [
    "FORMAT_EPCTX", "FORMAT_OPENVINO", "FORMAT_OPENVINO_BIN", "FORMAT_QNN", "FORMAT_TENSORRT", "FORMAT_UNKNOWN",
    "Payload", "PayloadEntry", "container_payload", "detect_payload",
]  # fmt: skip

FORMAT_EPCTX = "epctx-container"
FORMAT_QNN = "qnn-context-binary"
FORMAT_OPENVINO = "openvino-blob"
FORMAT_OPENVINO_BIN = "openvino-ep-bin"
FORMAT_TENSORRT = "tensorrt-engine"
FORMAT_UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class PayloadEntry:
    """One entry of a multi-entry payload (an epctx container's entries, an OVEP_BIN file's blobs)."""

    name: str
    kind: str
    size: int
    checksum: str = ""  # epctx containers: the payload checksum and attributes (what identities are made of)
    attrs: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Payload:
    """What a context payload is. ``details`` holds header fields (for epctx containers ``ep_name``,
    ``sdk_version``, ``hardware``, ``checksum``, ``alignment`` and ``metadata.<key>``)."""

    format: str
    size: int
    details: Mapping[str, str] = field(default_factory=dict)
    entries: tuple[PayloadEntry, ...] = ()


def detect_payload(
    data: object, *, verify: bool = False, where: str = "embedded context"
) -> tuple[Payload, list[str]]:
    """The format of a context payload (bytes-like) and the problems met reading its header (``where`` names
    it in them). ``verify`` checks every entry checksum of an epctx container."""
    buf = memoryview(data).cast("B")  # type: ignore[arg-type]
    try:
        if bytes(buf[: len(MAGIC)]) == MAGIC:
            problems: list[str] = []
            payload = container_payload(
                lambda: ContextBinary.from_bytes(buf, where=where), buf.nbytes, problems, verify=verify
            )
            return payload, problems
        for fmt, detect in (*payload_detectors(), *_FOREIGN):
            try:
                found = detect(buf)
            except (ValueError, struct.error, IndexError) as exc:
                return Payload(fmt, buf.nbytes), [f"{fmt} header could not be read: {exc}"]
            if found is not None:
                details, entries = found
                return Payload(fmt, buf.nbytes, details, tuple(PayloadEntry(*e) for e in entries)), []
        return Payload(FORMAT_UNKNOWN, buf.nbytes), []
    finally:
        buf.release()


def container_payload(opener: Any, size: int, problems: list[str], *, verify: bool = False) -> Payload:
    try:
        with opener() as binary:
            details = dict(ep_name=binary.ep_name, sdk_version=binary.sdk_version, hardware=binary.hardware,
                           checksum=binary.checksum_algorithm, alignment=str(binary.alignment))  # fmt: skip
            details.update({f"metadata.{k}": v for k, v in sorted(binary.metadata.items())})
            infos = [binary.entry(n) for n in binary.names()]
            for info in infos if verify else ():  # every corrupt entry, not only the first
                try:
                    binary.read(info.name)
                except InvalidGraph as exc:
                    problems.append(str(exc))
    except EPCtxError as exc:
        problems.append(str(exc))
        return Payload(FORMAT_EPCTX, size)
    return Payload(
        FORMAT_EPCTX,
        size,
        details,
        tuple(PayloadEntry(i.name, i.kind, i.size, i.checksum, dict(i.attrs)) for i in infos),
    )


_Found = tuple[dict[str, str], tuple[tuple[str, str, int], ...]] | None
_QNN_SDK = re.compile(rb"v(\d+\.\d+\.\d+\.\d+)")


def _qnn(buf: memoryview) -> _Found:
    if buf.nbytes < 0x30:  # header versions (big-endian), then metadata / header section / body sizes
        return None
    major, minor = struct.unpack_from(">II", buf, 0)
    meta_size, head_size, body_size = struct.unpack_from("<QQQ", buf, 0x10)
    if not (0 < major < 256 and minor < 256 and meta_size <= head_size == buf.nbytes - body_size >= 0x30):
        return None
    details = {"header_version": f"{major}.{minor}", "metadata_bytes": str(meta_size)}
    sdk = _QNN_SDK.search(bytes(buf[0x30 : 0x30 + min(meta_size, 1 << 16)]))
    if sdk:
        details["sdk_version"] = sdk.group(1).decode()
    return details, ()


_TRT_SIGNATURES = (b"ptrt", b"ftrt")


def _tensorrt(buf: memoryview) -> _Found:
    at = 0
    if buf.nbytes >= 8 and bytes(buf[4:5]) == b"{":  # a length-prefixed JSON preamble before the engine
        at = struct.unpack_from("<I", buf, 0)[0] + 4
    if buf.nbytes < at + 8 or bytes(buf[at : at + 4]) not in _TRT_SIGNATURES:
        return None
    version = struct.unpack_from("<I", buf, at + 4)[0]
    details = {"signature": bytes(buf[at : at + 4]).decode(), "serialization_version": f"0x{version:x}"}
    if at:
        details["preamble_bytes"] = str(at)
    return details, ()


# Formats of EPs epctx does not have, written by onnxruntime's EPs; an EP epctx has recognises its own
# (``EP_PAYLOADS`` in its folder, or a plugin factory's ``payload_detectors``), asked first.
_FOREIGN = (
    (FORMAT_TENSORRT, _tensorrt),
    (FORMAT_QNN, _qnn),
)
