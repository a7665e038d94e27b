"""The CPU EP's native kernels (``csrc/``): a plain C library built with the package when a C compiler is at hand
(``setup.py``, an optional extension) and loaded here with ctypes, which releases the GIL for each call (helper
threads run other rows meanwhile, ``parallel.py``).

``kernels()`` is None where the library is not built, cannot be loaded, or ``EPCTX_NATIVE=0`` is set; the kernels
that use it then compute the same with numpy. Loaded at the first kernel that asks, never at ``import epctx``.
"""

from __future__ import annotations

import ctypes
import importlib.util
import logging
import os
import threading
from dataclasses import dataclass
from typing import Any

__all__ = ["DwGeometry", "Native", "kernels", "reset"]

_log = logging.getLogger("epctx")
_lock = threading.Lock()
_MODULE = "epctx.providers.cpu._native"
_P, _I, _S = ctypes.c_void_p, ctypes.c_int, ctypes.c_ssize_t


class DwGeometry(ctypes.Structure):
    """``dw_geometry`` of ``csrc/depthwise.c``: the input image (H, W, C) and its strides in values (channels
    contiguous), the output's columns, the kernel, strides, dilations and the padding before; the activation
    (``fusion.NativeForm``: its code and parameters)."""

    _fields_ = [
        ("h", _I),
        ("w", _I),
        ("c", _I),
        ("x_row", _S),
        ("x_col", _S),
        ("out_w", _I),
        *((name, _I) for name in ("kh", "kw", "sh", "sw", "dh", "dw", "top", "left")),
        ("act", _I),
        ("a", ctypes.c_float),
        ("b", ctypes.c_float),
        ("hi", ctypes.c_float),
    ]


@dataclass(frozen=True)
class Native:
    """The library's functions, bound with their argument types (``csrc/`` documents each)."""

    path: str
    # (x, geometry, filter (KH, KW, C), bias (C,) or None, y, first row, end row): addresses, a row range
    dw_rows_f32: Any


_found: list[Native | None] = []


def kernels() -> Native | None:
    """The native kernels, loaded once; None where there are none (see the module's doc)."""
    if _found:
        return _found[0]
    with _lock:
        if not _found:
            _found.append(_load())
    return _found[0]


def reset() -> None:
    """Forget what ``kernels`` found (tests turning ``EPCTX_NATIVE`` on and off)."""
    with _lock:
        _found.clear()


def _load() -> Native | None:
    if os.environ.get("EPCTX_NATIVE", "1").strip() == "0":
        _log.debug("native kernels: off (EPCTX_NATIVE=0)")
        return None
    try:
        spec = importlib.util.find_spec(_MODULE)
    except ImportError:
        spec = None
    if spec is None or not spec.origin:
        _log.debug("native kernels: not built (no C compiler at install?): numpy kernels")
        return None
    try:
        lib = ctypes.CDLL(spec.origin)
        rows = lib.epctx_dw_rows_f32
        rows.argtypes = [_P, _P, _P, _P, _P, _I, _I]
        rows.restype = None
        return Native(spec.origin, rows)
    except (OSError, AttributeError) as exc:
        _log.warning("native kernels at %s failed to load (%s): numpy kernels", spec.origin, exc)
        return None
