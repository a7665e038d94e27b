"""``warnings.warn`` attributed to the user's line (the first frame outside epctx), wherever epctx warns from; and
``warn_and_log``, for the warnings epctx gives both ways (as onnxruntime's Python layer warns, and on the
``epctx`` logger), shown once."""

from __future__ import annotations

import logging
import os
import sys
import warnings

__all__ = ["ALSO_WARNED", "warn_and_log", "warn_user"]

# Set on a log record whose message was also given to ``warnings``: a handler that shows both (the command
# line's) drops the record.
ALSO_WARNED = "epctx_also_warned"

_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def warn_user(message: str, category: type[Warning] = UserWarning) -> None:
    level = 2  # 1 is warn_user itself, 2 its caller
    frame = sys._getframe(1)
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE):
        frame = frame.f_back  # type: ignore[assignment]
        level += 1
    warnings.warn(message, category, stacklevel=level)


def warn_and_log(logger: logging.Logger, message: str) -> None:
    """``message`` as a ``UserWarning`` and, when the logger has a handler to show it, as a log record at
    WARNING. Without a handler, logging would print it on stderr again through its last resort."""
    if logger.hasHandlers():
        logger.warning("%s", message, extra={ALSO_WARNED: True})
    warn_user(message)  # attributed to the first frame outside epctx, as always
