"""``warnings.warn`` attributed to the user's line (the first frame outside epctx), wherever epctx warns from."""

from __future__ import annotations

import os
import sys
import warnings

__all__ = ["warn_user"]

_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def warn_user(message: str, category: type[Warning] = UserWarning) -> None:
    level = 2  # 1 is warn_user itself, 2 its caller
    frame = sys._getframe(1)
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE):
        frame = frame.f_back  # type: ignore[assignment]
        level += 1
    warnings.warn(message, category, stacklevel=level)
