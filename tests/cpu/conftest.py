"""Fixtures of the CPU EP's tests."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture
def shared_jobs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Two runners whatever BLAS has here (``blas_serial.serial().threads``), and the block count of every job
    handed to helper threads (``parallel._run``), in order."""
    from epctx.providers.cpu import blas_serial, parallel

    monkeypatch.setattr(blas_serial.serial(), "threads", lambda: 2)
    jobs: list[int] = []
    real = parallel._run

    def counted(job: Any, helpers: int) -> None:
        jobs.append(job.blocks)
        real(job, helpers)

    monkeypatch.setattr(parallel, "_run", counted)
    return jobs


@pytest.fixture
def numpy_kernels(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The CPU EP without its native kernels (``EPCTX_NATIVE=0``): the numpy forms they replace, for the tests
    of those forms."""
    from epctx.providers.cpu import native

    monkeypatch.setenv("EPCTX_NATIVE", "0")
    native.reset()
    yield
    monkeypatch.delenv("EPCTX_NATIVE")
    native.reset()


@pytest.fixture
def native_shares(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Two runners whatever BLAS has here, and the thread count of every native kernel call
    (``native.Native.rows``: above one, its rows are shared by csrc/pool.c's workers), in order."""
    from epctx.providers.cpu import blas_serial, native

    monkeypatch.setattr(blas_serial.serial(), "threads", lambda: 2)
    threads: list[int] = []
    real = native.Native.rows

    def counted(
        self: Any, kernel: int, xs: Any, ys: Any, rows: int, args: Any, count: int, blocks: int
    ) -> None:
        threads.append(count)
        real(self, kernel, xs, ys, rows, args, count, blocks)

    monkeypatch.setattr(native.Native, "rows", counted)
    return threads
