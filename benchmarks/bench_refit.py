"""Refit time against a fresh compile, on the LLM pair (``llm_pair.py``): the base pair is compiled by IREE; a
fine-tune stand-in (same graph, every matrix moved by torch) is then made ready two ways, each in a fresh
process: ``epctx compile`` (a compile) and ``epctx refit`` (the base context's code, its new weights).

Run: python benchmarks/bench_refit.py [--size tiny|bench]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.llm_pair import export_pair

EP = "IREEExecutionProvider"


def _epctx(*args: str) -> float:
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "epctx.cli", *args], capture_output=True, text=True, timeout=600
    )
    if done.returncode != 0:
        raise SystemExit(f"epctx {' '.join(args)} failed: {done.stderr}")
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="tiny", choices=["tiny", "bench"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        base = export_pair(root / "base", args.size, seed=3)
        tuned = export_pair(root / "tuned", args.size, seed=3, tune=0.05)
        for name, source, target in zip(("prefill", "decode"), base, tuned):
            _epctx("compile", str(source), "-p", EP, "-q")
            compiled = _epctx(
                "compile", str(target), "-p", EP, "-q", "-o", str(root / "tuned" / f"{name}_c.onnx")
            )
            ctx = source.with_name(f"{name}_ctx.onnx")
            refit = _epctx(
                "refit", str(ctx), "--weights", str(target), "-o", str(root / "tuned" / f"{name}_r.onnx")
            )
            print(
                f"{args.size} {name}: compile {compiled:.2f} s, refit {refit:.2f} s "
                f"({compiled / refit:.1f}x; both fresh processes, epctx CLI)"
            )


if __name__ == "__main__":
    main()
