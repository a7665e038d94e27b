"""The library's progress lines (``logging.getLogger("epctx")`` at INFO) on stderr while a verb runs."""

from __future__ import annotations

import contextlib
import logging
import sys
import warnings
from collections.abc import Callable, Iterator

__all__ = ["progress_lines", "warning_lines"]


@contextlib.contextmanager
def progress_lines(enabled: bool) -> Iterator[None]:
    """The library's INFO log lines on stderr as ``epctx: ...`` while the command runs (not those also given to
    ``warnings``: Python prints the warning)."""
    if not enabled:
        yield
        return
    from epctx._warnings import ALSO_WARNED

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("epctx: %(message)s"))
    handler.addFilter(lambda record: not getattr(record, ALSO_WARNED, False))  # Python shows the warning
    log = logging.getLogger("epctx")
    level = log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        yield
    finally:
        log.removeHandler(handler)
        log.setLevel(level)


@contextlib.contextmanager
def warning_lines(prog: Callable[[], str]) -> Iterator[None]:
    """Python warnings shown as one line, ``<prog>: warning: <message>``, while the command runs (not Python's
    two lines naming the ``epctx`` script)."""

    def show(message: Warning | str, category: type[Warning], *args: object, **kwargs: object) -> None:
        print(f"{prog()}: warning: {message}", file=sys.stderr)

    with warnings.catch_warnings():
        warnings.showwarning = show
        yield
