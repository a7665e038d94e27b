"""IREE flag / rewrite A/B on one corpus model, in one process, against onnxruntime CPU in that process:

    python benchmarks/bench_iree_ab.py MODEL '{"name": {provider options}, ...}' [--seconds 4] [--threads 1]
                                       [--shipped]

The model's inputs are stated with its feed's shapes (``bench_iree_flags.stated``; ``--shipped``: as shipped).
Each variant's session is created once (``create s``: capability check + compile; the in-process compile cache
makes a repeated variant free), checked against onnxruntime (``err``), then timed in three alternating blocks
against onnxruntime with ``time.thread_time`` (one thread each: the CPU time leaves out the time another process
held the core, so the ratio holds on a loaded machine): medians, their ratio, best against best. The measured
rule is off (``epctx.partition.measured_rule=0``): the IREE code is what is timed. Provider options as the EP
takes them (``compile_flags`` for raw iree-compile flags); keys starting ``epctx.`` are session config entries;
``"_without": ["epctx:rewrite-nhwc-pools", ...]`` drops epctx's own markers (rewrites) from the EP's flags.
Used for issue 21's measurements (options.py and the rewrite modules quote them)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.bench_iree_flags import stated
from benchmarks.corpus import feeds, materialise

EP = "IREEExecutionProvider"


def _times(run: Any, count: int) -> list[float]:
    out = []
    for _ in range(count):
        start = time.thread_time()
        run()
        out.append(time.thread_time() - start)
    return out


def _session(model: Path, options: dict[str, Any], threads: int) -> Any:
    import epctx
    from epctx.providers.iree.provider import IREEExecutionProvider

    options = dict(options)
    without = set(options.pop("_without", ()))
    so = epctx.SessionOptions()
    so.intra_op_num_threads = threads
    so.add_session_config_entry("epctx.partition.measured_rule", "0")
    for key in [k for k in options if k.startswith("epctx.")]:
        so.add_session_config_entry(key, options.pop(key))
    real = IREEExecutionProvider.flags
    IREEExecutionProvider.flags = lambda self: [f for f in real(self) if f not in without]  # type: ignore[method-assign]
    try:
        return epctx.InferenceSession(str(model), so, providers=[(EP, options)])
    finally:
        IREEExecutionProvider.flags = real  # type: ignore[method-assign]


def variant(name: str, model: Path, options: dict[str, Any], oracle: Any, feed: Any, args: Any) -> str:
    start = time.perf_counter()
    try:
        sess = _session(model, options, args.threads)
    except Exception as exc:  # a variant IREE refuses is a result
        return f"{name}: failed: {type(exc).__name__}: {str(exc)[:300]}"
    create = time.perf_counter() - start
    partitions = [(ep.replace("ExecutionProvider", ""), len(nodes)) for ep, nodes in sess.get_partitions()]
    got, expected = sess.run(None, feed), oracle.run(None, feed)
    err = max(float(np.max(np.abs(g.astype(np.float64) - e))) for g, e in zip(got, expected))
    start = time.thread_time()
    sess.run(None, feed)
    count = max(3, int(args.seconds / 6 / max(time.thread_time() - start, 1e-4)))
    ours: list[float] = []
    theirs: list[float] = []
    for _ in range(3):
        ours += _times(lambda: sess.run(None, feed), count)
        theirs += _times(lambda: oracle.run(None, feed), count)
    mine, ort_ms = statistics.median(ours) * 1e3, statistics.median(theirs) * 1e3
    load = os.getloadavg()[0]
    return (f"{name}: create {create:.1f} s, partitions {partitions}, err {err:.1e}, epctx {mine:.2f} ms, "
            f"ort {ort_ms:.2f} ms, ratio {mine / ort_ms:.2f}, best {min(ours) / min(theirs):.2f}, load {load:.1f}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("model")
    parser.add_argument("variants", help='JSON: {"name": {provider options}}')
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--shipped", action="store_true", help="the model as shipped (its dynamic dims kept)")
    args = parser.parse_args()
    import onnxruntime as ort

    feed = feeds(args.model)
    with tempfile.TemporaryDirectory(prefix="epctx-iree-ab-") as tmp:
        path = materialise(args.model, Path(tmp))
        model = path if args.shipped else stated(path, feed, Path(tmp) / f"{args.model}_stated.onnx")
        so = ort.SessionOptions()
        so.intra_op_num_threads = args.threads
        oracle = ort.InferenceSession(str(model), so, providers=["CPUExecutionProvider"])
        for name, options in json.loads(args.variants).items():
            print(f"{args.model} {variant(name, model, options, oracle, feed, args)}", flush=True)


if __name__ == "__main__":
    main()
