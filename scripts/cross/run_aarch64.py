"""Cross-compilation check: compile context models for aarch64 here (x86-64), run them under qemu-aarch64 through
epctx's own loader, and compare with onnxruntime CPU on this machine.

    python scripts/cross/run_aarch64.py [--sysroot build/cross-aarch64] [--workdir DIR] [--models conv,transformer]

Per model: the IREE EP compiles it with ``target=aarch64`` into ``<name>_ctx.onnx`` + ``<name>_IREEExecutionProvider
.bin`` (``epctx.ModelCompiler``); loading it here must be refused (InvalidGraph naming the triple, since IREE itself
would crash); under emulation (``scripts/cross/setup_aarch64.sh`` builds the aarch64 Python, numpy and
iree-base-runtime; epctx comes from this repository's ``src``, no onnx installed there) ``epctx.InferenceSession``
loads and runs it; the outputs must match onnxruntime's within ``--tolerance``. Exit status 0 when every model
passes. Also the script run under emulation (``--emulated``)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
EP = "IREEExecutionProvider"


def _models() -> dict[str, object]:
    """Small on purpose: emulation runs aarch64 code about 50x slower than this CPU runs its own."""
    sys.path.insert(0, str(ROOT))
    from benchmarks import models

    return {
        "conv": models.resnet18(image=32, widths=(8, 16, 16, 32), blocks=(1, 1, 1, 1)),
        "transformer": models.transformer(layers=1, hidden=64, heads=4, ffn=128, seq=16),
        "mlp": models.mlp(batch=4, sizes=(32, 64, 10)),
    }


def _feed(model: object, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feed = {}
    for value in model.graph.input:  # type: ignore[attr-defined]
        dims = [d.dim_value if d.dim_value > 0 else 1 for d in value.type.tensor_type.shape.dim]
        feed[value.name] = rng.standard_normal(dims).astype(np.float32)
    return feed


def prepare(name: str, model: object, folder: Path) -> tuple[Path, Path, dict[str, np.ndarray]]:
    """Compile for aarch64; check this machine refuses it; the reference outputs of onnxruntime."""
    import onnx
    import onnxruntime as ort

    import epctx

    folder.mkdir(parents=True, exist_ok=True)
    source = folder / f"{name}.onnx"
    onnx.save(model, source)  # type: ignore[arg-type]
    ctx = folder / f"{name}_ctx.onnx"
    so = epctx.SessionOptions()
    so.add_provider(EP, {"target": "aarch64"})
    started = time.perf_counter()
    epctx.ModelCompiler(so, str(source)).compile_to_file(str(ctx))
    print(f"{name}: compiled for aarch64 in {time.perf_counter() - started:.1f} s -> {ctx.name}")
    try:
        epctx.InferenceSession(str(ctx), providers=[EP])
    except epctx.InvalidGraph as exc:
        if "aarch64" not in str(exc):
            raise SystemExit(f"{name}: refused here, but the error does not name the triple: {exc}") from exc
        print(f"{name}: refused on x86-64 as it should be: {str(exc)[:160]}")
    else:
        raise SystemExit(f"{name}: an aarch64 context model loaded on x86-64")
    feed = _feed(model)
    inputs = folder / f"{name}_inputs.npz"
    np.savez(inputs, **feed)
    want = ort.InferenceSession(str(source), providers=["CPUExecutionProvider"]).run(None, feed)
    return ctx, inputs, {f"out{k}": np.asarray(w) for k, w in enumerate(want)}


def emulate(sysroot: Path, ctx: Path, inputs: Path, outputs: Path) -> float:
    python = sysroot / "usr" / "bin" / "python3.11"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "PYTHONDONTWRITEBYTECODE": "1"}
    command = ["qemu-aarch64", "-L", str(sysroot), str(python), __file__, "--emulated", str(ctx), str(inputs)]
    started = time.perf_counter()
    done = subprocess.run([*command, str(outputs)], env=env, capture_output=True, text=True, timeout=1800)
    elapsed = time.perf_counter() - started
    sys.stdout.write(done.stdout)
    if done.returncode != 0:
        raise SystemExit(f"emulated run failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return elapsed


def emulated_main(ctx: str, inputs: str, outputs: str) -> int:
    """Runs under qemu-aarch64: epctx's own loader, no onnx installed."""
    import platform

    import epctx

    feed = dict(np.load(inputs))
    started = time.perf_counter()
    session = epctx.InferenceSession(ctx, providers=[EP])
    loaded = time.perf_counter() - started
    results = session.run(None, feed)
    np.savez(outputs, **{f"out{k}": np.asarray(r) for k, r in enumerate(results)})
    onnx_loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("onnx", "onnx_ir"))
    print(
        f"  [{platform.machine()}] session over {Path(ctx).name} in {loaded:.2f} s, ran in "
        f"{time.perf_counter() - started - loaded:.2f} s; onnx / onnx-ir imported: "
        f"{'no' if not onnx_loaded else 'yes (the model has CPU nodes: the full loader)'}"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] == "--emulated":
        return emulated_main(*args[1:4])
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sysroot", default=str(ROOT / "build" / "cross-aarch64"))
    parser.add_argument("--workdir", default=str(ROOT / "build" / "cross-test"))
    parser.add_argument("--models", default="conv,transformer")
    parser.add_argument("--tolerance", type=float, default=1e-4)
    opts = parser.parse_args(args)
    sysroot = Path(opts.sysroot)
    if not (sysroot / ".ready").exists():
        raise SystemExit(f"no aarch64 sysroot at {sysroot}: run scripts/cross/setup_aarch64.sh")
    models = _models()
    failed = 0
    for name in opts.models.split(","):
        folder = Path(opts.workdir) / name
        ctx, inputs, want = prepare(name, models[name], folder)
        outputs = folder / f"{name}_aarch64_outputs.npz"
        elapsed = emulate(sysroot, ctx, inputs, outputs)
        got = dict(np.load(outputs))
        diff = max(float(np.max(np.abs(got[k] - want[k]))) for k in want)
        ok = set(got) == set(want) and diff <= opts.tolerance
        failed += not ok
        print(f"{name}: aarch64 under qemu in {elapsed:.1f} s, max abs diff vs onnxruntime x86 {diff:.2e}: "
              f"{'OK' if ok else 'FAILED'}")  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
