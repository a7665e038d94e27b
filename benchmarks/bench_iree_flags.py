"""IREE's compile flags on the real-model corpus, stated shapes, against onnxruntime CPU in the same process:

    python benchmarks/bench_iree_flags.py [--models magika,ppocr_cls] [--variants default,plain]
                                          [--steady 3] [--budget 300] [--threads 0] [--cpu]

Every graph input of a corpus model (``benchmarks/corpus``) is stated with the shape of its feed (the dynamic
dimensions fixed, as ``--dim`` / free-dimension overrides do), then, per (model, variant), in its own process
(killed after ``--budget`` seconds): the session is created with ``IREEExecutionProvider`` and the variant's
provider options (``create s``: capability check + compile, the context written), loaded again from its
context model (``warm ms``), checked against onnxruntime (``max err``) and timed against onnxruntime in
alternating blocks (``epctx ms`` / ``ort ms``: medians; ``min ratio``: best run against best run); with
``--cpu``, epctx's CPU EP alone too (``IREE / CPU``: above 1, adding IREE made the model slower).

Variants (provider options of the IREE EP): ``default`` (the EP's defaults), ``plain`` (``depthwise_rewrite=0``:
the EP as it was, IREE's own depthwise code), ``fast`` (``fast_codegen=1``: data tiling, microkernels, im2col),
``nocl`` (``channels_last=0``), ``measured`` (the defaults with ``epctx.partition.measured_rule=1``, a session
config entry: ``epctx.`` keys are); more as ``name=opt:value;opt:value`` on the command line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.corpus import feeds, materialise

EP = "IREEExecutionProvider"
VARIANTS: dict[str, dict[str, str]] = {
    "default": {},
    "plain": {"depthwise_rewrite": "0"},
    "fast": {"fast_codegen": "1"},
    "nocl": {"channels_last": "0"},
    "measured": {"epctx.partition.measured_rule": "1"},
}


def stated(model_path: Path, feed: dict[str, np.ndarray], out: Path) -> Path:
    """The model with each graph input's dimensions fixed to its feed's shape."""
    import onnx

    model = onnx.load(str(model_path))
    for value in model.graph.input:
        if value.name not in feed:
            continue
        dims = value.type.tensor_type.shape.dim
        for dim, size in zip(dims, feed[value.name].shape):
            dim.Clear()
            dim.dim_value = int(size)
    onnx.save(model, str(out))
    return out


def _blocks(run: Any, seconds: float) -> list[float]:
    times: list[float] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end or len(times) < 3:
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return times


def cell(
    name: str, model: Path, options: dict[str, str], steady: float, threads: int, with_cpu: bool = False
) -> dict[str, Any]:
    import onnxruntime as ort

    import epctx

    feed = feeds(name)
    so_ort = ort.SessionOptions()
    so = epctx.SessionOptions()
    config = {k: options.pop(k) for k in [k for k in options if k.startswith("epctx.")]}  # the measured rule
    for key, value in config.items():
        so.add_session_config_entry(key, value)
    if threads:
        so_ort.intra_op_num_threads = so.intra_op_num_threads = threads
    oracle = ort.InferenceSession(str(model), so_ort, providers=["CPUExecutionProvider"])
    expected = oracle.run(None, feed)
    row: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="epctx-iree-flags-") as tmp:
        ctx = Path(tmp) / "ctx.onnx"
        so.add_session_config_entry("ep.context_enable", "1")
        so.add_session_config_entry("ep.context_file_path", str(ctx))
        start = time.perf_counter()
        first = epctx.InferenceSession(str(model), so, providers=[(EP, options)])
        row["create_s"] = time.perf_counter() - start
        row["partitions"] = sum(1 for ep, _ in first.get_partitions() if ep == EP)
        row["other_nodes"] = sum(len(n) for ep, n in first.get_partitions() if ep != EP)
        del first
        warm_so = epctx.SessionOptions()
        for key, value in config.items():  # the same config (a context records hand-backs)
            warm_so.add_session_config_entry(key, value)
        if threads:
            warm_so.intra_op_num_threads = threads
        start = time.perf_counter()
        warm = epctx.InferenceSession(str(ctx), warm_so, providers=[(EP, options)])
        row["warm_ms"] = (time.perf_counter() - start) * 1e3
        got = warm.run(None, feed)
        row["max_err"] = max(
            float(np.max(np.abs(g.astype(np.float64) - e))) if g.size else 0.0 for g, e in zip(got, expected)
        )
        cpu = (
            epctx.InferenceSession(str(model), warm_so, providers=["CPUExecutionProvider"])
            if with_cpu
            else None
        )
        ours: list[float] = []
        theirs: list[float] = []
        cpus: list[float] = []
        for _ in range(3):
            ours += _blocks(lambda: warm.run(None, feed), steady / 6)
            theirs += _blocks(lambda: oracle.run(None, feed), steady / 6)
            if cpu is not None:
                cpus += _blocks(lambda: cpu.run(None, feed), steady / 6)
    row["epctx_ms"] = statistics.median(ours) * 1e3
    row["ort_ms"] = statistics.median(theirs) * 1e3
    row["ratio"] = row["epctx_ms"] / row["ort_ms"]
    row["min_ratio"] = min(ours) / min(theirs)
    if cpus:  # [IREE, CPU] against [CPU]: adding IREE must not make the model slower
        row["cpu_ms"] = statistics.median(cpus) * 1e3
        row["vs_cpu"] = row["epctx_ms"] / row["cpu_ms"]
    return row


def _parse_variant(text: str) -> tuple[str, dict[str, str]]:
    if text in VARIANTS:
        return text, VARIANTS[text]
    name, _, spec = text.partition("=")
    options = dict(item.split(":", 1) for item in spec.split(";") if item)
    return name, options


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", default="magika,ppocr_cls,ppocr_rec,ppocr_det,resnet18,mobilenetv3,yolo")
    parser.add_argument("--variants", default="plain,default")
    parser.add_argument("--steady", type=float, default=3.0)
    parser.add_argument("--budget", type=float, default=300.0)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument(
        "--cpu", action="store_true", help="also time epctx's CPU EP alone (IREE / CPU ratio)"
    )
    parser.add_argument("--cell", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.cell:
        name, path, options, steady = args.cell
        print(json.dumps(cell(name, Path(path), json.loads(options), float(steady), args.threads, args.cpu)))
        return
    load = "/".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"IREE flags, stated shapes, vs onnxruntime CPU  cpus {os.cpu_count()}  load {load}")
    print(
        "| model | variant | partitions | create s | warm ms | max err | epctx / ort ms (median) | ratio | min ratio "
        "| CPU EP alone ms (IREE / CPU) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="epctx-iree-flags-models-") as tmp:
        for name in args.models.split(","):
            path = stated(materialise(name, Path(tmp)), feeds(name), Path(tmp) / f"{name}_stated.onnx")
            for text in args.variants.split(","):
                variant, options = _parse_variant(text)
                command = [sys.executable, __file__, "--cell", name, str(path), json.dumps(options),
                           str(args.steady), "--threads", str(args.threads), *(["--cpu"] if args.cpu else [])]  # fmt: skip
                try:
                    done = subprocess.run(command, capture_output=True, text=True, timeout=args.budget)
                except subprocess.TimeoutExpired:
                    print(
                        f"| {name} | {variant} | not done after {args.budget:g} s | | | | | | |", flush=True
                    )
                    continue
                if done.returncode != 0:
                    why = (done.stderr.strip().splitlines() or ["?"])[-1][:200]
                    print(f"| {name} | {variant} | failed: {why} | | | | | | |", flush=True)
                    continue
                r = json.loads(done.stdout.strip().splitlines()[-1])
                print(
                    f"| {name} | {variant} | {r['partitions']} (+{r['other_nodes']} other) | {r['create_s']:.1f} "
                    f"| {r['warm_ms']:.1f} | {r['max_err']:.1e} | {r['epctx_ms']:.2f} / {r['ort_ms']:.2f} "
                    f"| {r['ratio']:.2f} | {r['min_ratio']:.2f} | "
                    + (f"{r['cpu_ms']:.2f} ({r['vs_cpu']:.2f}) |" if "cpu_ms" in r else "- |"),
                    flush=True,
                )
    print(f"load after: {'/'.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
