"""Warm load of a context model, and what checksum verification adds to it.

For each size: an MLP whose weights live in the example EP's context binary is compiled once; then warm
sessions are created from the context model in the same process (file in the page cache), with checksum
verification as shipped and with it stubbed out. Prints: weights MB | warm load ms (verified) | warm load ms
(no verify) | verify share of warm load. Run: python benchmarks/bench_context_load.py [--repeat N]
[--provider ExampleExecutionProvider|OpenVINOExecutionProvider]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import epctx
from epctx.epcontext.container import ContextBinary


def mlp(width: int, layers: int) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    nodes, inits, prev = [], [], "x"
    for k in range(layers):
        inits.append(
            numpy_helper.from_array(rng.standard_normal((width, width)).astype(np.float32) * 0.01, f"W{k}")
        )
        nodes += [
            helper.make_node("MatMul", [prev, f"W{k}"], [f"m{k}"]),
            helper.make_node("Relu", [f"m{k}"], [f"r{k}"]),
        ]
        prev = f"r{k}"
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", width])],
        [helper.make_tensor_value_info(prev, TensorProto.FLOAT, ["N", width])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def warm_load_ms(ctx: Path, repeat: int) -> float:
    times = []
    x = {
        "x": np.ones(
            (
                1,
                int(
                    onnx.load(ctx, load_external_data=False)
                    .graph.input[0]
                    .type.tensor_type.shape.dim[1]
                    .dim_value
                ),
            ),
            np.float32,
        )
    }
    for _ in range(repeat):
        t = time.perf_counter()
        sess = epctx.InferenceSession(str(ctx), providers=[PROVIDER[0]])
        sess.run(None, x)  # first run touches every weight page, as a real first inference does
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


_FRESH = """
import sys, time
t = time.perf_counter()
import numpy as np
import epctx
from epctx.epcontext.container import ContextBinary
if sys.argv[2] == "0":
    ContextBinary._verify = lambda self, info, view: None
sess = epctx.InferenceSession(sys.argv[1], providers=[sys.argv[4]])
sess.run(None, {"x": np.ones((1, int(sys.argv[3])), np.float32)})
print((time.perf_counter() - t) * 1e3)
"""


def fresh_process_ms(ctx: Path, width: int, verify: bool, repeat: int) -> float:
    """Import epctx + create the session + first run, in a new interpreter (file in the page cache)."""
    import subprocess

    times = []
    for _ in range(repeat):
        out = subprocess.run(
            [sys.executable, "-c", _FRESH, str(ctx), "1" if verify else "0", str(width), PROVIDER[0]],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        times.append(float(out.stdout.strip().splitlines()[-1]))
    return statistics.median(times)


PROVIDER = ["ExampleExecutionProvider"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--provider", default="ExampleExecutionProvider")
    args = parser.parse_args()
    PROVIDER[0] = args.provider
    print(f"provider: {args.provider}")
    print("in-process warm session (create + first run) and fresh process (import + create + first run)")
    print(
        f"{'weights MB':>10} | {'warm ms':>8} | {'no-verify':>9} | {'share':>6} | "
        f"{'fresh ms':>8} | {'no-verify':>9} | {'share':>6}"
    )
    for width, layers in ((512, 4), (1024, 8), (2048, 8)):
        with tempfile.TemporaryDirectory() as tmp:
            src = Path(tmp) / "mlp.onnx"
            onnx.save(mlp(width, layers), src)
            so = epctx.SessionOptions()
            so.add_session_config_entry("ep.context_enable", "1")
            epctx.InferenceSession(str(src), so, providers=[PROVIDER[0]])
            ctx = src.with_name("mlp_ctx.onnx")
            warm_load_ms(ctx, 2)  # page cache and imports
            verified = warm_load_ms(ctx, args.repeat)
            original = ContextBinary._verify
            ContextBinary._verify = lambda self, info, view: None  # type: ignore[method-assign]
            try:
                unverified = warm_load_ms(ctx, args.repeat)
            finally:
                ContextBinary._verify = original  # type: ignore[method-assign]
            fresh = fresh_process_ms(ctx, width, True, max(3, args.repeat // 2))
            fresh_unverified = fresh_process_ms(ctx, width, False, max(3, args.repeat // 2))
            mb = width * width * layers * 4 / 1e6
            share = (verified - unverified) / verified * 100
            fresh_share = (fresh - fresh_unverified) / fresh * 100
            print(
                f"{mb:10.1f} | {verified:8.2f} | {unverified:9.2f} | {share:5.1f}% | "
                f"{fresh:8.1f} | {fresh_unverified:9.1f} | {fresh_share:5.1f}%"
            )


if __name__ == "__main__":
    main()
