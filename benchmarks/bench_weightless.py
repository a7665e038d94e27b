"""Disk of N IREE variants of one model, weightless (``ep.enable_weightless_mode=1``) against self-contained.

The source is an MLP (``models.mlp``, 784 -> 1024 x3 -> 10, ~11.6 MB of weights) saved with its weights as
external data. One variant per IREE target preset (``--targets``), each compiled into its own folder
(``ep.context_file_path``), in mode 0 and in mode 1; a weightless variant loads its weights from the one shared
``m.onnx.data`` (``session.model_external_initializers_file_folder_path``). Printed: the bytes each mode puts
on disk for N variants (the shared weights counted once), the compile times, and for a variant of this CPU the
first and second session creation in this process (the first one hashes the weights file, the second reuses
the digest of the same file version).

Run: python benchmarks/bench_weightless.py [--targets host,x86-64-v2,x86-64-v3,x86-64-v4]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np
import onnx

import epctx
from benchmarks.models import mlp

EP = "IREEExecutionProvider"
FOLDER_KEY = "session.model_external_initializers_file_folder_path"


def _size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file())


def _compile(source: Path, out: Path, target: str, mode: str) -> float:
    out.mkdir(parents=True)
    so = epctx.SessionOptions()
    so.add_session_config_entry("ep.context_enable", "1")
    so.add_session_config_entry("ep.context_file_path", str(out / "m_ctx.onnx"))
    so.add_session_config_entry("ep.enable_weightless_mode", mode)
    start = time.perf_counter()
    epctx.InferenceSession(str(source), so, providers=[(EP, {"target": target})])
    return time.perf_counter() - start


def _load(ctx: Path, weights: Path) -> float:
    so = epctx.SessionOptions()
    so.add_session_config_entry(FOLDER_KEY, str(weights))
    start = time.perf_counter()
    sess = epctx.InferenceSession(str(ctx), so, providers=[EP])
    elapsed = time.perf_counter() - start
    sess.run(None, {"input": np.zeros((32, 784), np.float32)})
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--targets", default="host,x86-64-v2,x86-64-v3,x86-64-v4")
    args = parser.parse_args()
    targets = args.targets.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        weights = root / "weights"
        weights.mkdir()
        source = weights / "m.onnx"
        onnx.save(mlp(), source, save_as_external_data=True, location="m.onnx.data", size_threshold=1024)
        shared = (weights / "m.onnx.data").stat().st_size
        print(f"source: {source.stat().st_size} B .onnx + {shared} B external data")
        totals = {}
        for mode in ("0", "1"):
            sizes, times = [], []
            for target in targets:
                out = root / f"mode{mode}" / target
                times.append(_compile(source, out, target, mode))
                sizes.append(_size(out))
            total = sum(sizes) + (shared if mode == "1" else 0)
            totals[mode] = total
            print(
                f"mode {mode}: {len(targets)} variants, per variant {min(sizes)}..{max(sizes)} B, "
                f"on disk {total / 1e6:.2f} MB{' (shared weights counted once)' if mode == '1' else ''}, "
                f"compile {sum(times):.1f} s"
            )
        print(f"weightless / self-contained disk: {totals['1'] / totals['0']:.3f}")
        ctx = root / "mode1" / targets[0] / "m_ctx.onnx"
        first, second = _load(ctx, weights), _load(ctx, weights)
        full = _load(root / "mode0" / targets[0] / "m_ctx.onnx", weights)
        print(
            f"session over a weightless variant ({targets[0]}): first {first * 1e3:.1f} ms (hashes the weights), "
            f"second {second * 1e3:.1f} ms; self-contained {full * 1e3:.1f} ms"
        )


if __name__ == "__main__":
    main()
