"""The library's progress lines (``logging.getLogger("epctx")`` at INFO) on stderr while a verb runs."""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator

__all__ = ["progress_lines"]


@contextlib.contextmanager
def progress_lines(enabled: bool) -> Iterator[None]:
    """The library's INFO log lines on stderr as ``epctx: ...`` while the command runs."""
    if not enabled:
        yield
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("epctx: %(message)s"))
    log = logging.getLogger("epctx")
    level = log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        yield
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
