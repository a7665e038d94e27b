"""One-thread BLAS calls for the CPU EP's small GEMMs (``serial``), and OpenBLAS's thread count now.

OpenBLAS splits a GEMM over its threads from m*n*k >= 2^18 on: for the small GEMMs of mobile nets (a 1x1
conv of 96 -> 576 channels over 7x7) waking a second thread costs more than it saves, and on a busy machine
far more (a 32x200x192 GEMM: 96 us on one thread, 2-12 ms on two, measured here under load). onnxruntime's
MLAS sizes its threads by the work too. Below ``SERIAL_MACS`` multiply-adds a kernel calls through ``serial``,
which runs the call with BLAS on one thread (under ``intra_op_num_threads``, which only lowers the count
further; ``epctx.ep.blas_thread_limit`` sets that). Setting fewer threads never starts a multi-threaded BLAS
call, so it is safe beside the import-time forks ``epctx/ep/_blas.py`` guards against.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["SERIAL_MACS", "one_thread", "serial", "single_threaded", "single_threaded_rows"]

_log = logging.getLogger("epctx")
_lock = threading.Lock()

SERIAL_MACS = 1 << 23

# OpenBLAS runs a GEMM on one thread below m*n*k = 2^18 (interface/gemm.c: SMP_THRESHOLD_MIN 65536 times
# GEMM_MULTITHREAD_THRESHOLD 4) and a GEMV below m*n = 9216 (interface/gemv.c: 2304 times 4); a GEMM of one
# row or column may be forwarded to GEMV (GEMM_GEMV_FORWARD).
_GEMM_ONE_THREAD = 1 << 18
_GEMV_ONE_THREAD = 2304 * 4


def single_threaded(a: Any, n: int) -> bool:
    """Whether OpenBLAS runs ``a @ b`` (``b`` with ``n`` columns) on one thread by itself: no need to lower its
    count through ``serial`` (whose get / set calls cost 1.1-1.3 us a call, more than a decode step's 1 x 64 x 64
    product, measured here). Every product numpy's matmul makes of them (one per batch entry) is at most
    ``a.size * n`` multiply-adds; a product of one row or column counts as a GEMV."""
    macs = a.size * n
    if macs < _GEMV_ONE_THREAD:
        return True
    rows = a.shape[-2] if a.ndim >= 2 else 1
    return rows > 1 and n > 1 and macs < _GEMM_ONE_THREAD


def single_threaded_rows(weight: Any) -> int:
    """For a constant right side ``weight`` (float32 / float64, 2-D): a left side of fewer values than this
    is multiplied on one BLAS thread by OpenBLAS itself, whatever its shape (the GEMV bound); 0 otherwise."""
    if weight.ndim != 2 or weight.dtype.kind != "f" or weight.dtype.itemsize < 4 or not weight.shape[1]:
        return 0
    return -(-_GEMV_ONE_THREAD // weight.shape[1])


class _SerialGate:
    """Lowers OpenBLAS's process-wide thread count to one while any serial call is in flight (nested and
    concurrent calls counted, the count restored by the last one out). A no-op where the BLAS is not a
    pthreads OpenBLAS (OpenMP builds keep a count per thread; other BLAS libraries are left alone)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.depth = 0
        self.saved = 0
        self.get_threads: Callable[[], int] | None = None
        self.set_threads: Callable[[int], None] | None = None
        self.numpy_blas = False  # whether the OpenBLAS found is numpy's own
        try:
            self._find()
        except Exception as exc:  # no threadpoolctl, or a BLAS it does not know: calls run as they are
            _log.debug("serial BLAS calls unavailable: %s", exc)

    def _find(self) -> None:
        import numpy  # noqa: F401  (loads its BLAS)
        from threadpoolctl import ThreadpoolController

        libs = ThreadpoolController().lib_controllers
        for lib in sorted(
            libs, key=lambda lib: "numpy" not in str(getattr(lib, "filepath", ""))
        ):  # numpy's first
            if lib.internal_api != "openblas" or getattr(lib, "threading_layer", "") != "pthreads":
                continue
            for prefix, suffix in itertools.product(("", "scipy_"), ("", "64_", "_64")):
                getter = getattr(lib.dynlib, f"{prefix}openblas_get_num_threads{suffix}", None)
                setter = getattr(lib.dynlib, f"{prefix}openblas_set_num_threads{suffix}", None)
                if getter is not None and setter is not None:
                    self.get_threads, self.set_threads = getter, setter
                    self.numpy_blas = "numpy" in str(getattr(lib, "filepath", ""))
                    return

    def threads(self) -> int:
        """OpenBLAS's thread count now (1 while a serial call is in flight; 1 when it cannot be read)."""
        return 1 if self.get_threads is None else max(1, int(self.get_threads()))

    def __call__(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        setter, getter = self.set_threads, self.get_threads
        if setter is None or getter is None:
            return fn(*args, **kwargs)
        if getter() <= 1:
            # one thread already (``intra_op_num_threads=1``'s run scope, or a serial call in flight): no lock,
            # no count (0.1 us against the 0.8 us of the counted path, measured here). Should a call in flight
            # restore a larger count meanwhile, OpenBLAS read the count when this call started.
            return fn(*args, **kwargs)
        with self.lock:
            if self.depth == 0:
                self.saved = getter()
                if self.saved > 1:
                    setter(1)
            self.depth += 1
        try:
            return fn(*args, **kwargs)
        finally:
            with self.lock:
                self.depth -= 1
                if self.depth == 0 and self.saved > 1:
                    setter(self.saved)


_gate: _SerialGate | None = None


def serial() -> _SerialGate:
    """``serial()(fn, *args)`` calls ``fn`` with numpy's BLAS on one thread (see :data:`SERIAL_MACS`).
    Found once; call it when building a kernel, never at import."""
    global _gate
    if _gate is None:
        with _lock:
            if _gate is None:
                _gate = _SerialGate()
    return _gate


class _OneThread:
    """numpy's OpenBLAS at one thread inside the block, its count before restored after (process-wide, as BLAS's
    own setting is). Two ctypes calls: 0.2 us a run, where threadpoolctl's limit (``epctx.ep.blas_thread_limit``)
    asks every library loaded for its state and costs 9 us a run (the LLM decode step of the corpus: 6% of its
    run, measured here). Going down to one thread never starts a thread, so no backend's fork can meet one."""

    __slots__ = ("gate", "saved")

    def __init__(self, gate: _SerialGate) -> None:
        self.gate = gate
        self.saved = 1

    def __enter__(self) -> None:
        get, put = self.gate.get_threads, self.gate.set_threads
        assert get is not None and put is not None
        self.saved = get()
        if self.saved != 1:
            put(1)

    def __exit__(self, *exc: object) -> None:
        put = self.gate.set_threads
        if self.saved != 1 and put is not None:
            put(self.saved)


def one_thread() -> _OneThread | None:
    """A scope holding numpy's BLAS at one thread (the CPU EP's runs under ``intra_op_num_threads=1``: its
    kernels call no other BLAS), or None where numpy's BLAS is no pthreads OpenBLAS (the caller then limits
    through threadpoolctl)."""
    gate = serial()
    if gate.get_threads is None or gate.set_threads is None or not gate.numpy_blas:
        return None
    return _OneThread(gate)
