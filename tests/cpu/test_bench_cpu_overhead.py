"""benchmarks/bench_cpu_overhead.py: the session's loop around the CPU EP's kernels, measured with null kernels
on a real corpus model (the PP-OCR direction classifier)."""

from __future__ import annotations

from pathlib import Path

import pytest
from benchmarks import bench_cpu_overhead
from benchmarks.corpus import Unavailable


def test_overhead_of_a_real_model(tmp_path: Path) -> None:
    try:
        row = bench_cpu_overhead.measure("ppocr_cls", tmp_path, runs=3, threads=1)
    except Unavailable as exc:
        pytest.skip(str(exc))
    # constant folding and pass-through kernels leave far fewer steps than nodes
    assert 0 < row["steps"] < row["nodes"]
    # the null run returns recorded results: it costs less than the kernels, which cost less than the run
    assert 0 < row["null_us"] < row["kernel_us"] <= row["run_us"] <= row["median_us"]
    assert row["loop_us"] == pytest.approx(row["null_us"] / row["steps"])
    # a run's time outside its kernels: positive, and far below a kernel's (tens of us on this model)
    assert 0 < row["outside_us"] * row["steps"] < row["median_us"] / 4
    lines = bench_cpu_overhead.table([row])
    assert len(lines) == 3 and lines[2].startswith("ppocr_cls ")
    assert f"{row['steps']:5d}" in lines[2]


def test_null_kernels_answer_from_the_recording() -> None:
    kernels = bench_cpu_overhead._Kernels()
    calls = []

    def add(a: int, b: int) -> tuple[int]:
        calls.append((a, b))
        return (a + b,)

    add.passes_input = lambda: None  # type: ignore[attr-defined]
    wrapped = kernels.wrap(add)
    assert wrapped.passes_input is add.passes_input
    assert wrapped(1, 2) == (3,) and kernels.best[0] > 0
    kernels.mode = "record"
    wrapped(2, 3)
    kernels.mode = "null"
    assert wrapped(10, 20) == (5,)  # the recorded result, the kernel not called
    assert calls == [(1, 2), (2, 3)]
