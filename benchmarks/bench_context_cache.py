"""The transparent cache (``epctx.context_cache``) against OpenVINO's own ``CACHE_DIR``, first and second process.

Each row is a fresh process that builds a session over the *source* model and runs one inference, timed from
before ``import`` to the first result (the wall time a deployer sees): the first process with an empty cache
folder (it compiles and writes), the second with the folder the first left (it loads). Three ways, same model,
same device (OpenVINO CPU, f32):

- ``epctx``: ``epctx.InferenceSession(model, so, providers=["OpenVINOExecutionProvider"])`` with
  ``epctx.context_cache=<folder>``;
- ``openvino``: raw OpenVINO, ``Core().compile_model(model, "CPU", {"CACHE_DIR": folder, ...})``;
- ``onnxruntime``: onnxruntime's CPU EP (no cache: the reference point).

Default model: the LLM pair's prefill (``llm_pair.py --size bench``, 126 MB of weights). Prints median (min)
of ``--repeat`` runs in seconds and the cache folder's size. Run: python benchmarks/bench_context_cache.py
[--size tiny|bench] [--repeat N]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.processes import child_env, compile_bytecode

_FEEDS = """
import numpy as np
feeds = {"input_ids": np.ones((1, 8), np.int64), "position_ids": np.arange(8, dtype=np.int64)[None]}
"""
CHILDREN = {
    "epctx": _FEEDS
    + """
import epctx
so = epctx.SessionOptions()
so.add_session_config_entry("epctx.context_cache", CACHE)
sess = epctx.InferenceSession(MODEL, so, providers=[("OpenVINOExecutionProvider", {"precision": "f32"})])
out = sess.run(None, feeds)[0]
""",
    "openvino": _FEEDS
    + """
import openvino as ov
core = ov.Core()
compiled = core.compile_model(MODEL, "CPU", {"CACHE_DIR": CACHE, "INFERENCE_PRECISION_HINT": "f32"})
out = compiled(feeds)[0]
""",
    "onnxruntime": _FEEDS
    + """
import onnxruntime as ort
sess = ort.InferenceSession(MODEL, providers=["CPUExecutionProvider"])
out = sess.run(None, feeds)[0]
""",
}


def _run(kind: str, model: Path, cache: Path) -> float:
    script = f"MODEL, CACHE = {str(model)!r}, {str(cache)!r}\n" + CHILDREN[kind]
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", script], check=True, env=child_env(), timeout=600)
    return time.perf_counter() - started


def _size(folder: Path) -> float:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / 1e6 if folder.exists() else 0.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="bench", choices=["tiny", "bench"])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    from benchmarks.llm_pair import export_pair

    compile_bytecode()
    with tempfile.TemporaryDirectory() as tmp:
        model, _ = export_pair(tmp, args.size)
        print(f"LLM pair prefill ({args.size}, {model.stat().st_size / 1e6:.1f} MB), OpenVINO CPU f32; "
              f"fresh process to the first result, median (min) of {args.repeat}, s")  # fmt: skip
        print("way | first process (empty cache) | second process (cache warm) | cache MB")
        for kind in ("epctx", "openvino", "onnxruntime"):
            first, second, size = [], [], 0.0
            for k in range(args.repeat):
                cache = Path(tmp) / f"cache_{kind}_{k}"
                first.append(_run(kind, model, cache))
                second.append(_run(kind, model, cache))
                size = _size(cache)
                shutil.rmtree(cache, ignore_errors=True)
            cells = [f"{statistics.median(t):.2f} ({min(t):.2f})" for t in (first, second)]
            print(f"{kind} | {cells[0]} | {cells[1]} | {size:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
