"""The CPU EP's native kernels (``csrc/``): a plain C library built with the package when a C compiler is at hand
(``setup.py``, an optional extension) and loaded here with ctypes, which releases the GIL for each call. Its
kernels compute output rows; ``Native.rows`` shares them among ``csrc/pool.c``'s worker threads.

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

import numpy as np

__all__ = [
    "CONV",
    "DEPTHWISE",
    "Activation",
    "ConvGeometry",
    "DwGeometry",
    "Native",
    "aligned",
    "bind",
    "kernels",
    "reset",
    "rest",
    "use",
]

_log = logging.getLogger("epctx")
_lock = threading.Lock()
_MODULE = "epctx.providers.cpu._native"
_P, _I, _S = ctypes.c_void_p, ctypes.c_int, ctypes.c_ssize_t


class Activation(ctypes.Structure):
    """``activation`` of ``csrc/common.h``: a ``fusion.NativeForm`` (code, a, b, hi)."""

    _fields_ = [("code", _I), ("a", ctypes.c_float), ("b", ctypes.c_float), ("hi", ctypes.c_float)]


_KERNEL = [(name, _I) for name in ("kh", "kw", "sh", "sw", "dh", "dw", "top", "left")]


class DwGeometry(ctypes.Structure):
    """``dw_geometry`` of ``csrc/depthwise.c``: the input image (H, W, C) and its strides in values (channels
    contiguous), the output's columns, the kernel, strides, dilations and the padding before; the activation."""

    _fields_ = [
        ("h", _I),
        ("w", _I),
        ("c", _I),
        ("x_row", _S),
        ("x_col", _S),
        ("out_w", _I),
        *_KERNEL,
        ("act", Activation),
    ]


class ConvGeometry(ctypes.Structure):
    """``conv_geometry`` of ``csrc/conv.c``: the input image (C, H, W) and its strides in values, the output
    channels and the packed filter's row length, the output's size, the kernel, strides, dilations and the
    padding before, the result's layout (1: channels-last), the activation, the address of the input offsets of
    the filter's rows (int64, kept alive by the caller)."""

    _fields_ = [
        ("c", _I),
        ("h", _I),
        ("w", _I),
        ("x_ch", _S),
        ("x_row", _S),
        ("x_col", _S),
        ("m", _I),
        ("m_pad", _I),
        ("out_h", _I),
        ("out_w", _I),
        *_KERNEL,
        ("nhwc", _I),
        ("act", Activation),
        ("offsets", _P),
    ]


@dataclass(frozen=True)
class Native:
    """The library's functions, bound with their argument types (``csrc/`` documents each)."""

    path: str
    # (x, geometry, filter (KH, KW, C), bias (C,) or None, y, first row, end row): addresses, a row range
    dw_rows_f32: Any
    # (x, geometry, packed filter (KH, KW, C, m_pad), bias (m_pad,) or None, y, first row, end row)
    conv_rows_f32: Any
    # (kernel: 0 dw_rows, 1 conv_rows; x per image, y per image (address arrays), images, rows per image,
    # geometry, filter, bias or None, threads, blocks): every row of every image, shared by csrc/pool.c's workers
    parallel_rows: Any
    # (): the pool's spinning workers sleep now (before a GEMM on OpenBLAS's own threads)
    rest: Any

    def rows(
        self,
        kernel: int,
        xs: list[int],
        ys: list[int],
        rows: int,
        args: tuple[int, int, int | None],
        threads: int,
        blocks: int,
    ) -> None:
        """Rows [0, rows) of each image (``xs``/``ys`` their addresses) through ``kernel`` with ``args``
        (geometry, filter, bias addresses): one call on this thread, or shared among ``threads`` in ``blocks``."""
        if threads <= 1 and len(xs) == 1:
            fn = self.dw_rows_f32 if kernel == DEPTHWISE else self.conv_rows_f32
            fn(xs[0], args[0], args[1], args[2], ys[0], 0, rows)
            return
        count = len(xs)
        self.parallel_rows(
            kernel, (_P * count)(*xs), (_P * count)(*ys), count, rows, *args, max(1, threads), blocks
        )


DEPTHWISE, CONV = 0, 1  # the kernels of ``Native.rows``

_found: list[Native | None] = []


def kernels() -> Native | None:
    """The native kernels, loaded once; None where there are none (see the module's doc)."""
    if _found:
        return _found[0]
    with _lock:
        if not _found:
            _found.append(_load())
    return _found[0]


# The kernels' vectors are 64 bytes: a filter or bias starting off that boundary has every vector load straddle two
# cache lines. numpy aligns an array to 16 bytes (a large one: a page plus 16); measured here, the direct conv 64 ->
# 64 channels, 3x3 at 40x40, one thread: 1009 us with the packed filter at 32 bytes past the boundary, 788 aligned.
ALIGNMENT = 64


def aligned(array: np.ndarray) -> np.ndarray:
    """A C-contiguous copy of ``array`` whose data starts on an ``ALIGNMENT``-byte boundary (the kernels' filters
    and biases)."""
    nbytes = max(array.nbytes, 1)
    buffer = np.empty(nbytes + ALIGNMENT, dtype=np.uint8)
    start = -buffer.ctypes.data % ALIGNMENT
    out = buffer[start : start + array.nbytes].view(array.dtype).reshape(array.shape)
    out[...] = array
    return out


def rest() -> None:
    """The pool's spinning workers sleep now, where the library is loaded (before work that other threads share:
    OpenBLAS's own threads, Python's helper threads). Never loads it."""
    found = _found[0] if _found else None
    if found is not None:
        found.rest()


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
        return bind(spec.origin)
    except (OSError, AttributeError) as exc:
        _log.warning("native kernels at %s failed to load (%s): numpy kernels", spec.origin, exc)
        return None


def bind(path: str) -> Native:
    """The library at ``path`` loaded and its functions bound (OSError, AttributeError where it cannot be)."""
    lib = ctypes.CDLL(path)
    bound = []
    for name in ("epctx_dw_rows_f32", "epctx_conv_rows_f32"):
        fn = getattr(lib, name)
        fn.argtypes = [_P, _P, _P, _P, _P, _I, _I]
        fn.restype = None
        bound.append(fn)
    parallel = lib.epctx_parallel_rows
    parallel.argtypes = [_I, _P, _P, _I, _I, _P, _P, _P, _I, _I]
    parallel.restype = None
    rest = lib.epctx_pool_rest
    rest.argtypes, rest.restype = [], None
    return Native(path, bound[0], bound[1], parallel, rest)


def use(found: Native | None) -> None:
    """Serve ``found`` from ``kernels`` from now on (tests of a library built for another instruction set)."""
    with _lock:
        _found[:] = [found]
