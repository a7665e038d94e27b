"""Large GEMMs of the CPU EP split into column blocks that the calling thread and helper threads take in turn.

Why: OpenBLAS splits a GEMM statically over its threads and the caller waits for every part. On a machine
whose cores are busy with other work, a worker that is not scheduled stalls the whole call for a time slice or
more (a 64x576x1600 conv GEMM: 1.6 ms on one thread, 56 ms on two, measured here under load), where
onnxruntime's pool, whose caller takes work too, degrades gracefully. Here BLAS runs on one thread per call and
the blocks are shared as onnxruntime shares them: whoever is free takes the next block, the caller included,
and the caller only ever waits for blocks a helper has already started. As many runners as BLAS has threads at
the call (``intra_op_num_threads`` sets that, as before); with one, the GEMM runs as a single call.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable

import numpy as np

from epctx.providers.cpu import blas_serial as blas

__all__ = ["MIN_BLOCK_COLUMNS", "matmul_columns", "split_columns", "split_ranges"]

MIN_BLOCK_COLUMNS = 128  # narrower blocks lose more to call overhead than they gain


class _Job:
    __slots__ = ("blocks", "done", "error", "fn", "lock", "next", "settled")

    def __init__(self, fn: Callable[[int], None], blocks: int) -> None:
        self.fn = fn
        self.blocks = blocks
        self.next = 0
        self.done = 0
        self.lock = threading.Lock()
        self.settled = threading.Event()
        self.error: BaseException | None = None

    def work(self) -> None:
        while True:
            with self.lock:
                k = self.next
                if k >= self.blocks:
                    return
                self.next = k + 1
            try:
                self.fn(k)
            except BaseException as exc:  # re-raised by the caller
                self.error = exc
            finally:
                with self.lock:
                    self.done += 1
                    if self.done == self.blocks:
                        self.settled.set()


class _Helpers:
    """Daemon threads that take jobs from one queue (started on first use, as many as ever asked for)."""

    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self.count = 0
        self.lock = threading.Lock()

    def ensure(self, count: int) -> None:
        with self.lock:
            while self.count < count:
                threading.Thread(target=self._loop, name=f"epctx-cpu-{self.count}", daemon=True).start()
                self.count += 1

    def _loop(self) -> None:
        while True:
            self.jobs.get().work()


_HELPERS = _Helpers()


def _forget_helpers() -> None:
    """In a forked child: the helper threads did not come along (their lock may even be held)."""
    global _HELPERS
    _HELPERS = _Helpers()


os.register_at_fork(after_in_child=_forget_helpers)


def _run(job: _Job, helpers: int) -> None:
    _HELPERS.ensure(helpers)
    for _ in range(helpers):
        _HELPERS.jobs.put(job)
    job.work()
    job.settled.wait()  # only blocks a helper already took are left
    if job.error is not None:
        raise job.error


def split_columns(cols: int, block: Callable[[int, int], None]) -> None:
    """Run ``block(lo, hi)`` over column ranges covering ``range(cols)``, shared with helper threads (as many
    runners as BLAS has threads now), each range computed with BLAS on one thread."""
    split_ranges(cols, block, MIN_BLOCK_COLUMNS)


def split_ranges(count: int, block: Callable[[int, int], None], min_size: int = 1) -> None:
    """Run ``block(lo, hi)`` over ranges of at least ``min_size`` covering ``range(count)``, shared with helper
    threads as :func:`split_columns` shares columns (any work that releases the GIL: BLAS, numpy's einsum)."""
    gate = blas.serial()
    runners = gate.threads()
    blocks = min(4 * runners, count // max(1, min_size))
    if runners <= 1:
        block(0, count)
        return
    if blocks <= 1:  # too small to share: one range, BLAS on one thread
        gate(block, 0, count)
        return
    edges = [count * k // blocks for k in range(blocks + 1)]
    gate(_run, _Job(lambda k: block(edges[k], edges[k + 1]), blocks), runners - 1)


def matmul_columns(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    """``out[...] = a @ b`` for 2-D ``a`` (M, K), ``b`` (K, L) and ``out`` (M, L), split by columns of ``b``."""

    def block(lo: int, hi: int) -> None:
        np.matmul(a, b[:, lo:hi], out=out[:, lo:hi])

    split_columns(b.shape[1], block)
