"""The EPContext op and its files: the context binary container, its writer, the loader, merge.
Names below are imported on first use, so loading a context model imports nothing of generation."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from epctx.epcontext.checksums import CHECKSUM_ALGORITHMS, DEFAULT_CHECKSUM
    from epctx.epcontext.container import ContextBinary, EntryInfo
    from epctx.epcontext.header import FORMAT_VERSION
    from epctx.epcontext.writer import ContextBinaryWriter

_WHERE = {
    "CHECKSUM_ALGORITHMS": "epctx.epcontext.checksums",
    "DEFAULT_CHECKSUM": "epctx.epcontext.checksums",
    "ContextBinary": "epctx.epcontext.container",
    "EntryInfo": "epctx.epcontext.container",
    "FORMAT_VERSION": "epctx.epcontext.header",
    "ContextBinaryWriter": "epctx.epcontext.writer",
}

__all__ = [
    "CHECKSUM_ALGORITHMS",
    "DEFAULT_CHECKSUM",
    "FORMAT_VERSION",
    "ContextBinary",
    "ContextBinaryWriter",
    "EntryInfo",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
