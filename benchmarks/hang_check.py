"""Does any fresh process hang when OpenVINO loads while numpy's BLAS runs CPU-fallback MatMuls? (issue 7)

Each of N fresh processes builds an epctx CPU session on a MatMul model (multi-threaded BLAS), starts a thread
that runs it in a loop, loads OpenVINO, then runs the session in the main thread right away (the import-time
fork of OpenVINO's telemetry comes 1-5 ms after ``import openvino``: see ``epctx/ep/_blas.py``),
each under a timeout. Prints hangs / total.

Modes (what loads OpenVINO):
  epctx  the OpenVINO EP, as a session creates it (``import openvino`` through ``backend_import``)
  raw    ``import openvino; openvino.Core()`` directly: what the EP did before the fix (the "before" count)
  none   no OpenVINO (a control: the same BLAS work alone)

    python benchmarks/hang_check.py                    # 200 processes, mode epctx
    python benchmarks/hang_check.py -n 200 --mode raw  # the same sequence without epctx's coordination

BLAS thread-count variables (OPENBLAS_NUM_THREADS, OMP_NUM_THREADS, ...) are removed from the children's
environment, as a user has none (--keep-env keeps them). A process whose telemetry is off (opted out, or CI=true)
never forks: each child reports the forks it saw, and the summary counts the children that had one.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

BLAS_ENV = (
    "OPENBLAS_NUM_THREADS",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "BLIS_NUM_THREADS",
    "GOTO_NUM_THREADS",
)
MODES = ("epctx", "raw", "none")
ROWS, SIZE = 256, 1024  # X (ROWS, SIZE) @ W (SIZE, SIZE): ~10 ms per MatMul, inside multi-threaded OpenBLAS


def write_model(path: Path, rows: int = ROWS, size: int = SIZE) -> None:
    """Y = (X @ W1) @ W2 with X (rows, size), W (size, size) float32: each MatMul is multi-threaded BLAS."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = [
        numpy_helper.from_array((rng.standard_normal((size, size)) / size).astype(np.float32), f"w{i}")
        for i in (1, 2)
    ]
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("MatMul", ["h", "w2"], ["y"])],
        "matmuls",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, size])],
        initializer=w,
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def child(mode: str, model: str, seconds: float, dump_after: float) -> int:
    """One fresh process: CPU session ready, BLAS running in a thread, load OpenVINO, BLAS in this thread."""
    if dump_after > 0:  # a hung child leaves the stacks of all its threads on stderr
        faulthandler.dump_traceback_later(dump_after, exit=False)
    forks = [0]
    os.register_at_fork(after_in_parent=lambda: forks.__setitem__(0, forks[0] + 1))
    import epctx

    sess = epctx.InferenceSession(model, providers=["CPUExecutionProvider"])
    feeds = {"x": np.ones((ROWS, SIZE), dtype=np.float32)}
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            sess.run(None, feeds)

    side = threading.Thread(target=loop, daemon=True)
    side.start()
    sess.run(None, feeds)
    t0 = time.perf_counter()
    if mode == "epctx":
        from epctx.providers.registry import create_provider

        create_provider("OpenVINOExecutionProvider")
    elif mode == "raw":
        import openvino as ov

        ov.Core()
    load_s = time.perf_counter() - t0
    forks_at_load = forks[0]
    runs = 0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        sess.run(None, feeds)
        runs += 1
    stop.set()
    side.join()
    info = {"forks": forks[0], "forks_at_load": forks_at_load, "runs": runs, "load_s": round(load_s, 4)}
    print(json.dumps(info), flush=True)
    return 0


def run_one(cmd: list[str], env: dict[str, str], timeout: float) -> dict[str, Any]:
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:  # subprocess.run kills the child
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else exc.stderr or ""
        return {"status": "hang", "wall_s": time.perf_counter() - t0, "stderr": err[-6000:]}
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        return {"status": "error", "wall_s": wall, "stderr": proc.stderr[-2000:]}
    try:
        info = json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return {"status": "error", "wall_s": wall, "stderr": proc.stdout[-500:] + proc.stderr[-1500:]}
    return {"status": "ok", "wall_s": wall, **info}


def check(
    n: int, mode: str, *, jobs: int = 2, timeout: float = 20.0, seconds: float = 1.0, keep_env: bool = False
) -> dict[str, Any]:
    """Run ``n`` fresh child processes; returns counts (hangs, errors, children that saw a fork) and timings."""
    env = dict(os.environ)
    if not keep_env:
        for var in BLAS_ENV:
            env.pop(var, None)
    root = Path(__file__).resolve().parent.parent
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root / "src"), env.get("PYTHONPATH", "")]))
    with tempfile.TemporaryDirectory(prefix="epctx-hang-") as tmp:
        model = Path(tmp) / "matmuls.onnx"
        write_model(model)
        cmd = [sys.executable, os.path.abspath(__file__), "--child", mode, "--model", str(model)]
        cmd += ["--seconds", str(seconds), "--dump-after", str(max(0.0, timeout - 3.0))]
        t0 = time.perf_counter()
        with ThreadPoolExecutor(max(1, jobs)) as pool:
            results = list(pool.map(lambda _: run_one(cmd, env, timeout), range(n)))
        wall = time.perf_counter() - t0
    ok = [r for r in results if r["status"] == "ok"]
    loads = sorted(r["load_s"] for r in ok)
    return {
        "mode": mode,
        "total": n,
        "hangs": sum(r["status"] == "hang" for r in results),
        "errors": sum(r["status"] == "error" for r in results),
        "forked": sum(r.get("forks", 0) > 0 for r in ok),
        # epctx mode: children whose OpenVINO load returned before the fork came (the guard's wait ran out)
        "returned_before_fork": sum(r.get("forks", 0) > r.get("forks_at_load", 0) for r in ok),
        "load_median_s": loads[len(loads) // 2] if loads else None,
        "wall_s": round(wall, 1),
        "first_error": next((r["stderr"] for r in results if r["status"] == "error"), None),
        "hung_stacks": [r["stderr"] for r in results if r["status"] == "hang"][:3],
        "blas_env": {v: os.environ[v] for v in BLAS_ENV if v in os.environ and keep_env},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("-n", type=int, default=200, help="fresh processes (default 200)")
    parser.add_argument("--mode", choices=MODES, default="epctx")
    parser.add_argument("--jobs", type=int, default=2, help="processes at a time (default 2)")
    parser.add_argument("--timeout", type=float, default=20.0, help="seconds before a process counts as hung")
    parser.add_argument(
        "--seconds", type=float, default=1.0, help="BLAS work after OpenVINO loads (default 1)"
    )
    parser.add_argument("--keep-env", action="store_true", help="keep OPENBLAS_NUM_THREADS & co. as they are")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--dump-after", type=float, default=0.0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(args.child, args.model, args.seconds, args.dump_after)
    result = check(
        args.n, args.mode, jobs=args.jobs, timeout=args.timeout, seconds=args.seconds, keep_env=args.keep_env
    )
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(
            f"mode {result['mode']}: hangs {result['hangs']} / {result['total']}, errors {result['errors']}, "
            f"{result['forked']} of the others saw OpenVINO's import-time fork; OpenVINO load median "
            f"{result['load_median_s']} s; {result['wall_s']} s wall"
        )
        if result["first_error"]:
            print("first error:\n" + result["first_error"], file=sys.stderr)
        for stacks in result["hung_stacks"]:
            print("a hung child's threads:\n" + stacks, file=sys.stderr)
    return 1 if result["hangs"] or result["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
