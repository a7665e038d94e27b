"""``epctx demo`` (``make demo``): the main job end to end on the default EP.

Until a compiling EP lands this builds a small CNN, runs it on the CPU EP and checks the result against
onnxruntime when that is installed (it is a test dependency, not a runtime one).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["add_parser", "build_demo_model"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser("demo", help="build a small model and run it end to end")
    p.set_defaults(func=demo)


def build_demo_model(path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)

    def init(name: str, *shape: int) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.1).astype(np.float32), name)

    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("GlobalAveragePool", ["r2"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Gemm", ["f", "w3", "b3"], ["logits"], transB=1),
        helper.make_node("Softmax", ["logits"], ["probs"], axis=-1),
    ]
    graph = helper.make_graph(
        nodes,
        "demo_cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 64, 64])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["batch", 10])],
        [
            init("w1", 16, 3, 3, 3),
            init("b1", 16),
            init("w2", 32, 16, 3, 3),
            init("b2", 32),
            init("w3", 10, 32),
            init("b3", 10),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="epctx-demo")
    onnx.save(model, path)


def demo(args: argparse.Namespace) -> int:
    import epctx

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "demo_cnn.onnx"
        build_demo_model(path)
        x = np.random.default_rng(1).standard_normal((2, 3, 64, 64)).astype(np.float32)
        t0 = time.perf_counter()
        session = epctx.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        created = (time.perf_counter() - t0) * 1e3
        times = []
        for _ in range(10):
            t = time.perf_counter()
            (probs,) = session.run(None, {"x": x})
            times.append((time.perf_counter() - t) * 1e3)
        print(f"model: {path.name}  providers: {', '.join(session.get_providers())}")
        print(f"session creation: {created:.1f} ms   run (median of 10): {np.median(times):.2f} ms")
        print(f"output 'probs': shape {list(probs.shape)}, rows sum to {probs.sum(axis=1).round(5).tolist()}")
        try:
            import onnxruntime as ort
        except ImportError:
            print("onnxruntime not installed: skipping the cross-check")
            return 0
        ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
        diff = float(np.max(np.abs(ref - probs)))
        print(f"max abs diff vs onnxruntime CPU: {diff:.2e}")
        if diff > 1e-4:
            print("MISMATCH against onnxruntime")
            return 1
    return 0
