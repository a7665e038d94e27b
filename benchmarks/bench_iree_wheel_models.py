"""IREE on models shipped inside PyPI wheels (issue 21), against onnxruntime CPU in the same process:

    python benchmarks/bench_iree_wheel_models.py [--models silero,cls,rec,det,magika] [--dynamic] [--runs 20]
                                                 [--timeout 600]

Per model, in its own process (killed after ``--timeout`` seconds: "no" with the time): does the session
compile and run; IREE partitions and the nodes left to other EPs; the session's creation time (capability check
and compile); max abs error against onnxruntime; steady latency (minimum of ``--runs``, epctx and onnxruntime
interleaved) and its ratio to onnxruntime's; the same for epctx with the CPU EP alone (``[IREE, CPU]`` must never be slower
than ``[CPU]``: adding an EP never makes a model slower).

Models: silero-vad (``silero_vad``'s ``silero_vad.onnx``, a 512-sample chunk at 16 kHz), rapidocr's PP-OCR
``det`` (1x3x640x640), ``rec`` (1x3x48x320) and ``cls`` (6x3x48x192) (Paddle exports), magika's
``standard_v3_3`` (1x2048 bytes). The input shapes are stated in the model (its dynamic dimensions fixed)
unless ``--dynamic``, which keeps the model as shipped.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

EP = "IREEExecutionProvider"
MODELS: dict[str, tuple[str, str, tuple[int, ...]]] = {  # name: (package, file, stated input shape)
    "silero": ("silero_vad", "data/silero_vad.onnx", ()),
    "cls": ("rapidocr_onnxruntime", "models/ch_ppocr_mobile_v2.0_cls_infer.onnx", (6, 3, 48, 192)),
    "rec": ("rapidocr_onnxruntime", "models/ch_PP-OCRv4_rec_infer.onnx", (1, 3, 48, 320)),
    "det": ("rapidocr_onnxruntime", "models/ch_PP-OCRv4_det_infer.onnx", (1, 3, 640, 640)),
    "magika": ("magika", "models/standard_v3_3/model.onnx", (1, 2048)),
}


def _feeds(name: str, shape: tuple[int, ...]) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    if name == "silero":
        chunk = (0.3 * rng.standard_normal((1, 512))).astype(np.float32)
        return {"input": chunk, "state": np.zeros((2, 1, 128), np.float32), "sr": np.array(16000, np.int64)}
    if name == "magika":
        return {"bytes": rng.integers(0, 257, shape).astype(np.int32)}
    return {"x": ((rng.integers(0, 256, shape) / 255.0 - 0.5) / 0.5).astype(np.float32)}  # rapidocr's scaling


def _model(name: str, dynamic: bool) -> Any:
    import onnx

    package, relative, shape = MODELS[name]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"{package} is not installed")
    model = onnx.load(str(Path(next(iter(spec.submodule_search_locations))) / relative))
    if shape and not dynamic:
        for dim, size in zip(model.graph.input[0].type.tensor_type.shape.dim, shape):
            dim.Clear()
            dim.dim_value = size
    return model


def measure(name: str, dynamic: bool, runs: int) -> dict[str, Any]:
    import onnxruntime as ort

    import epctx

    data = _model(name, dynamic).SerializeToString()
    feeds = _feeds(name, MODELS[name][2])
    start = time.perf_counter()
    sess = epctx.InferenceSession(data, providers=[EP])
    create = time.perf_counter() - start
    parts = sess.get_partitions()
    oracle = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    cpu_only = epctx.InferenceSession(data, providers=["CPUExecutionProvider"])
    got, expected = sess.run(None, feeds), oracle.run(None, feeds)
    error = max(float(np.max(np.abs(g.astype(np.float64) - e))) for g, e in zip(got, expected))
    cpu_only.run(None, feeds)
    ours, theirs, cpu = [], [], []
    for _ in range(runs):
        for timed, times in ((sess, ours), (oracle, theirs), (cpu_only, cpu)):
            start = time.perf_counter()
            timed.run(None, feeds)
            times.append(time.perf_counter() - start)
    return {
        "partitions": sum(1 for ep, _ in parts if ep == EP),
        "other_nodes": sum(len(nodes) for ep, nodes in parts if ep != EP),
        "create_s": create,
        "max_error": error,
        "epctx_ms": min(ours) * 1e3,
        "ort_ms": min(theirs) * 1e3,
        "cpu_ep_ms": min(cpu) * 1e3,
    }


def _row(name: str, dynamic: bool, runs: int, timeout: float) -> str:
    command = [
        sys.executable,
        __file__,
        "--one",
        name,
        "--runs",
        str(runs),
        *(["--dynamic"] if dynamic else []),
    ]
    start = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"| {name} | no: not done after {timeout:.0f} s | | | | | | |"
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or ["?"])[-1][:160]
        return f"| {name} | no ({time.perf_counter() - start:.0f} s): {why} | | | | | | |"
    r = json.loads(done.stdout.strip().splitlines()[-1])
    return (
        f"| {name} | yes | {r['partitions']} (+{r['other_nodes']} other nodes) | {r['create_s']:.1f} s "
        f"| {r['max_error']:.1e} | {r['epctx_ms']:.2f} / {r['ort_ms']:.2f} ms | {r['epctx_ms'] / r['ort_ms']:.2f}x "
        f"| {r['cpu_ep_ms']:.2f} ms ({r['cpu_ep_ms'] / r['ort_ms']:.2f}x) |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--dynamic", action="store_true", help="keep the models' dynamic dimensions")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.one, args.dynamic, args.runs)))
        return
    print(
        f"IREE ({'dynamic dimensions as shipped' if args.dynamic else 'input shapes stated'}) vs onnxruntime CPU"
    )
    print(
        "| model | compiles | IREE partitions | create | max error | steady epctx / ort | ratio "
        "| CPU EP alone |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name in args.models.split(","):
        print(_row(name, args.dynamic, args.runs, args.timeout), flush=True)


if __name__ == "__main__":
    main()
