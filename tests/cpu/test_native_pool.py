"""csrc/pool.c, the C kernels' worker threads: the same numbers from threads that run sessions at the same time
(one job in the pool at a time, the others on their own thread), a forked child that uses the pool (its workers
did not come along: rebuilt), many jobs in a row, and a job of more blocks than rows."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import epctx
from epctx.providers.cpu import native
from tests.cpu.test_depthwise_native import _model

needs_native = pytest.mark.skipif(native.kernels() is None, reason="the native kernels are not built here")
RNG = np.random.default_rng(5)


def _session(threads: int = 2) -> epctx.InferenceSession:
    options = epctx.SessionOptions()
    options.intra_op_num_threads = threads
    return epctx.InferenceSession(_model((1, 32, 64, 64), (3, 3), "relu6", pads=[1] * 4), options)


@needs_native
def test_threads_running_sessions_at_once() -> None:
    sessions = [_session() for _ in range(4)]
    feeds = [RNG.standard_normal((1, 32, 64, 64)).astype(np.float32) for _ in sessions]
    expected = [s.run(None, {"x": x})[0] for s, x in zip(sessions, feeds)]
    errors: list[BaseException] = []

    def loop(k: int) -> None:
        try:
            for _ in range(50):
                np.testing.assert_array_equal(sessions[k].run(None, {"x": feeds[k]})[0], expected[k])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=loop, args=(k,)) for k in range(len(sessions))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors and not any(t.is_alive() for t in threads)


@needs_native
@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_a_forked_child_uses_the_pool() -> None:
    """The parent's workers are running when it forks; the child's first shared conv starts its own."""
    script = textwrap.dedent(
        """
        import os, sys
        import numpy as np
        from tests.cpu.test_native_pool import _session
        session = _session()
        x = np.ones((1, 32, 64, 64), np.float32)
        expected = session.run(None, {"x": x})[0]
        pid = os.fork()
        if pid == 0:
            ok = all(np.array_equal(session.run(None, {"x": x})[0], expected) for _ in range(20))
            os._exit(0 if ok else 3)
        _, status = os.waitpid(pid, 0)
        sys.exit(os.waitstatus_to_exitcode(status))
        """
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, timeout=120, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr


@needs_native
def test_many_jobs_and_more_blocks_than_rows() -> None:
    """Ten thousand jobs in a row (the generation counter, the spin and sleep between them), then a job of
    more blocks than rows (an image of 3 rows, in 8 blocks: some blocks empty)."""
    session = _session()
    x = RNG.standard_normal((1, 32, 64, 64)).astype(np.float32)
    expected = session.run(None, {"x": x})[0]
    for _ in range(10_000 // 100):
        for _ in range(100):
            y = session.run(None, {"x": x})[0]
        np.testing.assert_array_equal(y, expected)
    kernels = native.kernels()
    assert kernels is not None
    from epctx.providers.cpu.kernels.conv_weights import prepare_weight
    from epctx.providers.cpu.kernels.depthwise_native import DepthwiseNative
    from epctx.providers.cpu.kernels.windows import spatial_geometry

    geo = spatial_geometry((3, 40), (3, 3), (1, 1), (1, 1), [1] * 4, "NOTSET")
    conv = DepthwiseNative((2, 16, 3, 40), (16, 1, 3, 3), geo, kernels)
    prep = prepare_weight(RNG.standard_normal((16, 1, 3, 3)).astype(np.float32), 16)
    x = RNG.standard_normal((2, 16, 3, 40)).astype(np.float32)
    alone = conv.run_channels_last(x, prep)
    conv.shares = True
    from epctx.providers.cpu import blas_serial

    real = blas_serial.serial().threads
    try:
        blas_serial.serial().threads = lambda: 8  # type: ignore[method-assign]
        np.testing.assert_array_equal(conv.run_channels_last(x, prep), alone)
    finally:
        blas_serial.serial().threads = real  # type: ignore[method-assign]


@needs_native
def test_rest_between_jobs() -> None:
    """native.rest (before OpenBLAS's own threads or Python's helpers get work) sends spinning workers to sleep;
    the next job wakes them: runs interleaved with rests, from two threads, give the same numbers."""
    session = _session()
    x = RNG.standard_normal((1, 32, 64, 64)).astype(np.float32)
    expected = session.run(None, {"x": x})[0]
    errors: list[BaseException] = []

    def loop() -> None:
        try:
            for k in range(300):
                if k % 3 == 0:
                    native.rest()
                np.testing.assert_array_equal(session.run(None, {"x": x})[0], expected)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=loop) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors and not any(t.is_alive() for t in threads)
