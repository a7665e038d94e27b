"""numpy's own OpenBLAS ``cblas_?gemm``, called with a ``beta``: a GEMM that adds its product to what the output
holds (``C = A B + beta C``), which ``np.matmul`` cannot do.

A sum of products (a flat GEMM's kernel offsets, ``kernels/conv_flat.py``) then needs no temporary and no add
pass per term: ResNet-18's 64 -> 64 3x3 conv at 56x56 2.48 -> 1.88 ms, a 32 -> 32 one at 80x80 2.03 -> 1.34, one
thread, the same results to the bit here (the terms are added in the same order); a 1x1 conv's product is added to its
bias written first, a write pass instead of a pass that reads and writes the result (``conv.pointwise_last``: 18-27
us a conv on 56x56 and larger maps). Found once, through threadpoolctl as
``blas_serial`` finds the thread count, in numpy's OpenBLAS only (the BLAS numpy multiplies with); None where there
is none (another BLAS, a numpy without OpenBLAS): callers keep their numpy form.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["Gemm", "gemm_for"]

_log = logging.getLogger("epctx")
_lock = threading.Lock()

# gemm(m, n, k, a, lda, b, ldb, beta, c, ldc): row-major, no transposes, alpha 1; a, b, c addresses
Gemm = Callable[[int, int, int, int, int, int, int, float, int, int], None]

_ROW_MAJOR, _NO_TRANS = 101, 111
_NAMES = ("scipy_cblas_{}gemm64_", "cblas_{}gemm64_", "cblas_{}gemm_64", "scipy_cblas_{}gemm", "cblas_{}gemm")
_found: dict[str, Gemm | None] | None = None


def gemm_for(dtype: np.dtype[Any]) -> Gemm | None:
    """The GEMM for float32 or float64 operands, or None (another dtype, or no OpenBLAS of numpy's found)."""
    found = _found
    if found is None:
        with _lock:
            found = _found if _found is not None else _find()
    return found.get(dtype.char)


def _find() -> dict[str, Gemm | None]:
    global _found
    found: dict[str, Gemm | None] = {}
    try:
        lib = _numpy_openblas()
        if lib is not None:
            found = {"f": _bind(lib, "s", ctypes.c_float), "d": _bind(lib, "d", ctypes.c_double)}
    except Exception as exc:  # an unknown BLAS layout: numpy's own forms stay
        _log.debug("cblas GEMM unavailable: %s", exc)
    _found = found
    return found


def _numpy_openblas() -> Any:
    import numpy  # noqa: F401  (loads its BLAS)
    from threadpoolctl import ThreadpoolController

    for lib in ThreadpoolController().lib_controllers:
        if lib.internal_api == "openblas" and "numpy" in str(getattr(lib, "filepath", "")):
            return lib.dynlib
    return None


def _bind(lib: Any, kind: str, scalar: Any) -> Gemm | None:
    for pattern in _NAMES:
        name = pattern.format(kind)
        fn = getattr(lib, name, None)
        if fn is None:
            continue
        index = ctypes.c_int64 if "64" in name else ctypes.c_int
        fn.argtypes = [ctypes.c_int] * 3 + [index] * 3 + [scalar, ctypes.c_void_p, index]
        fn.argtypes += [ctypes.c_void_p, index, scalar, ctypes.c_void_p, index]
        fn.restype = None

        def gemm(
            m: int, n: int, k: int, a: int, lda: int, b: int, ldb: int, beta: float, c: int, ldc: int,
            fn: Any = fn,
        ) -> None:  # fmt: skip
            fn(_ROW_MAJOR, _NO_TRANS, _NO_TRANS, m, n, k, 1.0, a, lda, b, ldb, beta, c, ldc)

        return gemm
    return None
