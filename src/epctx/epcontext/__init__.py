"""The EPContext op and its files: context binary container (more modules join here)."""

from epctx.epcontext.container import (
    CHECKSUM_ALGORITHMS,
    DEFAULT_CHECKSUM,
    FORMAT_VERSION,
    ContextBinary,
    ContextBinaryWriter,
    EntryInfo,
)

__all__ = [
    "CHECKSUM_ALGORITHMS",
    "DEFAULT_CHECKSUM",
    "FORMAT_VERSION",
    "ContextBinary",
    "ContextBinaryWriter",
    "EntryInfo",
]
