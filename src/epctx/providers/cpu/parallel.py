"""Large convs and GEMMs of the CPU EP split into blocks that the calling thread and helper threads take in turn.

Why: OpenBLAS splits a GEMM statically over its threads and the caller waits for every part. On a machine
whose cores are busy with other work, a worker that is not scheduled stalls the whole call for a time slice or
more (a 64x576x1600 conv GEMM: 1.6 ms on one thread, 56 ms on two, measured here under load), where
onnxruntime's pool, whose caller takes work too, degrades gracefully. Here BLAS runs on one thread per call and
the blocks are shared as onnxruntime shares them: whoever is free takes the next block, the caller included,
and the caller only ever waits for blocks a helper has already started. As many runners as BLAS has threads at
the call (``intra_op_num_threads`` sets that, as before); with one, the GEMM runs as a single call.

One block per runner, each a whole run of BLAS calls (``split_product``): every block a thread starts takes the
GIL back at its end, so finer blocks lose to the hand-offs on two cores (a 64 -> 64 3x3 conv at 56x56 as nine
column-block GEMMs: one thread 1594 us, 2 blocks 958, 4 blocks 1076, 8 blocks 1635; one GEMM 128 x 1152 x 784:
one thread 1541, 2 column blocks 997, 8 blocks 2066; measured here). A product is split along its longer side:
each block then reads all of the smaller operand (512 x 4608 x 49: 2 row blocks 1260 us, 2 column blocks 1850).
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable

import numpy as np

from epctx.providers.cpu import blas_serial as blas
from epctx.providers.cpu import native

__all__ = [
    "MIN_BLOCK_COLUMNS",
    "MIN_BLOCK_ROWS",
    "SHARE_MACS",
    "matmul_columns",
    "split_product",
    "split_ranges",
]

MIN_BLOCK_COLUMNS = 128  # narrower blocks lose more to call overhead than they gain
MIN_BLOCK_ROWS = 16
# Work shared with a helper thread only from this many multiply-adds on: waking a sleeping helper takes tens of
# microseconds here (an idle virtual CPU), more than half of a smaller product gains (a 1x1 conv 64 -> 64 at
# 56x56, 12.8M: 194 us on OpenBLAS's own two threads, 253 in two shared bands; an empty two-block job 9 us
# median, a 41 us ufunc pass split in two 100; measured here).
SHARE_MACS = 1 << 25


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
    native.rest()  # the C pool's spinning workers leave the cores to the helpers
    _HELPERS.ensure(helpers)
    for _ in range(helpers):
        _HELPERS.jobs.put(job)
    job.work()
    job.settled.wait()  # only blocks a helper already took are left
    if job.error is not None:
        raise job.error


def split_ranges(
    count: int, block: Callable[[int, int], None], min_size: int = 1, per_runner: int = 4
) -> None:
    """Run ``block(lo, hi)`` over ranges of at least ``min_size`` covering ``range(count)``, ``per_runner``
    blocks a runner, shared with helper threads (any work that releases the GIL: BLAS, numpy's ufuncs)."""
    gate = blas.serial()
    runners = gate.threads()
    blocks = min(per_runner * runners, count // max(1, min_size))
    if runners <= 1:
        block(0, count)
        return
    if blocks <= 1:  # too small to share: one range, BLAS on one thread
        gate(block, 0, count)
        return
    edges = [count * k // blocks for k in range(blocks + 1)]
    gate(_run, _Job(lambda k: block(edges[k], edges[k + 1]), blocks), runners - 1)


def split_product(
    rows: int, cols: int, by_rows: Callable[[int, int], None], by_cols: Callable[[int, int], None]
) -> None:
    """A product of ``rows`` x ``cols`` results computed in one block per runner along its longer side:
    ``by_rows(lo, hi)`` computes rows ``[lo, hi)``, ``by_cols(lo, hi)`` columns ``[lo, hi)`` (each a run of BLAS
    calls with BLAS on one thread); a product too small to split is one call of ``by_cols(0, cols)``."""
    if rows >= 2 * MIN_BLOCK_ROWS and (rows >= cols or cols < 2 * MIN_BLOCK_COLUMNS):
        split_ranges(rows, by_rows, MIN_BLOCK_ROWS, per_runner=1)
    else:
        split_ranges(cols, by_cols, MIN_BLOCK_COLUMNS, per_runner=1)


def matmul_columns(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    """``out[...] = a @ b`` for 2-D ``a`` (M, K), ``b`` (K, L) and ``out`` (M, L), split along its longer side
    (``split_product``; the name kept from when only columns were split); under ``SHARE_MACS`` one call on
    one BLAS thread."""

    def rows(lo: int, hi: int) -> None:
        np.matmul(a[lo:hi], b, out=out[lo:hi])

    def cols(lo: int, hi: int) -> None:
        np.matmul(a, b[:, lo:hi], out=out[:, lo:hi])

    if a.shape[0] * a.shape[1] * b.shape[1] < SHARE_MACS:
        blas.serial()(np.matmul, a, b, out=out)
        return
    split_product(a.shape[0], b.shape[1], rows, cols)
