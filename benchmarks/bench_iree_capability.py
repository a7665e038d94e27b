"""IREE's capability check on corpus models with default options (issue 21): per model, the capability time (from
its log line), the session's creation time, the IREE partitions and nodes per EP, the nodes IREE declined, and
the max error of one run against onnxruntime CPU:

    python benchmarks/bench_iree_capability.py [--models nudenet,ppocr_det] [--budget-s 30]

Each model runs in its own process (the compile cache of one does not serve another). Run it from a tree with
that tree's ``PYTHONPATH`` (``src`` and the root) to compare two trees; say the load (``cat /proc/loadavg``).
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

EP = "IREEExecutionProvider"
MODELS = "nudenet,ppocr_det,ppocr_rec,ppocr_cls,mobilenetv3"


def _cell(name: str, budget: str | None) -> dict[str, object]:
    import numpy as np
    import onnxruntime as ort

    import epctx
    from benchmarks.corpus import feeds, materialise

    lines: list[str] = []

    class _Log(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    logging.getLogger("epctx").addHandler(_Log(logging.INFO))
    logging.getLogger("epctx").setLevel(logging.INFO)
    with tempfile.TemporaryDirectory() as tmp:
        path = materialise(name, Path(tmp))
        options = {"capability_budget_s": budget} if budget else {}
        start = time.perf_counter()
        try:
            sess = epctx.InferenceSession(str(path), providers=[(EP, options)])
        except Exception as exc:  # reported, as the corpus bench does
            return {"model": name, "error": f"{type(exc).__name__}: {str(exc)[:200]}"}
        seconds = time.perf_counter() - start
        inputs = feeds(name)
        got = sess.run(None, inputs)
        expected = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, inputs)
        error = max(float(np.max(np.abs(np.asarray(g, np.float64) - e))) for g, e in zip(got, expected))
    capability = [m for m in lines if "capability: " in m and "claimed in" in m]
    found = re.search(r"in ([\d.]+) s$", capability[-1]) if capability else None
    placed = sess.get_partitions()
    nodes: dict[str, int] = {}
    for ep, names in placed:
        nodes[ep] = nodes.get(ep, 0) + len(names)
    declined = sum(1 for reasons in sess.get_fallback_reasons().values() if EP in reasons)
    return {
        "model": name,
        "capability_s": float(found.group(1)) if found else None,
        "session_s": round(seconds, 1),
        "iree_partitions": sum(ep == EP for ep, _ in placed),
        "nodes": nodes,
        "declined_by_iree": declined,
        "max_err": float(f"{error:.2g}"),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default=MODELS)
    parser.add_argument("--budget-s", default=None, help="capability_budget_s (default: the EP's)")
    parser.add_argument("--cell", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.cell:
        print(json.dumps(_cell(args.cell, args.budget_s)))
        return
    for name in args.models.split(","):
        command = [sys.executable, __file__, "--cell", name]
        if args.budget_s:
            command += ["--budget-s", args.budget_s]
        done = subprocess.run(command, capture_output=True, text=True)
        row = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr.strip()[-300:]
        print(row, flush=True)


if __name__ == "__main__":
    main()
