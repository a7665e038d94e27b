"""``iree.runtime``, imported once for this EP, so that it leaves the root logger as the user set it.

Some of ``iree.runtime``'s modules log through the ``logging`` module's own shortcuts (``logging.debug`` when a
``FunctionInvoker`` is made for a function without reflection data, which this EP no longer makes since it calls
the VM directly, ``vmcall``; ``logging.warn``, ``logging.info`` elsewhere in the package). Those shortcuts call ``logging.basicConfig()`` when the root logger has no
handler: the first IREE context loaded then gave the root logger a stderr handler of its own, the ``epctx``
command line printed each line twice (``epctx: ...`` and ``INFO:epctx: ...``), and a user's later
``logging.basicConfig()`` did nothing.

On import, each such module's ``logging`` name is pointed at :class:`_IreeLogging`: the ``logging`` module with
its shortcuts sent to the ``iree.runtime`` logger (which propagates to the root logger's handlers when there
are some, and configures nothing). Nothing is added to the root logger, not even for a moment, so a user
thread configuring logging meanwhile is not disturbed.
"""

from __future__ import annotations

import logging
import sys
import threading
from types import ModuleType
from typing import Any

__all__ = ["iree_runtime"]

_LOCK = threading.Lock()
_PATCHED = False
# The ``logging`` shortcuts that configure the root logger, and the Logger method each stands for.
_SHORTCUTS = {
    "debug": "debug",
    "info": "info",
    "warning": "warning",
    "warn": "warning",
    "error": "error",
    "exception": "exception",
    "critical": "critical",
    "fatal": "critical",
    "log": "log",
}


class _IreeLogging:
    """The ``logging`` module as ``iree.runtime``'s modules see it: the shortcuts log to ``iree.runtime``."""

    def __init__(self) -> None:
        self._logger = logging.getLogger("iree.runtime")

    def __getattr__(self, name: str) -> Any:
        method = _SHORTCUTS.get(name)
        return getattr(self._logger, method) if method else getattr(logging, name)


def iree_runtime() -> ModuleType:
    """``iree.runtime`` (imported on first use; its modules' root-logger shortcuts redirected once)."""
    global _PATCHED
    import iree.runtime as rt

    if not _PATCHED:
        with _LOCK:
            if not _PATCHED:
                shim = _IreeLogging()
                for name, module in list(sys.modules.items()):
                    if name.startswith("iree.runtime") and getattr(module, "logging", None) is logging:
                        module.logging = shim  # type: ignore[attr-defined]
                _PATCHED = True
    return rt
