"""A run enters an EP's run scope (the CPU EP's BLAS thread limit) only when that EP runs a step of the plan."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest

import epctx
import epctx.providers.cpu.provider as cpu_provider
from tests.epcontext.models import EXAMPLE, feed, two_partition_model, whole_model
from tests.oracle import run_ort


@pytest.fixture
def limits(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    entered: list[int] = []

    @contextlib.contextmanager
    def counting(threads: int) -> Iterator[None]:
        entered.append(threads)
        yield

    monkeypatch.setattr(cpu_provider, "blas_thread_limit", counting)
    return entered


def _session(model: onnx.ModelProto, path: Path) -> epctx.InferenceSession:
    onnx.save(model, path)
    so = epctx.SessionOptions()
    so.intra_op_num_threads = 1
    return epctx.InferenceSession(str(path), so, providers=[EXAMPLE, "CPUExecutionProvider"])


@pytest.mark.parametrize(("model", "cpu_runs"), [(whole_model, False), (two_partition_model, True)])
def test_the_cpu_eps_thread_limit_only_where_it_runs_a_step(
    tmp_path: Path, limits: list[int], model: object, cpu_runs: bool
) -> None:
    built = model()  # type: ignore[operator]
    sess = _session(built, tmp_path / "m.onnx")
    assert ("CPUExecutionProvider" in {ep for ep, _ in sess.get_partitions()}) is cpu_runs
    limits.clear()
    out = sess.run(None, feed())
    np.testing.assert_allclose(out[0], run_ort(built, feed())[0], atol=1e-5)
    assert limits == ([1] if cpu_runs else [])
