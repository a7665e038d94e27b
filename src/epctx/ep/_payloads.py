"""What an EP says about a context payload it recognises (``epctx inspect`` asks each EP about its own).

Every epctx EP's binaries are epctx containers, which the framework reads itself. An EP whose backend also
writes payloads of its own (those of the matching onnxruntime EP, say) recognises them by their bytes with a
detector: ``detect(data: memoryview) -> PayloadInfo | None``: None when the bytes are not of its formats, a
:class:`PayloadInfo` when they are (with ``problem`` set when the header is of its format but cannot be read).
A detector reads bytes only: it imports no backend and never compiles. It is declared

- by a built-in EP folder: ``EP_PAYLOADS = "module:function"`` in its ``__init__.py`` (loaded only by inspect);
- by a plugin factory (``epctx.ep.EpFactory``): an optional ``detect_payload(data)`` method;
- by an EP class (``register_provider_class``): the ``ExecutionProvider.detect_payload`` classmethod.

Inspect asks the EP named by the EPContext node's ``source`` first, then the other EPs, then the framework's
table of formats written by onnxruntime EPs epctx does not have.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

__all__ = ["PayloadDetector", "PayloadEntry", "PayloadInfo"]


@dataclasses.dataclass(frozen=True, slots=True)
class PayloadEntry:
    """One entry of a multi-entry payload (an epctx container's entries, the blobs of an OVEP_BIN file)."""

    name: str
    kind: str
    size: int  # bytes; -1 when the payload does not say
    checksum: str = ""  # epctx containers: the entry checksum and attributes (what identities are made of)
    attrs: Mapping[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, slots=True)
class PayloadInfo:
    """A payload a detector recognised: its ``format`` name (e.g. ``"openvino-blob"``), header fields worth
    showing, its entries, and ``problem``: why its header could not be read (reported as an error)."""

    format: str
    details: Mapping[str, str] = dataclasses.field(default_factory=dict)
    entries: tuple[PayloadEntry, ...] = ()
    problem: str | None = None


PayloadDetector = Callable[[memoryview], "PayloadInfo | None"]
