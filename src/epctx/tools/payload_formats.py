"""Context payload formats, told apart by their bytes (used by ``epctx inspect``).

Who recognises what, asked in this order:

- the framework: ``epctx-container``, magic ``b"EPCTXBIN"``, the header read with :class:`ContextBinary`
  (every epctx EP's binaries are containers);
- the EPs, each recognising its own payloads (:mod:`epctx.ep._payloads`): a built-in folder's ``EP_PAYLOADS``
  (e.g. ``providers/openvino/payloads.py`` for what ONNX Runtime's OpenVINO EP writes), a plugin factory's
  ``detect_payload``, a registered class's ``ExecutionProvider.detect_payload``; the EP named by the node's
  ``source`` first, from the providers' registry (this module sits above it);
- the framework's table of **foreign formats** (``FOREIGN``): those of onnxruntime EPs epctx does not have, so
  that no EP folder of epctx speaks for them:
  - ``qnn-context-binary``: what ``QnnContext_getBinary`` returns (ORT's QNN EP stores it as is). Not a
    documented format: recognised by the layout seen in binaries of QNN SDK 2.51 (onnxruntime-qnn 2.7.0):
    big-endian u32 major and minor header versions, then at 0x10 three little-endian u64 (metadata size,
    header section size, body size) where header section + body = the payload size.
  - ``tensorrt-engine``: a serialized TensorRT engine (``ptrt`` / ``ftrt`` signature, possibly after a
    length-prefixed JSON preamble), as ORT's TensorRT EP embeds it or names it in ``ep_cache_context``.
- ``unknown``: anything else.
"""

from __future__ import annotations

import logging
import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from epctx.ep._payloads import PayloadDetector, PayloadEntry, PayloadInfo
from epctx.epcontext.container import ContextBinary
from epctx.epcontext.header import MAGIC
from epctx.errors import EPCtxError, InvalidGraph

__all__ = [
    "FOREIGN", "FORMAT_EPCTX", "FORMAT_OPENVINO", "FORMAT_OPENVINO_BIN", "FORMAT_QNN", "FORMAT_TENSORRT",
    "FORMAT_UNKNOWN", "Payload", "PayloadEntry", "container_payload", "detect_payload",
]  # fmt: skip

logger = logging.getLogger("epctx")

FORMAT_EPCTX = "epctx-container"
FORMAT_QNN = "qnn-context-binary"
FORMAT_TENSORRT = "tensorrt-engine"
FORMAT_UNKNOWN = "unknown"
# Recognised by the OpenVINO EP folder (providers/openvino/payloads.py); the names stay here for reports' readers.
FORMAT_OPENVINO = "openvino-blob"
FORMAT_OPENVINO_BIN = "openvino-ep-bin"


@dataclass(frozen=True, slots=True)
class Payload:
    """What a context payload is. ``details`` holds header fields (for epctx containers ``ep_name``,
    ``sdk_version``, ``hardware``, ``checksum``, ``alignment`` and ``metadata.<key>``)."""

    format: str
    size: int
    details: Mapping[str, str] = field(default_factory=dict)
    entries: tuple[PayloadEntry, ...] = ()


def detect_payload(
    data: object, *, verify: bool = False, where: str = "embedded context", source: str | None = None
) -> tuple[Payload, list[str]]:
    """The format of a context payload (bytes-like) and the problems met reading its header (``where`` names
    it in them). ``verify`` checks every entry checksum of an epctx container. ``source`` (the EPContext node's)
    names the EP asked first."""
    buf = memoryview(data).cast("B")  # type: ignore[arg-type]
    try:
        if bytes(buf[: len(MAGIC)]) == MAGIC:
            problems: list[str] = []
            payload = container_payload(
                lambda: ContextBinary.from_bytes(buf, where=where), buf.nbytes, problems, verify=verify
            )
            return payload, problems
        from epctx.providers.registry import payload_detectors

        failed: list[str] = []
        detectors: list[tuple[str, PayloadDetector]] = [*payload_detectors(source), *FOREIGN]
        for asked, detect in detectors:
            try:
                found = detect(buf)
            except Exception as exc:  # a broken detector is a finding, never a crash of inspect
                logger.debug("the payload detector of %s failed", asked, exc_info=True)
                failed.append(f"the payload detector of {asked} failed: {type(exc).__name__}: {exc}")
                continue
            if found is not None:
                payload = Payload(found.format, buf.nbytes, dict(found.details), tuple(found.entries))
                return payload, [*failed, found.problem] if found.problem else failed
        return Payload(FORMAT_UNKNOWN, buf.nbytes), failed
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


_QNN_SDK = re.compile(rb"v(\d+\.\d+\.\d+\.\d+)")


def _qnn(buf: memoryview) -> PayloadInfo | None:
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
    return PayloadInfo(FORMAT_QNN, details)


_TRT_SIGNATURES = (b"ptrt", b"ftrt")


def _tensorrt(buf: memoryview) -> PayloadInfo | None:
    at = 0
    if buf.nbytes >= 8 and bytes(buf[4:5]) == b"{":  # a length-prefixed JSON preamble before the engine
        at = struct.unpack_from("<I", buf, 0)[0] + 4
    if buf.nbytes < at + 8 or bytes(buf[at : at + 4]) not in _TRT_SIGNATURES:
        return None
    version = struct.unpack_from("<I", buf, at + 4)[0]
    details = {"signature": bytes(buf[at : at + 4]).decode(), "serialization_version": f"0x{version:x}"}
    if at:
        details["preamble_bytes"] = str(at)
    return PayloadInfo(FORMAT_TENSORRT, details)


def _foreign(fmt: str, detect: PayloadDetector) -> PayloadDetector:
    def checked(buf: memoryview) -> PayloadInfo | None:
        try:
            return detect(buf)
        except (ValueError, struct.error, IndexError) as exc:
            return PayloadInfo(fmt, problem=f"{fmt} header could not be read: {exc}")

    return checked


# Formats of onnxruntime EPs epctx does not have (asked after every EP): (who, detector).
FOREIGN: tuple[tuple[str, PayloadDetector], ...] = (
    ("onnxruntime's TensorRT EP", _foreign(FORMAT_TENSORRT, _tensorrt)),
    ("onnxruntime's QNN EP", _foreign(FORMAT_QNN, _qnn)),
)
