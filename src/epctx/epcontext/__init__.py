"""The EPContext op and its files: context binary container (more modules join here)."""

from epctx.epcontext.checksums import CHECKSUM_ALGORITHMS, DEFAULT_CHECKSUM
from epctx.epcontext.container import ContextBinary, EntryInfo
from epctx.epcontext.header import FORMAT_VERSION
from epctx.epcontext.writer import ContextBinaryWriter

__all__ = [
    "CHECKSUM_ALGORITHMS",
    "DEFAULT_CHECKSUM",
    "FORMAT_VERSION",
    "ContextBinary",
    "ContextBinaryWriter",
    "EntryInfo",
]
