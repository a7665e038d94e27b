"""The payloads ONNX Runtime's OpenVINO EP writes, recognised by their bytes (``epctx inspect`` asks this EP
folder's ``EP_PAYLOADS``, i.e. :func:`detect`): ``openvino-blob`` (``CompiledModel.export_model()`` output: the
CPU plugin's stream, with a ``meta=...;ov=<version>;isa=...`` preamble in recent releases or the bare data header
followed by XML in older ones, or an NPU blob with ``OVNPU`` at its start or in its trailer) and ``openvino-ep-bin`` (the
multi-blob file of ORT's OpenVINO EP: magic ``OVEP_BIN``, a 40-byte header, BSON metadata naming each blob's
offset and size). Bytes only: nothing here imports openvino.
"""

from __future__ import annotations

import re
import struct
from typing import Any

from epctx.ep import PayloadEntry, PayloadInfo

__all__ = ["FORMAT_BLOB", "FORMAT_EP_BIN", "detect"]

FORMAT_BLOB = "openvino-blob"
FORMAT_EP_BIN = "openvino-ep-bin"


def detect(data: memoryview) -> PayloadInfo | None:
    """An OVEP_BIN file or an exported OpenVINO blob (None: neither)."""
    for fmt, detector in ((FORMAT_EP_BIN, _ep_bin), (FORMAT_BLOB, _blob)):
        try:
            found = detector(data)
        except (ValueError, struct.error, IndexError) as exc:
            return PayloadInfo(fmt, problem=f"{fmt} header could not be read: {exc}")
        if found is not None:
            return found
    return None


_OV_CPU_MAGIC = b"RR_UPCVO"
_OV_NPU_MAGIC = b"OVNPU"
_OV_VERSION = re.compile(rb"meta=[^;\x00]*;ov=([0-9][\w.\-]*)")
_OV_META_KEYS = {"meta": "meta_version", "ov": "openvino_version", "isa": "isa"}


def _blob(buf: memoryview) -> PayloadInfo | None:
    head = bytes(buf[:512])
    if head.startswith(_OV_NPU_MAGIC) or _OV_NPU_MAGIC in bytes(buf[-256:]):
        return PayloadInfo(FORMAT_BLOB, {"device": "NPU"})
    if head.startswith(_OV_CPU_MAGIC) and len(head) >= 20:
        # Recent CPU plugin streams: magic, u32 version, u64 length, "meta=...;ov=...;isa=..." text.
        (length,) = struct.unpack_from("<Q", head, 12)
        details = {"device": "CPU"}
        text = bytes(buf[20 : 20 + min(length, 4096)]).decode("utf-8", "replace")
        for item in text.split(";"):
            key, _, value = item.partition("=")
            if key in _OV_META_KEYS and value:
                details[_OV_META_KEYS[key]] = value
        return PayloadInfo(FORMAT_BLOB, details)
    found = _OV_VERSION.search(head)
    if found is not None:
        return PayloadInfo(FORMAT_BLOB, {"openvino_version": found.group(1).decode("ascii", "replace")})
    # Older CPU plugin streams: the data header (6 u64: custom data offset/size, constants, model) and its XML.
    if len(head) >= 56 and struct.unpack_from("<Q", head, 0)[0] == 48 and head[48:53] == b"<?xml":
        return PayloadInfo(FORMAT_BLOB, {"device": "CPU"})
    return None


_OVEP_BIN_MAGIC = b"OVEP_BIN"
_OVEP_HEADER = struct.Struct("<8sQQQQ")  # magic, version, header size, BSON offset, BSON size


def _ep_bin(buf: memoryview) -> PayloadInfo | None:
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
    return PayloadInfo(FORMAT_EP_BIN, details, tuple(entries))


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
