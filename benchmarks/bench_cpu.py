"""CPU benchmark: epctx's CPU EP against onnxruntime's, side by side in one process.

    python benchmarks/bench_cpu.py [--models mlp,resnet18,transformer] [--repeat N] [--json PATH] [--profile]

Reports per model the median / p90 latency of both runtimes, their ratio and the max abs difference of the
outputs; the run() overhead on a one-node Identity model; session creation times; and the time of
``import epctx`` in a fresh interpreter (which must not import a backend runtime). Targets that are missed
print MISS; the exit code is 0 unless ``import epctx`` imported a backend module (a rule, not a target).

The machine is shared and noisy: both runtimes are timed in alternating blocks (``--rounds``) so load
changes hit both; compare ratios, not absolute times. On an oversubscribed machine multi-threaded BLAS and
onnxruntime's spinning thread pool give heavy tails; ``--threads 1`` pins both runtimes to one thread.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import gc
import io
import json
import os
import platform
import pstats
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.models import MODELS, example_inputs

# Latency targets as max epctx/onnxruntime ratios; models without one are reported only.
RATIO_TARGETS: dict[str, float] = {"transformer": 2.0, "resnet18": 3.0}
IDENTITY_TARGET_US = 30.0
IMPORT_TARGET_S = 0.3
BACKEND_MODULES = ("openvino", "iree", "onnxruntime")
DEFAULT_MODELS = "mlp,resnet18,transformer"
BLAS_THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
ORT_THREADS = [0]  # onnxruntime intra-op threads; 0 = its default (set by --threads)

Feeds = Mapping[str, np.ndarray]
RunFn = Callable[[], list[Any]]


# -- sessions ----------------------------------------------------------------------------------------------
def epctx_session(model_bytes: bytes) -> Any:
    import epctx

    return epctx.InferenceSession(model_bytes, providers=["CPUExecutionProvider"])


def ort_session(model_bytes: bytes) -> Any:
    import onnxruntime as ort

    # Default session options (ORT_ENABLE_ALL graph optimizations); intra-op threads default unless --threads.
    options = ort.SessionOptions()
    if ORT_THREADS[0]:
        options.intra_op_num_threads = ORT_THREADS[0]
    return ort.InferenceSession(model_bytes, options, providers=["CPUExecutionProvider"])


def time_creation(factory: Callable[[bytes], Any], model_bytes: bytes, count: int) -> float:
    """Median seconds to create a session from bytes."""
    samples = []
    for _ in range(count):
        gc.collect()
        start = time.perf_counter()
        factory(model_bytes)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


# -- timing ------------------------------------------------------------------------------------------------
def time_runs(run: RunFn, count: int, budget_s: float, min_count: int = 3) -> list[float]:
    """Up to ``count`` timed calls; stops early once ``budget_s`` is spent (after ``min_count`` calls)."""
    samples: list[float] = []
    deadline = time.perf_counter() + budget_s
    for _ in range(count):
        start = time.perf_counter()
        run()
        end = time.perf_counter()
        samples.append(end - start)
        if end > deadline and len(samples) >= min_count:
            break
    return samples


def summarize(samples: list[float]) -> dict[str, float]:
    arr = np.asarray(samples)
    return {
        "median_ms": float(np.median(arr) * 1e3),
        "p90_ms": float(np.percentile(arr, 90) * 1e3),
        "min_ms": float(arr.min() * 1e3),
        "runs": len(samples),
    }


def max_abs_diff(ours: list[Any], theirs: list[Any]) -> tuple[float, float]:
    """Max abs difference over all outputs, and the max abs value of onnxruntime's outputs."""
    diff = 0.0
    scale = 0.0
    for a, b in zip(ours, theirs):
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape:
            return float("inf"), 0.0
        if a.size:
            diff = max(diff, float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))))
            scale = max(scale, float(np.max(np.abs(b))))
    return diff, scale


def bench_model(name: str, args: argparse.Namespace) -> dict[str, Any]:
    model = MODELS[name]()
    model_bytes = model.SerializeToString()
    feeds = example_inputs(name, model)
    result: dict[str, Any] = {"nodes": len(model.graph.node), "model_mb": round(len(model_bytes) / 1e6, 2)}
    result["create_epctx_ms"] = time_creation(epctx_session, model_bytes, args.create_repeat) * 1e3
    result["create_ort_ms"] = time_creation(ort_session, model_bytes, args.create_repeat) * 1e3

    ep = epctx_session(model_bytes)
    ort = ort_session(model_bytes)
    runs: dict[str, RunFn] = {
        "epctx": lambda: ep.run(None, dict(feeds)),
        "ort": lambda: ort.run(None, dict(feeds)),
    }
    outputs = {side: run() for side, run in runs.items()}
    result["max_abs_diff"], result["max_abs_ort_output"] = max_abs_diff(outputs["epctx"], outputs["ort"])
    for run in runs.values():
        for _ in range(args.warmup):
            run()
    samples: dict[str, list[float]] = {"epctx": [], "ort": []}
    per_round = max(1, -(-args.repeat // args.rounds))
    for _ in range(args.rounds):
        for side, run in runs.items():
            gc.collect()
            samples[side] += time_runs(run, per_round, args.max_seconds / args.rounds)
    for side in ("epctx", "ort"):
        result[side] = summarize(samples[side])
    result["ratio"] = result["epctx"]["median_ms"] / result["ort"]["median_ms"]
    # Best-of-N ratio: less sensitive to load from other processes than the medians.
    result["ratio_min"] = result["epctx"]["min_ms"] / result["ort"]["min_ms"]
    target = RATIO_TARGETS.get(name)
    result["target_ratio"] = target
    result["meets_target"] = None if target is None else result["ratio"] <= target
    return result


def bench_identity(args: argparse.Namespace) -> dict[str, Any]:
    """Median microseconds of one run() call on the one-node Identity model, both runtimes."""
    model = MODELS["identity"]()
    model_bytes = model.SerializeToString()
    feeds = example_inputs("identity", model)
    result: dict[str, Any] = {
        "create_epctx_ms": time_creation(epctx_session, model_bytes, args.create_repeat) * 1e3,
        "create_ort_ms": time_creation(ort_session, model_bytes, args.create_repeat) * 1e3,
    }
    sessions = {"epctx": epctx_session(model_bytes), "ort": ort_session(model_bytes)}
    calls = args.identity_calls
    samples: dict[str, list[int]] = {"epctx": [], "ort": []}
    clock = time.perf_counter_ns
    for _ in range(args.rounds):
        for side, sess in sessions.items():
            run = sess.run
            for _ in range(200):
                run(None, feeds)
            gc.collect()
            out = samples[side]
            for _ in range(max(1, calls // args.rounds)):
                start = clock()
                run(None, feeds)
                out.append(clock() - start)
    for side in ("epctx", "ort"):
        result[f"{side}_us"] = statistics.median(samples[side]) / 1e3
        result[f"{side}_p90_us"] = float(np.percentile(samples[side], 90)) / 1e3
    result["calls"] = len(samples["epctx"])
    result["target_us"] = IDENTITY_TARGET_US
    result["meets_target"] = result["epctx_us"] <= IDENTITY_TARGET_US
    return result


# -- import time -------------------------------------------------------------------------------------------
_IMPORT_PROBE = r"""
import json, sys, time
before = set(sys.modules)
sys.stderr.write("@@epctx-import-start@@\n"); sys.stderr.flush()
start = time.perf_counter()
import epctx
seconds = time.perf_counter() - start
print(json.dumps({"seconds": seconds, "new_modules": sorted(set(sys.modules) - before)}))
"""


def _probe(extra_flags: list[str]) -> tuple[dict[str, Any], str]:
    proc = subprocess.run(
        [sys.executable, *extra_flags, "-c", _IMPORT_PROBE],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def _self_time_by_package(importtime_log: str) -> dict[str, float]:
    """Seconds of ``-X importtime`` self time per top-level package, for imports after the marker."""
    lines = importtime_log.split("@@epctx-import-start@@", 1)[-1].splitlines()
    totals: dict[str, float] = {}
    for line in lines:
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        fields = line.split("|")
        if len(fields) != 3:
            continue
        self_us = int(fields[0].split(":")[1])
        package = fields[2].strip().split(".")[0]
        totals[package] = totals.get(package, 0.0) + self_us / 1e6
    return totals


def bench_import(count: int) -> dict[str, Any]:
    """``import epctx`` in fresh interpreters: median seconds, modules it pulled in, backend check."""
    seconds = []
    new_modules: list[str] = []
    for _ in range(count):
        info, _ = _probe([])
        seconds.append(info["seconds"])
        new_modules = info["new_modules"]
    _, log = _probe(["-X", "importtime"])
    by_package = _self_time_by_package(log)
    stdlib = set(sys.stdlib_module_names)
    packages = sorted({m.split(".")[0] for m in new_modules} - stdlib - {"epctx", "_distutils_hack"})
    backends = sorted(m for m in new_modules if m.split(".")[0] in BACKEND_MODULES)
    heavy = sorted(packages, key=lambda p: -by_package.get(p, 0.0))
    return {
        "seconds": statistics.median(seconds),
        "target_s": IMPORT_TARGET_S,
        "meets_target": statistics.median(seconds) < IMPORT_TARGET_S,
        "third_party_packages": {p: round(by_package.get(p, 0.0) * 1e3, 1) for p in heavy},
        "epctx_self_ms": round(by_package.get("epctx", 0.0) * 1e3, 1),
        "onnx_reference_imported": "onnx.reference" in new_modules,
        "backend_modules": backends,
        "num_new_modules": len(new_modules),
    }


# -- profiling ---------------------------------------------------------------------------------------------
@contextlib.contextmanager
def op_timers(totals: dict[str, list[float]]) -> Iterator[None]:
    """While active, CPU EP kernels are created wrapped in a timer that adds to ``totals[op_type]``."""
    from epctx.providers.cpu.provider import CPUExecutionProvider

    original = CPUExecutionProvider.create_kernel

    def create_kernel(self: Any, ctx: Any) -> Any:
        fn = original(self, ctx)
        entry = totals.setdefault(ctx.node.op_type, [0.0, 0.0])  # [seconds, calls]
        clock = time.perf_counter

        def timed(*inputs: Any) -> Any:
            start = clock()
            out = fn(*inputs)
            entry[0] += clock() - start
            entry[1] += 1
            return out

        return timed

    CPUExecutionProvider.create_kernel = create_kernel  # type: ignore[method-assign]
    try:
        yield
    finally:
        CPUExecutionProvider.create_kernel = original  # type: ignore[method-assign]


def profile_model(name: str, runs: int, top: int) -> dict[str, Any]:
    """Per-op-type time of epctx's kernels, framework overhead, and cProfile's top functions."""
    model = MODELS[name]()
    model_bytes = model.SerializeToString()
    feeds = example_inputs(name, model)
    totals: dict[str, list[float]] = {}
    with op_timers(totals):
        sess = epctx_session(model_bytes)
    sess.run(None, dict(feeds))
    for entry in totals.values():  # drop constant folding and the warm-up run
        entry[0] = entry[1] = 0.0
    start = time.perf_counter()
    for _ in range(runs):
        sess.run(None, dict(feeds))
    wall = (time.perf_counter() - start) / runs
    ops = {
        op: {"ms_per_run": s / runs * 1e3, "calls_per_run": c / runs, "share": s / runs / wall}
        for op, (s, c) in sorted(totals.items(), key=lambda kv: -kv[1][0])
        if c
    }
    kernel_s = sum(s for s, _ in totals.values()) / runs

    plain = epctx_session(model_bytes)
    plain.run(None, dict(feeds))
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(runs):
        plain.run(None, dict(feeds))
    profiler.disable()
    stream = io.StringIO()
    stats = pstats.Stats(profiler, stream=stream)
    stats.sort_stats("tottime").print_stats(top)
    return {
        "runs": runs,
        "ms_per_run": wall * 1e3,
        "kernel_ms_per_run": kernel_s * 1e3,
        "framework_ms_per_run": (wall - kernel_s) * 1e3,
        "ops": ops,
        "cprofile_top": _trim_pstats(stream.getvalue()),
    }


def _trim_pstats(text: str) -> str:
    lines = text.splitlines()
    for k, line in enumerate(lines):
        if line.lstrip().startswith("ncalls"):
            return "\n".join(lines[k:]).replace(os.getcwd() + os.sep, "")
    return text


# -- report ------------------------------------------------------------------------------------------------
def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    fmt = " | ".join(f"{{:{'<' if i == 0 else '>'}{w}}}" for i, w in enumerate(widths))
    lines = [fmt.format(*header), "-+-".join("-" * w for w in widths)]
    lines += [fmt.format(*r) for r in rows]
    return "\n".join(lines)


def _mark(ok: bool | None) -> str:
    return "" if ok is None else ("ok" if ok else "MISS")


def report(results: dict[str, Any]) -> str:
    out = []
    env = results["environment"]
    out.append(
        f"epctx CPU benchmark  python {env['python']}  numpy {env['numpy']}  "
        f"onnxruntime {env['onnxruntime']}  cpus {env['cpus']}  threads {env['threads']}  "
        f"openblas core {env['openblas_coretype']}  "
        f"load {env['load_before']} -> {env['load_after']}"
    )
    rows = []
    for name, r in results["models"].items():
        target = r["target_ratio"]
        rows.append(
            [
                name,
                f"{r['epctx']['median_ms']:.2f}",
                f"{r['epctx']['p90_ms']:.2f}",
                f"{r['ort']['median_ms']:.2f}",
                f"{r['ort']['p90_ms']:.2f}",
                f"{r['ratio']:.2f}x",
                f"{r['ratio_min']:.2f}x",
                f"{r['max_abs_diff']:.2e}",
                "-" if target is None else f"<= {target:g}x {_mark(r['meets_target'])}",
                f"{r['epctx']['runs']}/{r['ort']['runs']}",
            ]
        )
    if "identity" in results:
        i = results["identity"]
        rows.append(
            [
                "identity run() us",
                f"{i['epctx_us']:.1f}",
                f"{i['epctx_p90_us']:.1f}",
                f"{i['ort_us']:.1f}",
                f"{i['ort_p90_us']:.1f}",
                f"{i['epctx_us'] / i['ort_us']:.2f}x",
                "",
                "",
                f"<= {i['target_us']:g} us {_mark(i['meets_target'])}",
                f"{i['calls']}/{i['calls']}",
            ]
        )
    header = [
        "model",
        "epctx med ms",
        "epctx p90",
        "ort med ms",
        "ort p90",
        "epctx/ort",
        "min ratio",
        "max|diff|",
    ]
    out += ["", _table([*header, "target", "runs"], rows)]
    out.append(
        "epctx/ort: ratio of medians (what the targets apply to); min ratio: best run against best run,"
    )
    out.append("steadier when other processes load the machine. max|diff|: over all outputs, epctx vs ort.")

    created = dict(results["models"])
    if "identity" in results:
        created["identity"] = results["identity"]
    crow = [
        [
            name,
            f"{r['create_epctx_ms']:.1f}",
            f"{r['create_ort_ms']:.1f}",
            f"{r['create_epctx_ms'] / r['create_ort_ms']:.2f}x",
        ]
        for name, r in created.items()
    ]
    out += [
        "",
        "session creation (from bytes, median)",
        _table(["model", "epctx ms", "ort ms", "ratio"], crow),
    ]

    if "import" in results:
        imp = results["import"]
        out.append("")
        out.append(
            f"import epctx (fresh interpreter, median): {imp['seconds'] * 1e3:.0f} ms  "
            f"target < {imp['target_s'] * 1e3:.0f} ms {_mark(imp['meets_target'])}"
        )
        pkgs = ", ".join(f"{p} {ms:.0f} ms" for p, ms in imp["third_party_packages"].items())
        out.append(f"  third-party packages imported (self time under -X importtime): {pkgs or 'none'}")
        out.append(
            f"  epctx's own modules: {imp['epctx_self_ms']:.0f} ms; {imp['num_new_modules']} modules in all"
        )
        if imp["onnx_reference_imported"]:
            out.append("  note: onnx.reference is imported by `import epctx`")
        if imp["backend_modules"]:
            out.append(f"  FAIL: backend modules imported: {', '.join(imp['backend_modules'])}")
        else:
            out.append(f"  no backend module imported ({', '.join(BACKEND_MODULES)}): ok")

    for name, p in results.get("profile", {}).items():
        out.append("")
        out.append(
            f"profile {name} (epctx, {p['runs']} runs): {p['ms_per_run']:.1f} ms/run, kernels "
            f"{p['kernel_ms_per_run']:.1f} ms, framework + timer overhead {p['framework_ms_per_run']:.2f} ms"
        )
        prow = [
            [op, f"{o['ms_per_run']:.2f}", f"{o['share'] * 100:.1f}%", f"{o['calls_per_run']:.0f}"]
            for op, o in p["ops"].items()
        ]
        out.append(_table(["op", "ms/run", "share", "calls/run"], prow))
        out.append("cProfile, top functions by own time:")
        out.append(p["cprofile_top"])
    return "\n".join(out)


def environment() -> dict[str, Any]:
    import onnxruntime

    return {
        "threads": ORT_THREADS[0] or "default",
        "blas_threads_env": os.environ.get("OPENBLAS_NUM_THREADS", "unset"),
        "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE", "auto-detected"),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "onnxruntime": onnxruntime.__version__,
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
    }


def _load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=DEFAULT_MODELS, help=f"comma-separated, of {sorted(MODELS)}")
    parser.add_argument("--repeat", type=int, default=30, help="timed runs per model and runtime")
    parser.add_argument(
        "--rounds", type=int, default=3, help="alternating epctx/ort blocks the runs split into"
    )
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--max-seconds", type=float, default=60.0, help="time budget per model and runtime")
    parser.add_argument("--create-repeat", type=int, default=3, help="session creations timed per model")
    parser.add_argument("--identity-calls", type=int, default=6000)
    parser.add_argument("--import-repeat", type=int, default=5)
    parser.add_argument("--skip-identity", action="store_true")
    parser.add_argument("--skip-import", action="store_true")
    parser.add_argument("--profile", action="store_true", help="also profile epctx on each benchmarked model")
    parser.add_argument("--profile-models", default=None, help="models to profile (default: --models)")
    parser.add_argument("--profile-runs", type=int, default=5)
    parser.add_argument("--json", metavar="PATH", help="write all numbers to PATH")
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="threads for both runtimes (numpy's BLAS via env + re-exec, onnxruntime's intra-op pool); "
        "0 = library defaults. 1 gives much steadier numbers on a loaded machine",
    )
    parser.add_argument(
        "--openblas-coretype",
        metavar="NAME",
        help="set OPENBLAS_CORETYPE for numpy's OpenBLAS ('auto': unset it, so OpenBLAS detects the CPU). "
        "An inherited value such as Haswell on an AVX-512 CPU makes GEMM ~1.7x slower; onnxruntime's MLAS "
        "ignores it",
    )
    args = parser.parse_args(argv)
    names = [n for n in args.models.split(",") if n]
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        parser.error(f"unknown model(s) {unknown}; known: {sorted(MODELS)}")
    args.model_names = [n for n in names if n != "identity"]
    args.rounds = max(1, args.rounds)
    profile = (
        args.profile_models.split(",") if args.profile_models else (args.model_names if args.profile else [])
    )
    args.profile_names = [n for n in profile if n]
    return args


def _reexec_with_env(env: Mapping[str, str | None]) -> None:
    """BLAS reads its settings when numpy loads: restart the script with ``env`` set (None: unset), once."""
    if all(os.environ.get(k) == v for k, v in env.items()):
        return
    for k, v in env.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    sys.stdout.flush()
    os.execv(sys.executable, [sys.executable, os.path.abspath(__file__), *sys.argv[1:]])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    env: dict[str, str | None] = (
        {var: str(args.threads) for var in BLAS_THREAD_VARS} if args.threads > 0 else {}
    )
    if args.openblas_coretype:
        core = args.openblas_coretype
        env["OPENBLAS_CORETYPE"] = None if core == "auto" else core
        if core == "auto":  # the two are set together on this machine; unset together
            env["OPENBLAS_L2_SIZE"] = None
    if env and argv is None:
        _reexec_with_env(env)
    ORT_THREADS[0] = max(args.threads, 0)
    results: dict[str, Any] = {"environment": environment(), "models": {}}
    results["environment"]["load_before"] = _load()
    if not args.skip_import:
        results["import"] = bench_import(args.import_repeat)
    if not args.skip_identity:
        results["identity"] = bench_identity(args)
    for name in args.model_names:
        print(f"benchmarking {name} ...", file=sys.stderr, flush=True)
        results["models"][name] = bench_model(name, args)
    if args.profile_names:
        results["profile"] = {}
        for name in args.profile_names:
            print(f"profiling {name} ...", file=sys.stderr, flush=True)
            results["profile"][name] = profile_model(name, args.profile_runs, top=25)
    results["environment"]["load_after"] = _load()
    print(report(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    backend_imported = bool(results.get("import", {}).get("backend_modules"))
    return 1 if backend_imported else 0


if __name__ == "__main__":
    sys.exit(main())
