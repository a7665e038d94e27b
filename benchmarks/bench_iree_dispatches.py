"""Where an IREE partition's time goes, dispatch by dispatch, against onnxruntime's kernels, on one corpus model:

    python benchmarks/bench_iree_dispatches.py MODEL ['{provider options}'] [--top 30] [--runs 30] [--keep DIR]

The model's inputs are stated with its feed's shapes (``bench_iree_flags.stated``). The EP compiles it as a session
would (``bench_iree_ab._session``: one thread, the measured rule off) and each compile job's folder is kept; per
job, the worker's rewritten model gives the parameters (an ``.irpa`` of the weights as the EP stores them), and
``iree-benchmark-module`` runs the job's ``.vmfb`` ``--runs`` times on the local-sync device (one thread) with
IREE's host-execution profiling (``--device_profiling_mode=host-execution``). Per dispatch: its fastest run and
its median run (a run's time: the sum of its invocations), ordered by the fastest; the sum of the fastest is the
floor a busy machine inflates least. Then onnxruntime's per-node profile (one thread, ``--runs`` runs, medians)
of the same model. The job folders (model, MLIR, ``.vmfb``, ``.irpa``, the profile) stay in ``--keep`` for
``iree-compile --compile-to=executable-configurations`` and friends. Used for issue 21's measurements."""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.bench_iree_ab import _session
from benchmarks.bench_iree_flags import stated
from benchmarks.corpus import feeds, materialise

_TOOLS = Path(sys.executable).parent


def compile_jobs(model: Path, options: dict[str, Any], keep: Path) -> list[Path]:
    """The EP's compile jobs for ``model``, each folder copied into ``keep`` once compiled."""
    import epctx.providers.iree.compile as iree_compile

    real = iree_compile._compile_job
    kept: list[Path] = []

    def keeping(
        folder: Path, label: str, start: float, limits: iree_compile.JobLimits = iree_compile.NO_LIMITS
    ) -> Any:
        result = real(folder, label, start, limits)
        kept.append(keep / f"job{len(kept)}")
        shutil.copytree(folder, kept[-1])
        return result

    iree_compile._compile_job = keeping  # type: ignore[assignment]
    try:
        _session(model, options, 1)
    finally:
        iree_compile._compile_job = real  # type: ignore[assignment]
    return [k for k in kept if json.loads((k / "result.json").read_text())["ok"]]


def write_parameters(job: Path) -> Path:
    """The job's weights as the EP stores them (the worker's rewritten model), as an ``.irpa``."""
    import iree.runtime as rt
    from onnx import numpy_helper

    from epctx.providers.iree import worker

    model, _ = worker._load(job, json.loads((job / "job.json").read_text()))
    initializers = {t.name: t for t in model.graph.initializer}
    index = rt.ParameterIndex()
    for name, key in json.loads((job / "result.json").read_text())["params"]:
        index.add_buffer(key, numpy_helper.to_array(initializers[name]).tobytes())
    path = job / "weights.irpa"
    index.create_archive_file(str(path))
    return path


def _entry(vmfb: Path) -> str:
    dump = subprocess.run(
        [_TOOLS / "iree-dump-module", vmfb], capture_output=True, text=True, check=True
    ).stdout
    exported = dump.split("Exported Functions:")[1].split("//===")[0]
    names = [line.split("] ", 1)[1].split("(")[0] for line in exported.splitlines() if "] " in line]
    return next(n for n in names if "$async" not in n and not n.startswith("__"))


def profile_job(job: Path, inputs: list[Path], runs: int) -> dict[str, list[float]]:
    """Microseconds per run of each dispatch of the job (the first, cold run left out)."""
    params, profile = write_parameters(job), job / "run.ireeprof"
    command = [_TOOLS / "iree-benchmark-module", f"--module={job / 'module.vmfb'}", f"--parameters=model={params}",
               "--device=local-sync", f"--function={_entry(job / 'module.vmfb')}", f"--benchmark_min_time={runs}x",
               *(f"--input=@{p}" for p in inputs), "--device_profiling_mode=host-execution",
               f"--device_profiling_output={profile}"]  # fmt: skip
    subprocess.run(command, capture_output=True, check=True)
    events = subprocess.run([_TOOLS / "iree-profile", "dispatch", "--format=jsonl", "--dispatch_events", profile],
                            capture_output=True, text=True, check=True).stdout  # fmt: skip
    per_run: dict[int, dict[str, float]] = collections.defaultdict(lambda: collections.defaultdict(float))
    for line in events.splitlines():
        event = json.loads(line)
        if event.get("type") == "host_dispatch_event":
            name = event["key"].split("$async_", 1)[-1]
            per_run[event["submission_id"]][name] += event["duration_ns"] / 1e3
    warm = [per_run[s] for s in sorted(per_run)[1:]]
    return {name: [run.get(name, 0.0) for run in warm] for name in set().union(*warm)}


def ort_nodes(model: Path, feed: dict[str, np.ndarray], runs: int) -> dict[str, float]:
    """Microseconds per run (median) of each node onnxruntime runs, one thread."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.enable_profiling = True
    so.profile_file_prefix = str(model.with_suffix(""))
    session = ort.InferenceSession(str(model), so, providers=["CPUExecutionProvider"])
    for _ in range(runs):
        session.run(None, feed)
    events = json.loads(Path(session.end_profiling()).read_text())
    times: dict[str, list[float]] = collections.defaultdict(list)
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            times[f"{event['args'].get('op_name')} {event['name'][: -len('_kernel_time')]}"].append(
                event["dur"]
            )
    return {name: statistics.median(values) for name, values in times.items()}


def report(title: str, rows: dict[str, float], top: int, extra: dict[str, str] | None = None) -> None:
    print(f"{title}: {len(rows)} rows, sum {sum(rows.values()) / 1e3:.2f} ms")
    for name in sorted(rows, key=lambda n: -rows[n])[:top]:
        print(f"  {rows[name]:9.1f} us  {(extra or {}).get(name, '')}{name}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("model")
    parser.add_argument("options", nargs="?", default="{}", help="provider options of the IREE EP, JSON")
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--keep", type=Path, help="folder for the job folders (default: a temporary one)")
    args = parser.parse_args()
    keep = args.keep or Path(tempfile.mkdtemp(prefix="epctx-iree-dispatches-"))
    keep.mkdir(parents=True, exist_ok=True)
    feed = feeds(args.model)
    model = stated(materialise(args.model, keep), feed, keep / f"{args.model}_stated.onnx")
    inputs = []
    for array in feed.values():
        inputs.append(keep / f"input_{len(inputs)}.npy")
        np.save(inputs[-1], array)
    for job in compile_jobs(model, json.loads(args.options), keep):
        times = profile_job(job, inputs, args.runs)
        best = {name: min(v) for name, v in times.items()}
        medians = {name: f"{statistics.median(v):9.1f} us median  " for name, v in times.items()}
        report(f"IREE {job.name}, fastest run of each dispatch", best, args.top, medians)
    report("onnxruntime, median of each node", ort_nodes(model, feed, args.runs), args.top)
    print(f"job folders: {keep}; load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
