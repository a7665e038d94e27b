"""What the load-time type check costs, and what OpenVINO in control-flow bodies gives (issue 21).

    python benchmarks/bench_load_check.py [--skip-bodies]

1. ``load_model`` (the full loader) on the real models shipped in wheels and on two generated big graphs, with
   the share the type check (ONNX type inference, strict, once per load) takes of it. A session with a
   compiling EP ran the same inference before (for the EPs' types); a CPU-only session pays it anew.
2. silero-vad (its 687 nodes inside If bodies), 16 kHz chunks: steady latency per chunk (best of 7 rounds of 50,
   every session in turn in the same process) and creation time, for onnxruntime, the CPU EP, OpenVINO, and
   OpenVINO with ``session.partition_control_flow_bodies=1``.
"""

from __future__ import annotations

import argparse
import importlib.util
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx.helper as oh
from onnx import TensorProto, numpy_helper

import epctx
from epctx.model import load as loader
from epctx.model.type_check import check_types

WHEEL_MODELS = [
    ("silero_vad", "data/silero_vad.onnx"),
    ("rapidocr_onnxruntime", "models/ch_PP-OCRv4_rec_infer.onnx"),
    ("rapidocr_onnxruntime", "models/ch_PP-OCRv4_det_infer.onnx"),
    ("magika", "models/standard_v3_3/model.onnx"),
]


def _wheel(package: str, relative: str) -> Path | None:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / relative
    return path if path.is_file() else None


def _big(layers: int, width: int) -> onnx.ModelProto:
    """A chain of MatMul -> Add -> Relu -> Shape -> Reshape -> Softmax blocks, dynamic batch and sequence."""
    rng = np.random.default_rng(0)
    nodes, inits, prev = [], [], "x"
    for i in range(layers):
        inits.append(numpy_helper.from_array(rng.random((width, width), dtype=np.float32), f"w{i}"))
        inits.append(numpy_helper.from_array(rng.random(width, dtype=np.float32), f"b{i}"))
        nodes += [
            oh.make_node("MatMul", [prev, f"w{i}"], [f"m{i}"]),
            oh.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"]),
            oh.make_node("Relu", [f"a{i}"], [f"r{i}"]),
            oh.make_node("Shape", [f"r{i}"], [f"s{i}"]),
            oh.make_node("Reshape", [f"r{i}", f"s{i}"], [f"h{i}"]),
            oh.make_node("Softmax", [f"h{i}"], [f"o{i}"], axis=-1),
        ]
        prev = f"o{i}"
    x = oh.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", width])
    graph = oh.make_graph(
        nodes, "big", [x], [oh.make_tensor_value_info(prev, TensorProto.FLOAT, None)], inits
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])


def _best(fn: Callable[[], Any], runs: int = 3) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def load_costs() -> None:
    paths = [(f"{pkg}:{rel.split('/')[-1]}", p) for pkg, rel in WHEEL_MODELS if (p := _wheel(pkg, rel))]
    with tempfile.TemporaryDirectory() as folder:
        for layers, width in ((2000, 128), (400, 1024)):
            path = Path(folder) / f"big_{layers}x{width}.onnx"
            onnx.save(_big(layers, width), path)
            paths.append((f"generated {layers * 6} nodes, {path.stat().st_size >> 20} MiB", path))
        print(f"{'model':48s} {'load_model':>11s} {'type check':>11s}")
        for label, path in paths:
            total = _best(lambda path=path: loader.load_model(path, infer_types=True))
            data = path.read_bytes()
            _, inferable = loader._checkable(loader.parse_model_proto(data, label), data, stripped=False)
            check = _best(lambda data=inferable, label=label: check_types(data, label))
            print(f"{label:48s} {total * 1e3:8.1f} ms {check * 1e3:8.1f} ms ({100 * check / total:.0f}%)")


def silero_bodies() -> None:
    import onnxruntime as ort

    path = _wheel("silero_vad", "data/silero_vad.onnx")
    if path is None:
        print("silero_vad is not installed: bodies skipped")
        return

    def session(providers: list[str], bodies: bool) -> tuple[Any, float]:
        options = epctx.SessionOptions()
        if bodies:
            options.add_session_config_entry("session.partition_control_flow_bodies", "1")
        start = time.perf_counter()
        made = epctx.InferenceSession(str(path), options, providers=providers)
        return made, time.perf_counter() - start

    start = time.perf_counter()
    sessions = {"onnxruntime": (ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]), 0.0)}
    sessions["onnxruntime"] = (sessions["onnxruntime"][0], time.perf_counter() - start)
    sessions["epctx CPU"] = session(["CPUExecutionProvider"], False)
    sessions["epctx OpenVINO"] = session(["OpenVINOExecutionProvider"], False)
    sessions["epctx OpenVINO + bodies"] = session(["OpenVINOExecutionProvider"], True)
    rng = np.random.default_rng(0)
    feeds = {
        "input": (rng.standard_normal((1, 512)) * 0.2).astype(np.float32),
        "state": np.zeros((2, 1, 128), np.float32),
        "sr": np.array(16000, np.int64),
    }
    expected = sessions["onnxruntime"][0].run(None, feeds)
    best = dict.fromkeys(sessions, float("inf"))
    for _ in range(7):
        for name, (made, _) in sessions.items():
            for _ in range(5):
                made.run(None, feeds)
            start = time.perf_counter()
            for _ in range(50):
                made.run(None, feeds)
            best[name] = min(best[name], (time.perf_counter() - start) / 50)
    for name, (made, created) in sessions.items():
        error = max(float(np.abs(a - b).max()) for a, b in zip(expected, made.run(None, feeds)))
        ratio = best[name] / best["onnxruntime"]
        print(
            f"{name:26s} create {created:6.2f} s  steady {best[name] * 1e3:7.3f} ms  {ratio:6.2f}x onnxruntime  "
            f"max error {error:.1e}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--skip-bodies", action="store_true")
    args = parser.parse_args()
    load_costs()
    if not args.skip_bodies:
        print()
        silero_bodies()


if __name__ == "__main__":
    main()
