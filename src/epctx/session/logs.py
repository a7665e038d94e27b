"""onnxruntime's log severities mapped onto the ``epctx`` logger (``logging``).

Severity 0 VERBOSE -> DEBUG, 1 INFO -> INFO, 2 WARNING -> WARNING, 3 ERROR -> ERROR, 4 FATAL -> CRITICAL;
-1 (onnxruntime's default for sessions and runs) keeps the logger's level. ``set_default_logger_severity``
sets the logger's level; a session's or a run's ``log_severity_level`` sets it while that session is created
or that run runs (process-wide while it lasts, as the logger is). The verbosity levels (onnxruntime's VLOG,
meaningful at severity 0 only) have no finer ``logging`` level to map to: they are checked and kept.
Messages below WARNING show once the application configures a handler (``logging.basicConfig``)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

from epctx.errors import InvalidArgument

__all__ = ["level_of", "severity_scope", "set_default_logger_severity", "set_default_logger_verbosity"]

logger = logging.getLogger("epctx")

_LEVELS = (logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR, logging.CRITICAL)


def level_of(severity: int) -> int:
    if isinstance(severity, bool) or not isinstance(severity, int) or not 0 <= severity <= 4:
        raise InvalidArgument(
            f"log severity must be 0 (verbose), 1 (info), 2 (warning), 3 (error) or 4 (fatal), got {severity!r}"
        )
    return _LEVELS[severity]


def set_default_logger_severity(severity: int) -> None:
    logger.setLevel(level_of(severity))


def set_default_logger_verbosity(verbosity: int) -> None:
    if isinstance(verbosity, bool) or not isinstance(verbosity, int) or verbosity < 0:
        raise InvalidArgument(f"log verbosity must be an int >= 0, got {verbosity!r}")


@contextlib.contextmanager
def severity_scope(severity: int) -> Iterator[None]:
    """The ``epctx`` logger at ``severity`` inside the block (-1: unchanged)."""
    if severity == -1:
        yield
        return
    previous = logger.level
    logger.setLevel(level_of(severity))
    try:
        yield
    finally:
        logger.setLevel(previous)
