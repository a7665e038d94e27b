"""``epctx demo`` (``make demo``): the main job end to end on the default EP.

Builds a small CNN, compiles it with a compiling EP into a context model (cold session), loads the context
model (warm session, no compile), and checks the outputs against onnxruntime when that is installed (it is a
test dependency, not a runtime one).
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
    p = sub.add_parser("demo", help="compile a small model to a context model, reload it, check the outputs")
    p.add_argument(
        "-p",
        "--provider",
        help="the EP, by name or short name (default: OpenVINO if installed, else the example EP); a kernel EP "
        "such as CPUExecutionProvider (cpu) runs the model without a context model",
    )
    p.add_argument("--keep", action="store_true", help="keep the files (printed at the end) to inspect them")
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


def _compiling_provider() -> str:
    """OpenVINO when it is installed (the real compiler), else the pure-Python example EP."""
    import epctx

    available = epctx.get_available_providers()
    return (
        "OpenVINOExecutionProvider"
        if "OpenVINOExecutionProvider" in available
        else "ExampleExecutionProvider"
    )


def demo(args: argparse.Namespace) -> int:
    from epctx.cli.provider_args import ep_name
    from epctx.providers.selection import check_provider_name

    provider = ep_name(args.provider) if args.provider else _compiling_provider()
    check_provider_name(provider)
    if not args.keep:
        with tempfile.TemporaryDirectory(prefix="epctx-demo-") as tmp:
            return _demo(Path(tmp), provider)
    folder = Path(tempfile.mkdtemp(prefix="epctx-demo-"))
    status = _demo(folder, provider)
    print(f"files kept in {folder}: {', '.join(sorted(p.name for p in folder.iterdir()))}")
    ctx = folder / "demo_cnn_ctx.onnx"
    if ctx.exists():
        print(f"  try: epctx inspect {ctx} --verify")
    return status


def _demo(folder: Path, provider: str) -> int:
    import epctx
    from epctx.providers.registry import create_provider
    from epctx.session.compile_guard import no_compile

    path = folder / "demo_cnn.onnx"
    build_demo_model(path)
    x = np.random.default_rng(1).standard_normal((2, 3, 64, 64)).astype(np.float32)
    print(f"model: {path.name}  EP: {provider}")

    # One-time imports (CPU kernels, the backend) are paid here, so the two timings below compare
    # compiling with loading, not first use with second use.
    epctx.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    compiles = create_provider(provider).compiles
    so = epctx.SessionOptions()
    if compiles:
        so.add_session_config_entry("ep.context_enable", "1")
    t0 = time.perf_counter()
    cold = epctx.InferenceSession(str(path), so, providers=[provider])
    cold_ms = (time.perf_counter() - t0) * 1e3
    placement = ", ".join(f"{n} on {ep}" for ep, n in sorted(_placement(cold).items()))
    if compiles:
        ctx = path.with_name("demo_cnn_ctx.onnx")
        files = sorted(p.name for p in folder.iterdir() if p.name != path.name)
        print(f"cold session (partition + compile + write context): {cold_ms:8.1f} ms  -> {', '.join(files)}")
        t0 = time.perf_counter()
        with no_compile():
            warm = epctx.InferenceSession(str(ctx), providers=[provider])
        warm_ms = (time.perf_counter() - t0) * 1e3
        print(
            f"warm session (load context model, no compile):       {warm_ms:8.1f} ms  ({cold_ms / warm_ms:.1f}x)"
        )
    else:
        print(f"session: {cold_ms:8.1f} ms  ({provider} compiles nothing, so no context model is written)")
        warm = cold
    print(f"placement: {placement}")

    times = []
    probs = warm.run(None, {"x": x})[0]
    for _ in range(10):
        t = time.perf_counter()
        (probs,) = warm.run(None, {"x": x})
        times.append((time.perf_counter() - t) * 1e3)
    print(f"run (median of 10): {np.median(times):.2f} ms   output 'probs' {list(probs.shape)}")
    same = float(np.max(np.abs(cold.run(None, {"x": x})[0] - probs)))
    if compiles:
        print(f"cold vs warm outputs: max abs diff {same:.2e}")
    try:
        import onnxruntime as ort
    except ImportError:
        print("onnxruntime not installed: skipping the cross-check")
        return 0 if same <= 1e-5 else 1
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    diff = float(np.max(np.abs(ref - probs)))
    print(f"max abs diff vs onnxruntime CPU: {diff:.2e}")
    if diff > 1e-4 or same > 1e-5:
        print("MISMATCH")
        return 1
    return 0


def _placement(session: Any) -> dict[str, int]:
    """Nodes per EP in the source model's session (its placement, ``get_partitions``)."""
    counts: dict[str, int] = {}
    for ep, nodes in session.get_partitions():
        counts[ep] = counts.get(ep, 0) + len(nodes)
    return counts
