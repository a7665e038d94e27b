"""Context payload formats: tell an epctx container, a QNN context binary, an OpenVINO blob, an ORT OpenVINO
EP multi-blob file and a TensorRT engine apart by their bytes (used by ``epctx inspect``).

Payload formats are told apart by their bytes, not by the node's ``source``:

- ``epctx-container``: magic ``b"EPCTXBIN"``; the header is read with :class:`ContextBinary`.
- ``qnn-context-binary``: what ``QnnContext_getBinary`` returns (ORT's QNN EP stores it as is). Not a documented
  format: recognised by the layout seen in binaries of QNN SDK 2.51 (onnxruntime-qnn 2.7.0): big-endian u32
  major and minor header versions, then at 0x10 three little-endian u64 (metadata size, header section size,
  body size) where header section + body = the payload size.
- ``openvino-blob``: ``CompiledModel.export_model()`` output, which ORT's OpenVINO EP embeds or writes: the CPU
  plugin's stream (a ``meta=...;ov=<version>;isa=...`` preamble in recent releases, or the bare data header
  followed by XML in older ones) or an NPU blob (``OVNPU`` magic at the start or in its trailer).
- ``openvino-ep-bin``: the multi-blob file of ORT's OpenVINO EP (magic ``OVEP_BIN``, a 40-byte header, BSON
  metadata naming each blob's offset and size).
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
        for fmt, detect in _DETECTORS:
            try:
                found = detect(buf)
            except (ValueError, struct.error, IndexError) as exc:
                return Payload(fmt, buf.nbytes), [f"{fmt} header could not be read: {exc}"]
            if found is not None:
                return Payload(fmt, buf.nbytes, found[0], found[1]), []
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


_Found = tuple[dict[str, str], tuple[PayloadEntry, ...]] | None
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


_OV_CPU_MAGIC = b"RR_UPCVO"
_OV_NPU_MAGIC = b"OVNPU"
_OV_VERSION = re.compile(rb"meta=[^;\x00]*;ov=([0-9][\w.\-]*)")
_OV_META_KEYS = {"meta": "meta_version", "ov": "openvino_version", "isa": "isa"}


def _openvino(buf: memoryview) -> _Found:
    head = bytes(buf[:512])
    if head.startswith(_OV_NPU_MAGIC) or _OV_NPU_MAGIC in bytes(buf[-256:]):
        return {"device": "NPU"}, ()
    if head.startswith(_OV_CPU_MAGIC) and len(head) >= 20:
        # Recent CPU plugin streams: magic, u32 version, u64 length, "meta=...;ov=...;isa=..." text.
        (length,) = struct.unpack_from("<Q", head, 12)
        details = {"device": "CPU"}
        text = bytes(buf[20 : 20 + min(length, 4096)]).decode("utf-8", "replace")
        for item in text.split(";"):
            key, _, value = item.partition("=")
            if key in _OV_META_KEYS and value:
                details[_OV_META_KEYS[key]] = value
        return details, ()
    found = _OV_VERSION.search(head)
    if found is not None:
        return {"openvino_version": found.group(1).decode("ascii", "replace")}, ()
    # Older CPU plugin streams: the data header (6 u64: custom data offset/size, constants, model) and its XML.
    if len(head) >= 56 and struct.unpack_from("<Q", head, 0)[0] == 48 and head[48:53] == b"<?xml":
        return {"device": "CPU"}, ()
    return None


_OVEP_BIN_MAGIC = b"OVEP_BIN"
_OVEP_HEADER = struct.Struct("<8sQQQQ")  # magic, version, header size, BSON offset, BSON size


def _openvino_bin(buf: memoryview) -> _Found:
    if bytes(buf[:8]) != _OVEP_BIN_MAGIC:
        return None
    _, version, header_size, bson_at, bson_size = _OVEP_HEADER.unpack_from(buf, 0)
    details = {"version": str(version)}
    if header_size != _OVEP_HEADER.size or bson_at + bson_size > buf.nbytes:
        raise ValueError(f"header size {header_size}, BSON at {bson_at} + {bson_size} of {buf.nbytes} bytes")
    meta = _bson(bytes(buf[bson_at : bson_at + bson_size]))
    for key in ("version", "producer"):
        if isinstance(meta.get(key), str):
            details[f"metadata.{key}"] = meta[key]
    blobs = meta.get("blob_metadata_map")
    entries = []
    if isinstance(blobs, dict):
        for name, info in blobs.items():
            size = info.get("size") if isinstance(info, dict) else None
            entries.append(PayloadEntry(name, "blob", int(size) if isinstance(size, int) else -1))
    weights = meta.get("weights_metadata_map")
    if isinstance(weights, dict):
        details["shared_weights"] = str(len(weights))
    return details, tuple(entries)


def _bson(raw: bytes) -> dict[str, Any]:
    """A small BSON reader (documents, arrays, strings, numbers, booleans, null): enough for OVEP_BIN."""

    def doc(at: int) -> tuple[dict[str, Any], int]:
        (size,) = struct.unpack_from("<i", raw, at)
        end = at + size
        if size < 5 or end > len(raw):
            raise ValueError(f"BSON document of {size} bytes at {at} runs past the end")
        out: dict[str, Any] = {}
        at += 4
        while raw[at] != 0:
            kind = raw[at]
            name_end = raw.index(b"\0", at + 1)
            name = raw[at + 1 : name_end].decode("utf-8", "replace")
            at = name_end + 1
            if kind in (0x03, 0x04):
                out[name], at = doc(at)
            elif kind == 0x02:
                (n,) = struct.unpack_from("<i", raw, at)
                out[name] = raw[at + 4 : at + 3 + n].decode("utf-8", "replace")
                at += 4 + n
            elif kind in _BSON_SCALARS:
                fmt = _BSON_SCALARS[kind]
                (out[name],) = struct.unpack_from(fmt, raw, at) if fmt else (None,)
                at += struct.calcsize(fmt) if fmt else 0
            else:
                raise ValueError(f"unsupported BSON element type 0x{kind:02x} for {name!r}")
            if at >= end:
                raise ValueError("BSON document ends inside an element")
        return out, end

    return doc(0)[0]


_BSON_SCALARS = {0x01: "<d", 0x08: "<?", 0x0A: "", 0x10: "<i", 0x11: "<Q", 0x12: "<q"}
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


_DETECTORS = (
    (FORMAT_OPENVINO_BIN, _openvino_bin),
    (FORMAT_TENSORRT, _tensorrt),
    (FORMAT_OPENVINO, _openvino),
    (FORMAT_QNN, _qnn),
)
