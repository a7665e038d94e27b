"""The context binary's preamble and JSON header: constants, and reading them back with every check that
makes a bad file cost no more than its header claims (see ``container.py`` for the layout)."""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from epctx.epcontext.layout import EntryInfo
from epctx.errors import InvalidGraph

__all__ = [
    "FORMAT_VERSION",
    "HEADER_SIZES",
    "MAGIC",
    "MAX_ALIGNMENT",
    "MAX_HEADER_BYTES",
    "PREAMBLE",
    "header_field",
    "parse_entries",
    "read_header",
    "str_map",
    "valid_alignment",
]

MAGIC = b"EPCTXBIN"
FORMAT_VERSION = 1
PREAMBLE = struct.Struct("<8sIIQQ")  # magic, version, header crc32, header length, file size
HEADER_SIZES = struct.Struct("<QQ")  # the preamble fields the header crc32 covers
MAX_ALIGNMENT = 1 << 16
MAX_HEADER_BYTES = 16 << 20  # the longest header written or read (~120,000 entries): json.loads stays cheap


def str_map(value: object) -> dict[str, str] | None:
    out = dict(value) if isinstance(value, Mapping) else None
    valid = out is not None and all(isinstance(k, str) and isinstance(v, str) for k, v in out.items())
    return out if valid else None


def valid_alignment(alignment: object) -> bool:
    return type(alignment) is int and 1 <= alignment <= MAX_ALIGNMENT and not alignment & (alignment - 1)


def read_header(buf: memoryview, where: str) -> dict[str, Any]:
    size = buf.nbytes
    if size < PREAMBLE.size:
        raise InvalidGraph(f"{where}: truncated: {size} bytes, a context binary has at least {PREAMBLE.size}")
    magic, version, header_crc, header_len, file_size = PREAMBLE.unpack_from(buf)
    if magic != MAGIC:
        raise InvalidGraph(f"{where}: not an epctx context binary (magic {magic!r}, expected {MAGIC!r})")
    if version != FORMAT_VERSION:
        raise InvalidGraph(
            f"{where}: unsupported context binary format version {version} (this epctx reads {FORMAT_VERSION})"
        )
    if file_size != size:
        raise InvalidGraph(
            f"{where}: size mismatch: the preamble records {file_size} bytes, found {size} (truncated file?)"
        )
    if header_len > size - PREAMBLE.size:
        raise InvalidGraph(f"{where}: header length {header_len} runs past the end ({size} bytes)")
    if header_len > MAX_HEADER_BYTES:
        raise InvalidGraph(
            f"{where}: header length {header_len} is over the {MAX_HEADER_BYTES} bytes a context binary header "
            "may take (corrupt binary)"
        )
    raw = buf[PREAMBLE.size : PREAMBLE.size + header_len]
    found = zlib.crc32(raw, zlib.crc32(HEADER_SIZES.pack(header_len, file_size)))
    if found != header_crc:
        raise InvalidGraph(
            f"{where}: header checksum mismatch: expected crc32 {header_crc:08x}, found {found:08x} (corrupt binary)"
        )
    try:
        header = json.loads(bytes(raw).decode("utf-8"))
    except (ValueError, RecursionError) as exc:
        raise InvalidGraph(f"{where}: header is not valid UTF-8 JSON: {exc}") from exc
    if not isinstance(header, dict):
        raise InvalidGraph(f"{where}: header must be a JSON object, found {type(header).__name__}")
    return header


def header_field(obj: Mapping[str, Any], key: str, kind: type, where: str) -> Any:
    """``obj[key]`` if it is a str (kind str) or a non-negative int (kind int), else InvalidGraph."""
    value = obj.get(key)
    if kind is int and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise InvalidGraph(f"{where}: header field {key!r} must be a non-negative integer, found {value!r}")
    if kind is str and not isinstance(value, str):
        raise InvalidGraph(f"{where}: header field {key!r} must be a string, found {value!r}")
    return value


def parse_entries(
    raw: object, where: str, header_end: int, size: int, alignment: int
) -> dict[str, EntryInfo]:
    if not isinstance(raw, list):
        raise InvalidGraph(f"{where}: header field 'entries' must be a list")
    entries: dict[str, EntryInfo] = {}
    for i, item in enumerate(raw):
        if not isinstance(item, dict):
            raise InvalidGraph(f"{where}: entry #{i} must be an object")
        name = header_field(item, "name", str, f"{where}: entry #{i}")
        here = f"{where}: entry {name!r}"
        kind = header_field(item, "kind", str, here)
        offset = header_field(item, "offset", int, here)
        length = header_field(item, "size", int, here)
        checksum = header_field(item, "checksum", str, here)
        attrs = str_map(item.get("attrs"))
        if attrs is None:
            raise InvalidGraph(f"{here}: 'attrs' must map str to str")
        if name in entries:
            raise InvalidGraph(f"{here} appears twice")
        if offset < header_end:
            raise InvalidGraph(f"{here}: offset {offset} points into the header (which ends at {header_end})")
        if offset + length > size:
            raise InvalidGraph(f"{here}: offset {offset} + size {length} runs past the end ({size} bytes)")
        if length and offset % alignment:
            raise InvalidGraph(f"{here}: offset {offset} is not a multiple of the alignment {alignment}")
        entries[name] = EntryInfo(name, kind, offset, length, checksum, MappingProxyType(attrs))
    return entries
