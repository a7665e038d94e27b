"""Late-bound hooks: how a lower layer reaches what a higher one provides without importing it.

``epctx/__init__.py`` (imported before any submodule) connects them to the providers' registry.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["payload_detectors", "set_payload_detectors"]

# source -> (who, detector) pairs, where a detector is ``epctx.ep.PayloadDetector`` (typed there: this module
# sits below epctx.ep).
DetectorSource = Callable[[str | None], Sequence[tuple[str, Callable[[memoryview], Any]]]]

_source: DetectorSource | None = None


def set_payload_detectors(source: DetectorSource) -> None:
    global _source
    _source = source


def payload_detectors(source: str | None = None) -> Sequence[tuple[str, Callable[[memoryview], Any]]]:
    """(EP name, detector) of every EP that recognises its own payloads (``epctx inspect``), the EP accepting
    ``source`` (an EPContext node's) first."""
    return () if _source is None else _source(source)
