"""Versioned JSON documents in a context binary: how EPs store their small metadata (programs, blob specs).

One format for all EPs: UTF-8 JSON with sorted keys and no whitespace (byte-identical for equal content),
carrying ``format`` (what the document is) and ``version`` (its layout), both checked on read so a binary
from another EP or an incompatible release is an InvalidGraph, never a misread.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from epctx.errors import InvalidGraph

__all__ = ["dump_document", "load_document"]


def dump_document(doc: Mapping[str, Any], *, format: str, version: int) -> bytes:
    body = {**doc, "format": format, "version": version}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def load_document(data: bytes | memoryview, *, format: str, version: int, where: str) -> dict[str, Any]:
    """Parse a document written by :func:`dump_document`; its fields are left to the caller to check."""
    try:
        doc = json.loads(bytes(data).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise InvalidGraph(f"{where}: not a JSON document: {exc}") from exc
    if not isinstance(doc, dict) or doc.get("format") != format:
        found = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise InvalidGraph(f"{where}: format {found!r}, expected {format!r}")
    if doc.get("version") != version:
        raise InvalidGraph(
            f"{where}: format version {doc.get('version')!r}, this epctx reads version {version}"
        )
    return doc
