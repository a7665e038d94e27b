"""What a verdict reads of a serialized model: its metadata, its EPContext nodes and, for an embedded binary,
the binary's header, straight from the protobuf wire format. Other nodes, initializers and payloads are
skipped unread (an embedded binary is viewed in place, its header parsed, its payload never copied)."""

from __future__ import annotations

import contextlib
import dataclasses
import mmap
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from epctx.errors import InvalidArgument, InvalidProtobuf, NoSuchFile
from epctx.model.wire import fields, signed, text

__all__ = ["ScannedModel", "ScannedNode", "read_mapped", "scan_model"]

_T = TypeVar("_T")

_EP_CONTEXT = ("com.microsoft", "EPContext")
_INT, _STRING = 2, 3  # AttributeProto.AttributeType
_EMBEDDED = b"<embedded>"  # stands for an embedded payload in the node's attributes (its header is read here)


@dataclasses.dataclass(frozen=True, slots=True)
class ScannedNode:
    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attributes: dict[
        str, tuple[int, Any]
    ]  # INT and STRING attributes, as EPContextNode.from_parts takes them
    header: (
        tuple[str, str] | str | None
    )  # an embedded binary's (sdk_version, hardware), or why it is unreadable


@dataclasses.dataclass(frozen=True, slots=True)
class ScannedModel:
    metadata: dict[str, str]
    nodes: list[ScannedNode]


def scan_model(buf: memoryview) -> ScannedModel:
    """The metadata and EPContext nodes of a model; WireError on bytes that are not a protobuf message."""
    metadata: dict[str, str] = {}
    nodes: list[ScannedNode] = []
    for number, _, value in fields(buf):
        if number == 14 and isinstance(value, memoryview):
            entry = {n: text(v) for n, _, v in fields(value) if n in (1, 2)}
            metadata[entry.get(1, "")] = entry.get(2, "")
        elif number == 7 and isinstance(value, memoryview):
            for field, _, item in fields(value):
                if field == 1 and isinstance(item, memoryview):
                    node = _node(item)
                    if node is not None:
                        nodes.append(node)
    return ScannedModel(metadata, nodes)


def _node(buf: memoryview) -> ScannedNode | None:
    parts: dict[int, list[Any]] = {1: [], 2: [], 3: [""], 4: [""], 7: [""]}
    attributes: dict[str, tuple[int, Any]] = {}
    payload: memoryview | None = None
    for number, _, value in fields(buf):
        if number in (1, 2):
            parts[number].append(text(value))
        elif number in (3, 4, 7):
            parts[number] = [text(value)]
        elif number == 5 and isinstance(value, memoryview):
            name, kind, raw = _attribute(value)
            if name == "ep_cache_context" and isinstance(raw, memoryview):
                payload, raw = raw, bytes(raw) if raw.nbytes < 4096 else _EMBEDDED
            if kind in (_INT, _STRING):
                attributes[name] = (kind, raw)
    if (parts[7][0], parts[4][0]) != _EP_CONTEXT:
        return None
    header = None
    embedded = attributes.get("embed_mode", (_INT, 1))[1] == 1
    if embedded and payload is not None and attributes.get("main_context", (_INT, 1))[1] == 1:
        header = _header(payload, parts[3][0])
    return ScannedNode(parts[3][0], tuple(parts[1]), tuple(parts[2]), attributes, header)


def _attribute(buf: memoryview) -> tuple[str, int, Any]:
    name, kind = "", 0
    value: Any = None
    for number, wire, item in fields(buf):
        if number == 1:
            name = text(item)
        elif number == 20 and isinstance(item, int):
            kind = item
        elif number == 3 and isinstance(item, int) and wire == 0:
            value = signed(item)
        elif number == 4 and isinstance(item, memoryview):
            value = item
    if kind == _STRING and isinstance(value, memoryview) and name != "ep_cache_context":
        value = bytes(value)
    return name, kind, value


def _header(payload: memoryview, node: str) -> tuple[str, str] | str:
    from epctx.epcontext.container import ContextBinary
    from epctx.errors import EPCtxError

    try:
        with ContextBinary.from_bytes(
            payload, where=f"embedded context of EPContext node {node!r}"
        ) as binary:
            return binary.sdk_version, binary.hardware
    except EPCtxError as exc:  # its message only: the exception's traceback holds views of the payload
        return str(exc.args[0]) if exc.args else type(exc).__name__


def read_mapped(path: Path, parse: Callable[[memoryview], _T]) -> _T:
    """``parse`` over the file at ``path`` mapped read-only (a model's header is read, not the whole file); bytes
    that are not a protobuf message are InvalidProtobuf naming the file."""
    from epctx.model.wire import WireError

    where = f"model {str(path)!r}"
    try:
        with open(path, "rb") as fh:
            if os.fstat(fh.fileno()).st_size == 0:
                raise InvalidProtobuf(f"{where} is empty")
            mapped = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    except FileNotFoundError:
        raise NoSuchFile(f"{where} not found") from None
    except IsADirectoryError:
        raise InvalidArgument(f"{where} is a folder") from None
    error: str | None = None
    try:
        return parse(memoryview(mapped))
    except (WireError, UnicodeDecodeError) as exc:  # raised again below: its traceback holds views of the map
        error = f"{where} is not an ONNX model: {exc}"
    except InvalidProtobuf as exc:
        error = str(exc.args[0]) if exc.args else where
    finally:
        with contextlib.suppress(BufferError):  # views still held: unmapped when the last one goes
            mapped.close()
    raise InvalidProtobuf(error)
