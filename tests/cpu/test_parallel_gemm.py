"""The CPU EP's shared-block GEMM (providers/cpu/parallel.py) and one-thread BLAS calls (blas.serial)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from epctx.providers.cpu import blas_serial as blas
from epctx.providers.cpu import parallel

RNG = np.random.default_rng(5)


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("cols", [100, 1000, 4099])
def test_matmul_columns_matches_numpy(threads: int, cols: int) -> None:
    a = RNG.standard_normal((37, 300)).astype(np.float32)
    b = RNG.standard_normal((300, cols)).astype(np.float32)
    out = np.full((37, cols), np.nan, np.float32)
    with threadpool_limits(threads, user_api="blas"):
        parallel.matmul_columns(a, b, out)
    np.testing.assert_allclose(out, a @ b, rtol=1e-5, atol=1e-4)


def test_a_block_that_fails_raises_in_the_caller() -> None:
    job = parallel._Job(lambda k: 1 // (k - 3), 6)  # block 3 divides by zero
    with pytest.raises(ZeroDivisionError):
        parallel._run(job, 2)


def test_serial_lowers_blas_threads_inside_and_restores_them() -> None:
    gate = blas.serial()
    if gate.get_threads is None:
        pytest.skip("numpy's BLAS is not a pthreads OpenBLAS")
    with threadpool_limits(2, user_api="blas"):
        if gate.threads() != 2:
            pytest.skip("OpenBLAS runs fewer than 2 threads here")
        assert gate(gate.threads) == 1
        assert gate(lambda: gate(gate.threads)) == 1  # nested
        assert gate.threads() == 2


def test_a_forked_child_computes_without_the_parents_helpers() -> None:
    import os

    a = RNG.standard_normal((16, 64)).astype(np.float32)
    b = RNG.standard_normal((64, 2048)).astype(np.float32)
    out = np.empty((16, 2048), np.float32)
    with threadpool_limits(2, user_api="blas"):
        parallel.matmul_columns(a, b, out)  # helpers started in the parent
        pid = os.fork()
        if pid == 0:  # the child: its own helpers (or none), never a hang
            try:
                child = np.empty_like(out)
                parallel.matmul_columns(a, b, child)
                os._exit(0 if np.allclose(child, out, rtol=1e-5, atol=1e-4) else 1)
            finally:
                os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


@pytest.mark.parametrize(
    ("op", "a_shape", "b_shape", "attrs"),
    [
        ("MatMul", (2, 300, 256), (256, 512), {}),  # large, 2-D right side: column blocks
        ("MatMul", (4, 64, 32), (4, 32, 64), {}),  # small and batched: one BLAS thread
        ("Gemm", (256, 300), (512, 256), {"transA": 1, "transB": 1, "alpha": 0.5}),
        ("Gemm", (8, 16), (16, 4), {}),
    ],
)
def test_matmul_and_gemm_sized_to_their_work_match_onnxruntime(
    op: str, a_shape: tuple[int, ...], b_shape: tuple[int, ...], attrs: dict[str, Any]
) -> None:
    from onnx import helper

    from tests.oracle import assert_matches_ort

    a = RNG.standard_normal(a_shape).astype(np.float32)
    b = RNG.standard_normal(b_shape).astype(np.float32)
    node = helper.make_node(op, ["a", "b"], ["y"], **attrs)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info(n, 1, v.shape) for n, v in (("a", a), ("b", b))],
        [helper.make_tensor_value_info("y", 1, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    with threadpool_limits(2, user_api="blas"):
        assert_matches_ort(model, {"a": a, "b": b}, atol=1e-3, rtol=1e-4)
