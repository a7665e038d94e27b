"""The protobuf wire format, read: enough to walk an ONNX file's messages without the protobuf runtime.

A field is (number, wire type, value): a varint is an int, a length-delimited field a memoryview of the
buffer (no copy), fixed 32/64-bit fields their raw bytes. Anything malformed raises :class:`WireError`; the
caller decides what that means (the lean model reader hands such a file to the full loader, whose errors are
the ones users see)."""

from __future__ import annotations

from collections.abc import Iterator

__all__ = ["LEN", "VARINT", "WireError", "fields", "signed", "text", "varints"]

VARINT = 0
I64 = 1
LEN = 2
I32 = 5


class WireError(ValueError):
    """The bytes are not a well-formed protobuf message."""


def _varint(buf: memoryview, pos: int, end: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while pos < end:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            break
    raise WireError("truncated or overlong varint")


def fields(buf: memoryview) -> Iterator[tuple[int, int, int | memoryview]]:
    """The fields of one message, in file order."""
    pos = 0
    end = len(buf)
    while pos < end:
        key, pos = _varint(buf, pos, end)
        number, kind = key >> 3, key & 7
        if number == 0:
            raise WireError("field number 0")
        if kind == VARINT:
            value, pos = _varint(buf, pos, end)
            yield number, kind, value
        elif kind == LEN:
            size, pos = _varint(buf, pos, end)
            if pos + size > end:
                raise WireError(f"field {number}: length {size} runs past the end of its message")
            yield number, kind, buf[pos : pos + size]
            pos += size
        elif kind in (I64, I32):
            size = 8 if kind == I64 else 4
            if pos + size > end:
                raise WireError(f"field {number}: truncated fixed-size value")
            yield number, kind, buf[pos : pos + size]
            pos += size
        else:  # groups (3, 4) are not used by ONNX; 6 and 7 do not exist
            raise WireError(f"field {number}: unsupported wire type {kind}")


def varints(buf: memoryview) -> Iterator[int]:
    """The values of a packed repeated varint field."""
    pos = 0
    end = len(buf)
    while pos < end:
        value, pos = _varint(buf, pos, end)
        yield value


def text(value: int | memoryview) -> str:
    """A string field as UTF-8 text (WireError when it is not a length-delimited UTF-8 string)."""
    if not isinstance(value, memoryview):
        raise WireError("expected a string, found a varint")
    try:
        return str(value, "utf-8")
    except UnicodeDecodeError as exc:
        raise WireError(f"string is not UTF-8: {exc}") from exc


def signed(value: int) -> int:
    """An int64 varint as a Python int (two's complement)."""
    return value - (1 << 64) if value >= 1 << 63 else value
