"""Late-bound hooks: how a lower layer reaches what a higher one provides without importing it.

``epctx/__init__.py`` (imported before any submodule) connects them to the providers' registry.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

__all__ = ["PayloadDetector", "payload_detectors", "set_payload_detectors"]

# bytes -> None (not this format), or (details, entries as (name, kind, size)); a malformed payload of the
# format raises ValueError / struct.error / IndexError.
PayloadDetector = Callable[[memoryview], "tuple[dict[str, str], tuple[tuple[str, str, int], ...]] | None"]

_source: Callable[[], Sequence[tuple[str, PayloadDetector]]] | None = None


def set_payload_detectors(source: Callable[[], Sequence[tuple[str, PayloadDetector]]]) -> None:
    global _source
    _source = source


def payload_detectors() -> Sequence[tuple[str, PayloadDetector]]:
    """(format name, detector) of every EP that recognises its own payloads (``epctx inspect``)."""
    return () if _source is None else _source()
