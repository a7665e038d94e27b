"""Compiling partitions out of process: each partition is written as an ONNX model into a temporary folder and
``python -m epctx.providers.iree.worker`` imports and compiles it there (the compiler never enters this
process), partitions in parallel up to ``os.cpu_count()``, each logged when it starts and ends."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from epctx.ep import CompileGuard, Partition, partition_model, plan_weights_file
from epctx.errors import EPFail

__all__ = ["CompileResult", "compile_partitions"]

logger = logging.getLogger("epctx")

MIN_OPSET = 17  # IREE's ONNX importer fails on older Softmax / ReduceX semantics: upgrade below this
_EXTERNAL_MIN_BYTES = 1024  # larger initializers reach the worker as external data, not in the protobuf
_TIMEOUT_S = 3600


@dataclasses.dataclass(frozen=True, slots=True)
class CompileResult:
    """The outcome of one partition's compile: the ``.vmfb`` and its parameters (ONNX initializer name, IREE
    parameter key), or the stage that failed and IREE's message."""

    ok: bool
    vmfb: bytes = b""
    params: tuple[tuple[str, str], ...] = ()
    stage: str = ""
    error: str = ""
    seconds: float = 0.0


def entry_name(partition: Partition) -> str:
    """The ONNX graph name given to IREE (its function is named after it; loading looks the name up)."""
    return re.sub(r"\W", "_", partition.name or "partition") or "partition"


def _write_job(partition: Partition, folder: Path, flags: Sequence[str]) -> None:
    plan = plan_weights_file(partition.initializers, location="weights.bin", min_size=_EXTERNAL_MIN_BYTES)
    model = partition_model(partition, weights=plan.refs, graph_name=entry_name(partition))
    if plan.arrays:
        plan.write(folder)
    (folder / "model.onnx").write_bytes(model.SerializeToString())
    (folder / "job.json").write_text(json.dumps({"flags": list(flags), "min_opset": MIN_OPSET}))


def _worker_env() -> dict[str, str]:
    """The environment of a worker: this process's, with the folder epctx is imported from first on the path."""
    root = str(Path(__file__).resolve().parents[3])  # the folder holding the epctx package
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    return env


def _run_one(partition: Partition, flags: Sequence[str], label: str) -> CompileResult:
    start = time.perf_counter()
    logger.info("%s: compiling %d node(s) with IREE", label, len(partition.nodes))
    with tempfile.TemporaryDirectory(prefix="epctx-iree-") as name:
        folder = Path(name)
        _write_job(partition, folder, flags)
        command = [sys.executable, "-m", "epctx.providers.iree.worker", str(folder)]
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, env=_worker_env(), timeout=_TIMEOUT_S
            )
        except subprocess.TimeoutExpired:
            return CompileResult(False, stage="compile", error=f"timed out after {_TIMEOUT_S} s")
        result_file = folder / "result.json"
        if done.returncode != 0 or not result_file.is_file():
            detail = (done.stderr or done.stdout).strip()[-2000:]
            raise EPFail(f"{label}: the IREE compile worker failed (exit status {done.returncode}): {detail}")
        doc = json.loads(result_file.read_text())
        seconds = time.perf_counter() - start
        if not doc["ok"]:
            logger.info("%s: IREE %s failed after %.1f s", label, doc["stage"], seconds)
            return CompileResult(False, stage=doc["stage"], error=doc["error"], seconds=seconds)
        vmfb = (folder / "module.vmfb").read_bytes()
    logger.info("%s: compiled in %.1f s (%d bytes of code)", label, seconds, len(vmfb))
    params = tuple((str(a), str(b)) for a, b in doc["params"])
    return CompileResult(True, vmfb=vmfb, params=params, seconds=seconds)


def compile_partitions(
    partitions: Sequence[Partition],
    flags: Sequence[str],
    guard: CompileGuard,
    *,
    ep_name: str = "IREEExecutionProvider",
    what: str = "partition",
    on_done: Callable[[Partition], None] | None = None,
) -> list[CompileResult]:
    """Compile each partition in a worker process, up to ``os.cpu_count()`` at a time; results in order. The
    only place that starts a worker: ``guard`` is checked first. ``on_done(partition)`` as each one ends
    (from a pool thread)."""
    if not partitions:
        return []
    guard.check(ep_name, len(partitions), "" if what == "partition" else f"for its {what}")
    total = len(partitions)
    labels = [f"IREE {what} {p.name!r} [{k + 1}/{total}]" for k, p in enumerate(partitions)]

    def one(partition: Partition, label: str) -> CompileResult:
        result = _run_one(partition, flags, label)
        if on_done is not None and result.ok:
            on_done(partition)
        return result

    workers = max(1, min(total, os.cpu_count() or 1))
    if workers == 1:
        return [one(p, label) for p, label in zip(partitions, labels)]
    with concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="epctx-iree") as pool:
        futures = [pool.submit(one, p, label) for p, label in zip(partitions, labels)]
        return [f.result() for f in futures]
